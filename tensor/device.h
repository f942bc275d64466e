#pragma once
// Where a tensor's storage lives. The CPU always exists; CUDA devices exist when
// the build has CUDA and a GPU is present at run time.
#include <string>

namespace attograd {

struct Device {
  enum class Kind : unsigned char { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {Kind::cpu, 0}; }
  static Device cuda(int i = 0) { return {Kind::cuda, i}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace attograd

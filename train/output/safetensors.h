#pragma once
// The safetensors file layout, so PyTorch and other tools can read our weights:
//   8 bytes   N, the header length, little-endian uint64
//   N bytes   JSON: name -> {"dtype": "F32"|"F64"|"I64"|"BF16", "shape": [...],
//             "data_offsets": [begin, end]}, plus "__metadata__": {string: string}
//   the rest  raw little-endian tensor data; offsets count from its start
// The reader treats a file as untrusted: every length, offset and shape is
// checked before a byte of data is touched.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace attograd::train::output {

using Metadata = std::map<std::string, std::string>;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct Safetensors {
  std::map<std::string, Tensor> tensors;  // CPU, contiguous
  Metadata metadata;
};

// Same limit as the reference implementation: larger headers are refused
// before any allocation.
inline constexpr std::uint64_t kMaxSafetensorsHeader = 100'000'000;

// The whole file's bytes; tensors are laid out in the given order.
std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata = {});
// The same file written atomically (train/files.h) a part at a time, never whole in memory; `what` names it in errors.
void write_safetensors(std::string_view what, const std::string& path, const NamedTensors& tensors,
                       const Metadata& metadata = {});
struct SafetensorsRead {
  // F16 tensors, for which attograd has no dtype, become float32 ones (exactly:
  // every half is a float). Otherwise F16 is refused as an unknown dtype, as
  // a checkpoint, which attograd writes, never holds one.
  bool widen_f16 = false;
  // When given, only the tensors whose names it accepts are read; every
  // tensor's entry is checked all the same.
  std::function<bool(const std::string& name)> wanted;
};

// `what` names the file in errors: "[checkpoint.safetensors] data_offsets of 'w' ...".
// `copied`, when given, hears each tensor's byte range in `bytes` once it is
// copied out (load_safetensors lets a mapping's pages go).
Safetensors parse_safetensors(std::string_view bytes, std::string_view what = "safetensors",
                              SafetensorsRead read = {},
                              const std::function<void(std::size_t begin, std::size_t end)>& copied = {});

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
// `flag` names the option the path came from in errors about the file itself ("[--resume] ...").
// The file is mapped, not read: each tensor's pages are let go once copied,
// so that loading holds the tensors and little more.
Safetensors load_safetensors(const std::string& path, const char* flag = "--ckpt", SafetensorsRead read = {});

}  // namespace attograd::train::output

// libFuzzer's entry point for the Hugging Face folder target (its body: tests/fuzz/targets.cpp).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return attograd::fuzz::hf(data, size);
}

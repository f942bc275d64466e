// The test programs' main: Catch2's, after one check. ctest runs the suite
// again on each narrower instruction set and bfloat16 kernel, named by
// ATTOGRAD_ATTENTION_ISA and ATTOGRAD_BF16_ISA (tests/CMakeLists.txt); where
// the CPU or this build lacks the one named, the run skips at once, saying
// why, rather than failing every case with that line. A name that is no
// kernel at all fails the run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <iostream>
#include <string_view>

#include "base/error.h"
#include "cpu/attention/attention.h"
#include "cpu/matmul_bf16/isa.h"

int main(int argc, char* argv[]) {
  try {
    attograd::cpu::attention_isa();
    attograd::cpu::bf16_kernel();
  } catch (const attograd::Error& e) {
    const bool lacking = std::string_view(e.what()).find("is wider than this CPU") != std::string_view::npos;
    (lacking ? std::cout : std::cerr) << (lacking ? "skipped: " : "") << e.what() << "\n";
    return lacking ? 0 : 1;
  }
  return Catch::Session().run(argc, argv);
}

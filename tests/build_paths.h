#pragma once
// Paths of this build and of the source tree, which CMake gives to
// build_paths.cpp alone: every other test file then compiles to the same
// object from a clone in any folder, so the compiler cache serves it.

namespace attograd::test {

extern const char* const kAttogradBinary;  // the built `attograd` program
extern const char* const kFuzzDir;         // tests/fuzz: the fuzzers' seed corpus and saved crashes
extern const char* const kHostsScript;     // tests/hosts/hosts: test hosts made of network namespaces
extern const char* const kSourceDir;       // the source tree's root

}  // namespace attograd::test

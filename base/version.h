#pragma once
// The version of attograd this library was built as (CMake's project(VERSION),
// "0.2.0"): what `attograd --version` prints, and what the processes of one
// mpirun compare before they train together.

namespace attograd {

const char* version();

}  // namespace attograd

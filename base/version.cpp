#include "base/version.h"

namespace attograd {

const char* version() { return ATTOGRAD_VERSION; }  // set by CMakeLists.txt from project(VERSION)

}  // namespace attograd

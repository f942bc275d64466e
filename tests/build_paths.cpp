#include "build_paths.h"

namespace attograd::test {

const char* const kAttogradBinary = ATTOGRAD_BINARY;
const char* const kFuzzDir = ATTOGRAD_FUZZ_DIR;
const char* const kHostsScript = ATTOGRAD_HOSTS_SCRIPT;
const char* const kSourceDir = ATTOGRAD_SOURCE_DIR;

}  // namespace attograd::test

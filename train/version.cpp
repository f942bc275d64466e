#include "train/version.h"

namespace attograd {
const char* version() { return ATTOGRAD_VERSION; }
}  // namespace attograd

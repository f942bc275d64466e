#pragma once

namespace attograd {
const char* version();  // "0.1.0"
}  // namespace attograd

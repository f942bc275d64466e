#pragma once
// The one exception type of attograd. Messages name the op (or flag) and the
// offending values: "[matmul] inner dimensions differ: a is [2,3], b is [4,5]".
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace attograd {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws Error("[op] message") with fmt-style formatting.
template <typename... Args>
[[noreturn]] void fail(std::string_view op, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format("[{}] {}", op, fmt::format(format, std::forward<Args>(args)...)));
}

}  // namespace attograd

// AG_CHECK(cond, op, fmt, args...): a user-facing precondition; throws attograd::Error.
#define AG_CHECK(cond, op, ...)                \
  do {                                         \
    if (!(cond)) ::attograd::fail(op, __VA_ARGS__); \
  } while (0)

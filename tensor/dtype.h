#pragma once
// Element types. float32 is the working type everywhere, float64 exists on the
// CPU for gradcheck and references; bfloat16 (base/bfloat16.h) holds the
// activations and product operands of mixed-precision training; int64 holds
// token ids and targets; bool8 holds masks (true = hidden).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/bfloat16.h"
#include "base/error.h"

namespace attograd {

enum class DType : std::uint8_t { f32, f64, i64, b8, bf16 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i64: return 8;
    case DType::b8: return 1;
    case DType::bf16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i64: return "int64";
    case DType::b8: return "bool";
    case DType::bf16: return "bfloat16";
  }
  return "?";
}

constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16; }

// The dtype a kernel on t values computes and keeps its statistics in
// (compute_t's, base/bfloat16.h): float32 for bfloat16, else t.
constexpr DType compute_dtype(DType t) { return t == DType::bf16 ? DType::f32 : t; }

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::b8; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::bf16; };

// Calls fn with a value of the C++ type of any dtype: fn(float{}), fn(double{}),
// fn(std::int64_t{}), fn(bool{}) or fn(bfloat16{}).
template <typename Fn>
void visit_dtype(DType t, Fn fn) {
  switch (t) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::i64: return fn(std::int64_t{});
    case DType::b8: return fn(bool{});
    case DType::bf16: return fn(bfloat16{});
  }
}

// Calls fn with a value of the C++ type of a floating dtype: fn(float{}) or
// fn(double{}); a kernel with no bfloat16 loop refuses bfloat16 by its name:
// "[softmax] has no bfloat16 kernel (float32 and float64 only)".
#define AG_DISPATCH_FLOAT(dtype, op, ...)                                         \
  [&] {                                                                           \
    switch (dtype) {                                                              \
      case ::attograd::DType::f32: { using scalar_t = float; return __VA_ARGS__(); }  \
      case ::attograd::DType::f64: { using scalar_t = double; return __VA_ARGS__(); } \
      default: ::attograd::fail_unsupported_dtype(op, dtype, "float32 and float64 only");  \
    }                                                                             \
  }()

// The same with bfloat16 too, for the kernels that have a bfloat16 loop
// (arithmetic in float32, one rounding to bfloat16 on the way out).
#define AG_DISPATCH_FLOAT_OR_BF16(dtype, op, ...)                                       \
  [&] {                                                                                 \
    switch (dtype) {                                                                    \
      case ::attograd::DType::f32: { using scalar_t = float; return __VA_ARGS__(); }        \
      case ::attograd::DType::f64: { using scalar_t = double; return __VA_ARGS__(); }       \
      case ::attograd::DType::bf16: { using scalar_t = ::attograd::bfloat16; return __VA_ARGS__(); } \
      default: ::attograd::fail_unsupported_dtype(op, dtype, "floating dtypes only");   \
    }                                                                                   \
  }()

[[noreturn]] inline void fail_unsupported_dtype(const char* op, DType dtype, const char* supported) {
  if (dtype == DType::bf16) fail(op, "has no bfloat16 kernel ({})", supported);
  fail(op, "expected a floating dtype, got {}", dtype_name(dtype));
}

}  // namespace attograd

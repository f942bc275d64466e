#pragma once
// Element types. float32 is the working type everywhere, float64 exists on the
// CPU for gradcheck and references; int64 holds token ids and targets; bool8
// holds masks (true = hidden).
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace attograd {

enum class DType : std::uint8_t { f32, f64, i64, b8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i64: return 8;
    case DType::b8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i64: return "int64";
    case DType::b8: return "bool";
  }
  return "?";
}

constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f64; }

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::b8; };

// Calls fn with a value of the C++ type of any dtype: fn(float{}), fn(double{}),
// fn(std::int64_t{}) or fn(bool{}).
template <typename Fn>
void visit_dtype(DType t, Fn fn) {
  switch (t) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::i64: return fn(std::int64_t{});
    case DType::b8: return fn(bool{});
  }
}

// Calls fn with a value of the C++ type of a floating dtype: fn(float{}) or fn(double{}).
#define AG_DISPATCH_FLOAT(dtype, op, ...)                                         \
  [&] {                                                                           \
    switch (dtype) {                                                              \
      case ::attograd::DType::f32: { using scalar_t = float; return __VA_ARGS__(); }  \
      case ::attograd::DType::f64: { using scalar_t = double; return __VA_ARGS__(); } \
      default: ::attograd::fail(op, "expected a floating dtype, got {}",           \
                                ::attograd::dtype_name(dtype));                    \
    }                                                                             \
  }()

}  // namespace attograd

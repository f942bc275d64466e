#pragma once
// Shapes and strides: sizes and strides are in elements, row-major, last
// dimension fastest (NumPy's conventions).
#include <cstdint>
#include <string>
#include <vector>

namespace attograd {

using Shape = std::vector<std::int64_t>;

std::int64_t numel_of(const Shape& sizes);
Shape contiguous_strides(const Shape& sizes);
std::string shape_str(const Shape& sizes);  // "[2,3]"

// Maps a possibly negative dim into [0, ndim); throws "[op] dim d out of range for a k-d tensor".
int normalize_dim(const char* op, std::int64_t dim, std::int64_t ndim);

// NumPy broadcasting of two shapes; throws "[op] shapes [..] and [..] cannot be broadcast".
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

// Whether `from` broadcasts to exactly `to` (NumPy rules, `to` unchanged).
bool broadcasts_to(const Shape& from, const Shape& to);

// Strides that read a tensor of (sizes, strides) as if it had shape `target`
// (which it broadcasts to): broadcast dims get stride 0.
std::vector<std::int64_t> broadcast_strides(const Shape& sizes, const std::vector<std::int64_t>& strides,
                                            const Shape& target);

}  // namespace attograd

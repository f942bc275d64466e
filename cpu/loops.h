#pragma once
// The CPU's one strided-iteration engine. Every elementwise kernel is an inner
// loop over `n` elements with per-operand strides; this header walks the outer
// dimensions, after merging dims that are contiguous with each other and
// dropping size-1 dims, so a contiguous tensor of any rank is one inner loop.
#include <array>
#include <cstdint>
#include <vector>

#include "cpu/parallel.h"
#include "tensor/shape.h"
#include "tensor/tensor.h"

namespace attograd::cpu {

template <int N>
struct Operands {
  std::array<char*, N> base;
  std::array<std::vector<std::int64_t>, N> strides;  // in bytes, one per dim of the loop shape
};

// Operand i viewed over loop shape `shape` (broadcasting it there).
template <int N>
void set_operand(Operands<N>& ops, int i, const Tensor& t, const Shape& shape) {
  ops.base[i] = static_cast<char*>(t.raw_data());
  auto strides = broadcast_strides(t.sizes(), t.strides(), shape);
  for (auto& s : strides) s *= static_cast<std::int64_t>(dtype_size(t.dtype()));
  ops.strides[i] = std::move(strides);
}

// inner(ptrs, strides, n): process n elements; ptrs[i] advances by strides[i] bytes.
// Outer iterations are split across threads when the work is large enough and
// no operand is written with stride 0 (a reduction target), which would race.
template <int N, typename Inner>
void strided_loop(Shape shape, Operands<N> ops, Inner inner, bool parallel_ok = true) {
  // Drop size-1 dims, then merge dim d into d+1 when every operand steps through them as one.
  Shape sizes;
  std::array<std::vector<std::int64_t>, N> strides;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (shape[d] == 0) return;
    sizes.push_back(shape[d]);
    for (int i = 0; i < N; ++i) strides[i].push_back(ops.strides[i][d]);
  }
  for (std::size_t d = sizes.size(); d-- > 1;) {
    bool mergeable = true;
    for (int i = 0; i < N; ++i) mergeable &= strides[i][d - 1] == strides[i][d] * sizes[d];
    if (!mergeable) continue;
    sizes[d - 1] *= sizes[d];
    for (int i = 0; i < N; ++i) {
      strides[i][d - 1] = strides[i][d];
      strides[i].erase(strides[i].begin() + d);
    }
    sizes.erase(sizes.begin() + d);
  }
  if (sizes.empty()) {  // a single element
    std::array<std::int64_t, N> zero{};
    inner(ops.base, zero, 1);
    return;
  }
  const std::size_t nd = sizes.size();
  const std::int64_t n_inner = sizes[nd - 1];
  std::array<std::int64_t, N> inner_strides;
  for (int i = 0; i < N; ++i) inner_strides[i] = strides[i][nd - 1];
  std::int64_t n_outer = 1;
  for (std::size_t d = 0; d + 1 < nd; ++d) n_outer *= sizes[d];

  auto run = [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t o = begin; o < end; ++o) {
      std::array<char*, N> ptrs = ops.base;
      std::int64_t rest = o;
      for (std::size_t d = nd - 1; d-- > 0;) {
        const std::int64_t idx = rest % sizes[d];
        rest /= sizes[d];
        for (int i = 0; i < N; ++i) ptrs[i] += idx * strides[i][d];
      }
      inner(ptrs, inner_strides, n_inner);
    }
  };
  if (parallel_ok && n_outer > 1 && n_outer * n_inner >= kParallelGrain)
    parallel_for(0, n_outer, std::max<std::int64_t>(1, kParallelGrain / n_inner), run);
  else if (parallel_ok && n_outer == 1 && n_inner >= 4 * kParallelGrain) {
    // One long contiguous run: split the inner loop itself.
    parallel_for(0, n_inner, kParallelGrain, [&](std::int64_t begin, std::int64_t end) {
      std::array<char*, N> ptrs = ops.base;
      for (int i = 0; i < N; ++i) ptrs[i] += begin * inner_strides[i];
      inner(ptrs, inner_strides, end - begin);
    });
  } else {
    run(0, n_outer);
  }
}

}  // namespace attograd::cpu

#pragma once
// The problem as the CPU kernels read it: base/attention_problem.h's, with the
// tile geometry of tiling.h on top (which keys of a tile a query sees, the
// first query block that sees a key tile) and dropout factors drawn a row at
// a time. Part of the one translation unit cpu/attention/attention.cpp.
#include <algorithm>
#include <cstdint>

#include "base/attention_problem.h"
#include "cpu/attention/tiling.h"
#include "cpu/philox_block.h"
#include "cpu/vec_math.h"

namespace attograd::cpu::attention_detail {

// A (B, H, T, D) operand read, and one written, through its strides; the last dim is contiguous.
template <typename T>
using Rows = AttentionRows<const T>;
template <typename T>
using OutRows = AttentionRows<T>;

template <typename T>
using Problem = AttentionProblem<T>;

// Key c of a tile at (i0, j0) is visible to its query r only when c <= r + diagonal(P, i0, j0).
template <typename T>
AG_ALWAYS_INLINE std::int64_t diagonal(const Problem<T>& P, std::int64_t i0, std::int64_t j0) {
  return P.causal ? i0 - j0 : kNoDiagonal;
}

// The first query of the first query block that can see keys from j0 on:
// causally, blocks wholly before j0 see none of them.
template <typename T>
AG_ALWAYS_INLINE std::int64_t first_query_tile(const Problem<T>& P, std::int64_t j0) {
  return P.causal ? j0 / kBlockQ * kBlockQ : 0;
}

// z[j] = dropout factor of weight (b, h, i, j0 + j), j < n: P.dropout_factor's,
// drawn many counters at a time (cpu/philox_block.h).
template <typename T>
AG_ALWAYS_INLINE void dropout_factors(const Problem<T>& P, std::int64_t b, std::int64_t h, std::int64_t i,
                                      std::int64_t j0, std::int64_t n, T* z) {
  philox_dropout_factors(P.seed, P.offset, P.weight_index(b, h, i, j0), n, P.dropout_threshold, P.keep_scale, z);
}

}  // namespace attograd::cpu::attention_detail

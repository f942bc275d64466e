#pragma once
// The bfloat16 attention's problem: bfloat16 operand rows, with masking,
// dropout and the scale as float32's problem has them (the float32 kernel's
// masking, dropout and online softmax run on its float32 score tiles), and
// the tile geometry both passes share. Part of the translation unit
// cpu/attention/attention_bf16.cpp.
#include <cstdint>
#include <limits>

#include "base/attention_problem.h"
#include "base/bfloat16.h"
#include "cpu/attention/bf16_tiles.h"
#include "cpu/attention/problem.h"

namespace attograd::cpu::attention_bf16 {

struct Bf16Problem {
  AttentionRows<const bfloat16> q, k, v;  // (B, H, T, D), rows contiguous
  attention_detail::Problem<float> meta;  // sizes, scale, causal, mask, dropout; its rows unused (null)
  // D padded to whole AMX steps (and so whole 32-column blocks), T to whole
  // blocks: the last tile is worked on that far only (tile_extent, below).
  std::int64_t dp() const { return round_up(meta.D, kKStep); }
  std::int64_t tqp() const { return round_up(meta.Tq, kBlock); }
  std::int64_t tkp() const { return round_up(meta.Tk, kBlock); }
};

// Key c of a tile at (i0, j0) is visible to its query r only when c <= r + diagonal.
inline std::int64_t diagonal(const Bf16Problem& P, std::int64_t i0, std::int64_t j0) {
  return attention_detail::diagonal(P.meta, i0, j0);
}

// Whether the 32 x 32 block (keys from kb, queries from qb) of a tile with
// that diagonal is wholly hidden causally: its first key is past its last query.
inline bool block_hidden(std::int64_t kb, std::int64_t qb, std::int64_t diag) {
  return kb > qb + kBlock - 1 + diag;
}

// How far a tile holding n keys (or n queries) is worked on: to whole 32 x 32
// blocks, not to the tile's 64. The products, the float32 softmax and the
// roundings all stop there, so a short sequence (the default task's 16) does
// not pay for a whole tile's exponentials, 16 times its own.
inline std::int64_t tile_extent(std::int64_t n) { return round_up(n, kBlock); }

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace attograd::cpu::attention_bf16

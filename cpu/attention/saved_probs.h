#pragma once
// The probability tiles a forward keeps for its backward, within a budget.
// Part of the one translation unit cpu/attention/attention.cpp.
#include <algorithm>
#include <cstdint>

#include "cpu/attention/tiling.h"

namespace attograd::cpu::attention_detail {

// Within a budget (AttentionKernelOptions::probs_budget) the forward keeps
// the probability tiles of as many whole heads as fit (the first ones,
// b * H + h) for the backward, which recomputes the others'. A kept tile it
// multiplies by one factor per query instead of recomputing S = q k^T and its
// exponentials: four tile products instead of five. A tile is kept
// as the forward has it, keys for rows, exp(s - m) against the running max m
// of its moment, with that m beside it; P = exp(s - m) exp(m - lse).
//
// The tiles of one head are stored in the backward's order, key tile by key
// tile and within one by query block, so that it reads them front to back.
// Each tile's maxima follow it, so the tiles do not lie exactly 16 KiB apart,
// all at one offset within a 4 KiB page, where they would share cache sets.
template <typename T>
struct SavedProbs {
  T* data = nullptr;  // kSlotValues per tile: (kBlockK, kBlockQ) exp(s - m), zero where hidden, before
                      // dropout, then the m of each of its kBlockQ queries
  std::int64_t query_blocks = 0, key_tiles = 0, per_head = 0;
  std::int64_t heads = 0;  // heads 0 .. heads - 1 (b * H + h) keep their tiles; the others recompute them
  bool causal = false;

  static constexpr std::int64_t kTileValues = kBlockK * kBlockQ, kSlotValues = kTileValues + kBlockQ;
  SavedProbs() = default;
  SavedProbs(std::int64_t Tq, std::int64_t Tk, bool is_causal)
      : query_blocks((Tq + kBlockQ - 1) / kBlockQ), key_tiles((Tk + kBlockK - 1) / kBlockK), causal(is_causal) {
    per_head = before(key_tiles);
  }
  // Values kept for B * H heads.
  std::int64_t values(std::int64_t heads) const { return heads * per_head * kSlotValues; }
  // Tiles of a head's key tiles before kb. Causally, key tile kb is seen by
  // query blocks kb and later only (kBlockQ == kBlockK).
  std::int64_t before(std::int64_t kb) const {
    if (!causal) return kb * query_blocks;
    const std::int64_t n = std::min(kb, query_blocks);
    return n * query_blocks - n * (n - 1) / 2;
  }
  std::int64_t index(std::int64_t bh, std::int64_t qb, std::int64_t kb) const {
    return bh * per_head + before(kb) + (causal ? qb - kb : qb);
  }
  bool kept(std::int64_t bh) const { return data != nullptr && bh < heads; }
  T* tile(std::int64_t bh, std::int64_t qb, std::int64_t kb) const { return data + index(bh, qb, kb) * kSlotValues; }
  T* tile_max(std::int64_t bh, std::int64_t qb, std::int64_t kb) const { return tile(bh, qb, kb) + kTileValues; }
};
static_assert(kBlockQ == kBlockK, "SavedProbs::before counts causal tiles for square tiles");

}  // namespace attograd::cpu::attention_detail

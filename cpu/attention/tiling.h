#pragma once
// The fused attention's tiles: how many queries and keys one holds, and the
// cache-line-aligned scratch buffers threads keep them in (cpu/scratch.h). Part of the one
// translation unit cpu/attention/attention.cpp (see there).
#include <cstdint>

#include "cpu/scratch.h"

namespace attograd::cpu::attention_detail {

constexpr std::int64_t kBlockQ = 64;  // queries per tile; a multiple of every vector width and micro-tile height
constexpr std::int64_t kBlockK = 64;  // keys per tile; a multiple of every micro-tile height
// A diagonal offset no index reaches: "no causal limit" in the tile loops below.
constexpr std::int64_t kNoDiagonal = std::int64_t(1) << 40;

constexpr std::int64_t round_up(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

using cpu::Scratch;  // cpu/scratch.h: cache-line-aligned

}  // namespace attograd::cpu::attention_detail

#pragma once
// What the pipelined products share (cuda/matmul_bf16_pipelined.cu, bfloat16;
// cuda/matmul_tf32_pipelined.cu, float32 in 3xTF32): each thread's cp.async
// copies of an operand's tiles into their swizzled stages, the lanes' ldmatrix
// offsets in a tile, and the order in which blocks take C's tiles. Value is
// the operand's element as copied: std::uint16_t (bfloat16 bits) or float.
#include <cstdint>

#include "cuda/async_copy.cuh"
#include "cuda/gemm_tiles.h"

namespace attograd::cuda::gemm_pipeline {

using gemm_tiles::byte_offset;

// An operand's tile of the pipelined products: 64 bytes of K a row.
template <int Rows, bool KFastest, typename Value>
using PipelineTile = gemm_tiles::OperandTile<Rows, KFastest, 64 / static_cast<int>(sizeof(Value)),
                                             static_cast<int>(sizeof(Value))>;

// One operand's copies into a stage for this thread: each a source that moves
// by `step` values a tile and a destination in the operand's tile, copy i
// lying i times a constant after copy 0's (Threads chunks in OperandTile's
// layouts; TileType another layout, as the sm_90a product's WgmmaTile). A copy of a row outside the matrix
// (the tile's edge) reads nothing and stores zeros: which copies those are is
// the same for every tile, so it is worked out once. The products admit only
// operands whose chunks lie wholly inside or wholly outside.
template <int Rows, bool KFastest, int Threads, typename Value, typename TileType = PipelineTile<Rows, KFastest, Value>>
struct OperandCopies {
  using Tile = TileType;
  static constexpr int kK = KFastest ? Tile::kLineChunks * Tile::kChunkValues : Tile::kLines;  // K of a tile
  static constexpr int kCopies = Tile::kChunks / Threads;
  // Copy i + 1 is Threads / kLineChunks lines after copy i, the same chunk.
  static constexpr int kApartBytes =
      (Tile::Layout::at(Threads / Tile::kLineChunks, 0) - Tile::Layout::at(0, 0)) * 16;
  static_assert(Tile::kChunks % Threads == 0, "every thread copies as many chunks");
  static_assert(Tile::template kCopiesEvenlyApart<Threads>, "copy i lies i * kApartBytes after copy 0");
  const Value* data;  // what a copy reading nothing names
  const Value* source[kCopies];
  bool inside[kCopies];
  int destination;  // copy 0's, in bytes from the tile's first
  std::int64_t step;

  // Set for the tile at k = k_first + kK (the second), whose k all lie inside
  // the matrix; `first` issues the tile at k_first, below which k is outside.
  __device__ __forceinline__ OperandCopies(const Value* matrix, std::int64_t ld, std::int64_t rows, std::int64_t r0,
                                           std::int64_t k_first)
      : data(matrix), step(KFastest ? kK : kK * ld) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const auto [line, chunk] = Tile::copy(static_cast<int>(threadIdx.x) + i * Threads);
      if (i == 0) destination = Tile::Layout::at(line, chunk) * 16;
      // An outside copy's source is row r0's (inside), not one past the matrix's end.
      const std::int64_t r = KFastest ? r0 + line : r0 + chunk * Tile::kChunkValues;
      inside[i] = r < rows;
      const std::int64_t row = inside[i] ? r : r0;
      const std::int64_t k = KFastest ? k_first + kK + chunk * Tile::kChunkValues : k_first + kK + line;
      source[i] = matrix + (KFastest ? row * ld + k : k * ld + row);
    }
  }

  // The tile at k_first into `tile`: the copies of k below k_begin (the job's
  // first: 0, or its slice's) read nothing.
  __device__ __forceinline__ void first(Value* tile, std::int64_t k_first, std::int64_t k_begin) const {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const auto [line, chunk] = Tile::copy(static_cast<int>(threadIdx.x) + i * Threads);
      const bool k_inside = (KFastest ? k_first + chunk * Tile::kChunkValues : k_first + line) >= k_begin;
      copy_async16(byte_offset(tile, destination + i * kApartBytes), k_inside ? source[i] - step : data,
                   inside[i] && k_inside);
    }
  }

  // The next tile into `tile`.
  __device__ __forceinline__ void next(Value* tile) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      copy_async16(byte_offset(tile, destination + i * kApartBytes), source[i], inside[i]);
      source[i] += step;
    }
  }
};

// A job's first Stages - 1 tiles of A and B in flight, a cp.async group each
// (empty past the last tile): the tile at k_first (its k below k_begin read as
// zeros) into stage 0, the next ones after it; stage_a(s) and stage_b(s) are
// where stage s keeps them.
template <int Stages, typename ACopies, typename BCopies, typename StageA, typename StageB>
__device__ __forceinline__ void start_pipeline(ACopies& a, BCopies& b, StageA stage_a, StageB stage_b, int tiles,
                                               std::int64_t k_first, std::int64_t k_begin) {
  if (tiles > 0) {
    a.first(stage_a(0), k_first, k_begin);
    b.first(stage_b(0), k_first, k_begin);
  }
  commit_async_copies();
#pragma unroll
  for (int s = 1; s < Stages - 1; ++s) {
    if (s < tiles) {
      a.next(stage_a(s));
      b.next(stage_b(s));
    }
    commit_async_copies();
  }
}

// This lane's ldmatrix addresses in an operand's tile (bytes from its first)
// for the warp's Blocks 16-row blocks at each of the two mma steps of a tile:
// per lane one for each step (k fastest) or block (otherwise), the rest a
// constant from them (OperandTile::kLineStride), which the loads take as
// immediate offsets.
template <int Rows, bool KFastest, int Blocks, typename Value>
struct FragmentOffsets {
  using Tile = PipelineTile<Rows, KFastest, Value>;
  static constexpr int kApartBytes = Tile::kLineStride * 16;
  int base[KFastest ? 2 : Blocks];
  __device__ __forceinline__ FragmentOffsets(int warp_row0, int lane, bool b_pair) {
#pragma unroll
    for (int i = 0; i < (KFastest ? 2 : Blocks); ++i)
      base[i] = Tile::fragment_chunk(warp_row0 + (KFastest ? 0 : 16 * i), KFastest ? i : 0, lane, b_pair) * 16;
  }
  __device__ __forceinline__ int at(int step, int block) const {
    return KFastest ? base[step] + block * kApartBytes : base[block] + step * kApartBytes;
  }
};

// The block's tile of C: tiles_m x tiles_n of them in groups of kRasterGroup
// rows, each group walked down its rows first, so that the blocks in flight
// share the tiles of A and B they read from L2.
constexpr int kRasterGroup = 8;
struct TileAt {
  std::int64_t m0, n0;
};
// Tile `tile` in that order (a persistent kernel's work items).
template <int BM, int BN>
__device__ __forceinline__ TileAt raster_tile_at(std::int64_t m, std::int64_t n, std::int64_t tile) {
  const std::int64_t tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
  const std::int64_t per_group = kRasterGroup * tiles_n;
  const std::int64_t first_m = tile / per_group * kRasterGroup;
  const std::int64_t group_m = tiles_m - first_m < kRasterGroup ? tiles_m - first_m : kRasterGroup;
  const std::int64_t in_group = tile % per_group;
  return {(first_m + in_group % group_m) * BM, in_group / group_m * BN};
}
template <int BM, int BN>
__device__ __forceinline__ TileAt raster_tile(std::int64_t m, std::int64_t n) {
  return raster_tile_at<BM, BN>(m, n, blockIdx.x);
}

}  // namespace attograd::cuda::gemm_pipeline

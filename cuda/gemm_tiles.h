#pragma once
// Where the pipelined bfloat16 product (cuda/matmul_bf16_pipelined.cu) keeps
// its tiles in shared memory, and which 16-byte chunk each thread copies in
// and each lane points ldmatrix at. Plain host-and-device functions of the
// thread and lane, so that tests/test_gemm_tiles.cpp counts the bank
// conflicts of every access the kernel makes, on the host.
#include <type_traits>

#include "base/host_device.h"

namespace attograd::cuda::gemm_tiles {

// p moved by `bytes`: the tiles' offsets are kept in bytes, so that an address
// is one add to a tile's base, where offsets in values took a shift as well.
template <typename T>
AG_HOST_DEVICE inline T* byte_offset(T* p, int bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + bytes);
}

constexpr int kBK = 32;        // K of a tile: two mma steps of 16
constexpr int kChunk = 8;      // bfloat16 values in 16 bytes: one cp.async, one ldmatrix row
constexpr int kWarpTile = 64;  // a warp's 64 x 64 of C: 4 A fragments against 8 B fragments

// A tile of lines of LineChunks chunks, unpadded, chunk c of line l stored at
// l * LineChunks + (c ^ s(l)). s permutes the chunks within each 128-byte
// stretch (eight chunks: all 32 banks), so the eight lines an ldmatrix or a
// phase of eight copies reads at one logical chunk land on eight different
// stretches' worth of banks, where unswizzled they would share four banks
// (lines of 64 bytes: four ways; of 256 or 512: eight).
template <int LineChunks>
struct Swizzle {
  static_assert(LineChunks == 2 || LineChunks == 4 || LineChunks % 8 == 0, "a line is 32 or 64 bytes, or a multiple of 128");
  AG_HOST_DEVICE static constexpr int at(int line, int c) {
    const int s = LineChunks >= 8 ? line & 7 : (line / (8 / LineChunks)) & (LineChunks - 1);
    return line * LineChunks + (c ^ s);
  }
};

// An operand's tile seen as Rows x K, element (r, kk) being X(r0 + r, k0 +
// kk) with X = A (rows m) or B^T (rows n), stored as the operand lies in
// memory: with k fastest, a line is a row of K values (A row-major, B
// transposed); otherwise a line is one k of Rows values (A transposed, B
// row-major). A chunk is eight consecutive values of the line. (The
// attention's tiles are these too, K being the head size or a tile of keys.)
template <int Rows, bool KFastest, int K = kBK>
struct OperandTile {
  static constexpr int kLines = KFastest ? Rows : K;
  static constexpr int kLineChunks = (KFastest ? K : Rows) / kChunk;
  static constexpr int kChunks = kLines * kLineChunks;
  static_assert(Rows % 16 == 0 && K % 16 == 0, "whole 16 x 16 blocks");
  static constexpr int kValues = kChunks * kChunk;
  using Layout = Swizzle<kLineChunks>;

  // Copy v (thread + i * threads) is line v / kLineChunks, chunk v % kLineChunks:
  // consecutive threads read consecutive 16 bytes of global memory.
  struct Copy {
    int line, chunk;
  };
  AG_HOST_DEVICE static constexpr Copy copy(int v) { return {v / kLineChunks, v % kLineChunks}; }
  // A thread's copies lie Threads chunks apart in the swizzled tile too where
  // Threads chunks are a multiple of 8 lines, the swizzle's period.
  template <int Threads>
  static constexpr bool kCopiesEvenlyApart = Threads % kLineChunks == 0 && (Threads / kLineChunks) % 8 == 0;

  // The chunk (its swizzled index) whose first value lane `lane` gives ldmatrix
  // for the 16 x 16 block of X rows [row0, row0 + 16) and k [16 step, 16 step + 16).
  // Matrix q = lane / 8 is the block's quarter of rows 8 q_rows, k 8 q_k: for
  // an A fragment q_rows = q % 2, q_k = q / 2; for two B fragments (rows n and
  // n + 8 of B^T) q_rows = q / 2, q_k = q % 2 (cuda/mma_bf16.cuh's layouts).
  // With k fastest lane % 8 is the quarter's row, read plain; otherwise its k,
  // read transposed.
  // The swizzle repeats every 8 lines, so that of the warp's
  // blocks and steps, those along the lines are a constant apart: 16 rows with k
  // fastest, one step otherwise. The kernel works out only the others per lane.
  static constexpr int kLineStride = 16 * kLineChunks;  // chunks between blocks (k fastest) or steps
  AG_HOST_DEVICE static constexpr int fragment_chunk(int row0, int step, int lane, bool b_pair) {
    const int q = lane / 8, q_rows = b_pair ? q / 2 : q % 2, q_k = b_pair ? q % 2 : q / 2;
    const int row = row0 + 8 * q_rows, k = 16 * step + 8 * q_k;
    if (KFastest) return Layout::at(row + lane % 8, k / kChunk);
    return Layout::at(k + lane % 8, row / kChunk);
  }
};

// The pipelined kernel's shape: BM x BN of C a block, 8 warps of 64 x 64,
// kStages tiles of A and B in flight; C goes out through the same shared
// memory, rows of BN values.
template <int BM, int BN>
struct PipelineShape {
  static constexpr int kStages = 4;
  static constexpr int kWarpsN = BN / kWarpTile, kWarps = (BM / kWarpTile) * kWarpsN, kThreads = 32 * kWarps;
  static constexpr int kStageValues = (BM + BN) * kBK;
  static constexpr int kSharedBytes = kStages * kStageValues * 2;
  using CLayout = Swizzle<BN / kChunk>;
  static_assert(BM * BN <= kStages * kStageValues, "C's tile fits where the stages were");
};

}  // namespace attograd::cuda::gemm_tiles

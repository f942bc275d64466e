#pragma once
// How the float32 attention kernels in FlashAttention-2's shape (3xTF32:
// cuda/attention_tf32_flash.cu, attention_tf32_flash_backward.cu) read their
// fragments from tiles of float32 rows (gemm_tiles::OperandTile with 4-byte
// values: a line a row, XOR-swizzled), and split them into TF32 parts.
// - Where a product sums along the rows' head size, ldmatrix reads A and B
//   fragments as pairs of 16-bit halves (the float32 pipelined product's
//   reads: mma step s of a line takes its chunks s and s + 2).
// - Where it sums across rows (P V, dS K, ...), the A operand is an mma's
//   accumulators with its k renumbered (attention_tensor_core.cu): A's k t is
//   row 2t of a block of 8 and k t + 4 is row 2t + 1, so a B fragment is
//   X[2t][g] and X[2t + 1][g], two 4-byte reads (RowPairReads), which the
//   swizzle puts on 32 different banks.
#include <cstdint>

#include "cuda/attention_flash.cuh"
#include "cuda/mma.cuh"

namespace attograd::cuda::attention_detail::tf32_reads {

// A lane's ldmatrix offsets along a line of D float32 values, one for each mma
// step of 8 (LaneAddresses: a line of D float32 values is a line of 2D
// bfloat16 ones), and the chunk a step starts at (its k chunks are s and s + 2
// of each four: gemm_tiles::OperandTile::fragment_chunk).
template <int D>
using StepAddresses = flash::LaneAddresses<2 * D>;
__host__ __device__ constexpr int step_chunk(int ks) { return 4 * (ks / 2) + ks % 2; }

// N float32 values of a fragment (as ldmatrix gives their bits) split into TF32 parts.
template <int N>
__device__ __forceinline__ SplitFragment<N> split_bits(const std::uint32_t* bits) {
  float x[N];
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = bits_float(bits[i]);
  return split_tf32(x);
}

// An accumulator block (16 x 8) as an A fragment whose k t is its column 2t and k t + 4 its 2t + 1, split.
__device__ __forceinline__ SplitFragment<4> renumbered_fragment(const float (&c)[4]) {
  const float a[4] = {c[0], c[2], c[1], c[3]};
  return split_tf32(a);
}

// A lane's offsets into a tile of rows of D float32 values for B fragments
// read across the rows (gemm_tiles::RowPairs): runs of four blocks of D
// repeat 128 bytes on, so four offsets are held.
template <int D>
struct RowPairReads {
  using Pairs = gemm_tiles::RowPairs<D / 4>;
  static constexpr int kLineBytes = Pairs::kLineBytes, kHeld = D / 8 < 4 ? D / 8 : 4;
  int at[kHeld], next;
  __device__ __forceinline__ explicit RowPairReads(int lane) {
#pragma unroll
    for (int j = 0; j < kHeld; ++j) at[j] = Pairs::first(lane, j);
    next = Pairs::next(lane);
  }
  // B fragment (rows of block kb, columns of block nd) of the tile, split.
  __device__ __forceinline__ SplitFragment<2> fragment(const std::uint16_t* tile, int kb, int nd) const {
    const int offset = kb * 8 * kLineBytes + nd / 4 * 128 + at[nd % 4];
    const float b[2] = {*reinterpret_cast<const float*>(gemm_tiles::byte_offset(tile, offset)),
                        *reinterpret_cast<const float*>(gemm_tiles::byte_offset(tile, offset + next))};
    return split_tf32(b);
  }
};

// Every row of x starts 16 bytes aligned: the kernels copy 16 bytes at a time.
template <typename T>
bool rows_aligned(const ::attograd::AttentionRows<T>& x) {
  return reinterpret_cast<std::uintptr_t>(x.data) % 16 == 0 && x.sb % 4 == 0 && x.sh % 4 == 0 && x.st % 4 == 0;
}

}  // namespace attograd::cuda::attention_detail::tf32_reads

// The float32 attention backward on the tensor cores in FlashAttention-2's
// shape at head sizes 32 and 64 (rows 16-byte aligned), every product in
// 3xTF32 (cuda/mma.cuh): attention_backward_tensor_core sends those problems
// here once delta is made, and the rest to its two general kernels
// (cuda/attention_tensor_core.cu), whose conventions (attention_common.cuh's
// formulas) this one keeps. A kernel for each of causal, masked and dropout.
//
// The block's work, the query tiles' stream and the ordered sum of dQ are
// cuda/attention_flash_backward.cuh's, the bfloat16 backward's; here is how a
// warp reads and multiplies float32 fragments (cuda/attention_tf32_reads.cuh),
// each split into TF32 parts by the warp that reads it:
//   S^T = K Q^T, dP^T = V dO^T: K's and V's A fragments and Q's and dO's B
//     fragments by ldmatrix, K and V read from their tiles for each query tile;
//   dV += (P Z)^T dO, dK += dS^T Q: P^T and dS^T as they stand, their queries
//     renumbered, dO's and Q's B fragments by 4-byte reads;
//   dS^T stored a value at a time as dS (a line a query, 64 keys), whose A
//     fragments for dQ = dS K are 8-byte reads of a key pair (PairSwizzle:
//     no bank conflict), K's B fragments 4-byte reads.
#include <cstdint>

#include "cuda/attention_flash_backward.cuh"
#include "cuda/attention_tf32_reads.cuh"
#include "cuda/mma_bf16.cuh"  // load_matrices

namespace attograd::cuda::attention_detail {
namespace flash_tf32_backward {

using namespace flash_backward;
using namespace tf32_reads;
using gemm_tiles::DsTile;
using gemm_tiles::OperandTile;

// The tiles at head size D: a line a key or query, D float32 values (and dS's,
// gemm_tiles::DsTile).
template <int D>
struct Tiles {
  using KRows = OperandTile<kBlockKeys, true, D, 4>;  // A of K Q^T and V dO^T, B of dS K
  using QRows = OperandTile<kQueries, true, D, 4>;    // B^T of K Q^T and V dO^T, B of dS^T Q and (P Z)^T dO
  using Bytes = TileBytes<KRows, QRows, 4 * kQueries * kBlockKeys>;
};

// A warp's 16 keys and values as A fragments of K Q^T and V dO^T, read from
// their tiles and split for each step of each query tile.
template <int D>
struct WarpKeys {
  const std::uint16_t *k_tile, *v_tile;
  StepAddresses<D> at;
  __device__ __forceinline__ WarpKeys(const std::uint16_t* k, const std::uint16_t* v, int warp, int lane)
      : k_tile(k), v_tile(v), at([&](int ks) {
          return Tiles<D>::KRows::fragment_chunk(kWarpKeys * warp, step_chunk(ks), lane, false) * 16;
        }) {}
  __device__ __forceinline__ void step(SplitFragment<4>& kf, SplitFragment<4>& vf, int ks) const {
    std::uint32_t raw[4];
    load_matrices<false>(raw, byte_offset(k_tile, at[ks]));
    kf = split_bits<4>(raw);
    load_matrices<false>(raw, byte_offset(v_tile, at[ks]));
    vf = split_bits<4>(raw);
  }
};

// This lane's offsets: Q's and dO's B fragments by ldmatrix (per step of 8
// along D), the tiles' rows across (RowPairReads), and dS (gemm_tiles::DsTile):
// its stores of the lane's accumulator values r = 0..3, and its 8-byte reads
// for the warp's 16 queries of dQ.
template <int D>
struct Reads {
  StepAddresses<D> q_plain;
  RowPairReads<D> rows;
  int ds_store[4], ds_read[4];
  __device__ __forceinline__ Reads(int warp, int lane)
      : q_plain([&](int ks) { return Tiles<D>::QRows::fragment_chunk(0, step_chunk(ks), lane, true) * 16; }), rows(lane) {
#pragma unroll
    for (int r = 0; r < 4; ++r) ds_store[r] = DsTile::store_at(warp, lane, r);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) ds_read[kb] = DsTile::read_at(warp, lane, kb);
  }
};

// The float32 operands' part of backward_sweep (cuda/attention_flash_backward.cuh).
struct Tf32Kind : KindTypes<Tiles, WarpKeys, Reads> {
  using Value = float;
  template <int D>
  static constexpr int kPartQueries = kQueries;

  // S^T = K Q^T and dP^T = V dO^T for queries part * kPart on.
  template <int D, int Blocks>
  __device__ __forceinline__ static void key_scores(float (&s)[Blocks][4], float (&dp)[Blocks][4], const Work<D>& w,
                                                    int part) {
    constexpr int kPart = 8 * Blocks;
#pragma unroll
    for (int ks = 0; ks < D / 8; ++ks) {
      SplitFragment<4> kf, vf;
      w.keys.step(kf, vf, ks);
#pragma unroll
      for (int f = 0; f < kPart / 16; ++f) {
        std::uint32_t qf[4], of[4];
        const int at = w.reads.q_plain[ks] + (part * kPart / 16 + f) * Tiles<D>::QRows::kLineStride * 16;
        load_matrices<false>(qf, byte_offset(w.q_buf, at));
        load_matrices<false>(of, byte_offset(w.o_buf, at));
        mma_3xtf32(s[2 * f], kf, split_bits<2>(qf)), mma_3xtf32(s[2 * f + 1], kf, split_bits<2>(qf + 2));
        mma_3xtf32(dp[2 * f], vf, split_bits<2>(of)), mma_3xtf32(dp[2 * f + 1], vf, split_bits<2>(of + 2));
      }
    }
  }

  // dV += (P Z)^T dO and dK += dS^T Q; dS^T into shared memory as dS.
  template <int D, int Blocks>
  __device__ __forceinline__ static void add_key_grads(float (&dk)[D / 8][4], float (&dv)[D / 8][4],
                                                       const float (&s)[Blocks][4], const float (&dp)[Blocks][4],
                                                       const Work<D>& w, int part) {
#pragma unroll
    for (int n = 0; n < Blocks; ++n) {
      const int qb = part * Blocks + n;  // of the tile's 8 blocks of 8 queries
#pragma unroll
      for (int r = 0; r < 4; ++r)
        *reinterpret_cast<float*>(byte_offset(w.ds_tile, w.reads.ds_store[r] + 8 * qb * DsTile::kLineBytes)) = dp[n][r];
      const SplitFragment<4> pa = renumbered_fragment(s[n]), da = renumbered_fragment(dp[n]);
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        mma_3xtf32(dv[nd], pa, w.reads.rows.fragment(w.o_buf, qb, nd));
        mma_3xtf32(dk[nd], da, w.reads.rows.fragment(w.q_buf, qb, nd));
      }
    }
  }

  // dQ = dS K for the warp's 16 queries of the tile.
  template <int D>
  __device__ __forceinline__ static void tile_dq(float (&dq)[D / 8][4], const std::uint16_t* ds_tile,
                                                 const std::uint16_t* k_tile, const Reads<D>& reads) {
#pragma unroll
    for (int kb = 0; kb < kBlockKeys / 8; ++kb) {
      const int at = reads.ds_read[kb % 4] + kb / 4 * 128;
      const float2 top = *reinterpret_cast<const float2*>(byte_offset(ds_tile, at));
      const float2 bottom = *reinterpret_cast<const float2*>(byte_offset(ds_tile, at + 8 * DsTile::kLineBytes));
      const float af[4] = {top.x, bottom.x, top.y, bottom.y};  // keys 2t and 2t + 1 as A's k t and t + 4
      const SplitFragment<4> a = split_tf32(af);
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) mma_3xtf32(dq[nd], a, reads.rows.fragment(k_tile, kb, nd));
    }
  }

  __device__ __forceinline__ static void store_pair(float* at, float x0, float x1) {
    *reinterpret_cast<float2*>(at) = make_float2(x0, x1);
  }
};

// The operands, as backward_sweep reads them (the problem's own p.q, p.k and p.v).
struct Operands {
  AttentionRows q, k, v;
};

template <int D, bool Causal, bool HasMask, bool Dropout>
__global__ void __launch_bounds__(kThreads, 2)
    attention_backward_tf32_flash_kernel(AttentionProblem p, Operands x, Gradients<float> grad) {
  backward_sweep<Tf32Kind, D, Causal, HasMask, Dropout>(p, x, grad);
}

}  // namespace flash_tf32_backward

namespace {

struct BackwardKernels {
  using Kernel = void (*)(AttentionProblem, flash_tf32_backward::Operands, flash_backward::Gradients<float>);
  template <int D, bool Causal, bool HasMask, bool Dropout>
  static Kernel kernel() {
    return flash_tf32_backward::attention_backward_tf32_flash_kernel<D, Causal, HasMask, Dropout>;
  }
};

}  // namespace

bool attention_backward_tf32_flash(const AttentionProblem& p, AttentionRows dout, const float* lse, const float* delta,
                                   float* dq, float* dk, float* dv, cudaStream_t stream) {
  using tf32_reads::rows_aligned;
  // The gradients are contiguous (B, H, T, D); dropout's draws serve four
  // weights each where rows of weights start at multiples of 4.
  if ((p.D != 32 && p.D != 64) || p.Tq == 0 || p.Tk == 0 || (p.dropout() && p.Tk % 4 != 0) || !rows_aligned(p.q) ||
      !rows_aligned(p.k) || !rows_aligned(p.v) || !rows_aligned(dout))
    return false;
  using namespace flash_tf32_backward;
  const auto rows = [&](float* data, std::int64_t T) {
    return ::attograd::AttentionRows<float>{data, p.H * T * p.D, T * p.D, p.D};
  };
  const int smem = p.D == 32 ? Tiles<32>::Bytes::kShared : Tiles<64>::Bytes::kShared;
  const BackwardKernels::Kernel kernel =
      p.D == 32 ? flash::kernel_for<BackwardKernels, 32>(p) : flash::kernel_for<BackwardKernels, 64>(p);
  launch_backward(kernel, smem, p, Operands{p.q, p.k, p.v},
                  Gradients<float>{dout, lse, delta, nullptr, nullptr, rows(dq, p.Tq), rows(dk, p.Tk), rows(dv, p.Tk)},
                  stream);
  return true;
}

}  // namespace attograd::cuda::attention_detail

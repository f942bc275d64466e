// The bfloat16 attention backward in FlashAttention-2's shape at head sizes 32,
// 64 and 128 (rows 16-byte aligned): attention_backward_bf16 (cuda/attention_bf16.cu)
// sends those problems here once delta is made, and the rest to its two
// general kernels, whose conventions (attention_common.cuh's formulas, what
// is rounded where) this one keeps. A kernel for each of causal, masked and
// dropout, so that the common one has no code for either.
//
// The block's work, the query tiles' stream and the ordered sum of dQ are
// cuda/attention_flash_backward.cuh's; here is how a warp reads and multiplies
// bfloat16 fragments: K's and V's held in registers for the whole sweep (at
// 128, read from their tiles: WarpKeys), the rest read by ldmatrix, plain
// where the summed index runs along a tile's lines and transposing where it
// runs down them; P^T and dS^T rounded as they become A fragments.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_flash_backward.cuh"
#include "cuda/mma_bf16.cuh"

namespace attograd::cuda::attention_detail {
namespace flash_backward {

using gemm_tiles::OperandTile;

// The queries a warp's S^T and dP^T hold at a time: the whole tile up to head
// size 64; at 128, where dK and dV take 128 registers, half of it.
template <int D>
constexpr int kPartQueries = D <= 64 ? kQueries : kQueries / 2;

// The tiles at head size D, each read two ways: plain where the summed index
// runs along its lines, transposing where it runs down them.
template <int D>
struct Tiles {
  using KRows = OperandTile<kBlockKeys, true, D>;        // A of K Q^T and V dO^T: a line a key
  using KCols = OperandTile<D, false, kBlockKeys>;       // B of dS K, from the same lines
  using QRows = OperandTile<kQueries, true, D>;          // B^T of K Q^T and V dO^T: a line a query
  using QCols = OperandTile<D, false, kQueries>;         // B of dS^T Q and (P Z)^T dO, from the same lines
  using DsT = OperandTile<kQueries, false, kBlockKeys>;  // A of dS K, stored as dS^T: a line a key
  static_assert(KRows::kLineChunks == KCols::kLineChunks && QRows::kLineChunks == QCols::kLineChunks,
                "a tile read both ways is one tile");
  using Bytes = TileBytes<KRows, QRows, 2 * DsT::kValues>;
};

// A warp's keys and values as the A fragments of K Q^T and V dO^T: held in
// registers up to head size 64; at 128 they would take 64 of the registers
// that dK and dV's 128 need, so they are read from their tiles for each use.
template <int D, bool InRegisters = (D <= 64)>
struct WarpKeys {
  std::uint32_t k[D / 16][4], v[D / 16][4];
  __device__ __forceinline__ WarpKeys(const std::uint16_t* k_tile, const std::uint16_t* v_tile, int warp, int lane) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int at = OperandTile<kBlockKeys, true, D>::fragment_chunk(kWarpKeys * warp, ks, lane, false) * 16;
      load_matrices<false>(k[ks], byte_offset(k_tile, at));
      load_matrices<false>(v[ks], byte_offset(v_tile, at));
    }
  }
  __device__ __forceinline__ void step(std::uint32_t (&kf)[4], std::uint32_t (&vf)[4], int ks) const {
#pragma unroll
    for (int r = 0; r < 4; ++r) kf[r] = k[ks][r], vf[r] = v[ks][r];
  }
};
template <int D>
struct WarpKeys<D, false> {
  const std::uint16_t *k_tile, *v_tile;
  LaneAddresses<D> at;
  __device__ __forceinline__ WarpKeys(const std::uint16_t* k, const std::uint16_t* v, int warp, int lane)
      : k_tile(k), v_tile(v), at([&](int ks) {
          return OperandTile<kBlockKeys, true, D>::fragment_chunk(kWarpKeys * warp, ks, lane, false) * 16;
        }) {}
  __device__ __forceinline__ void step(std::uint32_t (&kf)[4], std::uint32_t (&vf)[4], int ks) const {
    load_matrices<false>(kf, byte_offset(k_tile, at[ks]));
    load_matrices<false>(vf, byte_offset(v_tile, at[ks]));
  }
};

// Accumulator blocks 2 ks and 2 ks + 1 as one A fragment, rounded (attention_bf16.cu).
__device__ __forceinline__ void rounded_fragment(std::uint32_t (&a)[4], const float (&left)[4], const float (&right)[4]) {
  a[0] = round_pair(left[0], left[1]), a[1] = round_pair(left[2], left[3]);
  a[2] = round_pair(right[0], right[1]), a[3] = round_pair(right[2], right[3]);
}

// This lane's ldmatrix offsets: per step of 16 along D (plain), or per block
// of 16 of D (transposing); and into dS^T for its warp's 16 queries.
template <int D>
struct Reads {
  LaneAddresses<D> q_plain, q_trans, k_trans;
  int ds_at;
  __device__ __forceinline__ Reads(int warp, int lane)
      : q_plain([&](int i) { return Tiles<D>::QRows::fragment_chunk(0, i, lane, true) * 16; }),
        q_trans([&](int i) { return Tiles<D>::QCols::fragment_chunk(16 * i, 0, lane, true) * 16; }),
        k_trans([&](int i) { return Tiles<D>::KCols::fragment_chunk(16 * i, 0, lane, true) * 16; }),
        ds_at(Tiles<D>::DsT::fragment_chunk(kStripe * warp, 0, lane, false) * 16) {}
};

// The bfloat16 operands' part of backward_sweep (cuda/attention_flash_backward.cuh).
template <int D>
using HeldOrReadKeys = WarpKeys<D>;  // one template parameter, as KindTypes takes it

struct Bf16Kind : KindTypes<Tiles, HeldOrReadKeys, Reads> {
  using Value = bfloat16;
  template <int D>
  static constexpr int kPartQueries = flash_backward::kPartQueries<D>;

  // S^T = K Q^T and dP^T = V dO^T for queries part * kPart on.
  template <int D, int Blocks>
  __device__ __forceinline__ static void key_scores(float (&s)[Blocks][4], float (&dp)[Blocks][4], const Work<D>& w,
                                                    int part) {
    constexpr int kPart = 8 * Blocks;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      std::uint32_t kf[4], vf[4];
      w.keys.step(kf, vf, ks);
#pragma unroll
      for (int f = 0; f < kPart / 16; ++f) {
        std::uint32_t qf[4], of[4];
        const int at = w.reads.q_plain[ks] + (part * kPart / 16 + f) * Tiles<D>::QRows::kLineStride * 16;
        load_matrices<false>(qf, byte_offset(w.q_buf, at));
        load_matrices<false>(of, byte_offset(w.o_buf, at));
        const std::uint32_t q_lo[2] = {qf[0], qf[1]}, q_hi[2] = {qf[2], qf[3]};
        const std::uint32_t o_lo[2] = {of[0], of[1]}, o_hi[2] = {of[2], of[3]};
        mma_bf16(s[2 * f], kf, q_lo), mma_bf16(s[2 * f + 1], kf, q_hi);
        mma_bf16(dp[2 * f], vf, o_lo), mma_bf16(dp[2 * f + 1], vf, o_hi);
      }
    }
  }

  // dV += (P Z)^T dO and dK += dS^T Q; dS^T into shared memory, at key line 16 warp + g (+ 8), word t of a chunk.
  template <int D, int Blocks>
  __device__ __forceinline__ static void add_key_grads(float (&dk)[D / 8][4], float (&dv)[D / 8][4],
                                                       const float (&s)[Blocks][4], const float (&dp)[Blocks][4],
                                                       const Work<D>& w, int part) {
    using T = Tiles<D>;
    constexpr int kPart = 8 * Blocks;
    const int g = w.g, t = w.t;
    const auto ds_word = [&](int key, int chunk) {
      return byte_offset(w.ds_tile, T::DsT::Layout::at(kWarpKeys * w.warp + key, chunk) * 16 + 4 * t);
    };
#pragma unroll
    for (int step = 0; step < kPart / 16; ++step) {
      const int ks = part * kPart / 16 + step;  // of the tile's 4 steps of 16 queries
      std::uint32_t pa[4], da[4];
      rounded_fragment(pa, s[2 * step], s[2 * step + 1]);
      rounded_fragment(da, dp[2 * step], dp[2 * step + 1]);
      *reinterpret_cast<std::uint32_t*>(ds_word(g, 2 * ks)) = da[0];
      *reinterpret_cast<std::uint32_t*>(ds_word(g + 8, 2 * ks)) = da[1];
      *reinterpret_cast<std::uint32_t*>(ds_word(g, 2 * ks + 1)) = da[2];
      *reinterpret_cast<std::uint32_t*>(ds_word(g + 8, 2 * ks + 1)) = da[3];
#pragma unroll
      for (int f = 0; f < D / 16; ++f) {
        std::uint32_t of[4], qf[4];
        const int at = w.reads.q_trans[f] + ks * T::QCols::kLineStride * 16;
        load_matrices<true>(of, byte_offset(w.o_buf, at));
        load_matrices<true>(qf, byte_offset(w.q_buf, at));
        const std::uint32_t o_lo[2] = {of[0], of[1]}, o_hi[2] = {of[2], of[3]};
        const std::uint32_t q_lo[2] = {qf[0], qf[1]}, q_hi[2] = {qf[2], qf[3]};
        mma_bf16(dv[2 * f], pa, o_lo), mma_bf16(dv[2 * f + 1], pa, o_hi);
        mma_bf16(dk[2 * f], da, q_lo), mma_bf16(dk[2 * f + 1], da, q_hi);
      }
    }
  }

  // dQ = dS K for the warp's 16 queries of the tile.
  template <int D>
  __device__ __forceinline__ static void tile_dq(float (&dq)[D / 8][4], const std::uint16_t* ds_tile,
                                                 const std::uint16_t* k_tile, const Reads<D>& reads) {
    using T = Tiles<D>;
#pragma unroll
    for (int ks = 0; ks < kBlockKeys / 16; ++ks) {
      std::uint32_t a[4];
      load_matrices<true>(a, byte_offset(ds_tile, reads.ds_at + ks * T::DsT::kLineStride * 16));
#pragma unroll
      for (int f = 0; f < D / 16; ++f) {
        std::uint32_t kk[4];
        load_matrices<true>(kk, byte_offset(k_tile, reads.k_trans[f] + ks * T::KCols::kLineStride * 16));
        const std::uint32_t lo[2] = {kk[0], kk[1]}, hi[2] = {kk[2], kk[3]};
        mma_bf16(dq[2 * f], a, lo), mma_bf16(dq[2 * f + 1], a, hi);
      }
    }
  }

  // Rounded as stored.
  __device__ __forceinline__ static void store_pair(bfloat16* at, float x0, float x1) {
    *reinterpret_cast<std::uint32_t*>(at) = round_pair(x0, x1);
  }
};

template <int D, bool Causal, bool HasMask, bool Dropout>
__global__ void __launch_bounds__(kThreads, 2)
    attention_backward_flash_kernel(AttentionProblem p, Bf16AttentionOperands x, Gradients<bfloat16> grad) {
  backward_sweep<Bf16Kind, D, Causal, HasMask, Dropout>(p, x, grad);
}

}  // namespace flash_backward

namespace {

struct BackwardKernels {
  using Kernel = void (*)(AttentionProblem, Bf16AttentionOperands, flash_backward::Gradients<bfloat16>);
  template <int D, bool Causal, bool HasMask, bool Dropout>
  static Kernel kernel() {
    return flash_backward::attention_backward_flash_kernel<D, Causal, HasMask, Dropout>;
  }
};

}  // namespace

bool attention_backward_bf16_flash(const AttentionProblem& p, const Bf16AttentionOperands& x,
                                   ::attograd::AttentionRows<const bfloat16> dout, const float* lse,
                                   const float* delta, Bf16AttentionOutput dq, Bf16AttentionOutput dk,
                                   Bf16AttentionOutput dv, cudaStream_t stream) {
  // dout's and the gradients' rows are aligned wherever x.vec holds (Bf16AttentionOperands);
  // dropout's draws serve four weights each where rows of weights start at multiples of 4.
  if ((p.D != 32 && p.D != 64 && p.D != 128) || !x.vec || p.Tq == 0 || p.Tk == 0 || (p.dropout() && p.Tk % 4 != 0))
    return false;
  using namespace flash_backward;
  const int smem = p.D == 32 ? Tiles<32>::Bytes::kShared : p.D == 64 ? Tiles<64>::Bytes::kShared : Tiles<128>::Bytes::kShared;
  launch_backward(flash::kernel_for<BackwardKernels>(p), smem, p, x,
                  Gradients<bfloat16>{dout, lse, delta, nullptr, nullptr, dq, dk, dv}, stream);
  return true;
}

}  // namespace attograd::cuda::attention_detail

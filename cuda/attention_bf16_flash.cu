// The bfloat16 attention forward in FlashAttention-2's shape at head sizes 32,
// 64 and 128 (rows 16-byte aligned): attention_forward_bf16 (cuda/attention_bf16.cu)
// sends those problems here and the rest to its general kernel, whose
// conventions (what is rounded where, the log-sum-exp, NaN rows, the dropout
// stream) this one keeps. A kernel for each of causal, masked and dropout, so
// that the common one (no mask, no dropout) has no code for either.
//
// The block, its sweep over the key tiles and the softmax are
// cuda/attention_flash_forward.cuh's; here is how a warp reads and multiplies
// bfloat16 fragments. A warp's Q fragments are held in registers for the
// whole sweep (at 128, read from the Q tile: WarpQueries). The swizzled tiles
// meet no bank conflict for the copies, the plain ldmatrix of K nor the
// transposing one of V. (Tiles of 128 keys, as FlashAttention-2 takes at this
// head size, left ptxas 255 registers and spills inside the sweep.)
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_flash_forward.cuh"
#include "cuda/mma_bf16.cuh"

namespace attograd::cuda::attention_detail {
namespace flash {

using gemm_tiles::OperandTile;

// The tiles at head size D.
template <int D>
struct Tiles {
  using Q = OperandTile<kBlockQueries, true, D>;  // A of Q K^T: a line a query
  using K = OperandTile<kKeys, true, D>;          // B^T of Q K^T: a line a key
  using V = OperandTile<D, false, kKeys>;         // B of P V, as B^T's tile: a line a key
  static constexpr int kSharedBytes = 16 * (Q::kChunks + 2 * 2 * K::kChunks);  // Q, then two buffers of K and V
};

// The keys whose scores a warp holds at once: the whole tile up to head size
// 64; at 128, where O takes 128 registers, a half tile at a time (the sweep's
// exponent and rescaling twice a tile, and no spill).
template <int D>
constexpr int kScoreKeys = D <= 64 ? kKeys : kKeys / 2;

// A warp's queries as A fragments. At head sizes up to 64 they are held in
// registers for the whole sweep; at 128 they would take 64 of the registers
// that O's 128 need beside the scores, so they are read from the Q tile again
// for each key tile (a sixth more LDSM a tile).
template <int D, bool InRegisters = (D <= 64)>
struct WarpQueries {
  std::uint32_t f[kM][D / 16][4];
  __device__ __forceinline__ WarpQueries(const std::uint16_t* q_tile, int warp, int lane) {
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        load_matrices<false>(f[mt][ks], byte_offset(q_tile, Tiles<D>::Q::fragment_chunk(warp * kWarpQueries + 16 * mt,
                                                                                         ks, lane, false) * 16));
  }
  __device__ __forceinline__ void step(std::uint32_t (&a)[kM][4], int ks) const {
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int r = 0; r < 4; ++r) a[mt][r] = f[mt][ks][r];
  }
};
template <int D>
struct WarpQueries<D, false> {
  const std::uint16_t* tile;
  LaneAddresses<D> at;  // per step of 16 along D; the warp's second mma tile 16 lines on
  __device__ __forceinline__ WarpQueries(const std::uint16_t* q_tile, int warp, int lane)
      : tile(q_tile),
        at([&](int ks) { return Tiles<D>::Q::fragment_chunk(warp * kWarpQueries, ks, lane, false) * 16; }) {}
  __device__ __forceinline__ void step(std::uint32_t (&a)[kM][4], int ks) const {
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
      load_matrices<false>(a[mt], byte_offset(tile, at[ks] + mt * Tiles<D>::Q::kLineStride * 16));
  }
};

// s = Q K^T for the key tile: K's ldmatrix offsets per step of 16 along D
// (k_at), its blocks of 16 keys a constant apart.
template <int D>
__device__ __forceinline__ void tile_scores(Scores<kScoreKeys<D>>& s, const WarpQueries<D>& q, const std::uint16_t* k_tile,
                                            const LaneAddresses<D>& k_at) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    std::uint32_t a[kM][4];
    q.step(a, ks);
#pragma unroll
    for (int f = 0; f < kScoreKeys<D> / 16; ++f) {
      std::uint32_t kf[4];
      load_matrices<false>(kf, byte_offset(k_tile, k_at[ks] + f * Tiles<D>::K::kLineStride * 16));
      const std::uint32_t lo[2] = {kf[0], kf[1]}, hi[2] = {kf[2], kf[3]};
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) mma_bf16(s[mt][2 * f], a[mt], lo), mma_bf16(s[mt][2 * f + 1], a[mt], hi);
    }
  }
}

// o += p v: the scores' accumulators are P's A fragments where they stand
// (attention_bf16.cu). V's ldmatrix offsets per block of 16 along D (v_at),
// its steps of 16 keys a constant apart.
template <int D>
__device__ __forceinline__ void add_values(WarpRows<D>& rows, const Scores<kScoreKeys<D>>& s, const std::uint16_t* v_tile,
                                           const LaneAddresses<D>& v_at) {
#pragma unroll
  for (int ks = 0; ks < kScoreKeys<D> / 16; ++ks) {
    std::uint32_t pf[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      const float(&left)[4] = s[mt][2 * ks];
      const float(&right)[4] = s[mt][2 * ks + 1];
      pf[mt][0] = round_pair(left[0], left[1]), pf[mt][1] = round_pair(left[2], left[3]);
      pf[mt][2] = round_pair(right[0], right[1]), pf[mt][3] = round_pair(right[2], right[3]);
    }
#pragma unroll
    for (int f = 0; f < D / 16; ++f) {
      std::uint32_t vf[4];
      load_matrices<true>(vf, byte_offset(v_tile, v_at[f] + ks * Tiles<D>::V::kLineStride * 16));
      const std::uint32_t lo[2] = {vf[0], vf[1]}, hi[2] = {vf[2], vf[3]};
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) mma_bf16(rows.o[mt][2 * f], pf[mt], lo), mma_bf16(rows.o[mt][2 * f + 1], pf[mt], hi);
    }
  }
}

// A lane's ldmatrix offsets into K's tile per step of 16 along D, and into V's
// per block of 16 along D.
template <int D>
struct KeyValueReads {
  LaneAddresses<D> k_at, v_at;
  __device__ __forceinline__ explicit KeyValueReads(int lane)
      : k_at([&](int i) { return Tiles<D>::K::fragment_chunk(0, i, lane, true) * 16; }),
        v_at([&](int i) { return Tiles<D>::V::fragment_chunk(16 * i, 0, lane, true) * 16; }) {}
};

// The bfloat16 operands' part of forward_sweep (cuda/attention_flash_forward.cuh).
struct Bf16Kind {
  using Value = bfloat16;
  template <int D>
  using Tiles = flash::Tiles<D>;
  template <int D>
  static constexpr int kScoreKeys = flash::kScoreKeys<D>;
  template <int D>
  using Queries = WarpQueries<D>;
  template <int D>
  using Reads = KeyValueReads<D>;
  template <int D>
  __device__ __forceinline__ static void scores(Scores<kScoreKeys<D>>& s, const Queries<D>& q, const std::uint16_t* k_tile,
                                                const Reads<D>& reads) {
    tile_scores<D>(s, q, k_tile, reads.k_at);
  }
  template <int D>
  __device__ __forceinline__ static void add_values(WarpRows<D>& rows, const Scores<kScoreKeys<D>>& s,
                                                    const std::uint16_t* v_tile, const Reads<D>& reads) {
    flash::add_values<D>(rows, s, v_tile, reads.v_at);
  }
  // Rounded as stored.
  __device__ __forceinline__ static void store_pair(bfloat16* at, float x0, float x1) {
    *reinterpret_cast<std::uint32_t*>(at) = round_pair(x0, x1);
  }
};

// HasMask: every tile is masked by the problem's mask (and causality, and
// Tk); else only the last two. Dropout: the problem's dropout on the weights.
template <int D, bool Causal, bool HasMask, bool Dropout>
__global__ void __launch_bounds__(kThreads, 2)
    attention_forward_flash_kernel(AttentionProblem p, Bf16AttentionOperands x, Bf16AttentionOutput out, float* lse) {
  forward_sweep<Bf16Kind, D, Causal, HasMask, Dropout>(p, x, out, lse);
}

}  // namespace flash

namespace {

struct ForwardKernels {
  using Kernel = void (*)(AttentionProblem, Bf16AttentionOperands, Bf16AttentionOutput, float*);
  template <int D, bool Causal, bool HasMask, bool Dropout>
  static Kernel kernel() {
    return flash::attention_forward_flash_kernel<D, Causal, HasMask, Dropout>;
  }
};

}  // namespace

bool attention_forward_bf16_flash(const AttentionProblem& p, const Bf16AttentionOperands& x, Bf16AttentionOutput out,
                                  float* lse, cudaStream_t stream) {
  // The output's rows are aligned wherever x.vec holds (Bf16AttentionOperands).
  // Dropout's draws serve four weights each where rows of weights start at multiples of 4.
  if ((p.D != 32 && p.D != 64 && p.D != 128) || !x.vec || !(p.scale > 0) || (p.dropout() && p.Tk % 4 != 0))
    return false;
  const ForwardKernels::Kernel kernel = flash::kernel_for<ForwardKernels>(p);
  const int smem = p.D == 32   ? flash::Tiles<32>::kSharedBytes
                   : p.D == 64 ? flash::Tiles<64>::kSharedBytes
                               : flash::Tiles<128>::kSharedBytes;
  allow_shared_memory(kernel, smem);
  launch(kernel, grid_over(p.Tq, flash::kBlockQueries, p.B, p.H), flash::kThreads, smem, stream, p, x, out, lse);
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace attograd::cuda::attention_detail

// The float32 attention forward on the tensor cores in FlashAttention-2's
// shape at head sizes 32 and 64 (rows 16-byte aligned), every product in
// 3xTF32 (cuda/mma.cuh): attention_forward_tensor_core sends those problems
// here and the rest to its general kernel (cuda/attention_tensor_core.cu),
// whose conventions (the log-sum-exp, NaN rows, the dropout stream) this one
// keeps. A kernel for each of causal, masked and dropout.
//
// The block, its sweep over the key tiles and the softmax are
// cuda/attention_flash_forward.cuh's, the bfloat16 forward's; here is how a
// warp reads and multiplies float32 fragments. Q, K and V are copied as they
// lie, a line a row, and each warp splits what it reads into TF32's big and
// small parts: splitting K and V once a block for the four warps would take
// twice their tiles in shared memory, and one block of 4 warps an SM.
// Q's and K's fragments come by ldmatrix, V's by 4-byte reads with P's keys
// renumbered (cuda/attention_tf32_reads.cuh); Q is read again for each key
// tile, as held in registers its split parts would take 128.
#include <cstdint>

#include "cuda/attention_flash_forward.cuh"
#include "cuda/attention_tf32_reads.cuh"
#include "cuda/mma_bf16.cuh"  // load_matrices

namespace attograd::cuda::attention_detail {
namespace flash_tf32 {

using namespace flash;
using namespace tf32_reads;
using gemm_tiles::OperandTile;

// The tiles at head size D: a line a query or key, D float32 values.
template <int D>
struct Tiles {
  using Q = OperandTile<kBlockQueries, true, D, 4>;  // A of Q K^T
  using K = OperandTile<kKeys, true, D, 4>;          // B^T of Q K^T
  using V = OperandTile<kKeys, true, D, 4>;          // B of P V, read a value at a time
  static constexpr int kSharedBytes = 16 * (Q::kChunks + 2 * 2 * K::kChunks);  // Q, then two buffers of K and V
};

// A warp's queries, read from the Q tile and split for each step of each key tile.
template <int D>
struct WarpQueries {
  const std::uint16_t* tile;
  StepAddresses<D> at;  // per step of 8 along D; the warp's second mma tile 16 lines on
  __device__ __forceinline__ WarpQueries(const std::uint16_t* q_tile, int warp, int lane)
      : tile(q_tile), at([&](int ks) {
          return Tiles<D>::Q::fragment_chunk(warp * kWarpQueries, step_chunk(ks), lane, false) * 16;
        }) {}
  __device__ __forceinline__ void step(SplitFragment<4> (&a)[kM], int ks) const {
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      std::uint32_t raw[4];
      load_matrices<false>(raw, byte_offset(tile, at[ks] + mt * Tiles<D>::Q::kLineStride * 16));
      a[mt] = split_bits<4>(raw);
    }
  }
};

// A lane's offsets into K's tile (ldmatrix, per step of 8 along D) and into V's (its 4-byte reads).
template <int D>
struct KeyValueReads {
  StepAddresses<D> k_at;
  RowPairReads<D> values;
  __device__ __forceinline__ explicit KeyValueReads(int lane)
      : k_at([&](int ks) { return Tiles<D>::K::fragment_chunk(0, step_chunk(ks), lane, true) * 16; }), values(lane) {}
};

// s = Q K^T for the key tile.
template <int D, int Keys>
__device__ __forceinline__ void tile_scores(Scores<Keys>& s, const WarpQueries<D>& q, const std::uint16_t* k_tile,
                                            const KeyValueReads<D>& reads) {
#pragma unroll
  for (int ks = 0; ks < D / 8; ++ks) {
    SplitFragment<4> a[kM];
    q.step(a, ks);
#pragma unroll
    for (int f = 0; f < Keys / 16; ++f) {
      std::uint32_t kf[4];
      load_matrices<false>(kf, byte_offset(k_tile, reads.k_at[ks] + f * Tiles<D>::K::kLineStride * 16));
      const SplitFragment<2> lo = split_bits<2>(kf), hi = split_bits<2>(kf + 2);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) mma_3xtf32(s[mt][2 * f], a[mt], lo), mma_3xtf32(s[mt][2 * f + 1], a[mt], hi);
    }
  }
}

// o += p v, over the tile's blocks of 8 keys.
template <int D, int Keys>
__device__ __forceinline__ void add_values(WarpRows<D>& rows, const Scores<Keys>& s, const std::uint16_t* v_tile,
                                           const KeyValueReads<D>& reads) {
#pragma unroll
  for (int kb = 0; kb < Keys / 8; ++kb) {
    SplitFragment<4> pa[kM];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) pa[mt] = renumbered_fragment(s[mt][kb]);
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const SplitFragment<2> vb = reads.values.fragment(v_tile, kb, nd);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) mma_3xtf32(rows.o[mt][nd], pa[mt], vb);
    }
  }
}

// The float32 operands' part of forward_sweep (cuda/attention_flash_forward.cuh).
struct Tf32Kind {
  using Value = float;
  template <int D>
  using Tiles = flash_tf32::Tiles<D>;
  template <int D>
  static constexpr int kScoreKeys = kKeys;
  template <int D>
  using Queries = WarpQueries<D>;
  template <int D>
  using Reads = KeyValueReads<D>;
  template <int D>
  __device__ __forceinline__ static void scores(Scores<kKeys>& s, const Queries<D>& q, const std::uint16_t* k_tile,
                                                const Reads<D>& reads) {
    tile_scores<D, kKeys>(s, q, k_tile, reads);
  }
  template <int D>
  __device__ __forceinline__ static void add_values(WarpRows<D>& rows, const Scores<kKeys>& s,
                                                    const std::uint16_t* v_tile, const Reads<D>& reads) {
    flash_tf32::add_values<D, kKeys>(rows, s, v_tile, reads);
  }
  __device__ __forceinline__ static void store_pair(float* at, float x0, float x1) {
    *reinterpret_cast<float2*>(at) = make_float2(x0, x1);
  }
};

// The problem holds its float32 operands (p.q, p.k, p.v): they are forward_sweep's x.
template <int D, bool Causal, bool HasMask, bool Dropout>
__global__ void __launch_bounds__(kThreads, 2)
    attention_forward_tf32_flash_kernel(AttentionProblem p, ::attograd::AttentionRows<float> out, float* lse) {
  forward_sweep<Tf32Kind, D, Causal, HasMask, Dropout>(p, p, out, lse);
}

}  // namespace flash_tf32

namespace {

struct ForwardKernels {
  using Kernel = void (*)(AttentionProblem, ::attograd::AttentionRows<float>, float*);
  template <int D, bool Causal, bool HasMask, bool Dropout>
  static Kernel kernel() {
    return flash_tf32::attention_forward_tf32_flash_kernel<D, Causal, HasMask, Dropout>;
  }
};

}  // namespace

bool attention_forward_tf32_flash(const AttentionProblem& p, ::attograd::AttentionRows<float> out, float* lse,
                                  cudaStream_t stream) {
  using tf32_reads::rows_aligned;
  // Dropout's draws serve four weights each where rows of weights start at multiples of 4.
  if ((p.D != 32 && p.D != 64) || !(p.scale > 0) || (p.dropout() && p.Tk % 4 != 0) || !rows_aligned(p.q) ||
      !rows_aligned(p.k) || !rows_aligned(p.v) || !rows_aligned(out))
    return false;
  const ForwardKernels::Kernel kernel =
      p.D == 32 ? flash::kernel_for<ForwardKernels, 32>(p) : flash::kernel_for<ForwardKernels, 64>(p);
  const int smem = p.D == 32 ? flash_tf32::Tiles<32>::kSharedBytes : flash_tf32::Tiles<64>::kSharedBytes;
  allow_shared_memory(kernel, smem);
  launch(kernel, grid_over(p.Tq, flash::kBlockQueries, p.B, p.H), flash::kThreads, smem, stream, p, out, lse);
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace attograd::cuda::attention_detail

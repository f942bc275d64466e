// Fused attention in bfloat16 on the tensor cores: attention.cu's algorithm,
// masking, dropout stream and conventions (read it first) and
// attention_tensor_core.cu's division of work (4 warps own 64 rows of one
// (b, h), each warp 16, the height of one mma tile; 64 keys a tile in the
// forward and 32 in the backward), with every product one mma.sync m16n8k16
// on bfloat16 operands with float32 sums (cuda/mma_bf16.cuh). What is
// rounded, and where, is the CPU's bfloat16 attention's
// (cpu/attention/bf16_forward.h, bf16_backward.h): scores are float32
// sums of exact products, scaled in float32; the softmax, its statistics and
// the log-sum-exp are float32; P Z (the forward's P V, the backward's dV)
// and dS (dQ, dK) are rounded to bfloat16 as the A operands of their
// products; the outputs accumulate in float32 and round once as stored.
//
// Every tile in shared memory holds rows of Q, K, V or dO as they lie in
// memory, and the fragments come from ldmatrix (load_matrices, mma_bf16.cuh):
// plain where the summed index runs along the rows (Q K^T's A and B^T, a
// warp's queries and the tile's keys), transposing where it runs down them
// (P V's B is V's rows, dS K's is K's), so each of Q, K, V and dO is loaded
// once, and no tile is stored transposed. Rows are padded by 8 values (16
// bytes): a pitch of 20, 36 or 68 words puts the 8 rows of 16 bytes that an
// ldmatrix reads at once on 8 different groups of 4 banks.
//
// A warp's scores stay in its mma accumulators (cuda/attention_warp_scores.cuh),
// and the C layout of m16n8k16 is its A layout: accumulator blocks 2kb and
// 2kb + 1 of 8 columns are the A fragment of columns [16kb, 16kb + 16), each
// register two neighbouring columns of one row. So the probabilities become
// the next product's operand where they are, rounded two at a time.
//
// Tiles move 16 bytes a thread where every row is 16-byte aligned and D is a
// multiple of 8 (Bf16AttentionOperands::vec), else a value at a time. The
// tiles that stream (keys and values, or queries and their dO) are double
// buffered (stream_tile_pairs): with 16-byte loads the next pair is copied by
// cp.async (cuda/async_copy.cuh) while the warps work on this one. How far it
// stands from PyTorch's bfloat16 SDPA is measured in docs/cuda.md.
#include <algorithm>
#include <cstdint>

#include "cuda/async_copy.cuh"
#include "cuda/attention_warp_scores.cuh"
#include "cuda/buffer.h"
#include "cuda/mma_bf16.cuh"

namespace attograd::cuda {
namespace {

using namespace attention_detail;
using Bf16Rows = ::attograd::AttentionRows<const bfloat16>;

// Values per row of a tile of Cols values a row (see the top of the file).
template <int Cols>
constexpr int kPitch = Cols + 8;

template <int Rows, int Cols>
constexpr std::size_t tile_bytes() {
  return sizeof(std::uint16_t) * Rows * kPitch<Cols>;
}

// The bits of element d of row t of (b, h); zero outside the tensor (t >= T or d >= D).
__device__ __forceinline__ std::uint16_t element_bits(const Bf16Rows& x, std::int64_t b, std::int64_t h,
                                                      std::int64_t t, std::int64_t T, int d, std::int64_t D) {
  return t < T && d < D ? x.row(b, h, t)[d].bits : std::uint16_t{0};
}

// Eight values of a row from d (16 bytes, aligned): zero past T.
__device__ __forceinline__ uint4 eight_values(const Bf16Rows& x, std::int64_t b, std::int64_t h, std::int64_t t,
                                              std::int64_t T, int d, std::int64_t D) {
  return t < T && d < D ? *reinterpret_cast<const uint4*>(x.row(b, h, t) + d) : make_uint4(0, 0, 0, 0);
}

// tile[r][d] = x[t0 + r][d] for Rows rows of DMax values: as they lie,
// 8 values a thread where `vec` (Bf16AttentionOperands), else one.
template <int Rows, int DMax>
__device__ __forceinline__ void load_tile_rows(std::uint16_t* tile, const Bf16Rows& x, std::int64_t b, std::int64_t h,
                                               std::int64_t t0, std::int64_t T, std::int64_t D, bool vec) {
  if (vec) {
    for (int e = threadIdx.x; e < Rows * DMax / 8; e += kBlockThreads) {
      const int r = e / (DMax / 8), d = 8 * (e % (DMax / 8));
      *reinterpret_cast<uint4*>(tile + r * kPitch<DMax> + d) = eight_values(x, b, h, t0 + r, T, d, D);
    }
    return;
  }
  for (int e = threadIdx.x; e < Rows * DMax; e += kBlockThreads) {
    const int r = e / DMax, d = e % DMax;
    tile[r * kPitch<DMax> + d] = element_bits(x, b, h, t0 + r, T, d, D);
  }
}

// load_tile_rows's tile through cp.async where `vec`, which the caller commits
// and waits for (stream_tile_pairs: the next pair of tiles, copied while the
// warps compute on this one). Where values are zero (past T or D) the copy
// reads nothing and fills zeros; its source is then row t0 (t0 < T), an
// address that exists.
template <int Rows, int DMax>
__device__ __forceinline__ void copy_tile_rows_async(std::uint16_t* tile, const Bf16Rows& x, std::int64_t b,
                                                     std::int64_t h, std::int64_t t0, std::int64_t T, std::int64_t D,
                                                     bool vec) {
  if (!vec) return load_tile_rows<Rows, DMax>(tile, x, b, h, t0, T, D, vec);
  for (int e = threadIdx.x; e < Rows * DMax / 8; e += kBlockThreads) {
    const int r = e / (DMax / 8), d = 8 * (e % (DMax / 8));
    const bool inside = t0 + r < T && d < D;
    copy_async16(tile + r * kPitch<DMax> + d, inside ? x.row(b, h, t0 + r) + d : x.row(b, h, t0), inside);
  }
}

// Rows [begin, end) of x and y (of (b, h); T rows each), Rows at a time, through
// two buffers in shared memory: buffer i's x tile at buffers + 2 i kTile, its y
// tile after it. While body(x_tile, y_tile, t0, buf) computes on one buffer,
// the next pair is copied into the other (cp.async where `vec`), and
// also(buf, t0) stores what else that tile needs into buffer buf's own place.
// The caller's last reads of buffer 0 must lie before a barrier.
template <int Rows, int DMax, typename Also, typename Body>
__device__ __forceinline__ void stream_tile_pairs(std::uint16_t* buffers, const Bf16Rows& x, const Bf16Rows& y,
                                                  std::int64_t b, std::int64_t h, std::int64_t begin, std::int64_t end,
                                                  std::int64_t T, std::int64_t D, bool vec, Also also, Body body) {
  constexpr int kTile = Rows * kPitch<DMax>;
  const auto copy = [&](int buf, std::int64_t t0) {
    copy_tile_rows_async<Rows, DMax>(buffers + 2 * buf * kTile, x, b, h, t0, T, D, vec);
    copy_tile_rows_async<Rows, DMax>(buffers + 2 * buf * kTile + kTile, y, b, h, t0, T, D, vec);
    also(buf, t0);
    commit_async_copies();
  };
  if (begin < end) copy(0, begin);
  int buf = 0;
  for (std::int64_t t0 = begin; t0 < end; t0 += Rows, buf ^= 1) {
    // The next pair into the other buffer, whose last reader (the previous pair) the barrier at
    // the end of the loop closed; then this pair's copies are waited for, and everyone's by the barrier.
    if (t0 + Rows < end) {
      copy(buf ^ 1, t0 + Rows);
      wait_async_copies<1>();
    } else {
      wait_async_copies<0>();
    }
    __syncthreads();
    body(buffers + 2 * buf * kTile, buffers + 2 * buf * kTile + kTile, t0, buf);
    __syncthreads();  // everyone is done with this buffer before the next pair's copies go into it
  }
}

// left += A B_left and right += A B_right: B's two fragments of 8 columns as
// one load_matrices gives them (b).
__device__ __forceinline__ void times_fragment_pair(float (&left)[4], float (&right)[4], const std::uint32_t (&a)[4],
                                                    const std::uint32_t (&b)[4]) {
  const std::uint32_t b_left[2] = {b[0], b[1]}, b_right[2] = {b[2], b[3]};
  mma_bf16(left, a, b_left);
  mma_bf16(right, a, b_right);
}

// acc (16 x 8N) += A B: A the warp's 16 rows at `a` (pitch PA), B^T's 8N rows
// at `bt` (pitch PB), K values of k along both.
template <int N, int K, int PA, int PB>
__device__ __forceinline__ void rows_times_rows(float (&acc)[N][4], const std::uint16_t* a, const std::uint16_t* bt) {
  static_assert(N % 2 == 0, "B's fragments come in pairs");
  const std::uint16_t *a_row = a + quarters_down_row(PA), *b_row = bt + quarters_across_row(PB);
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    std::uint32_t af[4];
    load_matrices<false>(af, a_row + k0);
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      std::uint32_t bf[4];
      load_matrices<false>(bf, b_row + 8 * n * PB + k0);
      times_fragment_pair(acc[n], acc[n + 1], af, bf);
    }
  }
}

// acc (16 x 8N) += S B: S (16 x 8NC) the warp's accumulator values, rounded
// to bfloat16 where they are as A fragments (see the top of the file), B's
// 8NC rows (k) of 8N values at `b` (pitch PB), read transposing.
template <int N, int NC, int PB>
__device__ __forceinline__ void scores_times_rows(float (&acc)[N][4], const float (&s)[NC][4],
                                                  const std::uint16_t* b) {
  static_assert(N % 2 == 0, "B's fragments come in pairs");
  const std::uint16_t* b_row = b + quarters_down_row(PB);
#pragma unroll
  for (int kb = 0; kb < NC / 2; ++kb) {
    const float(&left)[4] = s[2 * kb];
    const float(&right)[4] = s[2 * kb + 1];
    const std::uint32_t af[4] = {round_pair(left[0], left[1]), round_pair(left[2], left[3]),
                                 round_pair(right[0], right[1]), round_pair(right[2], right[3])};
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      std::uint32_t bf[4];
      load_matrices<true>(bf, b_row + 16 * kb * PB + 8 * n);
      times_fragment_pair(acc[n], acc[n + 1], af, bf);
    }
  }
}

// The warp's accumulator rows rounded into rows [w0, w0 + 16) of `out`, those
// below `count`: with `vec` a lane's two neighbouring values as one 32-bit pair.
template <int DMax>
__device__ __forceinline__ void store_bf16_rows(const Bf16AttentionOutput& out, std::int64_t b, std::int64_t h,
                                                const float (&acc)[DMax / 8][4], std::int64_t w0, std::int64_t count,
                                                std::int64_t D, int g, int t, const float (&factor)[2], bool vec) {
  if (vec) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t i = w0 + g + 8 * half;
      if (i >= count) continue;
      bfloat16* row = out.row(b, h, i);
#pragma unroll
      for (int n = 0; n < DMax / 8; ++n) {
        const int d = 8 * n + 2 * t;
        if (d < D)
          *reinterpret_cast<std::uint32_t*>(row + d) =
              round_pair(acc[n][2 * half] * factor[half], acc[n][2 * half + 1] * factor[half]);
      }
    }
    return;
  }
  store_accumulator_rows<DMax>(acc, w0, count, D, g, t, factor,
                               [&](std::int64_t i, int d, float value) { out.row(b, h, i)[d] = bfloat16(value); });
}

// ---- forward -----------------------------------------------------------------------------------

// The queries, and two buffers of a key tile and its values: the warps
// compute on one while the next is copied into the other.
template <int DMax>
constexpr std::size_t forward_smem() {
  return tile_bytes<kBlockRows, DMax>() + 2 * 2 * tile_bytes<kForwardTile, DMax>();
}

template <int DMax>
__global__ void __launch_bounds__(kBlockThreads)
    attention_forward_bf16_kernel(AttentionProblem p, Bf16AttentionOperands x, Bf16AttentionOutput out, float* lse) {
  constexpr int PD = kPitch<DMax>, NC = kForwardTile / 8, ND = DMax / 8;
  std::uint16_t* qs = dynamic_shared_memory<std::uint16_t>();  // (64, PD): the block's queries
  std::uint16_t* kv = qs + kBlockRows * PD;                     // two buffers of (64, PD) keys, then their values
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * kBlockRows, w0 = i0 + warp * kWarpRows;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    __syncthreads();  // the previous (b, h) is done with shared memory
    load_tile_rows<kBlockRows, DMax>(qs, x.q, b, h, i0, p.Tq, p.D, x.vec);
    float o[ND][4] = {};  // running sum of p v, rows g and g + 8
    RunningSoftmax run;   // of the same rows

    // Causal: keys past the block's last query are hidden from every row.
    const std::int64_t key_end = p.causal ? min(p.Tk, i0 + kBlockRows) : p.Tk;
    stream_tile_pairs<kForwardTile, DMax>(
        kv, x.k, x.v, b, h, 0, key_end, p.Tk, p.D, x.vec, [](int, std::int64_t) {},
        [&](const std::uint16_t* ks, const std::uint16_t* vs, std::int64_t j0, int) {
          float s[NC][4] = {};  // q_i . k_j, then times scale
          rows_times_rows<NC, DMax, PD, PD>(s, qs + warp * kWarpRows * PD, ks);
#pragma unroll
          for (int n = 0; n < NC; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) s[n][r] *= p.scale;
          online_softmax_tile<NC, ND>(s, o, run, p, b, h, w0, j0, g, t);
          scores_times_rows<ND, NC, PD>(o, s, vs);  // o_i += sum_j p_ij v_j
        });

    float inv[2];
    finish_softmax(run, p, bh, w0, g, t, lse, inv);
    store_bf16_rows<DMax>(out, b, h, o, w0, p.Tq, p.D, g, t, inv, x.vec);
  }
}

// ---- backward (attention_common.cuh's formulas, pair_grads) ------------------------------------

// The block's queries and their dO, and two buffers of a key tile and its values.
template <int DMax>
constexpr std::size_t dq_smem() {
  return 2 * tile_bytes<kBlockRows, DMax>() + 2 * 2 * tile_bytes<kBackwardTile, DMax>();
}

// A block owns queries [i0, i0 + 64) of one (b, h) and sweeps the key tiles:
// dq_i += sum_j scale dS_ij k_j.
template <int DMax>
__global__ void __launch_bounds__(kBlockThreads)
    attention_dq_bf16_kernel(AttentionProblem p, Bf16AttentionOperands x, Bf16Rows dout, const float* lse,
                             const float* delta, Bf16AttentionOutput dq) {
  constexpr int PD = kPitch<DMax>, NC = kBackwardTile / 8, ND = DMax / 8;
  std::uint16_t* qs = dynamic_shared_memory<std::uint16_t>();  // (64, PD): the block's queries
  std::uint16_t* dos = qs + kBlockRows * PD;                    // (64, PD): their output gradients
  std::uint16_t* kv = dos + kBlockRows * PD;  // two buffers of (32, PD) keys (for s and dq), then values (for dP)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * kBlockRows, w0 = i0 + warp * kWarpRows;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    __syncthreads();
    load_tile_rows<kBlockRows, DMax>(qs, x.q, b, h, i0, p.Tq, p.D, x.vec);
    load_tile_rows<kBlockRows, DMax>(dos, dout, b, h, i0, p.Tq, p.D, x.vec);
    const RowTerms terms = row_terms(p, lse, delta, bh, w0, g);
    float dq_acc[ND][4] = {};

    const std::int64_t key_end = p.causal ? min(p.Tk, i0 + kBlockRows) : p.Tk;
    stream_tile_pairs<kBackwardTile, DMax>(
        kv, x.k, x.v, b, h, 0, key_end, p.Tk, p.D, x.vec, [](int, std::int64_t) {},
        [&](const std::uint16_t* ks, const std::uint16_t* vs, std::int64_t j0, int) {
          float s[NC][4] = {}, dpv[NC][4] = {};  // q_i . k_j and do_i . v_j
          rows_times_rows<NC, DMax, PD, PD>(s, qs + warp * kWarpRows * PD, ks);
          rows_times_rows<NC, DMax, PD, PD>(dpv, dos + warp * kWarpRows * PD, vs);
          scores_to_ds<NC>(s, dpv, p, b, h, w0, j0, g, t, terms, p.scale);
          scores_times_rows<ND, NC, PD>(dq_acc, s, ks);
        });
    store_bf16_rows<DMax>(dq, b, h, dq_acc, w0, p.Tq, p.D, g, t, {1.0f, 1.0f}, x.vec);
  }
}

// The block's keys and values, and two buffers of a query tile, its dO and their lse and delta.
template <int DMax>
constexpr std::size_t dkdv_smem() {
  return 2 * tile_bytes<kBlockRows, DMax>() +
         2 * (2 * tile_bytes<kBackwardTile, DMax>() + sizeof(float) * 2 * kBackwardTile);
}

// A block owns keys [j0, j0 + 64) of one (b, h) and sweeps the query tiles:
// dv_j += sum_i P Z do_i and dk_j += sum_i scale dS q_i. The warp's scores are
// transposed here (its 16 keys by the tile's queries), so they are the A
// operand of both sums as they stand.
template <int DMax>
__global__ void __launch_bounds__(kBlockThreads)
    attention_dkdv_bf16_kernel(AttentionProblem p, Bf16AttentionOperands x, Bf16Rows dout, const float* lse,
                               const float* delta, Bf16AttentionOutput dk, Bf16AttentionOutput dv) {
  constexpr int PD = kPitch<DMax>, NC = kBackwardTile / 8, ND = DMax / 8;
  std::uint16_t* ks = dynamic_shared_memory<std::uint16_t>();  // (64, PD): the block's keys
  std::uint16_t* vs = ks + kBlockRows * PD;                     // (64, PD): and values
  std::uint16_t* qd = vs + kBlockRows * PD;  // two buffers of (32, PD) queries (for s and dk), then their dO (dP, dv)
  float* terms = reinterpret_cast<float*>(qd + 2 * 2 * kBackwardTile * PD);  // buffer i's lse at 64 i, delta after
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const std::int64_t j0 = std::int64_t(blockIdx.x) * kBlockRows, w0 = j0 + warp * kWarpRows;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    __syncthreads();
    load_tile_rows<kBlockRows, DMax>(ks, x.k, b, h, j0, p.Tk, p.D, x.vec);
    load_tile_rows<kBlockRows, DMax>(vs, x.v, b, h, j0, p.Tk, p.D, x.vec);
    float dk_acc[ND][4] = {}, dv_acc[ND][4] = {};

    // Causal: queries before j0 see none of these keys.
    const std::int64_t q_begin = p.causal ? j0 / kBackwardTile * kBackwardTile : 0;
    stream_tile_pairs<kBackwardTile, DMax>(
        qd, x.q, dout, b, h, q_begin, p.Tq, p.Tq, p.D, x.vec,
        [&](int buf, std::int64_t q0) {
          float* lse_s = terms + 2 * kBackwardTile * buf;
          load_query_terms(lse_s, lse_s + kBackwardTile, p, lse, delta, bh, q0, kBackwardTile);
        },
        [&](const std::uint16_t* qs, const std::uint16_t* dos, std::int64_t q0, int buf) {
          const float* lse_s = terms + 2 * kBackwardTile * buf;
          float s[NC][4] = {}, dpv[NC][4] = {};  // q_i . k_j and do_i . v_j, by key (row) and query (column)
          rows_times_rows<NC, DMax, PD, PD>(s, ks + warp * kWarpRows * PD, qs);
          rows_times_rows<NC, DMax, PD, PD>(dpv, vs + warp * kWarpRows * PD, dos);
          transposed_pair_grads<NC>(s, dpv, p, b, h, q0, w0, g, t, lse_s, lse_s + kBackwardTile);
          scores_times_rows<ND, NC, PD>(dv_acc, s, dos);
          scores_times_rows<ND, NC, PD>(dk_acc, dpv, qs);
        });
    store_bf16_rows<DMax>(dk, b, h, dk_acc, w0, p.Tk, p.D, g, t, {1.0f, 1.0f}, x.vec);
    store_bf16_rows<DMax>(dv, b, h, dv_acc, w0, p.Tk, p.D, g, t, {1.0f, 1.0f}, x.vec);
  }
}

}  // namespace

void attention_forward_bf16(const AttentionProblem& p, const Bf16AttentionOperands& x, Bf16AttentionOutput out,
                            float* lse, cudaStream_t stream) {
  if (p.B * p.H * p.Tq == 0) return;
  if (attention_forward_bf16_flash(p, x, out, lse, stream)) return;
  with_head_dim(p.D, [&](auto dmax) {
    constexpr int DMax = decltype(dmax)::value;
    constexpr std::size_t smem = forward_smem<DMax>();
    allow_shared_memory(attention_forward_bf16_kernel<DMax>, smem);
    launch(attention_forward_bf16_kernel<DMax>, grid_over(p.Tq, kBlockRows, p.B, p.H), kBlockThreads, smem, stream, p,
           x, out, lse);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_backward_bf16(const AttentionProblem& p, const Bf16AttentionOperands& x, Bf16Rows dout, Bf16Rows out,
                             const float* lse, Bf16AttentionOutput dq, Bf16AttentionOutput dk, Bf16AttentionOutput dv,
                             cudaStream_t stream) {
  if (p.B * p.H == 0) return;
  // With no queries dk and dv are zero, and with no keys dq: the kernels'
  // sweeps are empty and they store their zero sums.
  DeviceBuffer delta(sizeof(float) * std::max<std::int64_t>(p.B * p.H * p.Tq, 1));  // (B, H, Tq)
  if (p.Tq > 0) launch_delta(p, dout, out, delta.as<float>(), stream);
  if (attention_backward_bf16_flash(p, x, dout, lse, delta.as<const float>(), dq, dk, dv, stream)) return;
  with_head_dim(p.D, [&](auto dmax) {
    constexpr int DMax = decltype(dmax)::value;
    constexpr std::size_t kv_smem = dkdv_smem<DMax>(), q_smem = dq_smem<DMax>();
    if (p.Tk > 0) {
      allow_shared_memory(attention_dkdv_bf16_kernel<DMax>, kv_smem);
      launch(attention_dkdv_bf16_kernel<DMax>, grid_over(p.Tk, kBlockRows, p.B, p.H), kBlockThreads, kv_smem, stream,
             p, x, dout, lse, delta.as<const float>(), dk, dv);
      CUDA_CHECK_LAUNCH();
    }
    if (p.Tq > 0) {
      allow_shared_memory(attention_dq_bf16_kernel<DMax>, q_smem);
      launch(attention_dq_bf16_kernel<DMax>, grid_over(p.Tq, kBlockRows, p.B, p.H), kBlockThreads, q_smem, stream, p,
             x, dout, lse, delta.as<const float>(), dq);
      CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace attograd::cuda

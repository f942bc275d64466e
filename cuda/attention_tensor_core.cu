// Fused attention on the tensor cores: attention.cu's algorithm, masking,
// dropout stream and conventions (read it first), with every product of two
// tiles a warp's mma.sync in float32 accuracy (3xTF32, cuda/mma.cuh).
// Problems at head sizes 32 and 64 with 16-byte aligned rows go to the kernels
// in FlashAttention-2's shape instead (cuda/attention_tf32_flash.cu and
// attention_tf32_flash_backward.cu); these take the rest.
//
// A block of 4 warps owns 64 rows of one (b, h) (queries; keys in the dK/dV
// kernel), each warp 16: the height of one mma tile. Tiles of the other side
// (keys; queries) stream through shared memory, 64 rows at a time in the
// forward and 32 in the backward, whose kernels keep four accumulators live.
// A warp's scores for its 16 rows stay in mma accumulators, and the softmax
// works on them there (cuda/attention_warp_scores.cuh): lane (g, t) =
// (lane / 4, lane % 4) holds rows g and g + 8 and, of each 8-column block,
// columns 2t and 2t + 1. So a row's max and sum are the lane's own values and
// then two shuffles within its quad of lanes.
//
// The scores then become the A operand of the next product (P V, dS K, ...)
// without moving. A's layout wants columns t and t + 4 where the lane holds 2t
// and 2t + 1; but the product sums over the columns, and the order of a sum's
// terms is ours to choose as long as B's rows follow it: A's column t is the
// block's column 2t and column t + 4 is 2t + 1, so B's row t is read from row
// 2t of the tile in shared memory and row t + 4 from row 2t + 1.
//
// Shared memory holds two kinds of tile. A warp's own rows (the A operands of
// its score products) stay as they are, each row DMax + 8 floats apart, and a
// lane reads the two values it needs as one float2 (a[0] and a[2] are columns t
// and t + 4 of an 8-wide step; they are numbered as columns 2t and 2t + 1 of the
// head dim, the same renumbering as above, with B following). The B operands
// are split into big and small parts once, when the tile is stored, not by
// each of the 4 warps at every use: a float4 holds {big, big, small, small} of
// the two values a lane reads, so one 128-bit read is a whole B fragment. Rows
// of a tile read along the head dim (K in Q K^T) are stored as pairs of
// neighbouring columns; rows read along their own index (V in P V) as pairs of
// neighbouring rows, column by column. The raw rows' pitch (DMax + 8 floats)
// and the split tiles' swizzle (`swizzled`) put the 16 lanes of each
// half-warp's 64-bit read, and the 8 of each quarter-warp's 128-bit read, in
// different banks.
#include <cstdint>

#include "cuda/attention_warp_scores.cuh"
#include "cuda/mma.cuh"

namespace attograd::cuda::attention_detail {
namespace {

template <int DMax>
constexpr int kRowPitch = DMax + 8;  // floats per row of a tile of raw rows
template <int DMax>
constexpr int kPairPitch = DMax / 2;  // float4s per row of a tile split by column pairs
template <int Rows>
constexpr int kColumnPitch = Rows / 2;  // float4s per head dim of a tile split by row pairs

// Where float4 `i` of row `r` of a split tile lives: odd rows swap the halves of
// each group of 8 float4s. A quarter-warp's 128-bit read takes the same 4
// float4s of two neighbouring rows, and the swap puts the second row's in the
// other half of the 32 banks (padding rows by 4 float4s would do it too, and
// would have cost the dK/dV kernel its second block per SM).
__device__ __forceinline__ int swizzled(int r, int pitch, int i) { return r * pitch + (i ^ ((r & 1) << 2)); }

template <int DMax>
constexpr std::size_t raw_bytes(int rows) {
  return sizeof(float) * rows * kRowPitch<DMax>;
}
template <int DMax>
constexpr std::size_t pairs_bytes(int rows) {
  return sizeof(float4) * rows * kPairPitch<DMax>;
}
template <int DMax, int Rows>
constexpr std::size_t columns_bytes() {
  return sizeof(float4) * DMax * kColumnPitch<Rows>;
}

// {x0, x1} as B-operand parts: {big x0, big x1, small x0, small x1}.
__device__ __forceinline__ float4 split_pair(float x0, float x1) {
  return make_float4(bits_float(tf32_big(x0)), bits_float(tf32_big(x1)), bits_float(tf32_small(x0)),
                     bits_float(tf32_small(x1)));
}

// Element d of row t0 + r of (b, h), times factor; zero outside the tensor (t >= T or d >= D).
__device__ __forceinline__ float element(const AttentionRows& x, std::int64_t b, std::int64_t h, std::int64_t t,
                                         std::int64_t T, int d, std::int64_t D, float factor) {
  return t < T && d < D ? x.row(b, h, t)[d] * factor : 0.0f;
}

// Rows [t0, t0 + Rows) split by column pairs: dst[r][p] = split_pair(x[r][2p], x[r][2p + 1]).
template <int DMax, int Rows>
__device__ __forceinline__ void load_pairs(float4* dst, const AttentionRows& x, std::int64_t b, std::int64_t h,
                                           std::int64_t t0, std::int64_t T, std::int64_t D, float factor = 1.0f) {
  for (int e = threadIdx.x; e < Rows * DMax / 2; e += kBlockThreads) {
    const int r = e / (DMax / 2), p = e % (DMax / 2);
    dst[swizzled(r, kPairPitch<DMax>, p)] =
        split_pair(element(x, b, h, t0 + r, T, 2 * p, D, factor), element(x, b, h, t0 + r, T, 2 * p + 1, D, factor));
  }
}

// Rows [t0, t0 + Rows) split by row pairs, by head dim: dst[d][q] = split_pair(x[2q][d], x[2q + 1][d]).
// Neighbouring threads take neighbouring d, so the global reads are coalesced.
template <int DMax, int Rows>
__device__ __forceinline__ void load_columns(float4* dst, const AttentionRows& x, std::int64_t b, std::int64_t h,
                                             std::int64_t t0, std::int64_t T, std::int64_t D) {
  for (int e = threadIdx.x; e < Rows / 2 * DMax; e += kBlockThreads) {
    const int d = e % DMax, q = e / DMax;
    dst[swizzled(d, kColumnPitch<Rows>, q)] =
        split_pair(element(x, b, h, t0 + 2 * q, T, d, D, 1.0f), element(x, b, h, t0 + 2 * q + 1, T, d, D, 1.0f));
  }
}

__device__ __forceinline__ SplitFragment<2> b_fragment(float4 v) {
  return {{float_bits(v.x), float_bits(v.y)}, {float_bits(v.z), float_bits(v.w)}};
}

// acc (16 x 8N) += A B^T: A the warp's 16 raw rows at `a`, B the tile's 8N rows
// at `b`, split by column pairs.
template <int N, int DMax>
__device__ __forceinline__ void rows_times_rows(float (&acc)[N][4], const float* a, const float4* b, int g, int t) {
  constexpr int P = kRowPitch<DMax>;
#pragma unroll
  for (int k0 = 0; k0 < DMax; k0 += 8) {
    const float2 top = *reinterpret_cast<const float2*>(a + g * P + k0 + 2 * t);
    const float2 bottom = *reinterpret_cast<const float2*>(a + (g + 8) * P + k0 + 2 * t);
    const float af[4] = {top.x, bottom.x, top.y, bottom.y};
    const SplitFragment<4> as = split_tf32(af);
#pragma unroll
    for (int n = 0; n < N; ++n)
      mma_3xtf32(acc[n], as, b_fragment(b[swizzled(8 * n + g, kPairPitch<DMax>, k0 / 2 + t)]));
  }
}

// acc (16 x DMax) += S V: S (16 x 8KB) the warp's accumulator values `s`, V the
// tile's 8KB rows at `v`, split by row pairs.
template <int KB, int DMax>
__device__ __forceinline__ void scores_times_columns(float (&acc)[DMax / 8][4], const float (&s)[KB][4],
                                                     const float4* v, int g, int t) {
#pragma unroll
  for (int kb = 0; kb < KB; ++kb) {
    const float af[4] = {s[kb][0], s[kb][2], s[kb][1], s[kb][3]};
    const SplitFragment<4> as = split_tf32(af);
#pragma unroll
    for (int n = 0; n < DMax / 8; ++n)
      mma_3xtf32(acc[n], as, b_fragment(v[swizzled(8 * n + g, kColumnPitch<8 * KB>, 4 * kb + t)]));
  }
}

// Writes the warp's 16 x DMax accumulator rows to rows [w0, w0 + 16) of `dst`
// (row i at dst + i * row_stride), those below `rows` and columns below D, the
// values of rows g and g + 8 times factor[0] and factor[1].
template <int DMax>
__device__ __forceinline__ void store_rows(float* dst, std::int64_t row_stride, const float (&acc)[DMax / 8][4],
                                           std::int64_t w0, std::int64_t rows, std::int64_t D, int g, int t,
                                           const float (&factor)[2]) {
  store_accumulator_rows<DMax>(acc, w0, rows, D, g, t, factor,
                               [&](std::int64_t i, int d, float x) { dst[i * row_stride + d] = x; });
}

// ---- forward -----------------------------------------------------------------------------------

template <int DMax>
constexpr std::size_t forward_smem() {
  return raw_bytes<DMax>(kBlockRows) + pairs_bytes<DMax>(kForwardTile) + columns_bytes<DMax, kForwardTile>();
}

template <int DMax>
__global__ void __launch_bounds__(kBlockThreads)
    attention_forward_tc_kernel(AttentionProblem p, float* out, std::int64_t out_sb, std::int64_t out_sh,
                                std::int64_t out_st, float* lse) {
  constexpr int P = kRowPitch<DMax>, NC = kForwardTile / 8, ND = DMax / 8;
  float* qs = dynamic_shared_memory<float>();                   // (64, P): the block's queries, times scale
  float4* ks = reinterpret_cast<float4*>(qs + kBlockRows * P);  // key tile, by column pairs
  float4* vs = ks + kForwardTile * kPairPitch<DMax>;            // value tile, by row pairs
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * kBlockRows, w0 = i0 + warp * kWarpRows;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    __syncthreads();  // the previous (b, h) is done with shared memory
    load_rows<DMax, kBlockThreads>(qs, P, p.q, b, h, i0, kBlockRows, p.Tq, p.D, p.scale);

    float o[ND][4] = {};  // running sum of p v, rows g and g + 8
    RunningSoftmax run;   // of the same rows

    // Causal: keys past the block's last query are hidden from every row.
    const std::int64_t key_end = p.causal ? min(p.Tk, i0 + kBlockRows) : p.Tk;
    for (std::int64_t j0 = 0; j0 < key_end; j0 += kForwardTile) {
      __syncthreads();  // everyone is done with the previous tile
      load_pairs<DMax, kForwardTile>(ks, p.k, b, h, j0, p.Tk, p.D);
      load_columns<DMax, kForwardTile>(vs, p.v, b, h, j0, p.Tk, p.D);
      __syncthreads();

      float s[NC][4] = {};  // scale q_i . k_j
      rows_times_rows<NC, DMax>(s, qs + warp * kWarpRows * P, ks, g, t);
      online_softmax_tile<NC, ND>(s, o, run, p, b, h, w0, j0, g, t);
      scores_times_columns<NC, DMax>(o, s, vs, g, t);  // o_i += sum_j p_ij v_j
    }

    float inv[2];
    finish_softmax(run, p, bh, w0, g, t, lse, inv);
    store_rows<DMax>(out + b * out_sb + h * out_sh, out_st, o, w0, p.Tq, p.D, g, t, inv);
  }
}

// ---- backward ----------------------------------------------------------------------------------

template <int DMax>
constexpr std::size_t dq_smem() {
  return 2 * raw_bytes<DMax>(kBlockRows) + 2 * pairs_bytes<DMax>(kBackwardTile) + columns_bytes<DMax, kBackwardTile>();
}

// A block owns queries [i0, i0 + 64) of one (b, h) and sweeps the key tiles:
// dq_i += sum_j scale dS_ij k_j.
template <int DMax>
__global__ void __launch_bounds__(kBlockThreads)
    attention_dq_tc_kernel(AttentionProblem p, AttentionRows dout, const float* lse, const float* delta, float* dq) {
  constexpr int P = kRowPitch<DMax>, NC = kBackwardTile / 8, ND = DMax / 8;
  float* qs = dynamic_shared_memory<float>();                    // (64, P): the block's queries, times scale
  float* dos = qs + kBlockRows * P;                              // (64, P): their output gradients
  float4* ks = reinterpret_cast<float4*>(dos + kBlockRows * P);  // key tile, by column pairs (for s)
  float4* vs = ks + kBackwardTile * kPairPitch<DMax>;            // value tile, by column pairs (for dP)
  float4* kc = vs + kBackwardTile * kPairPitch<DMax>;            // the key tile again, by row pairs (for dq)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * kBlockRows, w0 = i0 + warp * kWarpRows;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    __syncthreads();
    load_rows<DMax, kBlockThreads>(qs, P, p.q, b, h, i0, kBlockRows, p.Tq, p.D, p.scale);
    load_rows<DMax, kBlockThreads>(dos, P, dout, b, h, i0, kBlockRows, p.Tq, p.D);
    const RowTerms terms = row_terms(p, lse, delta, bh, w0, g);
    float dq_acc[ND][4] = {};

    const std::int64_t key_end = p.causal ? min(p.Tk, i0 + kBlockRows) : p.Tk;
    for (std::int64_t j0 = 0; j0 < key_end; j0 += kBackwardTile) {
      __syncthreads();
      load_pairs<DMax, kBackwardTile>(ks, p.k, b, h, j0, p.Tk, p.D);
      load_pairs<DMax, kBackwardTile>(vs, p.v, b, h, j0, p.Tk, p.D);
      load_columns<DMax, kBackwardTile>(kc, p.k, b, h, j0, p.Tk, p.D);
      __syncthreads();

      float s[NC][4] = {}, dpv[NC][4] = {};  // scale q_i . k_j and do_i . v_j
      rows_times_rows<NC, DMax>(s, qs + warp * kWarpRows * P, ks, g, t);
      rows_times_rows<NC, DMax>(dpv, dos + warp * kWarpRows * P, vs, g, t);
      scores_to_ds<NC>(s, dpv, p, b, h, w0, j0, g, t, terms, 1.0f);  // the queries were scaled as loaded
      scores_times_columns<NC, DMax>(dq_acc, s, kc, g, t);
    }

    store_rows<DMax>(dq + bh * p.Tq * p.D, p.D, dq_acc, w0, p.Tq, p.D, g, t, {1.0f, 1.0f});
  }
}

template <int DMax>
constexpr std::size_t dkdv_smem() {
  return 2 * raw_bytes<DMax>(kBlockRows) + 2 * pairs_bytes<DMax>(kBackwardTile) +
         2 * columns_bytes<DMax, kBackwardTile>() + sizeof(float) * 2 * kBackwardTile;
}

// A block owns keys [j0, j0 + 64) of one (b, h) and sweeps the query tiles:
// dv_j += sum_i P Z do_i and dk_j += sum_i scale dS q_i. The warp's scores are
// transposed here (its 16 keys by the tile's queries), so they are the A
// operand of both sums as they stand.
template <int DMax>
__global__ void __launch_bounds__(kBlockThreads)
    attention_dkdv_tc_kernel(AttentionProblem p, AttentionRows dout, const float* lse, const float* delta, float* dk,
                             float* dv) {
  constexpr int P = kRowPitch<DMax>, NC = kBackwardTile / 8, ND = DMax / 8;
  float* ks = dynamic_shared_memory<float>();                   // (64, P): the block's keys
  float* vs = ks + kBlockRows * P;                              // (64, P): and values
  float4* qs = reinterpret_cast<float4*>(vs + kBlockRows * P);  // query tile, by column pairs (not scaled)
  float4* dos = qs + kBackwardTile * kPairPitch<DMax>;          // its output gradients, by column pairs
  float4* qc = dos + kBackwardTile * kPairPitch<DMax>;          // the query tile by row pairs (for dk)
  float4* doc = qc + DMax * kColumnPitch<kBackwardTile>;        // the gradients by row pairs (for dv)
  float* lse_s = reinterpret_cast<float*>(doc + DMax * kColumnPitch<kBackwardTile>);  // (32)
  float* delta_s = lse_s + kBackwardTile;                                             // (32)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const std::int64_t j0 = std::int64_t(blockIdx.x) * kBlockRows, w0 = j0 + warp * kWarpRows;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    __syncthreads();
    load_rows<DMax, kBlockThreads>(ks, P, p.k, b, h, j0, kBlockRows, p.Tk, p.D);
    load_rows<DMax, kBlockThreads>(vs, P, p.v, b, h, j0, kBlockRows, p.Tk, p.D);
    float dk_acc[ND][4] = {}, dv_acc[ND][4] = {};

    // Causal: queries before j0 see none of these keys.
    const std::int64_t q_begin = p.causal ? j0 / kBackwardTile * kBackwardTile : 0;
    for (std::int64_t q0 = q_begin; q0 < p.Tq; q0 += kBackwardTile) {
      __syncthreads();
      load_pairs<DMax, kBackwardTile>(qs, p.q, b, h, q0, p.Tq, p.D);
      load_pairs<DMax, kBackwardTile>(dos, dout, b, h, q0, p.Tq, p.D);
      load_columns<DMax, kBackwardTile>(qc, p.q, b, h, q0, p.Tq, p.D);
      load_columns<DMax, kBackwardTile>(doc, dout, b, h, q0, p.Tq, p.D);
      load_query_terms(lse_s, delta_s, p, lse, delta, bh, q0, kBackwardTile);
      __syncthreads();

      float s[NC][4] = {}, dpv[NC][4] = {};  // q_i . k_j and do_i . v_j, by key (row) and query (column)
      rows_times_rows<NC, DMax>(s, ks + warp * kWarpRows * P, qs, g, t);
      rows_times_rows<NC, DMax>(dpv, vs + warp * kWarpRows * P, dos, g, t);
      transposed_pair_grads<NC>(s, dpv, p, b, h, q0, w0, g, t, lse_s, delta_s);
      scores_times_columns<NC, DMax>(dv_acc, s, doc, g, t);
      scores_times_columns<NC, DMax>(dk_acc, dpv, qc, g, t);
    }

    store_rows<DMax>(dk + bh * p.Tk * p.D, p.D, dk_acc, w0, p.Tk, p.D, g, t, {1.0f, 1.0f});
    store_rows<DMax>(dv + bh * p.Tk * p.D, p.D, dv_acc, w0, p.Tk, p.D, g, t, {1.0f, 1.0f});
  }
}

}  // namespace

void attention_forward_tensor_core(const AttentionProblem& p, float* out, std::int64_t out_sb, std::int64_t out_sh,
                                   std::int64_t out_st, float* lse, cudaStream_t stream) {
  if (attention_forward_tf32_flash(p, {out, out_sb, out_sh, out_st}, lse, stream)) return;
  with_head_dim(p.D, [&](auto dmax) {
    constexpr int DMax = decltype(dmax)::value;
    constexpr std::size_t smem = forward_smem<DMax>();
    allow_shared_memory(attention_forward_tc_kernel<DMax>, smem);
    launch(attention_forward_tc_kernel<DMax>, grid_over(p.Tq, kBlockRows, p.B, p.H), kBlockThreads, smem, stream, p,
           out, out_sb, out_sh, out_st, lse);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_backward_tensor_core(const AttentionProblem& p, AttentionRows dout, const float* lse, const float* delta,
                                    float* dq, float* dk, float* dv, cudaStream_t stream) {
  if (attention_backward_tf32_flash(p, dout, lse, delta, dq, dk, dv, stream)) return;
  with_head_dim(p.D, [&](auto dmax) {
    constexpr int DMax = decltype(dmax)::value;
    constexpr std::size_t kv_smem = dkdv_smem<DMax>(), q_smem = dq_smem<DMax>();
    allow_shared_memory(attention_dkdv_tc_kernel<DMax>, kv_smem);
    launch(attention_dkdv_tc_kernel<DMax>, grid_over(p.Tk, kBlockRows, p.B, p.H), kBlockThreads, kv_smem, stream, p,
           dout, lse, delta, dk, dv);
    CUDA_CHECK_LAUNCH();
    allow_shared_memory(attention_dq_tc_kernel<DMax>, q_smem);
    launch(attention_dq_tc_kernel<DMax>, grid_over(p.Tq, kBlockRows, p.B, p.H), kBlockThreads, q_smem, stream, p, dout,
           lse, delta, dq);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attograd::cuda::attention_detail

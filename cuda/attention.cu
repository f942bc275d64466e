// Fused attention, flash-attention style (Dao et al. 2022; the backward in
// FlashAttention-2's order), float32: softmax(scale q k^T, hiding masked keys)
// (with dropout) @ v, computed tile by tile with an online softmax, so no
// (Tq, Tk) matrix ever exists in device memory unless the weights are asked
// for. The forward saves one log-sum-exp per query row; the backward
// recomputes the probabilities from it. The math, masking, dropout stream and
// the all-hidden-row convention are cpu/attention/'s; read those files
// first, this one adds only the GPU's division of work:
//
//  - forward: a block of 4 warps owns 16 query rows of one (b, h), each warp 4
//    rows. Key and value tiles of 32 rows pass through shared memory; lane j
//    scores key j against the warp's 4 queries, the row max and sum are warp
//    shuffles, and each lane accumulates the output dims d = lane + 32 t.
//  - backward: delta_i = do_i . o_i first; then one kernel owns 16 keys per
//    block and sweeps the query tiles (accumulating dk, dv), another owns 16
//    queries and sweeps the key tiles (accumulating dq). Each recomputes the
//    probabilities; neither needs atomics, so results are deterministic and
//    racecheck has nothing to report.
// Causal tiles that are entirely hidden are never visited. Head dims up to
// 128 are supported (kernels templated on the next of 32, 64, 128).
// attention_tensor_core.cu does the same on the tensor cores; which set runs is
// kernel_set(KernelOp::attention) (cuda/runtime.h), asked at the bottom of this file.
#include <cstdint>

#include "cuda/attention_common.cuh"
#include "cuda/buffer.h"
#include "cuda/runtime.h"

namespace attograd::cuda {
namespace {

using namespace attention_detail;

constexpr int kWarps = 4;
constexpr int kBlockThreads = kWarps * kWarp;
constexpr int kRows = 4;                   // query (or key) rows per warp
constexpr int kBlockRows = kWarps * kRows; // 16 rows owned by a block
constexpr int kTile = 32;                  // rows per streamed tile: one per lane

// ---- forward -----------------------------------------------------------------------------------

template <int DMax>
constexpr std::size_t forward_smem() {
  return sizeof(float) * (kBlockRows * DMax + kTile * (DMax + 1) + kTile * DMax);
}

template <int DMax>
__global__ void __launch_bounds__(kBlockThreads)
    attention_forward_kernel(AttentionProblem p, float* out, std::int64_t out_sb, std::int64_t out_sh,
                             std::int64_t out_st, float* lse) {
  constexpr int kPerLane = DMax / kWarp;
  float* smem = dynamic_shared_memory<float>();
  float* qs = smem;                       // (16, DMax): the block's queries, times scale
  float* ks = qs + kBlockRows * DMax;     // (32, DMax + 1): padded, lane j reads row j
  float* vs = ks + kTile * (DMax + 1);    // (32, DMax)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * kBlockRows;
  const float neg_inf = -INFINITY;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    __syncthreads();  // the previous (b, h) is done with shared memory
    load_rows<DMax, kBlockThreads>(qs, DMax, p.q, b, h, i0, kBlockRows, p.Tq, p.D, p.scale);

    float o[kRows][kPerLane] = {};  // running sum of p v over the keys so far, rows of this warp
    float m[kRows], l[kRows];       // running max and running sum of exp(s - m)
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) m[rr] = neg_inf, l[rr] = 0.0f;

    // Causal: keys past the block's last query are hidden from every row.
    const std::int64_t key_end = p.causal ? min(p.Tk, i0 + kBlockRows) : p.Tk;
    for (std::int64_t j0 = 0; j0 < key_end; j0 += kTile) {
      __syncthreads();  // everyone is done with the previous tile
      load_rows<DMax, kBlockThreads>(ks, DMax + 1, p.k, b, h, j0, kTile, p.Tk, p.D);
      load_rows<DMax, kBlockThreads>(vs, DMax, p.v, b, h, j0, kTile, p.Tk, p.D);
      __syncthreads();

      // s[rr] = scale q_i . k_j for this lane's key j and the warp's rows i.
      float s[kRows] = {};
      const float* kj = ks + lane * (DMax + 1);
      for (int d = 0; d < p.D; ++d) {
        const float kd = kj[d];
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr) s[rr] += qs[(warp * kRows + rr) * DMax + d] * kd;
      }
      const std::int64_t j = j0 + lane;
      float pd[kRows];  // this lane's weight for each row, after dropout
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const std::int64_t i = i0 + warp * kRows + rr;
        const float sv = p.hidden(b, h, i, j) ? neg_inf : s[rr];
        // NaN-propagating, so every lane gets the same m_new (the branch below and the shuffles after
        // it need the whole warp), and a NaN score makes the row NaN, as on the CPU, instead of the
        // zeros of a row that sees no key.
        const float m_new = NanMaxOp{}(m[rr], warp_reduce(sv, NanMaxOp{}));
        pd[rr] = 0.0f;
        if (m_new == neg_inf) continue;  // nothing visible to this row yet (warp-uniform)
        const float correction = expf(m[rr] - m_new);  // 0 while m was -inf
        const float e = expf(sv - m_new);              // 0 for hidden keys
        l[rr] = l[rr] * correction + warp_reduce(e, SumOp{});
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) o[rr][t] *= correction;
        m[rr] = m_new;
        pd[rr] = p.dropout() && e != 0.0f ? e * p.dropout_factor(b, h, i, j) : e;
      }
      // o_i += sum_j p_ij v_j: key j's weight comes from lane j by shuffle.
      for (int jj = 0; jj < kTile; ++jj) {
        float vj[kPerLane];
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) vj[t] = vs[jj * DMax + lane + kWarp * t];
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr) {
          const float w = __shfl_sync(kFullMask, pd[rr], jj);
#pragma unroll
          for (int t = 0; t < kPerLane; ++t) o[rr][t] += w * vj[t];
        }
      }
    }

#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const std::int64_t i = i0 + warp * kRows + rr;
      if (i >= p.Tq) continue;
      float* orow = out + b * out_sb + h * out_sh + i * out_st;
      const bool none_visible = l[rr] == 0.0f;  // every key hidden: zeros, not 0/0
      const float inv = none_visible ? 0.0f : 1.0f / l[rr];
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int d = lane + kWarp * t;
        if (d < p.D) orow[d] = o[rr][t] * inv;
      }
      if (lane == 0) lse[bh * p.Tq + i] = none_visible ? neg_inf : m[rr] + logf(l[rr]);
    }
  }
}

// The softmax weights, recomputed from the log-sum-exp: w_ij = exp(s_ij - lse_i),
// zero where hidden and on rows with every key hidden. A block per query row.
__global__ void attention_weights_kernel(AttentionProblem p, const float* lse, float* weights) {
  const std::int64_t rows = p.B * p.H * p.Tq;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t bh = row / p.Tq, i = row % p.Tq, b = bh / p.H, h = bh % p.H;
    const float l = lse[row];
    const float* qi = p.q.row(b, h, i);
    for (std::int64_t j = threadIdx.x; j < p.Tk; j += blockDim.x) {
      float w = 0.0f;
      if (l != -INFINITY && !p.hidden(b, h, i, j)) {
        const float* kj = p.k.row(b, h, j);
        float s = 0.0f;
        for (int d = 0; d < p.D; ++d) s += qi[d] * p.scale * kj[d];
        w = expf(s - l);
      }
      weights[row * p.Tk + j] = w;
    }
  }
}

// ---- backward ----------------------------------------------------------------------------------

template <int DMax>
constexpr std::size_t dkdv_smem() {
  return sizeof(float) * (2 * kTile * (DMax + 1) + 2 * kBlockRows * DMax + 2 * kTile);
}

// A block owns keys [j0, j0 + 16) of one (b, h) and sweeps the query tiles.
template <int DMax>
__global__ void __launch_bounds__(kBlockThreads)
    attention_dkdv_kernel(AttentionProblem p, AttentionRows dout, const float* lse, const float* delta, float* dk,
                          float* dv) {
  constexpr int kPerLane = DMax / kWarp;
  float* smem = dynamic_shared_memory<float>();
  float* qs = smem;                        // (32, DMax + 1): query tile, lane i reads row i
  float* dos = qs + kTile * (DMax + 1);    // (32, DMax + 1): its output gradients
  float* ks = dos + kTile * (DMax + 1);    // (16, DMax): the block's keys
  float* vs = ks + kBlockRows * DMax;      // (16, DMax): and values
  float* lse_s = vs + kBlockRows * DMax;   // (32)
  float* delta_s = lse_s + kTile;          // (32)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const std::int64_t j0 = std::int64_t(blockIdx.x) * kBlockRows;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    __syncthreads();
    load_rows<DMax, kBlockThreads>(ks, DMax, p.k, b, h, j0, kBlockRows, p.Tk, p.D);
    load_rows<DMax, kBlockThreads>(vs, DMax, p.v, b, h, j0, kBlockRows, p.Tk, p.D);
    float dk_acc[kRows][kPerLane] = {}, dv_acc[kRows][kPerLane] = {};

    // Causal: queries before j0 see none of these keys.
    const std::int64_t q_begin = p.causal ? j0 / kTile * kTile : 0;
    for (std::int64_t q0 = q_begin; q0 < p.Tq; q0 += kTile) {
      __syncthreads();
      load_rows<DMax, kBlockThreads>(qs, DMax + 1, p.q, b, h, q0, kTile, p.Tq, p.D);
      load_rows<DMax, kBlockThreads>(dos, DMax + 1, dout, b, h, q0, kTile, p.Tq, p.D);
      load_query_terms(lse_s, delta_s, p, lse, delta, bh, q0, kTile);
      __syncthreads();

      const std::int64_t i = q0 + lane;  // this lane's query
      float s[kRows] = {}, dpv[kRows] = {};
      const float *qi = qs + lane * (DMax + 1), *gi = dos + lane * (DMax + 1);
      for (int d = 0; d < p.D; ++d) {
        const float qd = qi[d] * p.scale, gd = gi[d];
#pragma unroll
        for (int kk = 0; kk < kRows; ++kk) {
          s[kk] += qd * ks[(warp * kRows + kk) * DMax + d];
          dpv[kk] += gd * vs[(warp * kRows + kk) * DMax + d];
        }
      }
      PairGrads g[kRows];
#pragma unroll
      for (int kk = 0; kk < kRows; ++kk)
        g[kk] = pair_grads(p, b, h, i, j0 + warp * kRows + kk, s[kk], dpv[kk], lse_s[lane], delta_s[lane]);

      // dv_j += sum_i P Z do_i, dk_j += sum_i scale dS q_i: query i's factors come from lane i.
      for (int ii = 0; ii < kTile; ++ii) {
        float gv[kPerLane], qv[kPerLane];
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) {
          gv[t] = dos[ii * (DMax + 1) + lane + kWarp * t];
          qv[t] = qs[ii * (DMax + 1) + lane + kWarp * t];
        }
#pragma unroll
        for (int kk = 0; kk < kRows; ++kk) {
          const float pz = __shfl_sync(kFullMask, g[kk].pz, ii), ds = __shfl_sync(kFullMask, g[kk].ds, ii);
#pragma unroll
          for (int t = 0; t < kPerLane; ++t) {
            dv_acc[kk][t] += pz * gv[t];
            dk_acc[kk][t] += ds * qv[t];
          }
        }
      }
    }

#pragma unroll
    for (int kk = 0; kk < kRows; ++kk) {
      const std::int64_t j = j0 + warp * kRows + kk;
      if (j >= p.Tk) continue;
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int d = lane + kWarp * t;
        if (d >= p.D) continue;
        dk[(bh * p.Tk + j) * p.D + d] = dk_acc[kk][t];
        dv[(bh * p.Tk + j) * p.D + d] = dv_acc[kk][t];
      }
    }
  }
}

template <int DMax>
constexpr std::size_t dq_smem() {
  return sizeof(float) * (2 * kTile * (DMax + 1) + 2 * kBlockRows * DMax);
}

// A block owns queries [i0, i0 + 16) of one (b, h) and sweeps the key tiles.
template <int DMax>
__global__ void __launch_bounds__(kBlockThreads)
    attention_dq_kernel(AttentionProblem p, AttentionRows dout, const float* lse, const float* delta, float* dq) {
  constexpr int kPerLane = DMax / kWarp;
  float* smem = dynamic_shared_memory<float>();
  float* ks = smem;                        // (32, DMax + 1): key tile, lane j reads row j
  float* vs = ks + kTile * (DMax + 1);     // (32, DMax + 1)
  float* qs = vs + kTile * (DMax + 1);     // (16, DMax): the block's queries, times scale
  float* dos = qs + kBlockRows * DMax;     // (16, DMax): their output gradients
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * kBlockRows;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    __syncthreads();
    load_rows<DMax, kBlockThreads>(qs, DMax, p.q, b, h, i0, kBlockRows, p.Tq, p.D, p.scale);
    load_rows<DMax, kBlockThreads>(dos, DMax, dout, b, h, i0, kBlockRows, p.Tq, p.D);
    float lse_r[kRows], delta_r[kRows];
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const std::int64_t i = i0 + warp * kRows + rr;
      lse_r[rr] = i < p.Tq ? lse[bh * p.Tq + i] : -INFINITY;
      delta_r[rr] = i < p.Tq ? delta[bh * p.Tq + i] : 0.0f;
    }
    float dq_acc[kRows][kPerLane] = {};

    const std::int64_t key_end = p.causal ? min(p.Tk, i0 + kBlockRows) : p.Tk;
    for (std::int64_t j0 = 0; j0 < key_end; j0 += kTile) {
      __syncthreads();
      load_rows<DMax, kBlockThreads>(ks, DMax + 1, p.k, b, h, j0, kTile, p.Tk, p.D);
      load_rows<DMax, kBlockThreads>(vs, DMax + 1, p.v, b, h, j0, kTile, p.Tk, p.D);
      __syncthreads();

      const std::int64_t j = j0 + lane;  // this lane's key
      float s[kRows] = {}, dpv[kRows] = {};
      const float *kj = ks + lane * (DMax + 1), *vj = vs + lane * (DMax + 1);
      for (int d = 0; d < p.D; ++d) {
        const float kd = kj[d], vd = vj[d];
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr) {
          s[rr] += qs[(warp * kRows + rr) * DMax + d] * kd;
          dpv[rr] += dos[(warp * kRows + rr) * DMax + d] * vd;
        }
      }
      float ds[kRows];
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr)
        ds[rr] = pair_grads(p, b, h, i0 + warp * kRows + rr, j, s[rr], dpv[rr], lse_r[rr], delta_r[rr]).ds;

      // dq_i += sum_j scale dS_ij k_j: key j's factor comes from lane j.
      for (int jj = 0; jj < kTile; ++jj) {
        float kv[kPerLane];
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) kv[t] = ks[jj * (DMax + 1) + lane + kWarp * t];
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr) {
          const float c = __shfl_sync(kFullMask, ds[rr], jj);
#pragma unroll
          for (int t = 0; t < kPerLane; ++t) dq_acc[rr][t] += c * kv[t];
        }
      }
    }

#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const std::int64_t i = i0 + warp * kRows + rr;
      if (i >= p.Tq) continue;
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int d = lane + kWarp * t;
        if (d < p.D) dq[(bh * p.Tq + i) * p.D + d] = dq_acc[rr][t];
      }
    }
  }
}

// ---- choosing the kernels (kernel_set, cuda/runtime.h) and launching ------------------------

bool on_tensor_cores() { return kernel_set(KernelOp::attention) == KernelSet::tensor_core; }

}  // namespace

void attention_forward(const AttentionProblem& p, float* out, std::int64_t out_sb, std::int64_t out_sh,
                       std::int64_t out_st, float* lse, float* weights, cudaStream_t stream) {
  if (p.B * p.H * p.Tq == 0) return;
  if (on_tensor_cores())
    attention_forward_tensor_core(p, out, out_sb, out_sh, out_st, lse, stream);
  else
    with_head_dim(p.D, [&](auto dmax) {
      constexpr int DMax = decltype(dmax)::value;
      constexpr std::size_t smem = forward_smem<DMax>();
      allow_shared_memory(attention_forward_kernel<DMax>, smem);
      launch(attention_forward_kernel<DMax>, grid_over(p.Tq, kBlockRows, p.B, p.H), kBlockThreads, smem, stream, p, out,
             out_sb, out_sh, out_st, lse);
      CUDA_CHECK_LAUNCH();
    });
  if (weights) {
    const std::int64_t rows = p.B * p.H * p.Tq;
    launch(attention_weights_kernel, static_cast<unsigned>(std::min<std::int64_t>(rows, 65535)), kBlockThreads, 0,
           stream, p, lse, weights);
    CUDA_CHECK_LAUNCH();
  }
}

void attention_backward(const AttentionProblem& p, AttentionRows dout, AttentionRows out, const float* lse, float* dq,
                        float* dk, float* dv, cudaStream_t stream) {
  const std::int64_t rows = p.B * p.H * p.Tq;
  if (p.B * p.H == 0) return;
  if (p.Tq == 0 || p.Tk == 0) {  // nothing attends: every gradient is zero
    CUDA_CHECK(cudaMemsetAsync(dk, 0, sizeof(float) * p.B * p.H * p.Tk * p.D, stream));
    CUDA_CHECK(cudaMemsetAsync(dv, 0, sizeof(float) * p.B * p.H * p.Tk * p.D, stream));
    CUDA_CHECK(cudaMemsetAsync(dq, 0, sizeof(float) * rows * p.D, stream));
    return;
  }
  DeviceBuffer delta(sizeof(float) * rows);  // (B, H, Tq)
  launch_delta(p, dout, out, delta.as<float>(), stream);
  if (on_tensor_cores())
    return attention_backward_tensor_core(p, dout, lse, delta.as<const float>(), dq, dk, dv, stream);
  with_head_dim(p.D, [&](auto dmax) {
    constexpr int DMax = decltype(dmax)::value;
    constexpr std::size_t kv_smem = dkdv_smem<DMax>(), q_smem = dq_smem<DMax>();
    allow_shared_memory(attention_dkdv_kernel<DMax>, kv_smem);
    launch(attention_dkdv_kernel<DMax>, grid_over(p.Tk, kBlockRows, p.B, p.H), kBlockThreads, kv_smem, stream, p, dout,
           lse, delta.as<const float>(), dk, dv);
    CUDA_CHECK_LAUNCH();
    allow_shared_memory(attention_dq_kernel<DMax>, q_smem);
    launch(attention_dq_kernel<DMax>, grid_over(p.Tq, kBlockRows, p.B, p.H), kBlockThreads, q_smem, stream, p, dout,
           lse, delta.as<const float>(), dq);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attograd::cuda

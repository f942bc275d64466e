#pragma once
// What the two sets of fused attention kernels share (cuda/attention.cu, SIMT
// float32; cuda/attention_tensor_core.cu, mma.sync) beyond the problem itself
// (base/attention_problem.h: rows, which keys a query sees, the dropout
// factor of each weight): loading rows into shared memory, the gradients of
// one (query, key) pair, and the launch plumbing. The math is
// cpu/attention/'s. Included by those two files only.
#include <cstdint>
#include <type_traits>

#include "base/error.h"
#include "cuda/device_utils.cuh"
#include "cuda/launchers.h"
#include "cuda/runtime.h"

namespace attograd::cuda::attention_detail {

// The block's Threads threads copy rows [t0, t0 + count) of (b, h) into shared
// memory with row pitch `pitch`, zero beyond the tensor's rows and beyond D,
// and multiplied by `factor`.
template <int DMax, int Threads>
__device__ __forceinline__ void load_rows(float* dst, int pitch, const AttentionRows& x, std::int64_t b, std::int64_t h,
                                          std::int64_t t0, int count, std::int64_t T, std::int64_t D,
                                          float factor = 1.0f) {
  for (int e = threadIdx.x; e < count * DMax; e += Threads) {
    const int r = e / DMax, d = e % DMax;
    dst[r * pitch + d] = t0 + r < T && d < D ? x.row(b, h, t0 + r)[d] * factor : 0.0f;
  }
}

// With P = exp(s - lse) recomputed and Z the dropout factors:
//   forward: o_i = sum_j P_ij Z_ij v_j
//   so  dv_j += P_ij Z_ij do_i;  dP_ij = Z_ij (do_i . v_j);
//       dS_ij = P_ij (dP_ij - delta_i);  dq_i += scale dS_ij k_j;  dk_j += scale dS_ij q_i.
// pair_grads gives, for one pair with score s (scale included) and dpv = do_i . v_j,
// the probability P Z and the scaled dS.
struct PairGrads {
  float pz, ds;  // P_ij Z_ij and scale * dS_ij
};
__device__ __forceinline__ PairGrads pair_grads(const AttentionProblem& p, std::int64_t b, std::int64_t h,
                                                std::int64_t i, std::int64_t j, float s, float dpv, float lse_i,
                                                float delta_i) {
  if (lse_i == -INFINITY || p.hidden(b, h, i, j)) return {0.0f, 0.0f};  // every key hidden, or this one
  const float prob = expf(s - lse_i);
  const float z = p.dropout() && prob != 0.0f ? p.dropout_factor(b, h, i, j) : 1.0f;
  return {prob * z, p.scale * prob * (dpv * z - delta_i)};
}

// delta_i = do_i . o_i = sum_j P_ij dP_ij (B, H, Tq), in float32 from rows of T: a warp per row.
template <typename T>
__global__ void attention_delta_kernel(AttentionProblem p, ::attograd::AttentionRows<const T> dout,
                                       ::attograd::AttentionRows<const T> out, float* delta) {
  const std::int64_t rows = p.B * p.H * p.Tq;
  const int lane = threadIdx.x % kWarp;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (std::int64_t row = global_thread() / kWarp; row < rows; row += warps) {
    const std::int64_t bh = row / p.Tq, i = row % p.Tq, b = bh / p.H, h = bh % p.H;
    const T *g = dout.row(b, h, i), *o = out.row(b, h, i);
    float acc = 0.0f;
    for (std::int64_t d = lane; d < p.D; d += kWarp) acc += static_cast<float>(g[d]) * static_cast<float>(o[d]);
    acc = warp_reduce(acc, SumOp{});
    if (lane == 0) delta[row] = acc;
  }
}

// The backward's terms of queries [q0, q0 + count) of (b, h) = bh into
// shared memory, a thread each: their lse and delta, -inf and 0 past Tq.
__device__ __forceinline__ void load_query_terms(float* lse_s, float* delta_s, const AttentionProblem& p,
                                                 const float* lse, const float* delta, std::int64_t bh,
                                                 std::int64_t q0, int count) {
  if (static_cast<int>(threadIdx.x) >= count) return;
  const std::int64_t i = q0 + threadIdx.x;
  lse_s[threadIdx.x] = i < p.Tq ? lse[bh * p.Tq + i] : -INFINITY;
  delta_s[threadIdx.x] = i < p.Tq ? delta[bh * p.Tq + i] : 0.0f;
}

// ---- launching --------------------------------------------------------------------------------

// Kernels over (blocks of BlockRows rows, B * H): grid.y is capped and the kernels loop over the rest.
inline dim3 grid_over(std::int64_t rows, int block_rows, std::int64_t B, std::int64_t H) {
  const std::int64_t blocks = (rows + block_rows - 1) / block_rows;
  AG_CHECK(blocks <= 0x7fffffff, "attention", "sequence of {} rows is too long for the CUDA kernels", rows);
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(std::min<std::int64_t>(B * H, 65535)));
}

template <typename T>
void launch_delta(const AttentionProblem& p, ::attograd::AttentionRows<const T> dout,
                  ::attograd::AttentionRows<const T> out, float* delta, cudaStream_t stream) {
  launch(attention_delta_kernel<T>, grid_for(p.B * p.H * p.Tq * kWarp), kThreads, 0, stream, p, dout, out, delta);
  CUDA_CHECK_LAUNCH();
}

// Calls fn(std::integral_constant<int, DMax>{}) for the smallest supported DMax >= D.
template <typename Fn>
void with_head_dim(std::int64_t D, Fn fn) {
  if (D <= 32) return fn(std::integral_constant<int, 32>{});
  if (D <= 64) return fn(std::integral_constant<int, 64>{});
  if (D <= kAttentionMaxHeadDim) return fn(std::integral_constant<int, 128>{});
  fail("attention", "head dim {} is above the CUDA kernels' maximum of {}", D, kAttentionMaxHeadDim);
}

// The tensor-core kernels (cuda/attention_tensor_core.cu), launched by
// attention.cu's entry points when they are the chosen set. Same arguments;
// the backward takes delta (B, H, Tq) already computed.
void attention_forward_tensor_core(const AttentionProblem& p, float* out, std::int64_t out_sb, std::int64_t out_sh,
                                   std::int64_t out_st, float* lse, cudaStream_t stream);
void attention_backward_tensor_core(const AttentionProblem& p, AttentionRows dout, const float* lse, const float* delta,
                                    float* dq, float* dk, float* dv, cudaStream_t stream);

// The float32 forward in FlashAttention-2's shape, in 3xTF32
// (cuda/attention_tf32_flash.cu), launched by attention_forward_tensor_core
// for the problems it takes: false, having launched nothing, for the others.
bool attention_forward_tf32_flash(const AttentionProblem& p, ::attograd::AttentionRows<float> out, float* lse,
                                  cudaStream_t stream);
// Its backward (cuda/attention_tf32_flash_backward.cu), launched by
// attention_backward_tensor_core once delta is made: false, having launched
// nothing, for the problems it does not take. dq, dk and dv are contiguous.
bool attention_backward_tf32_flash(const AttentionProblem& p, AttentionRows dout, const float* lse, const float* delta,
                                   float* dq, float* dk, float* dv, cudaStream_t stream);
// The bfloat16 forward in FlashAttention-2's shape (cuda/attention_bf16_flash.cu),
// launched by attention_forward_bf16 for the problems it takes: false, having
// launched nothing, for the others.
bool attention_forward_bf16_flash(const AttentionProblem& p, const Bf16AttentionOperands& x, Bf16AttentionOutput out,
                                  float* lse, cudaStream_t stream);
// Its backward (cuda/attention_bf16_flash_backward.cu), launched by
// attention_backward_bf16 once delta (B, H, Tq) is made: false, having
// launched nothing, for the problems it does not take.
bool attention_backward_bf16_flash(const AttentionProblem& p, const Bf16AttentionOperands& x,
                                   ::attograd::AttentionRows<const bfloat16> dout, const float* lse,
                                   const float* delta, Bf16AttentionOutput dq, Bf16AttentionOutput dk,
                                   Bf16AttentionOutput dv, cudaStream_t stream);

}  // namespace attograd::cuda::attention_detail

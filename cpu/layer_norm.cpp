// LayerNorm over the last dim on the CPU, forward and backward. Inputs arrive
// contiguous (tensor/dispatch_rows.cpp) and are read as (rows, n).
//
//   forward:  xhat = (x - mean) * rstd with rstd = 1 / sqrt(var + eps);  y = xhat * w + b
//   backward: with dxhat = dy * w,
//             dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//             dw = sum over rows of dy * xhat,  db = sum over rows of dy
//
// A row's sums are taken in float64 (lane_sum, rows.h). float32 rows run in
// functions compiled once per SIMD level (AG_SIMD_CLONES, vec_math.h) with
// everything they call forced inline: compiled for baseline x86-64 (SSE2) like
// the rest of the library, the GPT's 128-wide rows ran at a fraction of
// PyTorch's LayerNorm's speed. float64 rows (gradcheck, references) stay baseline.
//
// This file is compiled with -ffp-contract=off (CMakeLists.txt): GCC would
// otherwise fuse a * b + c into one FMA in the AVX2 and AVX-512 copies, so
// each level would round differently. Without it every level computes what
// the baseline code did, bit for bit (a training run's checkpoint is the one
// from before the SIMD copies); the rows ran no slower measurably.
//
// Under autocast a LayerNorm's float32 y feeds products, which cast it to
// bfloat16 and widen its gradient back: with a bfloat16 y (y_dtype) each row is
// rounded as it is made, and a bfloat16 dy widened a row at a time, the same
// bits as the casts without the float32 y and dy in memory.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/bf16_rounding.h"
#include "cpu/rows.h"
#include "cpu/vec_math.h"
#include "tensor/device_kernels.h"
#include "tensor/kernel_common.h"
#include "cpu/parallel.h"

namespace attograd::cpu {
namespace {

// Sixteen float64 lanes: two AVX-512 registers, so two chains of adds in flight.
constexpr std::int64_t kSumLanes = 16;

// ---- forward ---------------------------------------------------------------------

// What the forward reads and writes; w and b are null when not given. With
// y_bf16 (float32 only), y is one row of scratch, rounded into y_bf16's rows.
template <typename T>
struct ForwardRows {
  const T *x, *w, *b;
  T *y, *mean, *rstd;
  std::int64_t n;
  double eps;
  std::uint16_t* y_bf16 = nullptr;
};

// One row's y = (x - mu) * rstd * w + b. Like every loop over a row here, it
// takes its pointers as __restrict parameters (see the backward's below).
template <typename T, bool kWeight, bool kBias>
AG_ALWAYS_INLINE void normalise_row(std::int64_t n, const T* __restrict x, T mu, T rstd, const T* __restrict w,
                                    const T* __restrict b, T* __restrict y) {
  for (std::int64_t i = 0; i < n; ++i) {
    T v = (x[i] - mu) * rstd;
    if constexpr (kWeight) v *= w[i];
    if constexpr (kBias) v += b[i];
    y[i] = v;
  }
}

// Rows [r0, r1): y, and each row's mean and rstd. kWeight, kBias: whether w, b are given.
template <typename T, bool kWeight, bool kBias>
AG_ALWAYS_INLINE void normalise_rows(const ForwardRows<T>& io, std::int64_t r0, std::int64_t r1) {
  const std::int64_t n = io.n;
  for (std::int64_t r = r0; r < r1; ++r) {
    const T* x = io.x + r * n;
    // Two passes (mean, then squared deviations): the one-pass E[x^2] - E[x]^2
    // cancels catastrophically when the mean is large against the spread.
    const double mean = lane_sum<kSumLanes>(n, [&](std::int64_t i) { return double(x[i]); }) / n;
    const double var = lane_sum<kSumLanes>(n, [&](std::int64_t i) {
                         const double d = x[i] - mean;
                         return d * d;
                       }) / n;
    const auto mu = static_cast<T>(mean);
    const auto rstd = static_cast<T>(1.0 / std::sqrt(var + io.eps));
    io.mean[r] = mu;
    io.rstd[r] = rstd;
    if constexpr (std::is_same_v<T, float>) {
      if (io.y_bf16) {
        normalise_row<T, kWeight, kBias>(n, x, mu, rstd, io.w, io.b, io.y);
        round_to_bf16(io.y_bf16 + r * n, io.y, n);
        continue;
      }
    }
    normalise_row<T, kWeight, kBias>(n, x, mu, rstd, io.w, io.b, io.y + r * n);
  }
}

template <typename T>
AG_ALWAYS_INLINE void forward_rows(const ForwardRows<T>& io, std::int64_t r0, std::int64_t r1) {
  if (io.w && io.b)
    normalise_rows<T, true, true>(io, r0, r1);
  else if (io.w)
    normalise_rows<T, true, false>(io, r0, r1);
  else if (io.b)
    normalise_rows<T, false, true>(io, r0, r1);
  else
    normalise_rows<T, false, false>(io, r0, r1);
}

AG_SIMD_CLONES void forward_rows_f32(const ForwardRows<float>& io, std::int64_t r0, std::int64_t r1) {
  forward_rows(io, r0, r1);
}
void forward_rows_of(const ForwardRows<float>& io, std::int64_t r0, std::int64_t r1) { forward_rows_f32(io, r0, r1); }
void forward_rows_of(const ForwardRows<double>& io, std::int64_t r0, std::int64_t r1) { forward_rows(io, r0, r1); }

// ---- backward --------------------------------------------------------------------

// What the backward reads and writes; w is null when not given. With dy_bf16
// (float32 only) dy is unused, each row of dy_bf16 widened into scratch instead.
template <typename T>
struct BackwardRows {
  const T *dy, *x, *w, *mean, *rstd;
  T* dx;
  std::int64_t n;
  const std::uint16_t* dy_bf16 = nullptr;
};

// One row's xhat = (x - mu) * rs, gathered into the group's dw (dy * xhat) and db (dy).
// The loops over a row take their pointers as __restrict parameters: GCC
// vectorises a loop over several restrict-qualified locals only behind
// run-time overlap checks, and gave up on this one (scalar code).
template <typename T>
AG_ALWAYS_INLINE void normalise_and_gather(std::int64_t n, const T* __restrict x, const T* __restrict dy, T mu, T rs,
                                           T* __restrict xhat, T* __restrict dw, T* __restrict db) {
  for (std::int64_t i = 0; i < n; ++i) {
    xhat[i] = (x[i] - mu) * rs;
    dw[i] += dy[i] * xhat[i];
    db[i] += dy[i];
  }
}

template <typename T>
AG_ALWAYS_INLINE void scale_by(std::int64_t n, const T* __restrict dy, const T* __restrict w, T* __restrict dxhat) {
  for (std::int64_t i = 0; i < n; ++i) dxhat[i] = dy[i] * w[i];
}

template <typename T>
AG_ALWAYS_INLINE void input_gradient(std::int64_t n, const T* __restrict dxhat, const T* __restrict xhat, T rs,
                                     T mean_dxhat, T mean_dxhat_xhat, T* __restrict dx) {
  for (std::int64_t i = 0; i < n; ++i) dx[i] = rs * (dxhat[i] - mean_dxhat - xhat[i] * mean_dxhat_xhat);
}

template <typename T>
AG_ALWAYS_INLINE void add_into(std::int64_t n, const T* __restrict group, double* __restrict total) {
  for (std::int64_t i = 0; i < n; ++i) total[i] += group[i];
}

// Rows [r0, r1) of the backward: their dx, and their dy * xhat and dy added
// into dw and db (float64, n each). Each group of kGroup rows is gathered in T
// first (full-width vector adds), then added into the float64 sums.
// `scratch` holds 5 n values of T.
template <typename T, bool kWeight, bool kBf16Dy>
AG_ALWAYS_INLINE void gradient_rows(const BackwardRows<T>& io, std::int64_t r0, std::int64_t r1, double* dw,
                                    double* db, T* scratch) {
  constexpr std::int64_t kGroup = 8;
  const std::int64_t n = io.n;
  T *xhat = scratch, *dxhat_scratch = scratch + n, *dw_group = scratch + 2 * n, *db_group = scratch + 3 * n,
    *dy_wide = scratch + 4 * n;
  for (std::int64_t g0 = r0; g0 < r1; g0 += kGroup) {
    std::fill(dw_group, dw_group + n, T(0));
    std::fill(db_group, db_group + n, T(0));
    for (std::int64_t r = g0; r < std::min(r1, g0 + kGroup); ++r) {
      const T* dy;
      if constexpr (kBf16Dy) {
        widen_bf16(dy_wide, io.dy_bf16 + r * n, n);
        dy = dy_wide;
      } else {
        dy = io.dy + r * n;
      }
      const T rs = io.rstd[r];
      normalise_and_gather(n, io.x + r * n, dy, io.mean[r], rs, xhat, dw_group, db_group);
      const T* dxhat = dy;
      if constexpr (kWeight) {
        scale_by(n, dy, io.w, dxhat_scratch);
        dxhat = dxhat_scratch;
      }
      const double sum_dxhat = lane_sum<kSumLanes>(n, [&](std::int64_t i) { return double(dxhat[i]); });
      const double sum_dxhat_xhat = lane_sum<kSumLanes>(n, [&](std::int64_t i) { return double(dxhat[i]) * xhat[i]; });
      input_gradient(n, dxhat, xhat, rs, static_cast<T>(sum_dxhat / n), static_cast<T>(sum_dxhat_xhat / n),
                     io.dx + r * n);
    }
    add_into(n, dw_group, dw);
    add_into(n, db_group, db);
  }
}

template <typename T>
AG_ALWAYS_INLINE void backward_rows(const BackwardRows<T>& io, std::int64_t r0, std::int64_t r1, double* dw,
                                    double* db, T* scratch) {
  // A bfloat16 dy chosen at compile time too, so the float32 rows' loops stay as they were.
  if constexpr (std::is_same_v<T, float>) {
    if (io.dy_bf16) {
      if (io.w) return gradient_rows<T, true, true>(io, r0, r1, dw, db, scratch);
      return gradient_rows<T, false, true>(io, r0, r1, dw, db, scratch);
    }
  }
  if (io.w)
    gradient_rows<T, true, false>(io, r0, r1, dw, db, scratch);
  else
    gradient_rows<T, false, false>(io, r0, r1, dw, db, scratch);
}

AG_SIMD_CLONES void backward_rows_f32(const BackwardRows<float>& io, std::int64_t r0, std::int64_t r1, double* dw,
                                      double* db, float* scratch) {
  backward_rows(io, r0, r1, dw, db, scratch);
}
void backward_rows_of(const BackwardRows<float>& io, std::int64_t r0, std::int64_t r1, double* dw, double* db,
                      float* scratch) {
  backward_rows_f32(io, r0, r1, dw, db, scratch);
}
void backward_rows_of(const BackwardRows<double>& io, std::int64_t r0, std::int64_t r1, double* dw, double* db,
                      double* scratch) {
  backward_rows(io, r0, r1, dw, db, scratch);
}

}  // namespace

kernels::LayerNormResult layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                            DType y_dtype) {
  kernels::LayerNormResult out = layer_norm_outputs(x, y_dtype);
  const bool round_y = y_dtype != x.dtype();  // bfloat16 from float32 (dispatch allows no other)
  const RowShape shape = row_shape(x);
  const std::int64_t rows = shape.rows, n = shape.n;
  AG_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    const ForwardRows<scalar_t> io{x.data<scalar_t>(),
                                   weight.defined() ? weight.data<scalar_t>() : nullptr,
                                   bias.defined() ? bias.data<scalar_t>() : nullptr,
                                   round_y ? nullptr : out.y.data<scalar_t>(),
                                   out.mean.data<scalar_t>(),
                                   out.rstd.data<scalar_t>(),
                                   n,
                                   eps,
                                   round_y ? reinterpret_cast<std::uint16_t*>(out.y.data<bfloat16>()) : nullptr};
    parallel_for(0, rows, row_grain(n), [&](std::int64_t begin, std::int64_t end) {
      if (!round_y) return forward_rows_of(io, begin, end);
      std::vector<scalar_t> row(n);  // this block's rows are made here, then rounded into y
      ForwardRows<scalar_t> mine = io;
      mine.y = row.data();
      forward_rows_of(mine, begin, end);
    });
  });
  return out;
}

kernels::LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                            const Tensor& mean, const Tensor& rstd) {
  const RowShape shape = row_shape(x);
  const std::int64_t rows = shape.rows, n = shape.n;
  kernels::LayerNormGrads grads{empty(x.sizes(), x.options()), Tensor(), empty({n}, x.options())};
  if (weight.defined()) grads.dweight = empty({n}, x.options());

  // dw and db are sums over rows. Each block of rows sums into its own float64
  // partials, then the blocks are added in order: threads never share a sum,
  // and the block size depends only on n, so the result does not depend on
  // the thread count.
  const std::int64_t block_rows = row_grain(n);
  const std::int64_t blocks = (rows + block_rows - 1) / block_rows;
  std::vector<double> dw_partial(blocks * n, 0.0), db_partial(blocks * n, 0.0);  // (blocks, n) each

  // dy bfloat16 with a float32 x: the gradient of layer_norm_forward's bfloat16 y.
  const std::uint16_t* dy_bf16 =
      dy.dtype() == DType::bf16 ? reinterpret_cast<const std::uint16_t*>(dy.data<bfloat16>()) : nullptr;
  AG_DISPATCH_FLOAT(x.dtype(), "layer_norm backward", [&] {
    const BackwardRows<scalar_t> io{dy_bf16 ? nullptr : dy.data<scalar_t>(),
                                    x.data<scalar_t>(),
                                    weight.defined() ? weight.data<scalar_t>() : nullptr,
                                    mean.data<scalar_t>(),
                                    rstd.data<scalar_t>(),
                                    grads.dx.data<scalar_t>(),
                                    n,
                                    dy_bf16};
    parallel_for(0, blocks, 1, [&](std::int64_t block_begin, std::int64_t block_end) {
      std::vector<scalar_t> scratch(5 * n);
      for (std::int64_t block = block_begin; block < block_end; ++block)
        backward_rows_of(io, block * block_rows, std::min(rows, (block + 1) * block_rows),
                         dw_partial.data() + block * n, db_partial.data() + block * n, scratch.data());
    });
    // Blocks in order, so the sums are the same whatever the threads did.
    scalar_t* db_out = grads.dbias.data<scalar_t>();
    scalar_t* dw_out = weight.defined() ? grads.dweight.data<scalar_t>() : nullptr;
    for (std::int64_t i = 0; i < n; ++i) {
      double dw = 0, db = 0;
      for (std::int64_t block = 0; block < blocks; ++block) {
        dw += dw_partial[block * n + i];
        db += db_partial[block * n + i];
      }
      if (dw_out) dw_out[i] = static_cast<scalar_t>(dw);
      db_out[i] = static_cast<scalar_t>(db);
    }
  });
  return grads;
}

}  // namespace attograd::cpu

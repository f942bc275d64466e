// The bfloat16 attention backward in FlashAttention-2's shape at head sizes 32,
// 64 and 128 (rows 16-byte aligned): attention_backward_bf16 (cuda/attention_bf16.cu)
// sends those problems here once delta is made, and the rest to its two
// general kernels, whose conventions (attention_common.cuh's formulas, what
// is rounded where) this one keeps. A kernel for each of causal, masked and
// dropout, so that the common one has no code for either.
//
// A block owns 64 keys of one (b, h), a warp 16 of them, and makes all five
// products in one sweep over the query tiles that see them (causal: from
// its diagonal on), 64 queries a tile:
//   S^T = K Q^T and dP^T = V dO^T, the warp's keys by the tile's queries,
//     from K's and V's fragments held in registers for the whole sweep (at
//     128, read from their tiles: WarpKeys);
//   P^T = 2^(S^T scale log2(e) - lse log2(e)) and dS^T = P^T (dP^T Z scale -
//     delta scale) where they stand: the accumulators are the A fragments of
//     the next products (attention_bf16.cu);
//   dV += (P Z)^T dO and dK += dS^T Q, in registers until the sweep ends;
//   dS^T through shared memory, then the tile's part of dQ (dS K), a warp
//     16 of its queries.
// (32 keys a warp, which would load fewer fragments a product, would hold
// twice K, V, dK, dV, S and dP in registers: past ptxas's 255.)
// The key blocks' parts of a query tile's dQ are summed in float32 in the
// order of the key blocks (cuda/ordered_sum.cuh, a counter for each warp's
// 16 queries), the first writing its part without reading and the last
// rounding the sum into dq: the same bits on every run, and no pass to convert.
// Tiles of Q and dO stream through two buffers of swizzled shared memory by
// cp.async, the next pair copied while the warps work on this one, with their
// lse and delta, loaded into registers then and stored at the tile's end.
// Rows of the last query tile past Tq read zeros and get lse +inf, as rows
// whose keys are all hidden (lse -inf) do: their P is 0 with no test. Tiles
// with a hidden key (the causal diagonal, the keys' ragged end, a mask) are
// worked by the same code with the test; the others have none.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/attention_common.cuh"
#include "cuda/attention_flash.cuh"
#include "cuda/buffer.h"
#include "cuda/gemm_tiles.h"
#include "cuda/mma_bf16.cuh"
#include "cuda/ordered_sum.cuh"

namespace attograd::cuda::attention_detail {
namespace flash_backward {

using flash::copy_rows;
using flash::draw_word;
using flash::exp2_fast;
using flash::LaneAddresses;
using gemm_tiles::byte_offset;
using gemm_tiles::kChunk;
using gemm_tiles::OperandTile;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kWarpKeys = 16, kBlockKeys = kWarps * kWarpKeys;
constexpr int kQueries = 64;                    // a query tile
constexpr int kStripe = kQueries / kWarps;      // a warp's queries of the tile's dQ
// The queries a warp's S^T and dP^T hold at a time: the whole tile up to head
// size 64; at 128, where dK and dV take 128 registers, half of it.
template <int D>
constexpr int kPartQueries = D <= 64 ? kQueries : kQueries / 2;
constexpr float kLog2e = 1.4426950408889634f;

// The tiles at head size D, each read two ways: plain where the summed index
// runs along its lines, transposing where it runs down them.
template <int D>
struct Tiles {
  using KRows = OperandTile<kBlockKeys, true, D>;        // A of K Q^T and V dO^T: a line a key
  using KCols = OperandTile<D, false, kBlockKeys>;       // B of dS K, from the same lines
  using QRows = OperandTile<kQueries, true, D>;          // B^T of K Q^T and V dO^T: a line a query
  using QCols = OperandTile<D, false, kQueries>;         // B of dS^T Q and (P Z)^T dO, from the same lines
  using DsT = OperandTile<kQueries, false, kBlockKeys>;  // A of dS K, stored as dS^T: a line a key
  static_assert(KRows::kLineChunks == KCols::kLineChunks && QRows::kLineChunks == QCols::kLineChunks &&
                    KRows::kLineChunks == QRows::kLineChunks,
                "every tile of rows has a line a row, its head size in chunks");
  static constexpr int kLineChunks = QRows::kLineChunks;
  static constexpr int kKeyValues = KRows::kValues, kQueryValues = QRows::kValues;
  // K, V and dS^T, then two buffers of a query tile: its Q, dO and terms (lse log2(e), then delta scale).
  static constexpr int kQueryBytes = 2 * kQueryValues, kTermBytes = sizeof(float) * kQueries;
  static constexpr int kBuffersOffset = 2 * (2 * kKeyValues + DsT::kValues);
  static constexpr int kBufferBytes = 2 * kQueryBytes + 2 * kTermBytes;
  static constexpr int kSharedBytes = kBuffersOffset + 2 * kBufferBytes;
};

// What the kernel reads besides the operands, and writes.
struct Gradients {
  ::attograd::AttentionRows<const bfloat16> dout;
  const float *lse, *delta;  // (B, H, Tq)
  float* dq_sums;            // (B H, query tiles, 64, D): dQ's sums between key blocks
  int* turns;                // (B H, query tiles, warps): the key blocks that have added theirs
  Bf16AttentionOutput dq, dk, dv;
};

// The dropout factors of a lane's four weights of an accumulator block
// (weight r: query 2t + r % 2, key g + 8 (r / 2)) from one Philox draw a
// lane. Where every row of the weights starts at a multiple of 4 in the
// stream (Tk % 4 == 0), the four keys 4a to 4a + 3 of a row are one draw's
// four words, and lie with the four lanes c = g % 4 of group a = g / 4 (lane
// 16a + 4c + t). Lane c draws for weight r = c (`counter`: query 2t + c % 2,
// keys 4a + 8 (c / 2) on), keeps word c of it, and in round m hands word c ^ m
// to lane c ^ m, getting back word c of draw c ^ m.
__device__ __forceinline__ void four_factors(float (&z)[4], const AttentionProblem& p, std::uint64_t counter, int c) {
  const Philox4 draw = philox4x32(counter, p.seed);
  std::uint32_t got[4];  // got[m]: word c of draw c ^ m
  got[0] = draw_word(draw, c);
#pragma unroll
  for (int m = 1; m < 4; ++m) got[m] = __shfl_xor_sync(kFullMask, draw_word(draw, c ^ m), 4 * m);
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int m = c ^ r;
    const std::uint32_t bits = m == 0 ? got[0] : m == 1 ? got[1] : m == 2 ? got[2] : got[3];
    z[r] = uniform_from_bits(bits) < p.dropout_threshold ? 0.0f : p.keep_scale;
  }
}

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

// A warp's 16 rows of dK or dV from row0, rounded, those below `count`.
template <int D>
__device__ __forceinline__ void store_key_rows(const float (&acc)[D / 8][4], const Bf16AttentionOutput& out,
                                               std::int64_t b, std::int64_t h, std::int64_t row0, std::int64_t count,
                                               int g, int t) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t j = row0 + g + 8 * half;
    if (j >= count) continue;
    bfloat16* row = out.row(b, h, j) + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<std::uint32_t*>(row + 8 * n) = round_pair(acc[n][2 * half], acc[n][2 * half + 1]);
  }
}

// Accumulator blocks 2 ks and 2 ks + 1 as one A fragment, rounded (attention_bf16.cu).
__device__ __forceinline__ void rounded_fragment(std::uint32_t (&a)[4], const float (&left)[4], const float (&right)[4]) {
  a[0] = round_pair(left[0], left[1]), a[1] = round_pair(left[2], left[3]);
  a[2] = round_pair(right[0], right[1]), a[3] = round_pair(right[2], right[3]);
}

// The stream of query tiles through the two buffers: this thread's copies of
// Q and dO by cp.async, and its term (threads 0-63 a query's lse, 64-127 its
// delta), loaded into a register with the copies and stored into the buffer at
// the end of the tile before. Every step is worked out once: q_next and o_next
// point at this thread's first copy of the next tile, term_source at its term.
// A copy past Tq reads nothing, from the tensor's first row.
template <int D>
struct QueryStream {
  using Tile = typename Tiles<D>::QRows;
  static constexpr int kRowsApart = kThreads / Tiles<D>::kLineChunks;
  const bfloat16 *q_next, *o_next;
  std::int64_t q_step16, o_step16, q_tile_step, o_tile_step;
  const float* term_source;
  int term_row, copy_at;
  float next_term = 0.0f;

  __device__ __forceinline__ QueryStream(const AttentionProblem& p, const Bf16AttentionOperands& x,
                                         const Gradients& grad, std::int64_t bh, std::int64_t q0, int copy_at_)
      : q_step16(kRowsApart * x.q.st), o_step16(kRowsApart * grad.dout.st), q_tile_step(kQueries * x.q.st),
        o_tile_step(kQueries * grad.dout.st), term_row(static_cast<int>(threadIdx.x) % kQueries), copy_at(copy_at_) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    const int line = threadIdx.x / Tiles<D>::kLineChunks, chunk = threadIdx.x % Tiles<D>::kLineChunks;
    q_next = x.q.row(b, h, q0 + line) + chunk * kChunk;
    o_next = grad.dout.row(b, h, q0 + line) + chunk * kChunk;
    term_source = (threadIdx.x < kQueries ? grad.lse : grad.delta) + bh * p.Tq + q0 + term_row;
  }
  // The next tile, `rows` of it below Tq, into the buffer at buf_at; q_data and dout_data are where nothing is read.
  __device__ __forceinline__ void copy(std::uint16_t* buffers, int buf_at, int rows, const bfloat16* q_data,
                                       const bfloat16* dout_data) {
    copy_rows<Tile, kThreads>(byte_offset(buffers, buf_at), copy_at, q_next, q_step16, rows, q_data);
    copy_rows<Tile, kThreads>(byte_offset(buffers, buf_at + Tiles<D>::kQueryBytes), copy_at, o_next, o_step16, rows,
                              dout_data);
    if (term_row < rows) next_term = *term_source;
    q_next += q_tile_step, o_next += o_tile_step, term_source += kQueries;
  }
  // Its terms: lse as the exponent's (+inf where no key is seen, lse -inf, or past Tq, so that P
  // is 0), delta times the scale.
  __device__ __forceinline__ void store_terms(std::uint16_t* buffers, int buf_at, int rows, float scale) const {
    const bool inside = term_row < rows;
    const float term = threadIdx.x < kQueries ? (!inside || next_term == -INFINITY ? INFINITY : next_term * kLog2e)
                                              : (inside ? next_term * scale : 0.0f);
    reinterpret_cast<float*>(byte_offset(buffers, buf_at + 2 * Tiles<D>::kQueryBytes))[threadIdx.x] = term;
  }
};

// What a lane's products of one query tile read (tile_part).
template <int D>
struct TileWork {
  const AttentionProblem& p;
  const WarpKeys<D>& keys;
  const LaneAddresses<D>&q_plain, &q_trans;
  const std::uint16_t *q_buf, *o_buf;    // the tile's Q and dO
  const float *lse_log2, *delta_scaled;  // and terms
  std::uint16_t* ds_tile;
  std::int64_t b, h, q0, j0;
  int warp, g, t;
  int valid_keys, past;  // the block's keys below Tk; causal, key > query + past is hidden
  float scale_log2;
  std::uint64_t draw_counter, block_counters;  // dropout: the lane's draw for the tile's first block; a block's step
};

// Queries [part * kPart, part * kPart + kPart) of the tile: S^T and dP^T; P Z
// and scale dS where they stand (Masked: hidden pairs 0); dV += (P Z)^T dO
// and dK += dS^T Q; dS^T into shared memory for dQ.
template <int D, bool Causal, bool HasMask, bool Dropout, bool Masked>
__device__ __forceinline__ void tile_part(float (&dk)[D / 8][4], float (&dv)[D / 8][4], const TileWork<D>& w,
                                          int part) {
  using T = Tiles<D>;
  constexpr int kPart = kPartQueries<D>, kBlocks = kPart / 8;
  const int g = w.g, t = w.t;
  float s[kBlocks][4] = {}, dp[kBlocks][4] = {};  // S^T and dP^T: rows keys, columns queries
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    std::uint32_t kf[4], vf[4];
    w.keys.step(kf, vf, ks);
#pragma unroll
    for (int f = 0; f < kPart / 16; ++f) {
      std::uint32_t qf[4], of[4];
      const int at = w.q_plain[ks] + (part * kPart / 16 + f) * T::QRows::kLineStride * 16;
      load_matrices<false>(qf, byte_offset(w.q_buf, at));
      load_matrices<false>(of, byte_offset(w.o_buf, at));
      const std::uint32_t q_lo[2] = {qf[0], qf[1]}, q_hi[2] = {qf[2], qf[3]};
      const std::uint32_t o_lo[2] = {of[0], of[1]}, o_hi[2] = {of[2], of[3]};
      mma_bf16(s[2 * f], kf, q_lo), mma_bf16(s[2 * f + 1], kf, q_hi);
      mma_bf16(dp[2 * f], vf, o_lo), mma_bf16(dp[2 * f + 1], vf, o_hi);
    }
  }
  // P Z into s and scale dS into dp.
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) {
    const int block = part * kBlocks + n;  // of the tile's 8 blocks of 8 queries
    const float2 lse_pair = *reinterpret_cast<const float2*>(w.lse_log2 + 8 * block + 2 * t);
    const float2 delta_pair = *reinterpret_cast<const float2*>(w.delta_scaled + 8 * block + 2 * t);
    float z[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    if (Dropout) four_factors(z, w.p, w.draw_counter + block * w.block_counters, g % 4);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      // The pair's query and key in the tile, and in (b, h) for the mask.
      const int query = 8 * block + 2 * t + r % 2, key = kWarpKeys * w.warp + g + 8 * (r / 2);
      const float prob = exp2_fast(s[n][r] * w.scale_log2 - (r % 2 ? lse_pair.y : lse_pair.x));
      float pz = prob * z[r];
      float ds = prob * (dp[n][r] * z[r] * w.p.scale - (r % 2 ? delta_pair.y : delta_pair.x));
      if constexpr (Masked) {
        const bool hidden = HasMask ? w.p.hidden(w.b, w.h, w.q0 + query, w.j0 + key)
                                    : key >= w.valid_keys || (Causal && key > query + w.past);
        if (hidden) pz = 0.0f, ds = 0.0f;
      }
      s[n][r] = pz, dp[n][r] = ds;
    }
  }
  // dV += (P Z)^T dO and dK += dS^T Q; dS^T into shared memory, at key line 16 warp + g (+ 8), word t of a chunk.
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
      const int at = w.q_trans[f] + ks * T::QCols::kLineStride * 16;
      load_matrices<true>(of, byte_offset(w.o_buf, at));
      load_matrices<true>(qf, byte_offset(w.q_buf, at));
      const std::uint32_t o_lo[2] = {of[0], of[1]}, o_hi[2] = {of[2], of[3]};
      const std::uint32_t q_lo[2] = {qf[0], qf[1]}, q_hi[2] = {qf[2], qf[3]};
      mma_bf16(dv[2 * f], pa, o_lo), mma_bf16(dv[2 * f + 1], pa, o_hi);
      mma_bf16(dk[2 * f], da, q_lo), mma_bf16(dk[2 * f + 1], da, q_hi);
    }
  }
}

// Where a lane's rows g and g + 8 of its warp's 16 queries of a tile's dQ go:
// the float32 sums between key blocks, dq, and the warp's counter.
struct DqStripe {
  float* sums;
  bfloat16* out;
  std::int64_t half_step;  // dq's 8 rows
  int* turn;
};

// The tile's dQ from these keys for the warp's 16 queries (dS K), added to the
// key blocks' before in their order; the last block (`last`) rounds the sum
// into dq, its rows below rows_left (counted from the warp's first).
template <int D>
__device__ __forceinline__ void add_tile_dq(const DqStripe& at, const std::uint16_t* ds_tile, const std::uint16_t* k_tile,
                                           int ds_at, const LaneAddresses<D>& k_trans, int jb, int last, int rows_left,
                                           int g) {
  using T = Tiles<D>;
  float dq[D / 8][4] = {};
#pragma unroll
  for (int ks = 0; ks < kBlockKeys / 16; ++ks) {
    std::uint32_t a[4];
    load_matrices<true>(a, byte_offset(ds_tile, ds_at + ks * T::DsT::kLineStride * 16));
#pragma unroll
    for (int f = 0; f < D / 16; ++f) {
      std::uint32_t kk[4];
      load_matrices<true>(kk, byte_offset(k_tile, k_trans[f] + ks * T::KCols::kLineStride * 16));
      const std::uint32_t lo[2] = {kk[0], kk[1]}, hi[2] = {kk[2], kk[3]};
      mma_bf16(dq[2 * f], a, lo), mma_bf16(dq[2 * f + 1], a, hi);
    }
  }
  if (jb > 0) wait_for_turn(at.turn, jb);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float2* sums = reinterpret_cast<float2*>(at.sums + 8 * half * D);
    const bool inside = g + 8 * half < rows_left;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float2 sum = make_float2(dq[n][2 * half], dq[n][2 * half + 1]);
      if (jb > 0) {
        const float2 before = load_sum(sums + 4 * n);
        sum = make_float2(before.x + sum.x, before.y + sum.y);
      }
      if (jb != last)
        store_sum(sums + 4 * n, sum);
      else if (inside)
        *reinterpret_cast<std::uint32_t*>(at.out + half * at.half_step + 8 * n) = round_pair(sum.x, sum.y);
    }
  }
  if (jb != last) pass_turn(at.turn, jb + 1);
}

template <int D, bool Causal, bool HasMask, bool Dropout>
__global__ void __launch_bounds__(kThreads, 2)
    attention_backward_flash_kernel(AttentionProblem p, Bf16AttentionOperands x, Gradients grad) {
  using T = Tiles<D>;
  constexpr int kLineChunks = T::kLineChunks, kRowsApart = kThreads / kLineChunks;
  std::uint16_t* const smem = dynamic_shared_memory<std::uint16_t>();
  std::uint16_t* const k_tile = smem;
  std::uint16_t* const v_tile = k_tile + T::kKeyValues;
  std::uint16_t* const ds_tile = v_tile + T::kKeyValues;
  // Buffer u at byte u * kBufferBytes from here: Q, dO, lse, delta. A buffer's
  // offset goes to the other's by an exclusive or, where a multiply made 64-bit addresses.
  std::uint16_t* const buffers = byte_offset(smem, T::kBuffersOffset);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const int jb = blockIdx.x;
  const std::int64_t j0 = std::int64_t(jb) * kBlockKeys, w0 = j0 + kWarpKeys * warp;
  const int key_blocks = static_cast<int>((p.Tk + kBlockKeys - 1) / kBlockKeys);
  const int query_tiles = static_cast<int>((p.Tq + kQueries - 1) / kQueries);
  const auto rows_from = [&](std::int64_t q0) { return static_cast<int>(min(p.Tq - q0, std::int64_t(kQueries))); };

  // This thread's copies: a line of each tile and every kRowsApart-th after it, one chunk of each.
  const int copy_line = threadIdx.x / kLineChunks, copy_chunk = threadIdx.x % kLineChunks;
  const int copy_at = gemm_tiles::Swizzle<kLineChunks>::at(copy_line, copy_chunk) * 16;
  // This lane's ldmatrix offsets: per step of 16 along D (plain), or per block of 16 of D (transposing).
  const LaneAddresses<D> q_plain([&](int i) { return T::QRows::fragment_chunk(0, i, lane, true) * 16; });
  const LaneAddresses<D> q_trans([&](int i) { return T::QCols::fragment_chunk(16 * i, 0, lane, true) * 16; });
  const LaneAddresses<D> k_trans([&](int i) { return T::KCols::fragment_chunk(16 * i, 0, lane, true) * 16; });
  const int ds_at = T::DsT::fragment_chunk(kStripe * warp, 0, lane, false) * 16;

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    const int first_tile = Causal ? jb : 0;  // the query tiles before it see none of these keys
    const std::int64_t q0_first = std::int64_t(first_tile) * kQueries;
    const int valid_keys = static_cast<int>(min(p.Tk - j0, std::int64_t(kBlockKeys)));
    __syncthreads();  // the previous (b, h) is done with shared memory

    const bfloat16* k_first = x.k.row(b, h, min(j0 + copy_line, p.Tk - 1)) + copy_chunk * kChunk;
    const bfloat16* v_first = x.v.row(b, h, min(j0 + copy_line, p.Tk - 1)) + copy_chunk * kChunk;
    copy_rows<typename T::KRows, kThreads>(k_tile, copy_at, k_first, kRowsApart * x.k.st, valid_keys, k_first);
    copy_rows<typename T::KRows, kThreads>(v_tile, copy_at, v_first, kRowsApart * x.v.st, valid_keys, v_first);
    commit_async_copies();
    QueryStream<D> stream(p, x, grad, bh, q0_first, copy_at);
    if (first_tile < query_tiles) stream.copy(buffers, 0, rows_from(q0_first), x.q.data, grad.dout.data);
    commit_async_copies();
    wait_async_copies<1>();  // K and V have landed
    if (first_tile < query_tiles) stream.store_terms(buffers, 0, rows_from(q0_first), p.scale);
    __syncthreads();
    const WarpKeys<D> keys(k_tile, v_tile, warp, lane);

    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    const std::int64_t stripe_row = std::int64_t(bh * query_tiles + first_tile) * kQueries + kStripe * warp + g;
    DqStripe dq_at{grad.dq_sums + stripe_row * D + 2 * t,
                   grad.dq.row(b, h, 0) + (q0_first + kStripe * warp + g) * grad.dq.st + 2 * t, 8 * grad.dq.st,
                   grad.turns + (bh * query_tiles + first_tile) * kWarps + warp};
    const std::int64_t dq_tile_step = kQueries * grad.dq.st;
    // Dropout (four_factors): this lane's draw for its first accumulator block of the
    // tile; each block 8 queries on is 2 Tk counters on, each tile 16 Tk.
    const int c = g % 4;
    std::uint64_t draw_counter = 0;
    if (Dropout) draw_counter = p.offset + p.weight_index(b, h, q0_first + 2 * t + c % 2, w0 + (g - c) + 8 * (c / 2)) / 4;
    const std::uint64_t block_counters = 2 * static_cast<std::uint64_t>(p.Tk), tile_counters = 8 * block_counters;
    // Causal: key > query + past is hidden, past being the tile's first query less the block's
    // first key (0 on the first tile, the diagonal), and at most 64, past which nothing is.
    int past = 0;
    std::int64_t q0 = q0_first;
    for (int tile = first_tile, buf_at = 0; tile < query_tiles; ++tile, buf_at ^= T::kBufferBytes, q0 += kQueries) {
      wait_async_copies<0>();  // this tile has landed
      __syncthreads();         // everyone's copies have, and everyone is done with the other buffer and dS^T
      const bool more = tile + 1 < query_tiles;
      const int rows = rows_from(q0), next_rows = rows_from(q0 + kQueries);
      if (more) stream.copy(buffers, buf_at ^ T::kBufferBytes, next_rows, x.q.data, grad.dout.data);
      commit_async_copies();

      const float* lse_log2 = reinterpret_cast<const float*>(byte_offset(buffers, buf_at + 2 * T::kQueryBytes));
      const TileWork<D> work{p, keys, q_plain, q_trans, byte_offset(buffers, buf_at),
                             byte_offset(buffers, buf_at + T::kQueryBytes), lse_log2, lse_log2 + kQueries, ds_tile,
                             b, h, q0, j0, warp, g, t, valid_keys, past, p.scale * kLog2e, draw_counter, block_counters};
      if (HasMask || valid_keys < kBlockKeys || (Causal && tile == first_tile)) {
#pragma unroll
        for (int part = 0; part < kQueries / kPartQueries<D>; ++part)
          tile_part<D, Causal, HasMask, Dropout, true>(dk, dv, work, part);
      } else {
#pragma unroll
        for (int part = 0; part < kQueries / kPartQueries<D>; ++part)
          tile_part<D, Causal, HasMask, Dropout, false>(dk, dv, work, part);
      }
      __syncthreads();  // dS^T is whole

      add_tile_dq<D>(dq_at, ds_tile, k_tile, ds_at, k_trans, jb, Causal ? min(tile, key_blocks - 1) : key_blocks - 1,
                     rows - kStripe * warp, g);
      if (more) stream.store_terms(buffers, buf_at ^ T::kBufferBytes, next_rows, p.scale);
      dq_at.sums += kQueries * D, dq_at.turn += kWarps, dq_at.out += dq_tile_step;
      past = min(past + kQueries, kQueries), draw_counter += tile_counters;
    }
    store_key_rows<D>(dk, grad.dk, b, h, w0, p.Tk, g, t);
    store_key_rows<D>(dv, grad.dv, b, h, w0, p.Tk, g, t);
  }
}

}  // namespace flash_backward

namespace {

struct BackwardKernels {
  using Kernel = void (*)(AttentionProblem, Bf16AttentionOperands, flash_backward::Gradients);
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
  const std::int64_t query_tiles = (p.Tq + kQueries - 1) / kQueries, key_blocks = (p.Tk + kBlockKeys - 1) / kBlockKeys;
  AG_CHECK(query_tiles <= 0x7fffffff / kWarps, "attention", "sequence of {} queries is too long for the CUDA kernels",
           p.Tq);
  // The sums between key blocks: none where one block holds every key.
  const std::size_t sum_values = key_blocks > 1 ? static_cast<std::size_t>(p.B * p.H * query_tiles * kQueries * p.D) : 1;
  DeviceBuffer sums(sizeof(float) * sum_values);
  const std::size_t turn_bytes = sizeof(int) * static_cast<std::size_t>(p.B * p.H * query_tiles * kWarps);
  DeviceBuffer turns(turn_bytes);
  CUDA_CHECK(cudaMemsetAsync(turns.as<void>(), 0, turn_bytes, stream));
  const BackwardKernels::Kernel kernel = flash::kernel_for<BackwardKernels>(p);
  const int smem = p.D == 32 ? Tiles<32>::kSharedBytes : p.D == 64 ? Tiles<64>::kSharedBytes : Tiles<128>::kSharedBytes;
  allow_shared_memory(kernel, smem);
  const Gradients grad{dout, lse, delta, sums.as<float>(), turns.as<int>(), dq, dk, dv};
  launch(kernel, grid_over(p.Tk, kBlockKeys, p.B, p.H), kThreads, smem, stream, p, x, grad);
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace attograd::cuda::attention_detail

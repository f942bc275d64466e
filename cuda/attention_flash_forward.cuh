#pragma once
// The attention forward in FlashAttention-2's shape, for any operand kind: the
// bfloat16 one (cuda/attention_bf16_flash.cu) and the float32 one in 3xTF32
// (cuda/attention_tf32_flash.cu) share the block's division of the work, the
// sweep over the key tiles with its copies, a warp's rows, the masking,
// dropout and online softmax of a tile's scores. What differs, how a warp
// reads its fragments and multiplies them and how it stores its rows, is the
// kind's (Kind below).
//
// A block of 4 warps owns 128 queries of one (b, h), a warp 32 of them (two
// mma tiles high). Keys and values stream through shared memory in tiles of
// 64, copied by cp.async into XOR-swizzled tiles (cuda/gemm_tiles.h), the next
// pair in flight while the warps work on this one, one barrier a tile.
// The sweep runs from the last key tile down: without a mask the last two are
// the only ones with a hidden key (causal: the block's diagonal spans them and
// no earlier tile reaches it; else the ragged end of the keys), so they alone
// are masked, before a loop that has no mask code, and every copy of that
// loop reads whole rows.
// Each score costs one FFMA and one MUFU.EX2: exp2 of s log2(e) scale - m
// log2(e) scale, the scale folded into the exponent's FFMA (the scale is
// positive, so the max of the raw scores is the max of the scaled ones), and
// the max keeps NaN in one instruction (max.NaN). The row sums stay per lane
// until the end.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/attention_common.cuh"
#include "cuda/attention_flash.cuh"
#include "cuda/attention_warp_scores.cuh"
#include "cuda/gemm_tiles.h"

namespace attograd::cuda::attention_detail::flash {

using gemm_tiles::byte_offset;
using gemm_tiles::kChunk;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kWarpQueries = 32, kBlockQueries = kWarps * kWarpQueries;
constexpr int kKeys = 64;              // a key tile
constexpr int kM = kWarpQueries / 16;  // a warp's mma tiles down its queries
static_assert(2 * kKeys == kBlockQueries, "the causal diagonal lies in the last two key tiles");

// NanMaxOp (device_utils.cuh) in one instruction, max.NaN, where its
// comparisons take four. Not NanMaxOp's own form: there it moved the general
// bfloat16 forward at head size 32 to more registers and a larger stack.
struct NanMax {
  __device__ __forceinline__ float operator()(float a, float b) const {
#if defined(__CUDA_ARCH__) && !defined(ATTOGRAD_CUDA_EMULATION)
    float r;
    asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return NanMaxOp{}(a, b);
#endif
  }
};

// copy_rows (cuda/attention_flash.cuh) for a tile wholly inside: no row to check.
template <typename Tile, typename T>
__device__ __forceinline__ void copy_whole_rows(std::uint16_t* tile, int destination, const T* first,
                                                std::int64_t row_step16) {
  constexpr int kCopies = Tile::kChunks / kThreads;
  const T* source = first;
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    copy_async16(byte_offset(tile, destination + i * kThreads * 16), source, 16);
    source += row_step16;
  }
}

// A warp's scores against Keys keys of a tile, mma accumulators.
template <int Keys>
using Scores = float[kM][Keys / 8][4];

// A warp's rows, g and g + 8 of each of its mma tiles for lane (g, t): the
// running sum of p v, the running max of the raw scores, and this lane's share
// of the sum of p.
template <int D>
struct WarpRows {
  float o[kM][D / 8][4] = {};
  float m[kM][2], l[kM][2];
  __device__ __forceinline__ WarpRows() {
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  }
};

// Where a lane's scores of a tile lie: the warp's first query w0 of (b, h), the
// tile's first key j0; with dropout, the counter of the lane's first draw (drop_weights).
struct TileAt {
  std::int64_t b, h, w0, j0;
  int g, t;
  std::uint64_t draws;
  __device__ __forceinline__ std::int64_t i(int mt, int r) const { return w0 + 16 * mt + g + 8 * (r / 2); }
  __device__ __forceinline__ std::int64_t j(int n, int r) const { return j0 + 8 * n + 2 * t + r % 2; }
};

// Hidden keys at -inf: with a mask, as the problem hides them; else past Tk,
// or (causal) after the query.
template <bool Causal, bool HasMask, int N>  // N blocks of 8 keys
__device__ __forceinline__ void mask_tile(float (&s)[kM][N][4], const AttentionProblem& p, const TileAt& at) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const std::int64_t i = at.i(mt, r), j = at.j(n, r);
        if (HasMask ? p.hidden(at.b, at.h, i, j) : j >= p.Tk || (Causal && j > i)) s[mt][n][r] = -INFINITY;
      }
}

// The dropped weights of the tile to 0: the problem's stream
// (base/attention_problem.h), after their sum went into l. The kept ones' factor
// 1 / (1 - p) is the output's (store_rows), once a row rather than once a weight.
// Every row of the weights starts at a multiple of 4 in the stream (Tk % 4 ==
// 0, which the kernels' launchers ask of dropout), so keys 8n + 4u to
// 8n + 4u + 3 of a row are one draw's four words, held by the lanes t = 2u
// (words 0 and 1) and 2u + 1 (2 and 3), which share rows g and g + 8: the lane
// of parity v draws for its rows g + 8v, keeps words 2v and 2v + 1, and hands
// the other two to its partner. One draw for four weights, each tested by one
// integer compare (drop_bits_below).
template <int N>  // N blocks of 8 keys
__device__ __forceinline__ void drop_weights(float (&s)[kM][N][4], const AttentionProblem& p, const TileAt& at) {
  const auto kept = [&](float weight, std::uint32_t bits) { return bits < p.drop_below ? 0.0f : weight; };
  const int v = at.t % 2;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    // Counter of the lane's row g + 8v, keys j0 + 4u on (16 rows on: 16 Tk / 4 counters); each 8 keys on is 2 counters on.
    const std::uint64_t counter = at.draws + mt * 4 * static_cast<std::uint64_t>(p.Tk);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const Philox4 draw = philox4x32(counter + 2 * n, p.round_keys);
      const std::uint32_t keep0 = v ? draw.v[2] : draw.v[0], keep1 = v ? draw.v[3] : draw.v[1];
      const std::uint32_t got0 = __shfl_xor_sync(kFullMask, v ? draw.v[0] : draw.v[2], 1);
      const std::uint32_t got1 = __shfl_xor_sync(kFullMask, v ? draw.v[1] : draw.v[3], 1);
      float(&w)[4] = s[mt][n];
      w[0] = kept(w[0], v ? got0 : keep0), w[1] = kept(w[1], v ? got1 : keep1);  // row g
      w[2] = kept(w[2], v ? keep0 : got0), w[3] = kept(w[3], v ? keep1 : got1);  // row g + 8
    }
  }
}

// The online softmax over N blocks of 8 keys: s becomes 2^(s log2(e) scale - m
// log2(e) scale) with m the rows' new max, and o and l are rescaled to it.
template <int D, int N>
__device__ __forceinline__ void online_softmax(float (&s)[kM][N][4], WarpRows<D>& rows, float scale_log2) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = s[mt][0][2 * half];
#pragma unroll
      for (int n = 0; n < N; ++n)
        tile_max = NanMax{}(tile_max, NanMax{}(s[mt][n][2 * half], s[mt][n][2 * half + 1]));
      const float m_new = NanMax{}(rows.m[mt][half], quad_reduce(tile_max, NanMax{}));
      // Nothing visible yet: exponents from 0, not -inf - -inf (every p and the correction 0).
      const float base = m_new == -INFINITY ? 0.0f : m_new * scale_log2;
      const float correction = exp2_fast(rows.m[mt][half] * scale_log2 - base);
      rows.m[mt][half] = m_new;
      rows.l[mt][half] *= correction;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) rows.o[mt][n][2 * half] *= correction, rows.o[mt][n][2 * half + 1] *= correction;
#pragma unroll
      for (int n = 0; n < N; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& e = s[mt][n][2 * half + c];
          e = exp2_fast(e * scale_log2 - base);
          rows.l[mt][half] += e;
        }
    }
}

// The end of the warp's rows of (b, h) = bh: their log-sum-exp (-inf where
// every key was hidden) and o kept_scale / l, stored by Kind::store_pair(at, x0,
// x1), two neighbouring values of out's row (zeros, not 0 / 0, where l is 0).
template <typename Kind, int D, typename Output>
__device__ __forceinline__ void store_rows(const WarpRows<D>& rows, const AttentionProblem& p, std::int64_t bh,
                                           std::int64_t w0, int g, int t, float kept_scale, Output out, float* lse) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_reduce(rows.l[mt][half], SumOp{});  // every lane joins
      const std::int64_t i = w0 + 16 * mt + g + 8 * half;
      if (i >= p.Tq) continue;
      if (t == 0) lse[bh * p.Tq + i] = sum == 0.0f ? -INFINITY : rows.m[mt][half] * p.scale + logf(sum);
      const float inv = sum == 0.0f ? 0.0f : kept_scale / sum;
      auto* row = out.row(bh / p.H, bh % p.H, i);
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        Kind::store_pair(row + 8 * n + 2 * t, rows.o[mt][n][2 * half] * inv, rows.o[mt][n][2 * half + 1] * inv);
    }
}

// The forward of the block's queries, for every (b, h) its grid row takes.
// Kind (the kernel's operands) gives:
//   Value                      the operands' type; Tiles<D>: Q, K and V's OperandTiles (Q::kChunks, ...)
//   kScoreKeys<D>              keys of a tile whose scores a warp holds at once (the tile or half of it)
//   Queries<D>(q_tile, warp, lane)       a warp's queries as A fragments, held or read per tile
//   Reads<D>(lane)                       a lane's offsets into K's and V's tiles
//   scores<D>(s, queries, k_tile, reads) s = Q K^T of kScoreKeys keys
//   add_values<D>(rows, s, v_tile, reads) o += p v
//   store_pair(at, x0, x1)               two neighbouring values of an output row
// x holds q, k and v (AttentionRows of Value), out the output's rows.
template <typename Kind, int D, bool Causal, bool HasMask, bool Dropout, typename Operands, typename Output>
__device__ __forceinline__ void forward_sweep(const AttentionProblem& p, const Operands& x, Output out, float* lse) {
  using Value = typename Kind::Value;
  using Tiles = typename Kind::template Tiles<D>;
  using QTile = typename Tiles::Q;
  using KTile = typename Tiles::K;
  using VTile = typename Tiles::V;
  static_assert(KTile::kChunks == VTile::kChunks && KTile::kLineChunks == VTile::kLineChunks,
                "K's and V's tiles are laid out alike: a line a key, its head size in chunks");
  static_assert(kThreads % KTile::kLineChunks == 0 && (kThreads / KTile::kLineChunks) % 8 == 0,
                "a thread's copies lie a whole number of swizzle periods apart");
  constexpr int kLineChunks = KTile::kLineChunks, kTileValues = KTile::kChunks * kChunk;  // in 16-bit units
  constexpr int kChunkValues = 16 / sizeof(Value);
  std::uint16_t* const smem = dynamic_shared_memory<std::uint16_t>();
  std::uint16_t* const q_tile = smem;
  std::uint16_t* const kv = smem + QTile::kChunks * kChunk;  // buffer u: K at 2u tiles, V after it
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * kBlockQueries, w0 = i0 + warp * kWarpQueries;
  const float scale_log2 = p.scale * 1.4426950408889634f;

  // This thread's copies: a line of each tile and every kRowsApart-th after it, one chunk of each.
  const int copy_line = threadIdx.x / kLineChunks, copy_chunk = threadIdx.x % kLineChunks;
  const int copy_at = gemm_tiles::Swizzle<kLineChunks>::at(copy_line, copy_chunk) * 16;
  constexpr int kRowsApart = kThreads / kLineChunks;
  const typename Kind::template Reads<D> reads(lane);

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    const std::int64_t key_end = sweep_is_causal<Causal, HasMask>(p) ? min(p.Tk, i0 + kBlockQueries) : p.Tk;
    const int last = key_end > 0 ? static_cast<int>((key_end - 1) / kKeys) : -1;  // the key tile swept first
    const std::int64_t k_step16 = kRowsApart * x.k.st, v_step16 = kRowsApart * x.v.st;
    // Dropout: the counter of the lane's draw for its row g + 8 (t % 2), keys 4 (t / 2) to 4 (t / 2) + 3 (drop_weights);
    // a row's weights start at a multiple of 4 in the stream, so key j0 on is j0 / 4 counters on.
    const std::uint64_t row_draws = Dropout ? p.offset + p.weight_index(b, h, w0 + g + 8 * (t % 2), 0) / 4 + t / 2 : 0;
    const auto k_row = [&](std::int64_t j) { return x.k.row(b, h, min(j, p.Tk - 1)) + copy_chunk * kChunkValues; };
    const auto v_row = [&](std::int64_t j) { return x.v.row(b, h, min(j, p.Tk - 1)) + copy_chunk * kChunkValues; };
    __syncthreads();  // the previous (b, h) is done with shared memory

    // The queries and the last key tile, then the queries' fragments into registers.
    const Value* q_first = x.q.row(b, h, min(i0 + copy_line, p.Tq - 1)) + copy_chunk * kChunkValues;
    copy_rows<QTile, kThreads>(q_tile, copy_at, q_first, kRowsApart * x.q.st,
                               static_cast<int>(min(p.Tq - i0, std::int64_t(kBlockQueries))), q_first);
    if (last >= 0) {
      const std::int64_t j0 = std::int64_t(last) * kKeys;
      const int valid = static_cast<int>(key_end - j0);
      const Value *k_first = k_row(j0 + copy_line), *v_first = v_row(j0 + copy_line);
      copy_rows<KTile, kThreads>(kv, copy_at, k_first, k_step16, valid, k_first);
      copy_rows<VTile, kThreads>(kv + kTileValues, copy_at, v_first, v_step16, valid, v_first);
    }
    commit_async_copies();
    wait_async_copies<0>();
    __syncthreads();
    const typename Kind::template Queries<D> q(q_tile, warp, lane);

    WarpRows<D> rows;
    const auto sweep_tile = [&](int buf, std::int64_t j0, auto masked) {
      constexpr int kPart = Kind::template kScoreKeys<D>, kPartBytes = 16 * kPart * kLineChunks;  // lines of K or V
#pragma unroll
      for (int part = 0; part < kKeys / kPart; ++part) {
        Scores<kPart> s = {};
        Kind::template scores<D>(s, q, byte_offset(kv + 2 * buf * kTileValues, part * kPartBytes), reads);
        const TileAt at{b, h, w0, j0 + part * kPart, g, t,
                        row_draws + static_cast<std::uint64_t>(j0 + part * kPart) / 4};
        if constexpr (HasMask || decltype(masked)::value) mask_tile<Causal, HasMask>(s, p, at);
        online_softmax(s, rows, scale_log2);
        if constexpr (Dropout) drop_weights(s, p, at);
        Kind::template add_values<D>(rows, s, byte_offset(kv + 2 * buf * kTileValues + kTileValues, part * kPartBytes),
                                     reads);
      }
    };
    // The tiles below the last are whole: their copies' sources move down a tile at a time.
    const Value* k_next = last >= 1 ? k_row(std::int64_t(last - 1) * kKeys + copy_line) : nullptr;
    const Value* v_next = last >= 1 ? v_row(std::int64_t(last - 1) * kKeys + copy_line) : nullptr;
    const auto copy_next = [&](int buf) {
      copy_whole_rows<KTile>(kv + 2 * buf * kTileValues, copy_at, k_next, k_step16);
      copy_whole_rows<VTile>(kv + 2 * buf * kTileValues + kTileValues, copy_at, v_next, v_step16);
      k_next -= (kKeys / kRowsApart) * k_step16, v_next -= (kKeys / kRowsApart) * v_step16;  // a tile of rows down
    };
    if (last >= 1) copy_next(1);
    commit_async_copies();
    if (last >= 0) sweep_tile(0, std::int64_t(last) * kKeys, std::true_type{});
    int buf = 1, tile = last - 1;
    if (tile >= 0) {  // the second tile down: masked too (causal: it holds the diagonal's first half)
      wait_async_copies<0>();
      __syncthreads();
      if (tile >= 1) copy_next(0);
      commit_async_copies();
      sweep_tile(1, std::int64_t(tile) * kKeys, std::true_type{});
      --tile, buf = 0;
    }
    for (; tile >= 0; --tile, buf ^= 1) {
      wait_async_copies<0>();  // this tile has landed
      __syncthreads();         // everyone's copies have, and everyone is done with the other buffer
      if (tile >= 1) copy_next(buf ^ 1);
      commit_async_copies();
      sweep_tile(buf, std::int64_t(tile) * kKeys, std::false_type{});
    }
    store_rows<Kind>(rows, p, bh, w0, g, t, Dropout ? p.keep_scale : 1.0f, out, lse);
  }
}

}  // namespace attograd::cuda::attention_detail::flash

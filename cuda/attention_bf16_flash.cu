// The bfloat16 attention forward in FlashAttention-2's shape at head sizes 32,
// 64 and 128 (rows 16-byte aligned): attention_forward_bf16 (cuda/attention_bf16.cu)
// sends those problems here and the rest to its general kernel, whose
// conventions (what is rounded where, the log-sum-exp, NaN rows, the dropout
// stream) this one keeps. A kernel for each of causal, masked and dropout, so
// that the common one (no mask, no dropout) has no code for either.
//
// A block of 4 warps owns 128 queries of one (b, h), a warp 32 of them (two
// mma tiles high), their Q fragments held in registers for the whole sweep
// (at 128, read from the Q tile: WarpQueries).
// Keys and values stream through shared memory in tiles of 64, copied by
// cp.async into XOR-swizzled tiles (cuda/gemm_tiles.h: no bank conflict for
// the copies, the plain ldmatrix of K nor the transposing one of V), the next
// pair in flight while the warps work on this one, one barrier a tile. (Tiles
// of 128 keys, as FlashAttention-2 takes at this head size, left ptxas 255
// registers and spills inside the sweep.)
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
#include "cuda/mma_bf16.cuh"

namespace attograd::cuda::attention_detail {
namespace flash {

using gemm_tiles::byte_offset;
using gemm_tiles::kChunk;
using gemm_tiles::OperandTile;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kWarpQueries = 32, kBlockQueries = kWarps * kWarpQueries;
constexpr int kKeys = 64;              // a key tile
constexpr int kM = kWarpQueries / 16;  // a warp's mma tiles down its queries
static_assert(2 * kKeys == kBlockQueries, "the causal diagonal lies in the last two key tiles");

// The tiles at head size D.
template <int D>
struct Tiles {
  using Q = OperandTile<kBlockQueries, true, D>;  // A of Q K^T: a line a query
  using K = OperandTile<kKeys, true, D>;          // B^T of Q K^T: a line a key
  using V = OperandTile<D, false, kKeys>;         // B of P V, as B^T's tile: a line a key
  static_assert(K::kChunks == V::kChunks && K::kLineChunks == V::kLineChunks,
                "K's and V's tiles are laid out alike: a line a key, its head size in chunks");
  static constexpr int kLineChunks = K::kLineChunks;
  static constexpr int kTileValues = K::kChunks * kChunk;                                // of K, or of V
  static constexpr int kSharedBytes = 2 * (Q::kChunks * kChunk + 2 * 2 * kTileValues);  // Q, then two buffers of K and V
  static_assert(kThreads % kLineChunks == 0 && (kThreads / kLineChunks) % 8 == 0,
                "a thread's copies lie a whole number of swizzle periods apart");
};

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

// The same for a tile wholly inside: no row to check.
template <typename Tile>
__device__ __forceinline__ void copy_whole_rows(std::uint16_t* tile, int destination, const bfloat16* first,
                                                std::int64_t row_step16) {
  constexpr int kCopies = Tile::kChunks / kThreads;
  const bfloat16* source = first;
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    copy_async16(byte_offset(tile, destination + i * kThreads * 16), source, 16);
    source += row_step16;
  }
}

// A warp's scores against Keys keys of a tile, mma accumulators: the whole
// tile up to head size 64; at 128, where O takes 128 registers, a half tile at
// a time (the sweep's exponent and rescaling twice a tile, and no spill).
template <int D>
constexpr int kScoreKeys = D <= 64 ? kKeys : kKeys / 2;
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

// Where a lane's scores of a tile lie: the warp's first query w0 of (b, h), the tile's first key j0.
struct TileAt {
  std::int64_t b, h, w0, j0;
  int g, t;
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

// The dropped weights of the tile to 0, the kept ones times 1 / (1 - p): the
// problem's stream (base/attention_problem.h), after their sum went into l.
// Every row of the weights starts at a multiple of 4 in the stream (Tk % 4 ==
// 0, which attention_forward_bf16_flash asks of dropout), so keys 8n + 4u to
// 8n + 4u + 3 of a row are one draw's four words, held by the lanes t = 2u
// (words 0 and 1) and 2u + 1 (2 and 3), which share rows g and g + 8: the lane
// of parity v draws for its rows g + 8v, keeps words 2v and 2v + 1, and hands
// the other two to its partner. One draw for four weights.
template <int N>  // N blocks of 8 keys
__device__ __forceinline__ void drop_weights(float (&s)[kM][N][4], const AttentionProblem& p, const TileAt& at) {
  const auto factor = [&](std::uint32_t bits) { return uniform_from_bits(bits) < p.dropout_threshold ? 0.0f : p.keep_scale; };
  const int v = at.t % 2;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    // Counter of the lane's row g + 8v, keys j0 + 4u on; each 8 keys on is 2 counters on.
    const std::uint64_t counter = p.offset + p.weight_index(at.b, at.h, at.i(mt, 2 * v), at.j0) / 4 + at.t / 2;
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const Philox4 draw = philox4x32(counter + 2 * n, p.seed);
      const std::uint32_t keep0 = v ? draw.v[2] : draw.v[0], keep1 = v ? draw.v[3] : draw.v[1];
      const std::uint32_t got0 = __shfl_xor_sync(kFullMask, v ? draw.v[0] : draw.v[2], 1);
      const std::uint32_t got1 = __shfl_xor_sync(kFullMask, v ? draw.v[1] : draw.v[3], 1);
      s[mt][n][0] *= factor(v ? got0 : keep0), s[mt][n][1] *= factor(v ? got1 : keep1);  // row g
      s[mt][n][2] *= factor(v ? keep0 : got0), s[mt][n][3] *= factor(v ? keep1 : got1);  // row g + 8
    }
  }
}

// The online softmax over the tile: s becomes 2^(s log2(e) scale - m log2(e) scale)
// with m the rows' new max, and o and l are rescaled to it.
template <int D>
__device__ __forceinline__ void online_softmax(Scores<kScoreKeys<D>>& s, WarpRows<D>& rows, float scale_log2) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = s[mt][0][2 * half];
#pragma unroll
      for (int n = 0; n < kScoreKeys<D> / 8; ++n)
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
      for (int n = 0; n < kScoreKeys<D> / 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& e = s[mt][n][2 * half + c];
          e = exp2_fast(e * scale_log2 - base);
          rows.l[mt][half] += e;
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

// The end of the warp's rows of (b, h) = bh: the sums over their quads, the
// log-sum-exp, and o / l rounded as stored.
template <int D>
__device__ __forceinline__ void store_rows(const WarpRows<D>& rows, const AttentionProblem& p, std::int64_t bh,
                                           std::int64_t w0, int g, int t, Bf16AttentionOutput out, float* lse) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_reduce(rows.l[mt][half], SumOp{});
      const std::int64_t i = w0 + 16 * mt + g + 8 * half;
      if (i >= p.Tq) continue;
      if (t == 0) lse[bh * p.Tq + i] = sum == 0.0f ? -INFINITY : rows.m[mt][half] * p.scale + logf(sum);
      const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
      bfloat16* row = out.row(bh / p.H, bh % p.H, i);
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<std::uint32_t*>(row + 8 * n + 2 * t) =
            round_pair(rows.o[mt][n][2 * half] * inv, rows.o[mt][n][2 * half + 1] * inv);
    }
}

// HasMask: every tile is masked by the problem's mask (and causality, and
// Tk); else only the last two. Dropout: the problem's dropout on the weights.
template <int D, bool Causal, bool HasMask, bool Dropout>
__global__ void __launch_bounds__(kThreads, 2)
    attention_forward_flash_kernel(AttentionProblem p, Bf16AttentionOperands x, Bf16AttentionOutput out, float* lse) {
  using QTile = typename Tiles<D>::Q;
  using KTile = typename Tiles<D>::K;
  using VTile = typename Tiles<D>::V;
  constexpr int kLineChunks = Tiles<D>::kLineChunks, kTileValues = Tiles<D>::kTileValues;
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
  const LaneAddresses<D> k_at([&](int i) { return KTile::fragment_chunk(0, i, lane, true) * 16; });
  const LaneAddresses<D> v_at([&](int i) { return VTile::fragment_chunk(16 * i, 0, lane, true) * 16; });

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    const std::int64_t key_end = Causal ? min(p.Tk, i0 + kBlockQueries) : p.Tk;
    const int last = key_end > 0 ? static_cast<int>((key_end - 1) / kKeys) : -1;  // the key tile swept first
    const std::int64_t k_step16 = kRowsApart * x.k.st, v_step16 = kRowsApart * x.v.st;
    const auto k_row = [&](std::int64_t j) { return x.k.row(b, h, min(j, p.Tk - 1)) + copy_chunk * kChunk; };
    const auto v_row = [&](std::int64_t j) { return x.v.row(b, h, min(j, p.Tk - 1)) + copy_chunk * kChunk; };
    __syncthreads();  // the previous (b, h) is done with shared memory

    // The queries and the last key tile, then the queries' fragments into registers.
    const bfloat16* q_first = x.q.row(b, h, min(i0 + copy_line, p.Tq - 1)) + copy_chunk * kChunk;
    copy_rows<QTile, kThreads>(q_tile, copy_at, q_first, kRowsApart * x.q.st,
                               static_cast<int>(min(p.Tq - i0, std::int64_t(kBlockQueries))), q_first);
    if (last >= 0) {
      const std::int64_t j0 = std::int64_t(last) * kKeys;
      const int valid = static_cast<int>(key_end - j0);
      const bfloat16 *k_first = k_row(j0 + copy_line), *v_first = v_row(j0 + copy_line);
      copy_rows<KTile, kThreads>(kv, copy_at, k_first, k_step16, valid, k_first);
      copy_rows<VTile, kThreads>(kv + kTileValues, copy_at, v_first, v_step16, valid, v_first);
    }
    commit_async_copies();
    wait_async_copies<0>();
    __syncthreads();
    const WarpQueries<D> q(q_tile, warp, lane);

    WarpRows<D> rows;
    const auto sweep_tile = [&](int buf, std::int64_t j0, auto masked) {
      constexpr int kPart = kScoreKeys<D>, kPartBytes = 2 * kPart * kLineChunks * kChunk;  // lines of K or V
#pragma unroll
      for (int part = 0; part < kKeys / kPart; ++part) {
        Scores<kPart> s = {};
        tile_scores<D>(s, q, byte_offset(kv + 2 * buf * kTileValues, part * kPartBytes), k_at);
        const TileAt at{b, h, w0, j0 + part * kPart, g, t};
        if constexpr (HasMask || decltype(masked)::value) mask_tile<Causal, HasMask>(s, p, at);
        online_softmax(s, rows, scale_log2);
        if constexpr (Dropout) drop_weights(s, p, at);
        add_values(rows, s, byte_offset(kv + 2 * buf * kTileValues + kTileValues, part * kPartBytes), v_at);
      }
    };
    // The tiles below the last are whole: their copies' sources move down a tile at a time.
    const bfloat16* k_next = last >= 1 ? k_row(std::int64_t(last - 1) * kKeys + copy_line) : nullptr;
    const bfloat16* v_next = last >= 1 ? v_row(std::int64_t(last - 1) * kKeys + copy_line) : nullptr;
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
    store_rows(rows, p, bh, w0, g, t, out, lse);
  }
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

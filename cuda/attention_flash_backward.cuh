#pragma once
// The attention backward in FlashAttention-2's shape, for any operand kind:
// the bfloat16 one (cuda/attention_bf16_flash_backward.cu) and the float32 one
// in 3xTF32 (cuda/attention_tf32_flash_backward.cu) share the block's work,
// the stream of query tiles, the weights and dS of each pair, and the ordered
// sum of dQ. How a warp reads and multiplies its fragments and how values are
// stored is the kind's (Kind, at backward_sweep).
//
// A block owns 64 keys of one (b, h), a warp 16 of them, and makes all five
// products in one sweep over the query tiles that see them (causal: from
// its diagonal on), 64 queries a tile:
//   S^T = K Q^T and dP^T = V dO^T, the warp's keys by the tile's queries;
//   P^T = 2^(S^T scale log2(e) - lse log2(e)) and dS^T = P^T (dP^T Z scale -
//     delta scale) where they stand: the accumulators are the A fragments of
//     the next products;
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
#include "cuda/ordered_sum.cuh"

namespace attograd::cuda::attention_detail::flash_backward {

using flash::copy_rows;
using flash::exp2_fast;
using flash::LaneAddresses;
using flash::sweep_is_causal;
using flash::word_at;
using gemm_tiles::byte_offset;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kWarpKeys = 16, kBlockKeys = kWarps * kWarpKeys;
constexpr int kQueries = 64;                // a query tile
constexpr int kStripe = kQueries / kWarps;  // a warp's queries of the tile's dQ
constexpr float kLog2e = 1.4426950408889634f;

// Where a kind keeps its tiles in shared memory, in bytes: K, V (each a line a
// key, as the kind's KRows tile) and dS^T (DsBytes), then two buffers of a
// query tile, each its Q and dO (a line a query, as the kind's QRows tile) and
// terms (lse log2(e), then delta scale).
template <typename KRows, typename QRows, int DsBytes>
struct TileBytes {
  static constexpr int kKey = 16 * KRows::kChunks, kQuery = 16 * QRows::kChunks, kDs = DsBytes;
  static constexpr int kTerms = sizeof(float) * kQueries;
  static constexpr int kBuffersOffset = 2 * kKey + kDs, kBuffer = 2 * kQuery + 2 * kTerms;
  static constexpr int kShared = kBuffersOffset + 2 * kBuffer;
};

// What the kernel reads besides the operands, and writes.
template <typename Value>
struct Gradients {
  ::attograd::AttentionRows<const Value> dout;
  const float *lse, *delta;  // (B, H, Tq)
  float* dq_sums;            // (B H, query tiles, 64, D): dQ's sums between key blocks
  int* turns;                // (B H, query tiles, warps): the key blocks that have added theirs
  ::attograd::AttentionRows<Value> dq, dk, dv;
};

// The dropout factors of a lane's four weights of an accumulator block
// (weight r: query 2t + r % 2, key g + 8 (r / 2)) from one Philox draw a
// lane. Where every row of the weights starts at a multiple of 4 in the
// stream (Tk % 4 == 0), the four keys 4a to 4a + 3 of a row are one draw's
// four words, and lie with the four lanes c = g % 4 of group a = g / 4 (lane
// 16a + 4c + t). Lane c draws for weight r = c (`counter`: query 2t + c % 2,
// keys 4a + 8 (c / 2) on), keeps word c of it, and in round m hands word c ^ m
// to lane c ^ m, getting back word c of draw c ^ m. A word is tested by one
// integer compare (drop_bits_below).
__device__ __forceinline__ void four_factors(float (&z)[4], const AttentionProblem& p, std::uint64_t counter, int c) {
  const Philox4 draw = philox4x32(counter, p.round_keys);
  std::uint32_t got[4];  // got[m]: word c of draw c ^ m
  got[0] = word_at(draw.v, c);
#pragma unroll
  for (int m = 1; m < 4; ++m) got[m] = __shfl_xor_sync(kFullMask, word_at(draw.v, c ^ m), 4 * m);
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    z[r] = word_at(got, c ^ r) < p.drop_below ? 0.0f : p.keep_scale;
  }
}

// A warp's 16 rows of dK or dV from row0, those below `count`, stored by Kind::store_pair.
template <typename Kind, int D, typename Output>
__device__ __forceinline__ void store_key_rows(const float (&acc)[D / 8][4], const Output& out, std::int64_t b,
                                               std::int64_t h, std::int64_t row0, std::int64_t count, int g, int t) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t j = row0 + g + 8 * half;
    if (j >= count) continue;
    auto* row = out.row(b, h, j) + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) Kind::store_pair(row + 8 * n, acc[n][2 * half], acc[n][2 * half + 1]);
  }
}

// The stream of query tiles through the two buffers: this thread's copies of
// Q and dO by cp.async, and its term (threads 0-63 a query's lse, 64-127 its
// delta), loaded into a register with the copies and stored into the buffer at
// the end of the tile before. Every step is worked out once: q_next and o_next
// point at this thread's first copy of the next tile, term_source at its term.
// A copy past Tq reads nothing, from the tensor's first row.
template <typename Tile, typename Bytes, typename Value>
struct QueryStream {
  static constexpr int kRowsApart = kThreads / Tile::kLineChunks;
  const Value *q_next, *o_next;
  std::int64_t q_step16, o_step16, q_tile_step, o_tile_step;
  const float* term_source;
  int term_row, copy_at;
  float next_term = 0.0f;

  template <typename Operands>
  __device__ __forceinline__ QueryStream(const AttentionProblem& p, const Operands& x, const Gradients<Value>& grad,
                                         std::int64_t bh, std::int64_t q0, int copy_at_)
      : q_step16(kRowsApart * x.q.st), o_step16(kRowsApart * grad.dout.st), q_tile_step(kQueries * x.q.st),
        o_tile_step(kQueries * grad.dout.st), term_row(static_cast<int>(threadIdx.x) % kQueries), copy_at(copy_at_) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    const int line = threadIdx.x / Tile::kLineChunks, chunk = threadIdx.x % Tile::kLineChunks;
    q_next = x.q.row(b, h, q0 + line) + chunk * Tile::kChunkValues;
    o_next = grad.dout.row(b, h, q0 + line) + chunk * Tile::kChunkValues;
    term_source = (threadIdx.x < kQueries ? grad.lse : grad.delta) + bh * p.Tq + q0 + term_row;
  }
  // The next tile, `rows` of it below Tq, into the buffer at buf_at; q_data and dout_data are where nothing is read.
  __device__ __forceinline__ void copy(std::uint16_t* buffers, int buf_at, int rows, const Value* q_data,
                                       const Value* dout_data) {
    copy_rows<Tile, kThreads>(byte_offset(buffers, buf_at), copy_at, q_next, q_step16, rows, q_data);
    copy_rows<Tile, kThreads>(byte_offset(buffers, buf_at + Bytes::kQuery), copy_at, o_next, o_step16, rows,
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
    reinterpret_cast<float*>(byte_offset(buffers, buf_at + 2 * Bytes::kQuery))[threadIdx.x] = term;
  }
};

// What a lane's products of one query tile read (tile_part). Keys and Reads: the kind's.
template <typename Keys, typename Reads>
struct TileWork {
  const AttentionProblem& p;
  const Keys& keys;
  const Reads& reads;
  const std::uint16_t *q_buf, *o_buf;    // the tile's Q and dO
  const float *lse_log2, *delta_scaled;  // and terms
  std::uint16_t* ds_tile;
  std::int64_t b, h, q0, j0;
  int warp, g, t;
  int valid_keys, past;  // the block's keys below Tk; causal, key > query + past is hidden
  float scale_log2;
  std::uint64_t draw_counter;  // dropout: the lane's draw for the tile's first block
};

// A kind's types at head size D from its templates: its tiles, its warps' keys
// and its lanes' offsets, and what its products of a tile read.
template <template <int> class TilesOf, template <int> class KeysOf, template <int> class ReadsOf>
struct KindTypes {
  template <int D>
  using Tiles = TilesOf<D>;
  template <int D>
  using Keys = KeysOf<D>;
  template <int D>
  using Reads = ReadsOf<D>;
  template <int D>
  using Work = TileWork<Keys<D>, Reads<D>>;
};

// S^T and dP^T of queries part * Blocks * 8 on (Blocks blocks of 8) become P Z
// and scale dS where they stand (Masked: hidden pairs 0).
template <bool Causal, bool HasMask, bool Dropout, bool Masked, int Blocks, typename Work>
__device__ __forceinline__ void weights_and_ds(float (&s)[Blocks][4], float (&dp)[Blocks][4], const Work& w,
                                               int part) {
  const int g = w.g, t = w.t;
#pragma unroll
  for (int n = 0; n < Blocks; ++n) {
    const int block = part * Blocks + n;  // of the tile's 8 blocks of 8 queries
    const float2 lse_pair = *reinterpret_cast<const float2*>(w.lse_log2 + 8 * block + 2 * t);
    const float2 delta_pair = *reinterpret_cast<const float2*>(w.delta_scaled + 8 * block + 2 * t);
    float z[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    // Each block 8 queries on is 2 Tk counters on.
    if (Dropout) four_factors(z, w.p, w.draw_counter + block * 2 * static_cast<std::uint64_t>(w.p.Tk), g % 4);
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
}

// Queries [part * kPart, part * kPart + kPart) of the tile: S^T and dP^T; P Z
// and scale dS where they stand; dV += (P Z)^T dO and dK += dS^T Q; dS^T into
// shared memory for dQ.
template <typename Kind, int D, bool Causal, bool HasMask, bool Dropout, bool Masked, typename Work>
__device__ __forceinline__ void tile_part(float (&dk)[D / 8][4], float (&dv)[D / 8][4], const Work& w, int part) {
  constexpr int kBlocks = Kind::template kPartQueries<D> / 8;
  float s[kBlocks][4] = {}, dp[kBlocks][4] = {};  // S^T and dP^T: rows keys, columns queries
  Kind::template key_scores<D>(s, dp, w, part);
  weights_and_ds<Causal, HasMask, Dropout, Masked>(s, dp, w, part);
  Kind::template add_key_grads<D>(dk, dv, s, dp, w, part);
}

// Where a lane's rows g and g + 8 of its warp's 16 queries of a tile's dQ go:
// the float32 sums between key blocks, dq, and the warp's counter.
template <typename Value>
struct DqStripe {
  float* sums;
  Value* out;
  std::int64_t half_step;  // dq's 8 rows
  int* turn;
};

// The tile's dQ from these keys for the warp's 16 queries (Kind::tile_dq), added
// to the key blocks' before in their order; the last block (`last`) stores the
// sum into dq, its rows below rows_left (counted from the warp's first).
template <typename Kind, int D, typename Value, typename Reads>
__device__ __forceinline__ void add_tile_dq(const DqStripe<Value>& at, const std::uint16_t* ds_tile,
                                           const std::uint16_t* k_tile, const Reads& reads, int jb, int last,
                                           int rows_left, int g) {
  float dq[D / 8][4] = {};
  Kind::template tile_dq<D>(dq, ds_tile, k_tile, reads);
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
        Kind::store_pair(at.out + half * at.half_step + 8 * n, sum.x, sum.y);
    }
  }
  if (jb != last) pass_turn(at.turn, jb + 1);
}

// The backward of the block's keys, for every (b, h) its grid row takes.
// Kind (the kernel's operands) gives:
//   Value, Tiles<D>: KRows and QRows (OperandTiles: a line a key, a query) and Bytes (TileBytes)
//   kPartQueries<D>                     queries of a tile whose S^T and dP^T a warp holds at once
//   Keys<D>(k_tile, v_tile, warp, lane) a warp's keys and values as A fragments, held or read
//   Reads<D>(warp, lane)                a lane's offsets into the tiles
//   key_scores<D>(s, dp, work, part)    S^T and dP^T
//   add_key_grads<D>(dk, dv, s, dp, work, part)  dV and dK, and dS^T into work.ds_tile
//   tile_dq<D>(dq, ds_tile, k_tile, reads)       dS K for the warp's 16 queries
//   store_pair(at, x0, x1)              two neighbouring values of an output row
template <typename Kind, int D, bool Causal, bool HasMask, bool Dropout, typename Operands>
__device__ __forceinline__ void backward_sweep(const AttentionProblem& p, const Operands& x,
                                               const Gradients<typename Kind::Value>& grad) {
  using Value = typename Kind::Value;
  using T = typename Kind::template Tiles<D>;
  using Bytes = typename T::Bytes;
  constexpr int kLineChunks = T::KRows::kLineChunks, kRowsApart = kThreads / kLineChunks;
  static_assert(kLineChunks == T::QRows::kLineChunks, "every tile of rows has a line a row, its head size in chunks");
  constexpr int kPart = Kind::template kPartQueries<D>;
  std::uint16_t* const smem = dynamic_shared_memory<std::uint16_t>();
  std::uint16_t* const k_tile = smem;
  std::uint16_t* const v_tile = byte_offset(k_tile, Bytes::kKey);
  std::uint16_t* const ds_tile = byte_offset(v_tile, Bytes::kKey);
  // Buffer u at byte u * kBuffer from here: Q, dO, lse, delta. A buffer's
  // offset goes to the other's by an exclusive or, where a multiply made 64-bit addresses.
  std::uint16_t* const buffers = byte_offset(smem, Bytes::kBuffersOffset);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const int jb = blockIdx.x;
  const std::int64_t j0 = std::int64_t(jb) * kBlockKeys, w0 = j0 + kWarpKeys * warp;
  const int key_blocks = static_cast<int>((p.Tk + kBlockKeys - 1) / kBlockKeys);
  const int query_tiles = static_cast<int>((p.Tq + kQueries - 1) / kQueries);
  const auto rows_from = [&](std::int64_t q0) { return static_cast<int>(min(p.Tq - q0, std::int64_t(kQueries))); };

  // This thread's copies: a line of each tile and every kRowsApart-th after it, one chunk of each.
  const int copy_line = threadIdx.x / kLineChunks, copy_chunk = threadIdx.x % kLineChunks;
  const int copy_at = gemm_tiles::Swizzle<kLineChunks>::at(copy_line, copy_chunk) * 16;
  const typename Kind::template Reads<D> reads(warp, lane);

  for (std::int64_t bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    const int first_tile = sweep_is_causal<Causal, HasMask>(p) ? jb : 0;  // the query tiles before it see none of these keys
    const std::int64_t q0_first = std::int64_t(first_tile) * kQueries;
    const int valid_keys = static_cast<int>(min(p.Tk - j0, std::int64_t(kBlockKeys)));
    __syncthreads();  // the previous (b, h) is done with shared memory

    const Value* k_first = x.k.row(b, h, min(j0 + copy_line, p.Tk - 1)) + copy_chunk * T::KRows::kChunkValues;
    const Value* v_first = x.v.row(b, h, min(j0 + copy_line, p.Tk - 1)) + copy_chunk * T::KRows::kChunkValues;
    copy_rows<typename T::KRows, kThreads>(k_tile, copy_at, k_first, kRowsApart * x.k.st, valid_keys, k_first);
    copy_rows<typename T::KRows, kThreads>(v_tile, copy_at, v_first, kRowsApart * x.v.st, valid_keys, v_first);
    commit_async_copies();
    QueryStream<typename T::QRows, Bytes, Value> stream(p, x, grad, bh, q0_first, copy_at);
    if (first_tile < query_tiles) stream.copy(buffers, 0, rows_from(q0_first), x.q.data, grad.dout.data);
    commit_async_copies();
    wait_async_copies<1>();  // K and V have landed
    if (first_tile < query_tiles) stream.store_terms(buffers, 0, rows_from(q0_first), p.scale);
    __syncthreads();
    const typename Kind::template Keys<D> keys(k_tile, v_tile, warp, lane);

    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    const std::int64_t stripe_row = std::int64_t(bh * query_tiles + first_tile) * kQueries + kStripe * warp + g;
    DqStripe<Value> dq_at{grad.dq_sums + stripe_row * D + 2 * t,
                          grad.dq.row(b, h, 0) + (q0_first + kStripe * warp + g) * grad.dq.st + 2 * t, 8 * grad.dq.st,
                          grad.turns + (bh * query_tiles + first_tile) * kWarps + warp};
    const std::int64_t dq_tile_step = kQueries * grad.dq.st;
    // Dropout (four_factors): this lane's draw for its first accumulator block of the
    // tile; each block 8 queries on is 2 Tk counters on, each tile 16 Tk.
    const int c = g % 4;
    std::uint64_t draw_counter = 0;
    if (Dropout) draw_counter = p.offset + p.weight_index(b, h, q0_first + 2 * t + c % 2, w0 + (g - c) + 8 * (c / 2)) / 4;
    // Causal: key > query + past is hidden, past being the tile's first query less the block's
    // first key (0 on the first tile, the diagonal), and at most 64, past which nothing is.
    int past = 0;
    std::int64_t q0 = q0_first;
    for (int tile = first_tile, buf_at = 0; tile < query_tiles; ++tile, buf_at ^= Bytes::kBuffer, q0 += kQueries) {
      wait_async_copies<0>();  // this tile has landed
      __syncthreads();         // everyone's copies have, and everyone is done with the other buffer and dS^T
      const bool more = tile + 1 < query_tiles;
      const int rows = rows_from(q0), next_rows = rows_from(q0 + kQueries);
      if (more) stream.copy(buffers, buf_at ^ Bytes::kBuffer, next_rows, x.q.data, grad.dout.data);
      commit_async_copies();

      const float* lse_log2 = reinterpret_cast<const float*>(byte_offset(buffers, buf_at + 2 * Bytes::kQuery));
      const TileWork<typename Kind::template Keys<D>, typename Kind::template Reads<D>> work{
          p,         keys, reads, byte_offset(buffers, buf_at), byte_offset(buffers, buf_at + Bytes::kQuery),
          lse_log2,  lse_log2 + kQueries, ds_tile, b, h, q0, j0, warp, g, t, valid_keys, past, p.scale * kLog2e,
          draw_counter};
      if (HasMask || valid_keys < kBlockKeys || (Causal && tile == first_tile)) {
#pragma unroll
        for (int part = 0; part < kQueries / kPart; ++part)
          tile_part<Kind, D, Causal, HasMask, Dropout, true>(dk, dv, work, part);
      } else {
#pragma unroll
        for (int part = 0; part < kQueries / kPart; ++part)
          tile_part<Kind, D, Causal, HasMask, Dropout, false>(dk, dv, work, part);
      }
      __syncthreads();  // dS^T is whole

      const int last_block = sweep_is_causal<Causal, HasMask>(p) ? min(tile, key_blocks - 1) : key_blocks - 1;
      add_tile_dq<Kind, D>(dq_at, ds_tile, k_tile, reads, jb, last_block,
                           rows - kStripe * warp, g);
      if (more) stream.store_terms(buffers, buf_at ^ Bytes::kBuffer, next_rows, p.scale);
      dq_at.sums += kQueries * D, dq_at.turn += kWarps, dq_at.out += dq_tile_step;
      past = min(past + kQueries, kQueries), draw_counter += 16 * static_cast<std::uint64_t>(p.Tk);
    }
    store_key_rows<Kind, D>(dk, grad.dk, b, h, w0, p.Tk, g, t);
    store_key_rows<Kind, D>(dv, grad.dv, b, h, w0, p.Tk, g, t);
  }
}

// Launches `kernel` (the kernel its family makes for p) over the key blocks,
// with what its ordered sum of dQ needs: the sums between key blocks (none
// where one block holds every key) and the turns' counters, at 0, which it
// sets in grad.
template <typename Kernel, typename Operands, typename Value>
void launch_backward(Kernel kernel, int smem, const AttentionProblem& p, const Operands& x, Gradients<Value> grad,
                     cudaStream_t stream) {
  const std::int64_t query_tiles = (p.Tq + kQueries - 1) / kQueries, key_blocks = (p.Tk + kBlockKeys - 1) / kBlockKeys;
  AG_CHECK(query_tiles <= 0x7fffffff / kWarps, "attention", "sequence of {} queries is too long for the CUDA kernels",
           p.Tq);
  const std::size_t sum_values = key_blocks > 1 ? static_cast<std::size_t>(p.B * p.H * query_tiles * kQueries * p.D) : 1;
  DeviceBuffer sums(sizeof(float) * sum_values);
  const std::size_t turn_bytes = sizeof(int) * static_cast<std::size_t>(p.B * p.H * query_tiles * kWarps);
  DeviceBuffer turns(turn_bytes);
  CUDA_CHECK(cudaMemsetAsync(turns.as<void>(), 0, turn_bytes, stream));
  grad.dq_sums = sums.as<float>(), grad.turns = turns.as<int>();
  allow_shared_memory(kernel, smem);
  launch(kernel, grid_over(p.Tk, kBlockKeys, p.B, p.H), kThreads, smem, stream, p, x, grad);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attograd::cuda::attention_detail::flash_backward

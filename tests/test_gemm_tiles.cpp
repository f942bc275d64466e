// The pipelined bfloat16 product's shared-memory layouts (cuda/gemm_tiles.h),
// on the host, from the same functions the kernel calls: each swizzle is a
// bijection, and every access the kernel makes (the copies into a stage,
// ldmatrix, C's staging on its way out) meets no bank conflict. A GPU serves a
// 16-byte access of a warp in phases of eight lanes (128 bytes, all 32 banks),
// a 4-byte one in one; a phase takes as many wavefronts as the most distinct
// 16-byte chunks (or words) that share banks.
#include <algorithm>
#include <array>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "cuda/gemm_tiles.h"

using namespace attograd::cuda::gemm_tiles;

namespace {

// Wavefronts of one phase of 16-byte accesses, given each lane's chunk index.
int chunk_wavefronts(const std::vector<int>& chunks) {
  std::array<std::set<int>, 8> by_banks;  // a chunk covers banks 4 (c % 8) to 4 (c % 8) + 3
  for (int c : chunks) by_banks[static_cast<std::size_t>(c % 8)].insert(c);
  int most = 0;
  for (const auto& same : by_banks) most = std::max(most, static_cast<int>(same.size()));
  return most;
}

// Wavefronts of a warp's 4-byte accesses, given each lane's word index.
int word_wavefronts(const std::vector<int>& words) {
  std::array<std::set<int>, 32> by_bank;
  for (int w : words) by_bank[static_cast<std::size_t>(w % 32)].insert(w);
  int most = 0;
  for (const auto& same : by_bank) most = std::max(most, static_cast<int>(same.size()));
  return most;
}

template <int LineChunks>
void require_bijection(int lines) {
  std::set<int> seen;
  for (int l = 0; l < lines; ++l)
    for (int c = 0; c < LineChunks; ++c) {
      const int at = Swizzle<LineChunks>::at(l, c);
      INFO("line " << l << ", chunk " << c);
      REQUIRE(at / LineChunks == l);  // a line's chunks stay in it
      seen.insert(at);
    }
  REQUIRE(static_cast<int>(seen.size()) == lines * LineChunks);
}

// The most wavefronts any ldmatrix of the kernel takes on this operand's tile,
// a warp at each 64-row position, each step and block; `chunk` maps (row0,
// step, lane) to the chunk read, the kernel's fragment_chunk or an unswizzled one.
template <typename Chunk>
int worst_fragment_load(int rows, int steps, int blocks, Chunk chunk) {
  int worst = 0;
  for (int warp_row0 = 0; warp_row0 < rows; warp_row0 += 16 * blocks)
    for (int step = 0; step < steps; ++step)
      for (int f = 0; f < blocks; ++f)
        for (int phase = 0; phase < 4; ++phase) {
          std::vector<int> chunks;
          for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) chunks.push_back(chunk(warp_row0 + 16 * f, step, lane));
          worst = std::max(worst, chunk_wavefronts(chunks));
        }
  return worst;
}

// An operand's tile, read by warps of `blocks` 16-row blocks (of A fragments,
// or pairs of B's) and copied by kThreads threads; ValueBytes 4: the float32
// product's, whose tiles with rows fastest are only copied here (SplitPairTile
// holds what its warps read).
template <int Rows, bool KFastest, int K = kBK, int kThreads = PipelineShape<128, 256>::kThreads, int ValueBytes = 2>
void require_operand_tile(bool b_pair, int blocks = kWarpTile / 16) {
  using Tile = OperandTile<Rows, KFastest, K, ValueBytes>;
  INFO("tile of " << Rows << " rows by " << K << ", " << ValueBytes << " bytes a value, "
                  << (KFastest ? "k fastest" : "rows fastest") << (b_pair ? ", B" : ", A"));
  const int steps = K / Tile::kStepValues;

  if constexpr (ValueBytes == 2 || KFastest) {
    // ldmatrix: one wavefront a phase; the same reads unswizzled take four (lines of 64 bytes) or eight.
    const auto swizzled = [&](int row0, int step, int lane) { return Tile::fragment_chunk(row0, step, lane, b_pair); };
    CHECK(worst_fragment_load(Rows, steps, blocks, swizzled) == 1);
    const auto plain = [&](int row0, int step, int lane) {
      const int q = lane / 8, q_rows = b_pair ? q / 2 : q % 2, q_k = b_pair ? q % 2 : q / 2;
      const int row = row0 + 8 * q_rows, k_chunk = ValueBytes == 4 ? step + 2 * q_k : 2 * step + q_k;
      return KFastest ? (row + lane % 8) * Tile::kLineChunks + k_chunk
                      : (k_chunk * Tile::kChunkValues + lane % 8) * Tile::kLineChunks + row / Tile::kChunkValues;
    };
    CHECK(worst_fragment_load(Rows, steps, blocks, plain) == (Tile::kLineChunks == 4 ? 4 : 8));

    // What the kernel's FragmentOffsets assume: blocks (k fastest) or steps (otherwise) a constant apart.
    for (int warp_row0 = 0; warp_row0 < Rows; warp_row0 += 16 * blocks)
      for (int lane = 0; lane < 32; ++lane)
        for (int step = 0; step < steps; ++step)
          for (int f = 0; f < blocks; ++f) {
            const int from = KFastest ? Tile::fragment_chunk(warp_row0, step, lane, b_pair)
                                      : Tile::fragment_chunk(warp_row0 + 16 * f, 0, lane, b_pair);
            REQUIRE(Tile::fragment_chunk(warp_row0 + 16 * f, step, lane, b_pair) ==
                    from + (KFastest ? f : step) * Tile::kLineStride);
          }
  }

  // The copies: every chunk once, each phase of eight threads one wavefront, and copy i
  // of a thread i * kThreads chunks after its copy 0 (OperandCopies' one destination).
  REQUIRE(Tile::template kCopiesEvenlyApart<kThreads>);
  std::set<int> stored;
  for (int v = 0; v < Tile::kChunks; v += 8) {
    std::vector<int> chunks;
    for (int u = v; u < v + 8; ++u) {
      const auto [line, chunk] = Tile::copy(u);
      chunks.push_back(Tile::Layout::at(line, chunk));
      stored.insert(chunks.back());
      const auto [line0, chunk0] = Tile::copy(u % kThreads);
      REQUIRE(chunks.back() == Tile::Layout::at(line0, chunk0) + u / kThreads * kThreads);
    }
    CHECK(chunk_wavefronts(chunks) == 1);
  }
  REQUIRE(static_cast<int>(stored.size()) == Tile::kChunks);
}

}  // namespace

TEST_CASE("gemm tiles: each swizzle is a bijection of its tile that keeps a line's chunks in the line", "[gemm_tiles]") {
  require_bijection<2>(64);
  require_bijection<4>(256);
  require_bijection<16>(32);
  require_bijection<32>(128);
}

TEST_CASE("gemm tiles: the pipelined product's copies and ldmatrix meet no bank conflict in any layout",
          "[gemm_tiles]") {
  require_operand_tile<128, true>(false);   // A as it is
  require_operand_tile<128, false>(false);  // A transposed
  require_operand_tile<256, true>(true);    // B transposed
  require_operand_tile<256, false>(true);   // B as it is
}

// The sm_90a product's tiles (WgmmaTile; cuda/matmul_bf16_wgmma.cu): each layout a bijection
// onto the tile; each value (row, k) where the tensor cores' canonical layout with the 128-byte
// swizzle puts it, the formula cuda/wgmma.cuh's emulation decodes descriptors by (K-major: row r at
// (r / 8) 1024 + (r % 8) 128; MN-major: block r / 64 at 8 KiB, k / 8 at 1024, k % 8 at 128; then
// the address's 16-byte chunk XORed with its bits 7-9); and the copies of 256 threads, eight a
// phase, meet no bank conflict, copy i + 1 a constant after copy i.
template <int Rows, bool KFastest>
void require_wgmma_tile() {
  using Tile = WgmmaTile<Rows, KFastest>;
  std::set<int> seen;
  for (int line = 0; line < Tile::kLines; ++line)
    for (int c = 0; c < Tile::kLineChunks; ++c) seen.insert(Tile::Layout::at(line, c));
  REQUIRE(static_cast<int>(seen.size()) == Tile::kChunks);
  REQUIRE(*seen.rbegin() == Tile::kChunks - 1);
  for (int row = 0; row < Rows; ++row)
    for (int k = 0; k < Tile::kK; ++k) {
      const int line = KFastest ? row : k, chunk = KFastest ? k / 8 : row / 8, in_chunk = KFastest ? k % 8 : row % 8;
      const int stored = Tile::Layout::at(line, chunk) * 16 + 2 * in_chunk;
      const int logical = KFastest ? row / 8 * 1024 + row % 8 * 128 + k / 8 * 16 + 2 * (k % 8)  // step k / 16, k % 16 within
                                   : row / 64 * 8192 + k / 8 * 1024 + k % 8 * 128 + 2 * (row % 64);
      INFO("row " << row << ", k " << k);
      REQUIRE(stored == (logical ^ ((logical >> 7 & 7) << 4)));
    }
  constexpr int threads = 256;
  const int apart = Tile::Layout::at(threads / Tile::kLineChunks, 0) - Tile::Layout::at(0, 0);
  for (int i = 0; i + 1 < Tile::kChunks / threads; ++i)
    for (int t = 0; t < threads; ++t) {
      const auto [line, chunk] = Tile::copy(t + i * threads);
      const auto [next_line, next_chunk] = Tile::copy(t + (i + 1) * threads);
      REQUIRE(Tile::Layout::at(next_line, next_chunk) - Tile::Layout::at(line, chunk) == apart);
    }
  for (int first = 0; first < Tile::kChunks; first += 8) {
    std::vector<int> phase;
    for (int v = first; v < first + 8; ++v) phase.push_back(Tile::Layout::at(Tile::copy(v).line, Tile::copy(v).chunk));
    INFO("copies " << first << " to " << first + 7);
    REQUIRE(chunk_wavefronts(phase) == 1);
  }
}

TEST_CASE("gemm tiles: the sm_90a product's tiles are the tensor cores' layouts, and copies meet no bank conflict",
          "[gemm_tiles]") {
  require_wgmma_tile<128, true>();   // A as it is
  require_wgmma_tile<128, false>();  // A transposed
  require_wgmma_tile<256, true>();   // B transposed
  require_wgmma_tile<256, false>();  // B as it is
}

// cuda/attention_bf16_flash.cu, at head sizes 64 and 32: 4 warps (128 threads) copy Q's 128 rows and
// each key tile's K and V; a warp reads Q's fragments for its 32 queries (two
// blocks), K's as B^T (a line a key) and V's as B (a line a key, read
// transposing) across the whole tile.
TEST_CASE("gemm tiles: the flash attention's Q, K and V tiles meet no bank conflict", "[gemm_tiles]") {
  require_operand_tile<128, true, 64, 128>(false, 2);  // Q: a line a query
  require_operand_tile<64, true, 64, 128>(true, 4);    // K: a line a key, 64 keys
  require_operand_tile<64, false, 64, 128>(true, 4);   // V: a line a key, 64 values of D
  require_operand_tile<128, true, 32, 128>(false, 2);  // the same at head size 32: lines of 64 bytes
  require_operand_tile<64, true, 32, 128>(true, 4);
  require_operand_tile<32, false, 64, 128>(true, 2);
}

// cuda/attention_bf16_flash_backward.cu at each head size: 4 warps (128 threads) copy each query
// tile's Q and dO (64 rows) and the block's K and V (64 keys); a warp reads its 16 keys as A (K,
// V: KRows), every query as B^T (Q, dO: QRows) and transposed as B (QCols), K transposed as B of
// dS K (KCols), and its 16 queries of dS^T transposed as A (DsT), which it stores a word at a time:
// word t of a chunk of key lines 16 warp + g and + 8, as the lanes' accumulators hold dS.
template <int D>
void require_flash_backward_tiles() {
  INFO("head size " << D);
  require_operand_tile<64, true, D, 128>(false, 1);       // KRows: the warp's 16 keys
  require_operand_tile<64, true, D, 128>(true, 4);        // QRows: the tile's 64 queries
  require_operand_tile<D, false, 64, 128>(true, D / 16);  // QCols: all of D, the queries summed
  require_operand_tile<D, false, 64, 128>(true, D / 16);  // KCols: all of D, the keys summed
  require_operand_tile<64, false, 64, 128>(false, 1);     // DsT: the warp's 16 queries of dQ
  using DsT = OperandTile<64, false, 64>;
  for (int warp = 0; warp < 4; ++warp)
    for (int chunk = 0; chunk < DsT::kLineChunks; ++chunk)
      for (int half = 0; half < 2; ++half) {
        std::vector<int> words, plain;
        for (int lane = 0; lane < 32; ++lane) {
          const int line = 16 * warp + lane / 4 + 8 * half;
          words.push_back(DsT::Layout::at(line, chunk) * 4 + lane % 4);
          plain.push_back((line * DsT::kLineChunks + chunk) * 4 + lane % 4);
        }
        CHECK(word_wavefronts(words) == 1);
        CHECK(word_wavefronts(plain) == 8);
      }
}

TEST_CASE("gemm tiles: the flash attention backward's tiles meet no bank conflict at every head size",
          "[gemm_tiles]") {
  require_flash_backward_tiles<32>();
  require_flash_backward_tiles<64>();
  require_flash_backward_tiles<128>();
}

TEST_CASE("gemm tiles: C's staging takes one wavefront a store and a read", "[gemm_tiles]") {
  using Shape = PipelineShape<128, 256>;
  using C = Shape::CLayout;
  constexpr int kLineChunks = 256 / kChunk;
  std::set<int> chunks_written;
  // The stores: lane (g, t) of a warp writes word t of chunk (warp_n 64 + 8 j) / 8 of row
  // warp_m 64 + 16 i + 8 half + g, as the kernel's epilogue does.
  for (int warp = 0; warp < Shape::kWarps; ++warp)
    for (int i = 0; i < 4; ++i)
      for (int half = 0; half < 2; ++half)
        for (int j = 0; j < 8; ++j) {
          const int warp_m = warp / Shape::kWarpsN, warp_n = warp % Shape::kWarpsN;
          std::vector<int> words;
          for (int lane = 0; lane < 32; ++lane) {
            const int row = warp_m * kWarpTile + 16 * i + 8 * half + lane / 4, chunk = (warp_n * kWarpTile + 8 * j) / kChunk;
            words.push_back(C::at(row, chunk) * 4 + lane % 4);
            chunks_written.insert(C::at(row, chunk));
          }
          CHECK(word_wavefronts(words) == 1);
        }
  REQUIRE(static_cast<int>(chunks_written.size()) == 128 * kLineChunks);
  // The reads: thread v reads chunk v % 32 of row v / 32, in phases of eight.
  for (int v = 0; v < 128 * kLineChunks; v += 8) {
    std::vector<int> chunks;
    for (int u = v; u < v + 8; ++u) chunks.push_back(C::at(u / kLineChunks, u % kLineChunks));
    CHECK(chunk_wavefronts(chunks) == 1);
  }
}

// The float32 product's stages (cuda/matmul_tf32_pipelined.cu): with k fastest
// read by ldmatrix (a step's k chunks `step` and `step + 2`), with rows fastest
// only copied and read back by the thread that copied them.
TEST_CASE("gemm tiles: the float32 product's stages meet no bank conflict in any layout", "[gemm_tiles]") {
  constexpr int kThreads = PipelineShape<128, 256>::kThreads;
  require_operand_tile<128, true, kBKFloat, kThreads, 4>(false);  // A as it is
  require_operand_tile<128, false, kBKFloat, kThreads, 4>(false);  // A transposed
  require_operand_tile<256, true, kBKFloat, kThreads, 4>(true);    // B transposed
  require_operand_tile<256, false, kBKFloat, kThreads, 4>(true);   // B as it is
}

namespace {

// SplitPairTile<Rows, Group> as the float32 product writes and reads it: the
// layout a bijection whose chunks hold what the kernel's stores put there,
// the split stores and the fragment reads one wavefront each (their
// unswizzled twins more), and the constants the kernel's WordOffsets add.
template <int Rows, int Group>
void require_split_pair_tile() {
  using Split = SplitPairTile<Rows, Group>;
  using Stage = OperandTile<Rows, false, kBKFloat, 4>;
  constexpr int kThreads = PipelineShape<128, 256>::kThreads;
  INFO("split tile of " << Rows << " rows, groups of " << Group);

  std::set<int> words;
  for (int r = 0; r < Rows; ++r)
    for (int k = 0; k < kBKFloat; ++k) {
      const int w = Split::word(r, k);
      REQUIRE(w / (4 * Split::kLineChunks) == k % 8);  // line k % 8
      words.insert(w);
    }
  REQUIRE(static_cast<int>(words.size()) == Rows * kBKFloat);

  // The split stores: thread v copied chunk c = v % LC of stage line v / LC + i R (R lines
  // a round), i < 8 / R at k < 8 and their partners at k + 8; it stores chunk 2c + h as
  // rows 4c + 2h, 4c + 2h + 1 at k and k + 8, in the order the kernel's float4s give.
  constexpr int kRound = kThreads / Stage::kLineChunks;
  for (int i = 0; i < 8 / kRound; ++i)
    for (int h = 0; h < 2; ++h)
      for (int v0 = 0; v0 < kThreads; v0 += 8) {
        std::vector<int> chunks, plain;
        for (int v = v0; v < v0 + 8; ++v) {
          const int c = v % Stage::kLineChunks, k = v / Stage::kLineChunks + i * kRound;
          const int at = Split::at(k, 2 * c + h), r = 4 * c + 2 * h;
          const int want[4] = {Split::word(r, k), Split::word(Group == 2 ? r + 1 : r, Group == 2 ? k : k + 8),
                               Split::word(Group == 2 ? r : r + 1, Group == 2 ? k + 8 : k), Split::word(r + 1, k + 8)};
          for (int e = 0; e < 4; ++e) REQUIRE(want[e] == 4 * at + e);
          // What the kernel's addresses assume: chunk 2c + 1 next to 2c, and pairs i R lines apart.
          REQUIRE(at == (Split::at(k - i * kRound, 2 * c) ^ h) + i * kRound * Split::kLineChunks);
          chunks.push_back(at);
          plain.push_back(k * Split::kLineChunks + 2 * c + h);
        }
        CHECK(chunk_wavefronts(chunks) == 1);
        CHECK(chunk_wavefronts(plain) == 2);
      }

  // The reads of one warp's 64 rows at each step: A a 16-byte chunk a lane (phases of 8
  // lanes), its fragment's rows g, g + 8 (the block's 2g, 2g + 1) at k, then at k + 8;
  // B an 8-byte pair (phases of 16 lanes), column g at k and k + 8. What WordOffsets
  // assumes: items 32 rows on are 256 bytes on, the second step 4 lines on.
  constexpr int kItemRows = 8 * Group, kItems = kWarpTile / kItemRows, kPeriod = 32 / kItemRows;
  const auto plain_word = [](int r, int k) {
    const int w = 2 * Group * (r / Group) + Group * (k / 8) + r % Group;
    return (k % 8) * 4 * Split::kLineChunks + w;
  };
  for (int row0 = 0; row0 < Rows; row0 += kWarpTile)
    for (int step = 0; step < 2; ++step)
      for (int item = 0; item < kItems; ++item) {
        const int first = row0 + kItemRows * item;
        for (int phase = 0; phase < 32 / (4 * Group); ++phase) {
          std::vector<int> banks, plain;
          for (int lane = phase * 4 * Group; lane < (phase + 1) * 4 * Group; ++lane) {
            const int g = lane / 4, t = lane % 4, w = Split::lane_word(first, step, lane);
            REQUIRE(w == Split::lane_word(row0 + kItemRows * (item % kPeriod), 0, lane) + item / kPeriod * 64 +
                             step * 4 * 4 * Split::kLineChunks);
            const int r = first + Group * g, k = 4 * step + t;
            REQUIRE(w == Split::word(r, k));
            REQUIRE(w + 1 == Split::word(Group == 2 ? r + 1 : r, Group == 2 ? k : k + 8));
            if (Group == 2) {
              REQUIRE(w + 2 == Split::word(r, k + 8));
              REQUIRE(w + 3 == Split::word(r + 1, k + 8));
            }
            for (int e = 0; e < 2 * Group; ++e) banks.push_back(w + e), plain.push_back(plain_word(r, k) + e);
          }
          CHECK(word_wavefronts(banks) == 1);
          CHECK(word_wavefronts(plain) == 4);
        }
      }
}

}  // namespace

TEST_CASE("gemm tiles: the float32 product's split tiles hold the fragments and meet no bank conflict",
          "[gemm_tiles]") {
  require_split_pair_tile<128, 2>();  // A transposed
  require_split_pair_tile<256, 1>();  // B as it is
}

namespace {

// Wavefronts of a warp's 8-byte accesses, given each lane's first word: a
// half-warp (16 lanes, 128 bytes) a phase.
int pair_wavefronts(const std::vector<int>& first_words) {
  int most = 0;
  for (int half = 0; half < 2; ++half) {
    std::vector<int> words;
    for (int lane = 16 * half; lane < 16 * half + 16; ++lane)
      words.push_back(first_words[static_cast<std::size_t>(lane)]),
          words.push_back(first_words[static_cast<std::size_t>(lane)] + 1);
    most = std::max(most, word_wavefronts(words));
  }
  return most;
}

// The float32 flash attention's reads across the rows of a tile of D float32
// values a line (cuda/attention_tf32_reads.cuh's RowPairReads): the offsets it
// works out from RowPairs are where the copies' swizzle put each value, and
// each read, a word a lane, takes one wavefront (four unswizzled).
template <int D>
void require_row_pair_reads(int rows) {
  using Pairs = RowPairs<D / 4>;
  INFO("head size " << D);
  for (int kb = 0; kb < rows / 8; ++kb)
    for (int nd = 0; nd < D / 8; ++nd)
      for (int r = 0; r < 2; ++r) {
        std::vector<int> words, plain;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4, row = 8 * kb + 2 * t + r, column = 8 * nd + g;
          const int at = kb * 8 * Pairs::kLineBytes + nd / 4 * 128 + Pairs::first(lane, nd % 4) + r * Pairs::next(lane);
          REQUIRE(at == Swizzle<D / 4>::at(row, column / 4) * 16 + 4 * (column % 4));
          words.push_back(at / 4);
          plain.push_back(row * D + column);
        }
        CHECK(word_wavefronts(words) == 1);
        CHECK(word_wavefronts(plain) == 4);
      }
}

}  // namespace

// cuda/attention_tf32_flash.cu and attention_tf32_flash_backward.cu at head
// sizes 64 and 32: 4 warps copy tiles of float32 rows, a line a row; ldmatrix
// reads Q's A fragments (32 queries a warp in the forward) and K's B^T pairs
// in the forward, K's and V's A fragments (16 keys a warp) and Q's and dO's B^T
// pairs in the backward; the rest is read across the rows.
TEST_CASE("gemm tiles: the float32 flash attention's tiles meet no bank conflict", "[gemm_tiles]") {
  require_operand_tile<128, true, 64, 128, 4>(false, 2);  // forward: Q
  require_operand_tile<64, true, 64, 128, 4>(true, 4);    // K; backward: Q, dO
  require_operand_tile<64, true, 64, 128, 4>(false, 1);   // backward: K, V
  require_operand_tile<128, true, 32, 128, 4>(false, 2);  // the same at head size 32: lines of 128 bytes
  require_operand_tile<64, true, 32, 128, 4>(true, 4);
  require_operand_tile<64, true, 32, 128, 4>(false, 1);
  require_row_pair_reads<64>(64);
  require_row_pair_reads<32>(64);
}

// The float32 flash backward's dS tile: the warps' 8-byte reads of key pairs
// for dQ meet no bank conflict; the stores from dS^T's accumulators, a value a
// lane, meet two at most (queries 4 apart share a swizzle), where unswizzled
// they would meet four. Every store lands where a read looks for it.
TEST_CASE("gemm tiles: the float32 flash backward's dS tile", "[gemm_tiles]") {
  std::set<int> stored;
  for (int warp = 0; warp < 4; ++warp) {
    for (int r = 0; r < 4; ++r) {
      std::vector<int> words, plain;
      for (int lane = 0; lane < 32; ++lane) {
        words.push_back(DsTile::store_at(warp, lane, r) / 4);
        const int query = 2 * (lane % 4) + r % 2, key = 16 * warp + lane / 4 + 8 * (r / 2);
        plain.push_back(query * 64 + key);
        for (int block = 0; block < 8; ++block) stored.insert(DsTile::store_at(warp, lane, r) + block * 8 * DsTile::kLineBytes);
      }
      CHECK(word_wavefronts(words) <= 2);
      CHECK(word_wavefronts(plain) == 4);
    }
    for (int kb = 0; kb < 8; ++kb)
      for (int half = 0; half < 2; ++half) {
        std::vector<int> first_words;
        for (int lane = 0; lane < 32; ++lane) {
          const int at = DsTile::read_at(warp, lane, kb % 4) + kb / 4 * 128 + half * 8 * DsTile::kLineBytes;
          const int g = lane / 4, t = lane % 4, query = 16 * warp + g + 8 * half, key = 8 * kb + 2 * t;
          REQUIRE(at == DsTile::Layout::at(query, key / 4) * 16 + 4 * (key % 4));
          first_words.push_back(at / 4);
        }
        CHECK(pair_wavefronts(first_words) == 1);
      }
  }
  REQUIRE(stored.size() == 64u * 64u);  // every value of the tile, once
}

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
int worst_fragment_load(int rows, int k, int blocks, Chunk chunk) {
  int worst = 0;
  for (int warp_row0 = 0; warp_row0 < rows; warp_row0 += 16 * blocks)
    for (int step = 0; step < k / 16; ++step)
      for (int f = 0; f < blocks; ++f)
        for (int phase = 0; phase < 4; ++phase) {
          std::vector<int> chunks;
          for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) chunks.push_back(chunk(warp_row0 + 16 * f, step, lane));
          worst = std::max(worst, chunk_wavefronts(chunks));
        }
  return worst;
}

// An operand's tile, read by warps of `blocks` 16-row blocks (of A fragments,
// or pairs of B's) and copied by kThreads threads.
template <int Rows, bool KFastest, int K = kBK, int kThreads = PipelineShape<128, 256>::kThreads>
void require_operand_tile(bool b_pair, int blocks = kWarpTile / 16) {
  using Tile = OperandTile<Rows, KFastest, K>;
  INFO("tile of " << Rows << " rows by " << K << ", " << (KFastest ? "k fastest" : "rows fastest")
                  << (b_pair ? ", B" : ", A"));

  // ldmatrix: one wavefront a phase; the same reads unswizzled take four (lines of 64 bytes) or eight.
  const auto swizzled = [&](int row0, int step, int lane) { return Tile::fragment_chunk(row0, step, lane, b_pair); };
  CHECK(worst_fragment_load(Rows, K, blocks, swizzled) == 1);
  const auto plain = [&](int row0, int step, int lane) {
    const int q = lane / 8, q_rows = b_pair ? q / 2 : q % 2, q_k = b_pair ? q % 2 : q / 2;
    const int row = row0 + 8 * q_rows, k = 16 * step + 8 * q_k;
    return KFastest ? (row + lane % 8) * Tile::kLineChunks + k / kChunk
                    : (k + lane % 8) * Tile::kLineChunks + row / kChunk;
  };
  CHECK(worst_fragment_load(Rows, K, blocks, plain) == (Tile::kLineChunks == 4 ? 4 : 8));

  // What the kernel's FragmentOffsets assume: blocks (k fastest) or steps (otherwise) a constant apart.
  for (int warp_row0 = 0; warp_row0 < Rows; warp_row0 += 16 * blocks)
    for (int lane = 0; lane < 32; ++lane)
      for (int step = 0; step < K / 16; ++step)
        for (int f = 0; f < blocks; ++f) {
          const int from = KFastest ? Tile::fragment_chunk(warp_row0, step, lane, b_pair)
                                    : Tile::fragment_chunk(warp_row0 + 16 * f, 0, lane, b_pair);
          REQUIRE(Tile::fragment_chunk(warp_row0 + 16 * f, step, lane, b_pair) ==
                  from + (KFastest ? f : step) * Tile::kLineStride);
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

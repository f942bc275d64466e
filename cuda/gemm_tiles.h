#pragma once
// Where the pipelined products (cuda/matmul_bf16_pipelined.cu, and the float32
// one, cuda/matmul_tf32_pipelined.cu) and the flash attention keep their tiles
// in shared memory, and which 16-byte chunk each thread copies in and each
// lane reads. Plain host-and-device functions of the thread and lane, so that
// tests/test_gemm_tiles.cpp counts the bank conflicts of every access the
// kernels make, on the host.
#include <type_traits>

#include "base/host_device.h"

namespace attograd::cuda::gemm_tiles {

// p moved by `bytes`: the tiles' offsets are kept in bytes, so that an address
// is one add to a tile's base, where offsets in values took a shift as well.
template <typename T>
AG_HOST_DEVICE inline T* byte_offset(T* p, int bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + bytes);
}

constexpr int kBK = 32;        // K of a bfloat16 tile: two mma steps of 16, 64 bytes a row
constexpr int kBKFloat = 16;   // K of a float32 tile: two TF32 mma steps of 8, 64 bytes a row too
constexpr int kChunk = 8;      // bfloat16 values in 16 bytes: one cp.async, one ldmatrix row
constexpr int kWarpTile = 64;  // a warp's 64 x 64 of C: 4 A fragments against 8 B fragments

// A tile of lines of LineChunks chunks, unpadded, chunk c of line l stored at
// l * LineChunks + (c ^ s(l)). s permutes the chunks within each 128-byte
// stretch (eight chunks: all 32 banks), so the eight lines an ldmatrix or a
// phase of eight copies reads at one logical chunk land on eight different
// stretches' worth of banks, where unswizzled they would share four banks
// (lines of 64 bytes: four ways; of 256 or 512: eight).
template <int LineChunks>
struct Swizzle {
  static_assert(LineChunks == 2 || LineChunks == 4 || LineChunks % 8 == 0, "a line is 32 or 64 bytes, or a multiple of 128");
  static constexpr int kPeriodLines = 8;  // lines after which s repeats
  AG_HOST_DEVICE static constexpr int at(int line, int c) {
    const int s = LineChunks >= 8 ? line & 7 : (line / (8 / LineChunks)) & (LineChunks - 1);
    return line * LineChunks + (c ^ s);
  }
};

// Lines that a warp reads four at a time, two neighbouring chunks of each (an
// even one and the next): SplitPairTile's. Chunk c of line l is stored at
// l * LineChunks + (c ^ 2 (l % 4)): the four lines' pairs land on four
// different pairs of the eight chunks that cover the banks, where unswizzled
// all four would share one pair. Eight chunks of one line stay on all 32 banks.
template <int LineChunks>
struct PairSwizzle {
  static_assert(LineChunks % 8 == 0, "a line is a multiple of 128 bytes");
  static constexpr int kPeriodLines = 4;
  AG_HOST_DEVICE static constexpr int at(int line, int c) { return line * LineChunks + (c ^ (2 * (line & 3))); }
};

// The copies into a tile of lines of LineChunks chunks: copy v (thread + i *
// threads) is line v / LineChunks, chunk v % LineChunks, so consecutive
// threads read consecutive 16 bytes of global memory; a thread's copies lie
// the same distance apart in the swizzled tile where Threads chunks are a
// multiple of the swizzle's period in lines.
template <int LineChunks, int PeriodLines>
struct LineCopies {
  struct Copy {
    int line, chunk;
  };
  AG_HOST_DEVICE static constexpr Copy copy(int v) { return {v / LineChunks, v % LineChunks}; }
  template <int Threads>
  static constexpr bool kCopiesEvenlyApart = Threads % LineChunks == 0 && (Threads / LineChunks) % PeriodLines == 0;
};

// An operand tile's layout: Swizzle, but for float32 with rows fastest, whose
// copies, 4 lines apart where the lines are long, stay a constant apart in a
// layout that repeats every 4 lines (and only the thread that copied a chunk
// reads it back: SplitPairTile).
template <int LineChunks, bool PairSwizzled>
using OperandLayout = std::conditional_t<PairSwizzled, PairSwizzle<LineChunks>, Swizzle<LineChunks>>;

// An operand's tile seen as Rows x K, element (r, kk) being X(r0 + r, k0 +
// kk) with X = A (rows m) or B^T (rows n), stored as the operand lies in
// memory: with k fastest, a line is a row of K values (A row-major, B
// transposed); otherwise a line is one k of Rows values (A transposed, B
// row-major). A chunk is 16 consecutive bytes of the line: eight bfloat16
// values, or four float32 (ValueBytes 4: the 3xTF32 product). (The
// attention's tiles are these too, K being the head size or a tile of keys.)
template <int Rows, bool KFastest, int K = kBK, int ValueBytes = 2>
struct OperandTile
    : LineCopies<(KFastest ? K : Rows) * ValueBytes / 16,
                 OperandLayout<(KFastest ? K : Rows) * ValueBytes / 16, ValueBytes == 4 && !KFastest>::kPeriodLines> {
  static constexpr int kChunkValues = 16 / ValueBytes;
  static constexpr int kStepValues = 2 * kChunkValues;  // K of one mma step: 16 bfloat16, or 8 TF32
  static constexpr int kLines = KFastest ? Rows : K;
  static constexpr int kLineChunks = (KFastest ? K : Rows) / kChunkValues;
  static constexpr int kChunks = kLines * kLineChunks;
  static_assert(Rows % 16 == 0 && K % kStepValues == 0, "whole blocks of 16 rows by an mma step");
  static constexpr int kValues = kChunks * kChunkValues;
  using Layout = OperandLayout<kLineChunks, ValueBytes == 4 && !KFastest>;

  // The chunk (its swizzled index) whose first value lane `lane` gives ldmatrix
  // for the block of X rows [row0, row0 + 16) and the mma step `step` along K
  // (two chunks of k). Matrix q = lane / 8 is the block's quarter of rows
  // 8 q_rows and k chunk q_k: for an A fragment q_rows = q % 2, q_k = q / 2; for
  // two B fragments (rows n and n + 8 of B^T) q_rows = q / 2, q_k = q % 2
  // (cuda/mma_bf16.cuh's layouts, and cuda/mma.cuh's TF32 ones: a 32-bit value
  // is two halves of an ldmatrix row, so the same quarters give them). With
  // k fastest lane % 8 is the quarter's row, read plain; otherwise (bfloat16
  // only) its k, read transposed.
  // The swizzle repeats every 8 lines, so that of the warp's
  // blocks and steps, those along the lines are a constant apart: 16 rows with k
  // fastest, one step otherwise. The kernel works out only the others per lane.
  static constexpr int kLineStride = (KFastest ? 16 : kStepValues) * kLineChunks;  // chunks between blocks (k fastest) or steps
  AG_HOST_DEVICE static constexpr int fragment_chunk(int row0, int step, int lane, bool b_pair) {
    const int q = lane / 8, q_rows = b_pair ? q / 2 : q % 2, q_k = b_pair ? q % 2 : q / 2;
    const int row = row0 + 8 * q_rows;
    if constexpr (ValueBytes == 4) {
      static_assert(KFastest, "float32 with rows fastest is read from SplitPairTile");
      return Layout::at(row + lane % 8, step + 2 * q_k);  // k chunks step and step + 2: SplitPairTile says why
    } else {
      const int k = 16 * step + 8 * q_k;
      if (KFastest) return Layout::at(row + lane % 8, k / kChunk);
      return Layout::at(k + lane % 8, row / kChunk);
    }
  }
};

// The 3xTF32 product's split parts (big or small) of a float32 tile of 16 k
// whose rows run fastest in memory (A transposed, B as it is;
// cuda/matmul_tf32_pipelined.cu), laid out for the fragments, which ldmatrix
// cannot transpose at 32 bits. The product's mma step s takes k 4s + t as a
// fragment's k t and 4s + t + 8 as its t + 4 (t < 4: any split of the 16 k
// into two steps gives the same sum), so that one read gets both: line k % 8
// holds, for each group of Group rows, the group's values at k, then at k + 8.
// - A (Group 2): a lane (g, t) reads rows 2g, 2g + 1 of a 16-row block at k and
//   k + 8 as one 16-byte chunk, its fragment's four values in order (rows g,
//   g + 8 of the fragment are rows 2g, 2g + 1 of the block: C is put back as
//   it leaves).
// - B (Group 1): a lane reads column g of a fragment at k and k + 8 as one
//   8-byte pair.
// A thread copies chunks at k and k + 8 of the same four rows (its copies lie
// 8 lines apart, or 4 and 12), and splits them into two chunks here.
template <int Rows, int Group>
struct SplitPairTile {
  static constexpr int kLineChunks = 2 * Rows / 4, kLines = 8, kChunks = kLines * kLineChunks;
  using Layout = PairSwizzle<kLineChunks>;
  // Where chunk `chunk` of line `line` is stored, in chunks: chunk 2c + h holds
  // rows 4c + 2h and 4c + 2h + 1, which the thread that copied chunk c of the
  // stage's line splits; in each 16 chunks the second 8 swap neighbours, so
  // that the eight threads that copied chunks c0 to c0 + 7 (c0 a multiple of
  // 8) of a line store their h = 0 chunks to eight different bank groups,
  // where 2c for all would share four.
  AG_HOST_DEVICE static constexpr int at(int line, int chunk) { return Layout::at(line, chunk ^ ((chunk >> 3) & 1)); }
  // The value index of row r at k (0 to 15).
  AG_HOST_DEVICE static constexpr int word(int r, int k) {
    const int w = 2 * Group * (r / Group) + Group * (k / 8) + r % Group;
    return at(k % 8, w / 4) * 4 + w % 4;
  }
  // The value index of the first value lane (g, t) reads for mma step `step` of
  // the block or fragment whose first row is row0: A, rows row0 + 2g and next;
  // B, row row0 + g.
  AG_HOST_DEVICE static constexpr int lane_word(int row0, int step, int lane) {
    return word(row0 + Group * (lane / 4), 4 * step + lane % 4);
  }
};

// A tile of sm_90a's warpgroup products (cuda/wgmma.cuh), bfloat16, 64 of K:
// the tensor cores read it through a descriptor, so it lies as their
// canonical layouts with the 128-byte swizzle have it (the swizzle XORs an
// address's 16-byte chunk, bits 4-6, with bits 7-9: a tile starts on a
// 1024-byte boundary).
// - K fastest (A as it is, B transposed; "K-major"): a line is a row of 64 k,
//   128 bytes, chunk c of line l at l * 8 + (c ^ l % 8): OperandTile's.
// - Rows fastest (A transposed, B as it is; "MN-major"): a line is one k of
//   Rows values, kept in blocks of 64 rows (128 bytes): block j holds the 64
//   lines' stretches j one after the other, chunk c of line l at
//   (c / 8) * 512 + l * 8 + (c % 8 ^ l % 8), so a block is 8 KiB (the
//   descriptor's leading byte offset) and eight lines 1024 bytes (its stride
//   byte offset).
// Copies are OperandTile's (LineCopies).
template <int Rows, bool KFastest>
struct WgmmaTile : LineCopies<(KFastest ? 64 : Rows) / 8, 8> {
  static constexpr int kK = 64, kChunkValues = 8, kBlockRows = 64;
  static constexpr int kLines = KFastest ? Rows : kK;
  static constexpr int kLineChunks = (KFastest ? kK : Rows) / kChunkValues;
  static constexpr int kChunks = kLines * kLineChunks;
  static constexpr int kBlockBytes = kK * 128;  // MN-major: one block of 64 rows, Layout::at(0, 8) * 16 on
  static_assert(Rows % kBlockRows == 0, "whole blocks of 64 rows: a warpgroup's product");
  struct Layout {
    static constexpr int kPeriodLines = 8;
    AG_HOST_DEVICE static constexpr int at(int line, int c) {
      if constexpr (KFastest) return line * 8 + (c ^ (line & 7));
      return (c / 8) * (kK * 8) + line * 8 + ((c & 7) ^ (line & 7));
    }
  };
};

// The pipelined kernel's shape: BM x BN of C a block, 8 warps of 64 x 64,
// kStages tiles of A and B in flight; C goes out through the same shared
// memory, rows of BN values.
template <int BM, int BN>
struct PipelineShape {
  static constexpr int kStages = 4;
  static constexpr int kWarpsN = BN / kWarpTile, kWarps = (BM / kWarpTile) * kWarpsN, kThreads = 32 * kWarps;
  static constexpr int kStageValues = (BM + BN) * kBK;
  static constexpr int kSharedBytes = kStages * kStageValues * 2;
  using CLayout = Swizzle<BN / kChunk>;
  static_assert(BM * BN <= kStages * kStageValues, "C's tile fits where the stages were");
};

// The float32 flash attention's reads across the rows of a tile of float32
// rows (a line a row of LineChunks chunks of four values, Swizzle'd; cuda/
// attention_tf32_reads.cuh's RowPairReads): lane (g, t) = (lane / 4, lane % 4)
// reads X[8 kb + 2t + r][8 nd + g] (r = 0, 1) for a B fragment whose k is
// renumbered, four bytes at kb 8 LineBytes + nd / 4 128 + first(lane, nd % 4)
// + r next(lane). The value lies at chunk 2 nd + g / 4 of its line, swizzled by
// the line's 2t + r, which is chunk 2 (nd ^ t) + (g / 4 ^ r) of nd's run of 8.
template <int LineChunks>
struct RowPairs {
  static constexpr int kLineBytes = 16 * LineChunks;
  AG_HOST_DEVICE static constexpr int first(int lane, int j) {  // r = 0, kb = 0, nd = j < 4
    const int g = lane / 4, t = lane % 4;
    return 2 * t * kLineBytes + (2 * (j ^ t) + g / 4) * 16 + 4 * (g % 4);
  }
  AG_HOST_DEVICE static constexpr int next(int lane) { return kLineBytes + (lane / 4 / 4 == 0 ? 16 : -16); }
};

// The float32 flash backward's dS tile (cuda/attention_tf32_flash_backward.cu):
// a line a query of the tile's 64, its 64 keys' values, PairSwizzle'd.
struct DsTile {
  using Layout = PairSwizzle<16>;
  static constexpr int kLineBytes = 256;
  // Where lane (g, t) of `warp` stores value r of its accumulator block of dS^T
  // (key 16 warp + g + 8 (r / 2), query 2t + r % 2; each 8 queries on, 8 lines on).
  AG_HOST_DEVICE static constexpr int store_at(int warp, int lane, int r) {
    const int query = 2 * (lane % 4) + r % 2, key = 16 * warp + lane / 4 + 8 * (r / 2);
    return Layout::at(query, key / 4) * 16 + 4 * (key % 4);
  }
  // Where lane (g, t) of `warp` reads keys 8 kb + 2t and 2t + 1 of query 16
  // warp + g as eight bytes, kb < 4 (each 4 kb on, 128 bytes on; query g + 8, 8 lines on).
  AG_HOST_DEVICE static constexpr int read_at(int warp, int lane, int kb) {
    const int t = lane % 4;
    return Layout::at(16 * warp + lane / 4, 2 * kb + t / 2) * 16 + 8 * (t % 2);
  }
};

}  // namespace attograd::cuda::gemm_tiles

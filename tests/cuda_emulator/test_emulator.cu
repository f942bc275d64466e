// The emulator's own semantics, which every [cuda] test in an emulated build
// leans on: barriers order shared memory, shuffles exchange the right lanes,
// launches and copies a GPU refuses are refused, and fresh memory is NaN.
// The cases tagged [.dies] break a rule on purpose; ctest runs each alone and
// expects the emulator's line on stderr (tests/CMakeLists.txt).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "cuda/async_copy.cuh"
#include "cuda/device_utils.cuh"
#include "cuda/mbarrier.cuh"
#include "cuda/mma.cuh"
#include "cuda/tma.cuh"
#include "cuda/warp_roles.cuh"
#include "cuda/wgmma.cuh"
#include "nn/gpt.h"
#include "tensor/kernels.h"
#include "tensor/rng.h"
#include "train/optim/grad_clip.h"
#include "train/optim/optimizer.h"

using attograd::cuda::launch;

namespace {

// Device memory for n values, copied back to the host on read().
template <typename T>
struct DeviceArray {
  explicit DeviceArray(std::size_t count) : n(count) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)) == cudaSuccess);
  }
  ~DeviceArray() { cudaFree(p); }
  std::vector<T> read() const {
    std::vector<T> host(n);
    REQUIRE(cudaMemcpyAsync(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
  std::size_t n;
  T* p = nullptr;
};

// Each block sums its threads' indices by a tree in shared memory: every step
// reads what other threads wrote before the barrier.
__global__ void tree_sum_kernel(int* out) {
  __shared__ int partial[256];
  partial[threadIdx.x] = static_cast<int>(threadIdx.x + blockIdx.x * blockDim.x);
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    __syncthreads();
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

__global__ void shuffles_kernel(int* xor_sum, int* scan, int* broadcast) {
  const int lane = static_cast<int>(threadIdx.x % 32), id = static_cast<int>(threadIdx.x);
  int v = id;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  xor_sum[id] = v;
  int s = id;  // inclusive scan within each warp
  for (int delta = 1; delta < 32; delta *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, s, delta);
    if (lane >= delta) s += up;
  }
  scan[id] = s;
  broadcast[id] = __shfl_sync(0xffffffffu, id, 3, 16);  // lane 3 of each 16-lane segment
}

// Each of 32 threads copies 16 bytes (4 words) of `in` into its slot of shared memory with
// cp.async, in two groups (slots 0 to 15, then 16 to 31; odd threads zero-fill instead), and
// records its slot before any wait, after waiting for all but the newest group, and after waiting
// for all: at = 4 * (32 * stage + thread).
__global__ void async_copy_kernel(const unsigned* in, unsigned* at) {
  __shared__ __align__(16) unsigned slots[32 * 4];
  const int t = static_cast<int>(threadIdx.x);
  for (int w = 0; w < 4; ++w) slots[4 * t + w] = 0xaaaaaaaau;
  const auto record = [&](int stage) {
    for (int w = 0; w < 4; ++w) at[4 * (32 * stage + t) + w] = slots[4 * t + w];
  };
  const auto copy = [&] { attograd::cuda::copy_async16(slots + 4 * t, in + 4 * t, t % 2 == 0); };
  if (t < 16) copy();
  attograd::cuda::commit_async_copies();
  if (t >= 16) copy();
  attograd::cuda::commit_async_copies();
  record(0);
  attograd::cuda::wait_async_copies<1>();
  record(1);
  attograd::cuda::wait_async_copies<0>();
  record(2);
}

// Each thread issues two asynchronous products (emulator.h's, as wgmma's), in
// two groups: the first adds 1 to its slot, the second 2; it records the slot
// before any wait, after waiting for all but the newest group, and after
// waiting for all: at = 3 * stage + ... per thread.
struct AddToSlot {
  float* slot;
  float amount;
  static void make(const void* args) {
    AddToSlot a;
    std::memcpy(&a, args, sizeof a);
    *a.slot += a.amount;
  }
};
__global__ void async_product_kernel(float* at) {
  const int t = static_cast<int>(threadIdx.x);
  float slot = 0.0f;
  for (float amount : {1.0f, 2.0f}) {
    const AddToSlot args{&slot, amount};
    ::emu::async_product(&AddToSlot::make, &args, sizeof args);
    attograd::cuda::wgmma::commit();
  }
  at[3 * t] = slot;
  attograd::cuda::wgmma::wait<1>();
  at[3 * t + 1] = slot;
  attograd::cuda::wgmma::wait<0>();
  at[3 * t + 2] = slot;
}

// Shared memory addresses: byte offsets in the block's dynamic shared memory,
// which starts on a 1024-byte boundary (wgmma's swizzle is of addresses).
__global__ void shared_address_kernel(unsigned* out) {
  auto* smem = attograd::cuda::dynamic_shared_memory<unsigned char>();
  out[0] = ::emu::shared_address(smem);
  out[1] = ::emu::shared_address(smem + 1000);
  out[2] = ::emu::shared_pointer(1000) == smem + 1000;
  out[3] = reinterpret_cast<std::uintptr_t>(smem) % 1024;
}

// A warpgroup product whose descriptors name tiles without the 128-byte swizzle.
__global__ void unswizzled_wgmma_kernel() {
  (void)attograd::cuda::dynamic_shared_memory<unsigned char>();
  float d[128] = {};
  const std::uint64_t plain = attograd::cuda::wgmma::k_major_descriptor(0, 0) & ~(std::uint64_t{3} << 62);
  attograd::cuda::wgmma::mma_bf16_n256<false, false>(d, plain, plain, false);
  attograd::cuda::wgmma::commit();
  attograd::cuda::wgmma::wait<0>();
}

__global__ void read_kernel(const float* in, float* out) { out[threadIdx.x] = in[threadIdx.x]; }

__global__ void dynamic_smem_kernel(float* out) {
  float* smem = attograd::cuda::dynamic_shared_memory<float>();
  smem[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = smem[blockDim.x - 1 - threadIdx.x];
}

__global__ void divergent_barrier_kernel() {
  if (threadIdx.x % 2 == 0) __syncthreads();
}

__global__ void early_return_kernel() {
  if (threadIdx.x == 0) return;
  __syncthreads();
}

__global__ void mismatched_masks_kernel(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(threadIdx.x == 5 ? 0xffffff7fu : 0xffffffffu, 1, 1);
}

// A tensor of 40 lines of 64 bfloat16 (line l's value i is l * 64 + i + 1)
// through a ring of two stages of 8 lines each: warp 0's first thread copies
// each box by TMA once the consumers (warps 1 and 2) have emptied its stage;
// they wait for it to fill, copy it out of the swizzle and arrive at its
// empty barrier. Five boxes: each stage's barriers go round more than once.
constexpr int kRingLines = 40, kRingBox = 8, kRingStages = 2, kRingConsumers = 64;
constexpr int kRingStageBytes = kRingBox * 128;
constexpr int kRingSharedBytes = kRingStages * kRingStageBytes + 2 * kRingStages * 8;

__global__ void tma_ring_kernel(const __grid_constant__ attograd::cuda::tma::TensorMap map, std::uint16_t* out) {
  using namespace attograd::cuda;
  const std::uint32_t base = wgmma::shared_address(dynamic_shared_memory<unsigned char>());
  const auto stage = [&](int s) { return base + static_cast<std::uint32_t>(s * kRingStageBytes); };
  const auto full = [&](int s) { return base + static_cast<std::uint32_t>(kRingStages * kRingStageBytes + 8 * s); };
  const auto empty = [&](int s) { return full(kRingStages + s); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kRingStages; ++s) mbarrier::init(full(s), 1), mbarrier::init(empty(s), kRingConsumers);
    mbarrier::fence_init();
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0)
      for (int box = 0; box < kRingLines / kRingBox; ++box) {
        const int s = box % kRingStages;
        mbarrier::wait(empty(s), (box / kRingStages & 1) ^ 1);
        mbarrier::arrive_expect_bytes(full(s), kRingStageBytes);
        tma::load_box(&map, stage(s), full(s), 0, box * kRingBox, 0);
      }
    return;
  }
  const int t = static_cast<int>(threadIdx.x) - 32;
  for (int box = 0; box < kRingLines / kRingBox; ++box) {
    const int s = box % kRingStages;
    mbarrier::wait(full(s), box / kRingStages & 1);
    for (int v = t; v < kRingBox * 64; v += kRingConsumers) {
      const int line = v / 64, i = v % 64;
      const std::uint32_t at = stage(s) + static_cast<std::uint32_t>(line * 128 + ((i / 8) ^ line % 8) * 16 + i % 8 * 2);
      std::uint16_t value;
      std::memcpy(&value, ::emu::shared_pointer(at), sizeof value);
      out[(box * kRingBox + line) * 64 + i] = value;
    }
    mbarrier::arrive(empty(s));  // the stage's last consumer to arrive frees it
  }
}

// One box of 64 x 16 at (-8, 30) of a 60 x 40 tensor, read by thread 0 before
// it waits for the barrier and after: fresh shared memory (0xffff) or the box.
__global__ void tma_box_kernel(const __grid_constant__ attograd::cuda::tma::TensorMap map, std::uint16_t* before,
                               std::uint16_t* after) {
  using namespace attograd::cuda;
  const std::uint32_t base = wgmma::shared_address(dynamic_shared_memory<unsigned char>()), barrier = base + 2048;
  mbarrier::init(barrier, 1);
  mbarrier::arrive_expect_bytes(barrier, 2048);
  tma::load_box(&map, base, barrier, -8, 30, 0);
  std::memcpy(before, ::emu::shared_pointer(base), 2048);
  mbarrier::wait(barrier, 0);
  std::memcpy(after, ::emu::shared_pointer(base), 2048);
}

__global__ void unfinished_phase_kernel() {
  using namespace attograd::cuda;
  const std::uint32_t barrier = wgmma::shared_address(dynamic_shared_memory<unsigned char>());
  if (threadIdx.x == 0) mbarrier::init(barrier, 33);
  __syncthreads();
  mbarrier::arrive(barrier);
  mbarrier::wait(barrier, 0);  // 32 of the 33 arrivals come
}

// A barrier of one arrival, which has come with bytes still to come, gets another.
__global__ void extra_arrival_kernel() {
  using namespace attograd::cuda;
  const std::uint32_t barrier = wgmma::shared_address(dynamic_shared_memory<unsigned char>());
  mbarrier::init(barrier, 1);
  mbarrier::arrive_expect_bytes(barrier, 2048);
  mbarrier::arrive(barrier);
}

// A box copied to 64 bytes past a 128-byte boundary.
__global__ void misaligned_tma_kernel(const __grid_constant__ attograd::cuda::tma::TensorMap map) {
  using namespace attograd::cuda;
  const std::uint32_t base = wgmma::shared_address(dynamic_shared_memory<unsigned char>()), barrier = base + 4096;
  mbarrier::init(barrier, 1);
  mbarrier::arrive_expect_bytes(barrier, 2048);
  tma::load_box(&map, base + 64, barrier, 0, 0, 0);
}

__global__ void named_barrier_kernel(int* out) {
  __shared__ int seen[64];
  const int t = static_cast<int>(threadIdx.x);
  if (t < 32) return;  // the first warp takes no part
  seen[t - 32] = t;
  attograd::cuda::warp_roles::sync(3, 64);
  out[t - 32] = seen[(t - 32 + 17) % 64];
}

// All 32 lanes publish 3 ints; each checks it got every lane's.
__global__ void all_gather_kernel(int* wrong) {
  struct Three {
    int v[3];
  };
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  Three all[32];
  ::emu::warp_all_gather(0xffffffffu, Three{{lane, warp, lane * lane}}, all);
  int bad = 0;
  for (int l = 0; l < 32; ++l) bad += all[l].v[0] != l || all[l].v[1] != warp || all[l].v[2] != l * l;
  wrong[threadIdx.x] = bad;
}

}  // namespace

TEST_CASE("emulator: a warp's all-gather gives every lane every lane's values", "[emulator]") {
  DeviceArray<int> wrong(64);
  launch(all_gather_kernel, 1, 64, 0, nullptr, wrong.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  for (int w : wrong.read()) CHECK(w == 0);
}

// The emulated tensor-core product itself is checked by the [cuda] test of
// cuda/mma.cuh's fragment layout (test_cuda.cpp), which a GPU runs too.
TEST_CASE("emulator: TF32 operands and the big/small split of cuda/mma.cuh", "[emulator]") {
  using attograd::cuda::float_bits;
  using attograd::cuda::tf32_big;
  using attograd::cuda::tf32_operand_value;
  using attograd::cuda::tf32_small;
  // The tensor core reads a float32 register as TF32 by dropping its low 13 bits.
  CHECK(tf32_operand_value(float_bits(1.0f + 0x1p-10f + 0x1p-11f)) == 1.0f + 0x1p-10f);
  CHECK(tf32_operand_value(float_bits(-(1.0f + 0x1p-11f))) == -1.0f);
  CHECK(tf32_operand_value(float_bits(INFINITY)) == INFINITY);
  // x (truncated) + its small part (rounded) is x to about 2^-22; the big part alone is not.
  double worst = 0;
  for (int i = 1; i < 1000; ++i) {
    const float x = std::sin(0.37f * static_cast<float>(i)) * std::exp2(static_cast<float>(i % 40 - 20));
    const double rejoined = static_cast<double>(tf32_operand_value(tf32_big(x))) + tf32_operand_value(tf32_small(x));
    worst = std::max(worst, std::abs(rejoined - x) / std::abs(x));
  }
  CHECK(worst <= 0x1p-22);
  CHECK(std::abs(tf32_operand_value(tf32_big(1.0f / 3.0f)) - 1.0f / 3.0f) > 0x1p-14f);
  CHECK(tf32_big(1.0f + 0x1p-11f) == float_bits(1.0f));
  // inf and NaN have no small part: their big part carries them.
  CHECK(tf32_small(-INFINITY) == 0u);
  CHECK(tf32_small(NAN) == 0u);
}

// cp.async lands at one end of its time or the other (emulator.h): when waited for with the first
// warp ahead, so reading sooner shows; at once with the last warp ahead.
TEST_CASE("emulator: cp.async copies land when waited for (first warp ahead) or at once (last)", "[emulator]") {
  const char* order = std::getenv("ATTOGRAD_EMULATED_ORDER");
  const bool at_once = order && std::strcmp(order, "reverse") == 0;
  std::vector<unsigned> host(32 * 4);
  std::iota(host.begin(), host.end(), 1u);
  DeviceArray<unsigned> in(host.size()), at(3 * host.size());
  REQUIRE(cudaMemcpyAsync(in.p, host.data(), host.size() * sizeof(unsigned), cudaMemcpyHostToDevice) == cudaSuccess);
  launch(async_copy_kernel, 1, 32, 0, nullptr, in.p, at.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<unsigned> seen = at.read();
  for (int stage = 0; stage < 3; ++stage)
    for (int t = 0; t < 32; ++t) {
      const bool landed = at_once || stage == 2 || (stage == 1 && t < 16);  // wait<1> leaves the second group
      for (int w = 0; w < 4; ++w) {
        INFO("stage " << stage << ", thread " << t << ", word " << w);
        const unsigned copied = t % 2 == 0 ? host[static_cast<std::size_t>(4 * t + w)] : 0u;
        CHECK(seen[static_cast<std::size_t>(4 * (32 * stage + t) + w)] == (landed ? copied : 0xaaaaaaaau));
      }
    }
}

// wgmma's products are made at one end of their time or the other, as cp.async's copies are.
TEST_CASE("emulator: asynchronous products are made when waited for (first warp ahead) or at once (last)",
          "[emulator]") {
  const char* order = std::getenv("ATTOGRAD_EMULATED_ORDER");
  const bool at_once = order && std::strcmp(order, "reverse") == 0;
  DeviceArray<float> at(3 * 128);
  launch(async_product_kernel, 1, 128, 0, nullptr, at.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<float> seen = at.read();
  for (int t = 0; t < 128; ++t) {
    INFO("thread " << t);
    CHECK(seen[static_cast<std::size_t>(3 * t)] == (at_once ? 3.0f : 0.0f));
    CHECK(seen[static_cast<std::size_t>(3 * t + 1)] == (at_once ? 3.0f : 1.0f));  // wait<1> leaves the second
    CHECK(seen[static_cast<std::size_t>(3 * t + 2)] == 3.0f);
  }
}

// A tensor of lines 64 apart, line l's value i (bfloat16 bits) l * 64 + i + 1.
std::vector<std::uint16_t> numbered_lines(int lines) {
  std::vector<std::uint16_t> host(static_cast<std::size_t>(lines) * 64);
  std::iota(host.begin(), host.end(), std::uint16_t{1});
  return host;
}

attograd::cuda::tma::TensorMap map_of(const DeviceArray<std::uint16_t>& tensor, std::int64_t width, int lines,
                                      int box_lines) {
  return attograd::cuda::tma::tile_map({tensor.p, {width, lines, 1}, {64, 64 * lines}, {64, box_lines}});
}

TEST_CASE("emulator: mbarriers hand TMA-filled stages from a producer warp to consumer warps and back",
          "[emulator]") {
  const std::vector<std::uint16_t> host = numbered_lines(kRingLines);
  DeviceArray<std::uint16_t> tensor(host.size()), out(host.size());
  REQUIRE(cudaMemcpyAsync(tensor.p, host.data(), host.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  attograd::cuda::launch(tma_ring_kernel, 1, 32 + kRingConsumers, kRingSharedBytes, nullptr, map_of(tensor, 64, kRingLines, kRingBox),
         out.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  CHECK(out.read() == host);
}

// Zeros where the box leaves the tensor (left of it, below it); each line's
// 16-byte chunk c at chunk c ^ line % 8 (the 128-byte swizzle).
TEST_CASE("emulator: a TMA box lands swizzled, zeros outside, when waited for (first warp ahead) or at once (last)",
          "[emulator]") {
  const char* order = std::getenv("ATTOGRAD_EMULATED_ORDER");
  const bool at_once = order && std::strcmp(order, "reverse") == 0;
  const std::vector<std::uint16_t> host = numbered_lines(40);
  DeviceArray<std::uint16_t> tensor(host.size()), before(1024), after(1024);
  REQUIRE(cudaMemcpyAsync(tensor.p, host.data(), host.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  attograd::cuda::launch(tma_box_kernel, 1, 1, 2048 + 8, nullptr, map_of(tensor, 60, 40, 16), before.p, after.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<std::uint16_t> seen_before = before.read(), seen_after = after.read();
  for (int line = 0; line < 16; ++line)
    for (int i = 0; i < 64; ++i) {
      const int x = i - 8, y = 30 + line;
      const std::uint16_t value = x >= 0 && x < 60 && y < 40 ? host[static_cast<std::size_t>(y * 64 + x)] : 0;
      const auto at = static_cast<std::size_t>(line * 64 + ((i / 8) ^ line % 8) * 8 + i % 8);
      INFO("line " << line << ", value " << i);
      CHECK(seen_after[at] == value);
      CHECK(seen_before[at] == (at_once ? value : 0xffff));
    }
}

TEST_CASE("emulator: a named barrier (bar.sync) meets the threads it counts", "[emulator]") {
  DeviceArray<int> out(64);
  launch(named_barrier_kernel, 1, 96, 0, nullptr, out.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<int> seen = out.read();
  for (int t = 0; t < 64; ++t) CHECK(seen[static_cast<std::size_t>(t)] == 32 + (t + 17) % 64);
}

// The launches of one training step of a toy GPT of `layers` layers on the
// (emulated) GPU, in the trainer's order: the loss under autocast, backward,
// clipping, AdamW, zero_grad. The second step's: the first also makes state.
std::uint64_t step_launches(std::int64_t layers, attograd::DType dtype) {
  using namespace attograd;
  nn::GPTConfig config;
  config.vocab_size = 65, config.block_size = 16, config.n_layer = layers, config.n_head = 4, config.n_embd = 64;
  nn::GPT model(config);
  model.to(Device::cuda());
  train::optim::AdamW optimizer(model.named_parameters(), {.lr = 1e-3, .weight_decay = 0.1});
  Generator gen(5);
  const auto ids = [&] {
    const Tensor uniform = kernels::unary(kernels::Unary::mul_scalar, rand({4, 16}, {DType::f64}, gen), 64.99);
    return kernels::to_device(kernels::cast(uniform, DType::i64), Device::cuda());
  };
  const Tensor tokens = ids(), targets = ids();
  const auto step = [&] {
    Tensor loss;
    {
      const AutocastGuard autocast(dtype);
      loss = model.loss(tokens, targets);
    }
    backward(loss);
    train::optim::clip_grad_norm(optimizer.params(), 1.0);
    optimizer.step();
    optimizer.zero_grad();
    return loss.item();
  };
  step();
  const std::uint64_t before = ::emu::grids_run();
  step();
  return ::emu::grids_run() - before;
}

// Issue 77's launch budget of a GPT step, read without a GPU: launches a
// layer, and those of the step's rest (embeddings, classifier and loss,
// clipping, AdamW) whatever the layers; each a little above what the step
// makes (docs/cuda.md). Clipping in one pass over all the gradients is what
// keeps a layer's short: a pass a parameter costs several launches and a
// wait for each of its parameters.
TEST_CASE("emulator: a GPT training step's launches stay within their budget", "[emulator]") {
  for (const attograd::DType dtype : {attograd::DType::f32, attograd::DType::bf16}) {
    const auto two = static_cast<std::int64_t>(step_launches(2, dtype)), four = static_cast<std::int64_t>(step_launches(4, dtype));
    const std::int64_t per_layer = (four - two) / 2, rest = two - 2 * per_layer;
    INFO(attograd::dtype_name(dtype) << ": " << per_layer << " launches a layer, " << rest << " the rest of the step");
    CHECK(per_layer <= (dtype == attograd::DType::bf16 ? 60 : 45));
    CHECK(rest <= 34);
  }
}

TEST_CASE("emulator: shared memory addresses are offsets in the block's, which starts 1024-byte aligned",
          "[emulator]") {
  DeviceArray<unsigned> out(4);
  launch(shared_address_kernel, 1, 1, 2048, nullptr, out.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  CHECK(out.read() == std::vector<unsigned>{0, 1000, 1, 0});
}

TEST_CASE("emulator: __syncthreads orders shared memory within each block", "[emulator]") {
  DeviceArray<int> out(3);
  launch(tree_sum_kernel, 3, 256, 0, nullptr, out.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<int> sums = out.read();
  for (int b = 0; b < 3; ++b) {
    INFO("block " << b);
    CHECK(sums[b] == 256 * b * 256 + 255 * 256 / 2);
  }
}

TEST_CASE("emulator: shuffles exchange the lanes CUDA documents", "[emulator]") {
  DeviceArray<int> xor_sum(64), scan(64), broadcast(64);
  launch(shuffles_kernel, 1, 64, 0, nullptr, xor_sum.p, scan.p, broadcast.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<int> x = xor_sum.read(), s = scan.read(), b = broadcast.read();
  for (int id = 0; id < 64; ++id) {
    INFO("thread " << id);
    const int warp_first = id / 32 * 32;
    CHECK(x[id] == 32 * warp_first + 31 * 32 / 2);                  // the warp's sum, on every lane
    CHECK(s[id] == (warp_first + id) * (id - warp_first + 1) / 2);  // warp_first + ... + id
    CHECK(b[id] == id / 16 * 16 + 3);
  }
}

TEST_CASE("emulator: fresh device memory reads as NaN, and dynamic shared memory works", "[emulator]") {
  DeviceArray<float> fresh(32), out(32);
  launch(read_kernel, 1, 32, 0, nullptr, fresh.p, out.p);
  for (float v : out.read()) CHECK(std::isnan(v));
  launch(dynamic_smem_kernel, 1, 32, 32 * sizeof(float), nullptr, out.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<float> reversed = out.read();
  for (int t = 0; t < 32; ++t) CHECK(reversed[t] == static_cast<float>(31 - t));
}

TEST_CASE("emulator: launches a GPU refuses are refused, and run nothing", "[emulator]") {
  DeviceArray<float> out(32);
  launch(dynamic_smem_kernel, 1, 1025, 0, nullptr, out.p);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  launch(dynamic_smem_kernel, dim3(1, 65536), 32, 0, nullptr, out.p);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  launch(dynamic_smem_kernel, 1, 32, 64 * 1024, nullptr, out.p);  // over 48 KiB without saying so first
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  REQUIRE(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) ==
          cudaSuccess);
  launch(dynamic_smem_kernel, 1, 32, 64 * 1024, nullptr, out.p);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);  // an error is returned once
}

TEST_CASE("emulator: copies and memsets outside an allocation are refused", "[emulator]") {
  DeviceArray<float> a(8);
  std::vector<float> host(9, 1.0f);
  CHECK(cudaMemcpyAsync(a.p, host.data(), 8 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpyAsync(a.p, host.data(), 9 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(host.data(), a.p + 1, 8 * sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemsetAsync(host.data(), 0, 4) == cudaErrorInvalidValue);  // host memory is not device memory
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFree(host.data()) == cudaErrorInvalidValue);
}

// Each of these stops the process with the emulator's line on stderr.
TEST_CASE("emulator dies: a __syncthreads only half the threads reach", "[.dies]") {
  launch(divergent_barrier_kernel, 1, 64, 0, nullptr);
}
TEST_CASE("emulator dies: a thread returns while the others wait at __syncthreads", "[.dies]") {
  launch(early_return_kernel, 1, 32, 0, nullptr);
}
TEST_CASE("emulator dies: a wgmma descriptor without the 128-byte swizzle", "[.dies]") {
  launch(unswizzled_wgmma_kernel, 1, 128, 1024, nullptr);
}
TEST_CASE("emulator dies: an mbarrier phase that never completes", "[.dies]") {
  launch(unfinished_phase_kernel, 1, 32, 8, nullptr);
}
TEST_CASE("emulator dies: an mbarrier arrival past its count while the phase waits for bytes", "[.dies]") {
  launch(extra_arrival_kernel, 1, 1, 8, nullptr);
}
TEST_CASE("emulator dies: a TMA copy to shared memory off a 128-byte boundary", "[.dies]") {
  DeviceArray<std::uint16_t> tensor(64 * 16);
  attograd::cuda::launch(misaligned_tma_kernel, 1, 1, 4096 + 8, nullptr, map_of(tensor, 64, 16, 16));
}
TEST_CASE("emulator dies: the lanes of a shuffle disagree on its mask", "[.dies]") {
  DeviceArray<int> out(32);
  launch(mismatched_masks_kernel, 1, 32, 0, nullptr, out.p);
}

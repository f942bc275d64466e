#pragma once
// The CPU side of the CUDA emulator: how a launch runs a grid. Each block runs
// on the launching thread, one after the other; its threads run as fibers,
// each until it reaches __syncthreads, a warp shuffle or its end, so those
// have their GPU meaning: a barrier of the whole block, an exchange among the
// lanes of a warp. A warp runs as far as it can before the next one starts.
// A block whose threads cannot all go on (a __syncthreads that only some
// threads reach, a shuffle whose lanes disagree on the mask) stops the process
// with a line naming the kernel, block and threads, where a GPU would hang or
// give undefined results.
//
// What it cannot show: speed; races (a block's threads never run at the same
// time: a missing __syncthreads between warps mostly shows anyway, as one warp
// runs ahead, but races are compute-sanitizer racecheck's, on a GPU); the
// GPU's float rounding where it differs from the host's (expf, FMA
// contraction); memory visibility between blocks.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

using cudaStream_t = struct EmulatedStream*;

namespace emu {

// The coordinates of the thread running now (on a fiber).
struct ThreadCoordinates {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
const ThreadCoordinates& coordinates();

// Runs body (one thread's kernel call) for every thread of the grid. A
// configuration a GPU refuses runs nothing and becomes the error that
// cudaGetLastError returns next, as on a GPU.
void run_grid(const void* kernel, dim3 grid, dim3 block, std::size_t dynamic_smem, cudaStream_t stream,
              const std::function<void()>& body);
// The grids this process has run (a launch a GPU refuses runs none): what a
// test holds a training step's launches to.
std::uint64_t grids_run();

void syncthreads();
void* dynamic_shared_memory();

// Lane exchange: every lane in `mask` publishes `bits` and gets the bits of
// lane source(lane), or its own where source returns -1.
std::uint64_t exchange(unsigned mask, std::uint64_t bits, int source_lane);
int lane();

// Every lane in `mask` publishes `bytes` of `mine` and gets every lane's in
// `all` (32 x bytes; lanes outside the mask leave theirs unspecified): one
// round, where 32 shuffles would take 32. What the emulated ldmatrix
// (cuda/mma_bf16.cuh) needs: each lane's values come from the whole warp's row addresses.
constexpr std::size_t kMaxExchangeBytes = 128;
void all_gather(unsigned mask, const void* mine, std::size_t bytes, void* all);
template <typename T>
void warp_all_gather(unsigned mask, const T& mine, T (&all)[32]) {
  static_assert(sizeof(T) <= kMaxExchangeBytes && std::is_trivially_copyable_v<T>);
  all_gather(mask, &mine, sizeof(T), all);
}

// Every lane in `mask` publishes `mine`; once all have, `combine` runs once, on
// the last lane in, over every lane's value (those of lanes outside the mask
// unspecified) and writes every lane's result; each lane returns its own. What
// the emulated tensor-core product needs: the warp's product made once, where
// each lane gathering every operand made it 32 times over.
using CombineLanes = void (*)(const void* values, void* results);
void combine(unsigned mask, const void* mine, std::size_t bytes, void* result, std::size_t result_bytes,
             CombineLanes combine_lanes);
template <typename Out, typename In, typename Combine>  // Combine: void(const In (&)[32], Out (&)[32]), no state
Out warp_combine(unsigned mask, const In& mine, Combine) {
  static_assert(sizeof(In) <= kMaxExchangeBytes && std::is_trivially_copyable_v<In>);
  static_assert(sizeof(Out) <= kMaxExchangeBytes && std::is_trivially_copyable_v<Out>);
  static_assert(std::is_empty_v<Combine> && std::is_default_constructible_v<Combine>);
  Out out;
  combine(mask, &mine, sizeof(In), &out, sizeof(Out), [](const void* values, void* results) {
    In all[32];
    Out each[32]{};
    std::memcpy(all, values, sizeof all);
    Combine{}(all, each);
    std::memcpy(results, each, sizeof each);
  });
  return out;
}

// cp.async (sm_80 and newer): copies of `bytes` into shared memory, the first
// source_bytes from `source` and the rest zero, which a GPU makes in the
// background, any time between the copy and the wait for its group
// (cp.async.wait_group: every group but the newest `pending` committed ones).
// Here the two ends of that time, one for each thread order: first warp ahead,
// a copy is made when its thread waits for it, so a kernel that reads the
// destination sooner (or lets another thread read it before a barrier that
// follows the wait) reads stale values; last warp ahead
// (ATTOGRAD_EMULATED_ORDER=reverse), at once, so a copy into a buffer that
// other warps have not finished reading (a missing barrier) overwrites it.
void async_copy(void* destination, const void* source, std::size_t bytes, std::size_t source_bytes);
void async_commit();
void async_wait(int pending);

// Where p lies in the block's dynamic shared memory: its byte offset there,
// as the shared state space's address (__cvta_generic_to_shared) names it on a
// GPU; a pointer outside it stops the process. shared_pointer is the inverse.
std::uint32_t shared_address(const void* p);
void* shared_pointer(std::uint32_t address);

// wgmma.mma_async (sm_90a): a warpgroup's product, which reads its operands
// from shared memory and writes the thread's accumulators in the background,
// any time between the product and the wait for its group
// (wgmma.wait_group: every group but the newest `pending` committed ones).
// As with cp.async, the two ends of that time, one for each thread order:
// first warp ahead, `make(args)` runs when its thread waits for it, so a
// kernel that overwrites an operand's tile or reads the accumulators sooner
// gets other sums; last warp ahead, at once. `make` computes the thread's own
// accumulators (each is a function of shared memory alone), from `bytes` of
// arguments copied here.
constexpr std::size_t kMaxProductArgBytes = 64;
using AsyncProduct = void (*)(const void* args);
void async_product(AsyncProduct make, const void* args, std::size_t bytes);
void async_product_commit();
void async_product_wait(int pending);

// bar.sync id, threads (id 1 to 15): a barrier of the first `threads` threads
// to reach it, a multiple of 32 (sm_90's warp-specialised kernels let a few
// warpgroups meet without the rest of the block).
void named_barrier(int id, int threads);

// mbarrier (sm_90): a barrier object of 8 bytes at a shared memory `address`,
// whose phase completes when `count` threads have arrived and every byte of
// the transactions expected during the phase (arrive's expect_bytes) has come
// (TMA copies, below). A thread waiting for the phase of a parity to complete
// (mbarrier.try_wait.parity in a loop) leaves its fiber to the block's other
// threads until it does; a block in which none can go on stops the process
// where a GPU would hang. A phase counts as complete when the barrier's
// current phase has the other parity: a wait for parity 1 on a new barrier
// returns at once. An arrival while the phase has all its arrivals and waits
// only for bytes stops the process (on a GPU, the count goes wrong).
void mbarrier_init(std::uint32_t address, int count);
void mbarrier_arrive(std::uint32_t address, std::uint32_t expect_bytes);
void mbarrier_wait(std::uint32_t address, int parity);

// A tensor map (CUtensorMap, cuTensorMapEncodeTiled) as the emulator keeps it:
// up to three dims, the first fastest, strides in bytes, a box that a TMA copy
// moves, and the 128-byte swizzle or none. Coordinates outside the tensor,
// negative ones too, read as zeros.
struct alignas(64) TensorMap {
  const void* base;
  int rank, element_bytes;
  std::uint64_t dims[3];
  std::uint64_t strides[3];  // strides[0] is the element's size
  std::uint32_t box[3];
  bool swizzle_128;
};
// cp.async.bulk.tensor (TMA): the box at `coordinates` (the first dim's
// fastest) into shared memory at `destination`, row after row of the box,
// each 16-byte chunk moved by the 128-byte swizzle of its address where the
// map asks; its bytes complete the transaction of the mbarrier at `barrier`.
// As with cp.async, the two ends of the time a GPU makes it in: first warp
// ahead, when a thread waits for the barrier's phase, so a kernel that reads
// the tile without that wait reads stale values; last warp ahead, at once,
// so a copy into a stage that other warps still read shows.
void tma_load(const TensorMap& map, std::uint32_t destination, std::uint32_t barrier, const int (&coordinates)[3]);

// Stops the process with a line naming the block, the thread and `what`: a
// device-side misuse that a GPU would fault on or answer with garbage.
[[noreturn]] void device_fault(const char* what);

template <typename T>
T shuffle(unsigned mask, T value, int source_lane) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t) && std::is_trivially_copyable_v<T>);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = exchange(mask, bits, source_lane);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

// The launch: the arguments are converted to the kernel's parameter types
// once, and each thread gets its own copy, as on a GPU.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t dynamic_smem, cudaStream_t stream,
            Args&&... args) {
  const std::tuple<std::decay_t<Params>...> values(std::forward<Args>(args)...);
  run_grid(reinterpret_cast<const void*>(kernel), grid, block, dynamic_smem, stream,
           [&] { std::apply([&](auto... copy) { kernel(copy...); }, values); });
}

}  // namespace emu

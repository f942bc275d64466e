// GPU gradients summed in device memory by NCCL (built when CMake finds NCCL
// and the CUDA backend is on): no copy through the host, and NCCL's ring or
// tree over NVLink, PCIe or the network instead of MPI's over host memory.
//
// Each sum runs on a stream of its own. An event recorded on the device's
// stream makes it start only after backward wrote the bucket's gradients; the
// device's stream waits for the sum's event before anything later reads them.
// So backward's remaining kernels overlap the sums of the buckets it finished,
// as on the CPU. (cuda/stream.h is for code that queues GPU work; NCCL's
// kernels are that.)
#include <cuda_runtime.h>
#include <nccl.h>

#include <fmt/format.h>

#include "cuda/check.h"
#include "cuda/stream.h"
#include "tensor/error.h"
#include "train/communicator.h"

namespace attograd::train {
namespace {

void check_nccl(ncclResult_t result, const char* call) {
  if (result == ncclSuccess) return;
  fail("nccl", "{} failed: {} ({})", call, ncclGetErrorString(result), ncclGetLastError(nullptr));
}

cudaEvent_t new_event() {
  cudaEvent_t event = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

// Work queued on `waiter` from now on starts after the work already queued on `producer`.
void wait_for(cudaStream_t waiter, cudaStream_t producer) {
  const cudaEvent_t event = new_event();
  CUDA_CHECK(cudaEventRecord(event, producer));
  CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
  CUDA_CHECK(cudaEventDestroy(event));  // released once it has fired
}

class NcclSum final : public PendingReduce {
 public:
  NcclSum(cudaEvent_t done, int device) : done_(done), device_(device) {}
  ~NcclSum() override {
    cudaEventSynchronize(done_);  // never hand back a bucket NCCL still writes
    cudaEventDestroy(done_);
  }
  bool test() override {
    const cudaError_t status = cudaEventQuery(done_);
    if (status == cudaErrorNotReady) return false;
    CUDA_CHECK(status);
    return true;
  }
  void wait() override {
    CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device_), done_, 0));  // later kernels read the sum
    CUDA_CHECK(cudaEventSynchronize(done_));  // and the host learns how long it waited
  }

 private:
  cudaEvent_t done_;
  int device_;
};

class NcclGroup final : public DeviceCommunicator {
 public:
  NcclGroup(Communicator& comm, int device) : device_(device) {
    ncclUniqueId id{};  // rank 0's bootstrap address, carried to the others by MPI
    if (comm.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    comm.broadcast(&id, sizeof id, 0);
    cuda::stream(device);  // makes `device` current, as ncclCommInitRank needs
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    check_nccl(ncclCommInitRank(&nccl_, comm.size(), id, comm.rank()), "ncclCommInitRank");
    int version = 0;
    check_nccl(ncclGetVersion(&version), "ncclGetVersion");
    engine_ = fmt::format("NCCL {}.{}.{}", version / 10000, version / 100 % 100, version % 100);
  }
  ~NcclGroup() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(nccl_);
    cudaStreamDestroy(stream_);
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  std::string engine() const override { return engine_; }

  std::unique_ptr<PendingReduce> start_sum(float* device_data, std::size_t n) override {
    wait_for(stream_, cuda::stream(device_));  // backward has written the bucket
    check_nccl(ncclAllReduce(device_data, device_data, n, ncclFloat32, ncclSum, nccl_, stream_), "ncclAllReduce");
    const cudaEvent_t done = new_event();
    CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_unique<NcclSum>(done, device_);
  }

  void broadcast(const std::vector<Broadcast>& buffers) override {
    const cudaStream_t compute = cuda::stream(device_);
    wait_for(stream_, compute);  // the owners' updates are written
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (const Broadcast& b : buffers)
      check_nccl(ncclBroadcast(b.device_data, b.device_data, b.n, ncclFloat32, b.root, nccl_, stream_),
                 "ncclBroadcast");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    wait_for(compute, stream_);  // what reads the parameters next sees their owners' values
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t nccl_ = nullptr;
  std::string engine_;
};

}  // namespace

bool built_with_nccl() { return true; }

std::unique_ptr<DeviceCommunicator> make_nccl_communicator(Communicator& comm, int device) {
  // A process that fails here leaves the others waiting in MPI's broadcast or in
  // NCCL's bootstrap, which does not give up: stop them all instead. Alone, it
  // throws like any other error (exit(1) would also end a test program).
  try {
    return std::make_unique<NcclGroup>(comm, device);
  } catch (const std::exception& e) {
    stop_every_process(comm, e);
    throw;
  }
}

}  // namespace attograd::train

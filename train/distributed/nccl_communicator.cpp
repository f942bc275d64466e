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
//
// A peer that fails (a machine gone, a network link down) surfaces only as the
// communicator's asynchronous error: NCCL's kernels go on waiting for data that
// will not come, and cudaEventSynchronize would wait for ever. So the host waits
// by polling the sum's event and that error together, and on an error aborts the
// communicator (which ends its kernels) and fails; the trainer then stops every
// process. (A peer process that dies is mpirun's to notice: it stops the rest.)
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "base/error.h"
#include "cuda/check.h"
#include "cuda/stream.h"
#include "train/distributed/communicator.h"

namespace attograd::train::distributed {
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

// The NCCL communicator, shared by the group and its sums in flight.
struct NcclHandle {
  ncclComm_t comm = nullptr;  // null once destroyed or aborted
  std::string error;          // why it was aborted

  // False, after aborting the communicator (which ends its kernels), once NCCL
  // has met an error in the background.
  bool healthy() {
    if (!error.empty()) return false;
    if (!comm) return true;
    ncclResult_t async = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(comm, &async);
    if (asked != ncclSuccess) async = asked;
    if (async == ncclSuccess || async == ncclInProgress) return true;
    error = fmt::format("{} ({})", ncclGetErrorString(async), ncclGetLastError(comm));
    ncclCommAbort(comm);
    comm = nullptr;
    return false;
  }
  void check() {
    if (!healthy()) fail("nccl", "a collective failed in the background, and the communicator was aborted: {}", error);
  }
};

class NcclSum final : public PendingReduce {
 public:
  NcclSum(cudaEvent_t done, int device, std::shared_ptr<NcclHandle> nccl)
      : done_(done), device_(device), nccl_(std::move(nccl)) {}
  ~NcclSum() override {
    // Never hand back a bucket NCCL still writes (an abort ends its kernels).
    while (cudaEventQuery(done_) == cudaErrorNotReady && nccl_->healthy()) std::this_thread::yield();
    cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
  }
  bool test() override {
    const cudaError_t status = cudaEventQuery(done_);
    if (status == cudaErrorNotReady) {
      nccl_->check();
      return false;
    }
    CUDA_CHECK(status);
    return true;
  }
  void wait() override {
    CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device_), done_, 0));  // later kernels read the sum
    while (!test()) std::this_thread::yield();  // the host learns how long it waited, or of a failed peer
  }

 private:
  cudaEvent_t done_;
  int device_;
  std::shared_ptr<NcclHandle> nccl_;
};

class NcclGroup final : public DeviceCommunicator {
 public:
  NcclGroup(Communicator& comm, int device) : device_(device) {
    ncclUniqueId id{};  // rank 0's bootstrap address, carried to the others by MPI
    if (comm.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    comm.broadcast(&id, sizeof id, 0);
    cuda::stream(device);  // makes `device` current, as ncclCommInitRank needs
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    check_nccl(ncclCommInitRank(&nccl_->comm, comm.size(), id, comm.rank()), "ncclCommInitRank");
    int version = 0;
    check_nccl(ncclGetVersion(&version), "ncclGetVersion");
    engine_ = fmt::format("NCCL {}.{}.{}", version / 10000, version / 100 % 100, version % 100);
  }
  ~NcclGroup() override {
    if (nccl_->comm) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(nccl_->comm);
      nccl_->comm = nullptr;
    }
    cudaStreamDestroy(stream_);
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  std::string engine() const override { return engine_; }

  std::unique_ptr<PendingReduce> start_sum(float* device_data, std::size_t n) override {
    wait_for(stream_, cuda::stream(device_));  // backward has written the bucket
    nccl_->check();
    check_nccl(ncclAllReduce(device_data, device_data, n, ncclFloat32, ncclSum, nccl_->comm, stream_),
               "ncclAllReduce");
    const cudaEvent_t done = new_event();
    CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_unique<NcclSum>(done, device_, nccl_);
  }

  void broadcast(const std::vector<Broadcast>& buffers) override {
    const cudaStream_t compute = cuda::stream(device_);
    nccl_->check();
    wait_for(stream_, compute);  // the owners' updates are written
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (const Broadcast& b : buffers)
      check_nccl(ncclBroadcast(b.device_data, b.device_data, b.n, ncclFloat32, b.root, nccl_->comm, stream_),
                 "ncclBroadcast");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    wait_for(compute, stream_);  // what reads the parameters next sees their owners' values
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<NcclHandle> nccl_ = std::make_shared<NcclHandle>();
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

}  // namespace attograd::train::distributed

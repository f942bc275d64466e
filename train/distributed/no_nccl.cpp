// A build without NCCL: GPU gradients travel through host memory over MPI
// (train/distributed/data_parallel.cpp stages them).
#include "base/error.h"
#include "train/distributed/communicator.h"

namespace attograd::train::distributed {

bool built_with_nccl() { return false; }

std::unique_ptr<DeviceCommunicator> make_nccl_communicator(Communicator&, int) {
  fail("nccl", "this attograd was built without NCCL (configure with -DATTOGRAD_NCCL=ON -DNCCL_ROOT=...)");
}

}  // namespace attograd::train::distributed

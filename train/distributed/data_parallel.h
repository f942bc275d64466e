#pragma once
// Data parallelism over a Communicator, as PyTorch's DDP and llm.c do it: every
// process holds the whole model, computes gradients on its share of the batch,
// and the gradients are summed across processes before the (identical) update.
//
// GradientReducer groups the parameters into buckets of a few MB, in reverse
// registration order (backward reaches the last layers first). prepare() makes
// every parameter's .grad a zeroed view of its bucket's buffer, so backward
// accumulates the gradients straight into the buckets (nothing is copied). The
// hook, given to backward() as BackwardOptions::on_leaf_grad_ready, counts the
// gradients backward has finished; when a bucket's are all done (and those of
// every bucket before it: all processes must start them in the same order), its
// all-reduce starts in the background, overlapping communication with the rest
// of backward. finish() waits for every bucket: the .grads then hold the sums.
// GPU buckets are summed in device memory by NCCL when a DeviceCommunicator is
// given (see choose_device_reduction), else staged through host memory.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "nn/module.h"
#include "train/distributed/communicator.h"

namespace attograd::train::distributed {

inline constexpr std::size_t kDefaultBucketBytes = std::size_t{4} << 20;

class GradientReducer {
 public:
  GradientReducer(std::vector<nn::NamedParameter> params, Communicator& comm,
                  std::size_t bucket_bytes = kDefaultBucketBytes, DeviceCommunicator* device_comm = nullptr);

  // Before a step's first backward: zeroes the buckets and makes each .grad a view of its slot.
  void prepare();
  // For the backward whose gradients are final (the last micro-batch's).
  std::function<void(const Tensor& leaf)> hook();
  // Starts the buckets still waiting (a parameter that backward did not reach
  // contributes zeros), waits for all, and leaves each summed gradient in its
  // parameter's .grad. Returns the seconds spent waiting here. A .grad that is
  // not the bucket's view (no prepare(), or replaced) is copied in and out.
  double finish();

  std::size_t bucket_count() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<std::size_t> params;  // indices into params_
    Tensor flat;                      // the bucket's gradients, end to end, on the parameters' device
    std::vector<float> staged;        // a device bucket's host copy (MPI reads host memory)
    std::size_t ready = 0;
    std::unique_ptr<PendingReduce> pending;
  };
  void ready(std::size_t param);
  void start(Bucket& bucket);
  Tensor slot(std::size_t param) const;        // param's view of its bucket, shaped like it
  bool holds_in_place(std::size_t param) const;  // its .grad is that view

  std::vector<nn::NamedParameter> params_;
  Communicator& comm_;
  DeviceCommunicator* device_comm_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_, offset_;  // per parameter: its bucket and its offset in it
  std::vector<bool> is_ready_;
  std::size_t next_to_start_ = 0;  // buckets start in index order on every process
  std::unordered_map<const TensorImpl*, std::size_t> index_;
};

// How a run's gradients on `device` are summed. On a GPU: through NCCL in
// device memory when this build has it and every process drives a GPU of its
// own (NCCL refuses two processes on one GPU), else staged through host memory
// over MPI; ATTOGRAD_NCCL=0 in the environment asks for the host path. Every
// process gets the same answer (a collective: every process calls it).
struct DeviceReduction {
  std::unique_ptr<DeviceCommunicator> comm;  // null: host memory
  std::string how;                           // for the progress line: which path, and why
};
DeviceReduction choose_device_reduction(Communicator& comm, Device device);

// Every parameter takes rank `root`'s values (every owner is `root`; see gather_sharded_parameters).
void broadcast_parameters(const std::vector<nn::NamedParameter>& params, Communicator& comm, int root = 0,
                          DeviceCommunicator* device_comm = nullptr);
// FNV-1a of every parameter's bytes, in order, as 16 hex digits: processes
// whose parameters differ in any bit (almost surely) differ here.
std::string parameter_checksum(const std::vector<nn::NamedParameter>& params);

// ZeRO stage 1: which process keeps the optimizer state of (and updates) each
// parameter. Parameters go, largest first, to the process holding the fewest
// elements so far, so each keeps about 1/N of the state.
std::vector<int> shard_owners(const std::vector<nn::NamedParameter>& params, int processes);
// After each process updated the parameters it owns: every parameter takes its owner's values.
// GPU parameters go through NCCL in device memory when `device_comm` is given, else through the host.
void gather_sharded_parameters(const std::vector<nn::NamedParameter>& params, const std::vector<int>& owners,
                               Communicator& comm, DeviceCommunicator* device_comm = nullptr);

}  // namespace attograd::train::distributed

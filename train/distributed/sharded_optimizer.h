#pragma once
// ZeRO stage 1 (Rajbhandari et al. 2020), as llm.c does it: each process keeps
// the optimizer state (AdamW's two moments, SGD's momentum) of about 1/N of the
// parameters, updates only those, and then every parameter takes its owner's
// new values. Gradients are still summed whole on every process first (the
// gradient all-reduce), so the update is exactly the unsharded one.
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "train/distributed/communicator.h"
#include "train/optim/optimizer.h"
#include "train/output/checkpoint.h"

namespace attograd::train::distributed {

class ShardedOptimizer : public optim::Optimizer {
 public:
  // `make` builds the real optimizer over this process's shard (see data_parallel.h's shard_owners).
  ShardedOptimizer(std::vector<nn::NamedParameter> params, Communicator& comm,
                   const std::function<std::unique_ptr<optim::Optimizer>(std::vector<nn::NamedParameter>)>& make);

  // Updates this process's shard, then gathers every parameter from its owner (collective).
  void step() override;
  std::string name() const override { return local_->name(); }
  // This process's shard only; checkpoints use gather_state().
  std::map<std::string, Tensor> state() const override { return local_->state(); }
  // A whole state (as a checkpoint holds it): each process takes its shard's entries.
  void load_state(const std::map<std::string, Tensor>& state, std::int64_t step_count) override;

  // Collective: the whole state on rank 0 (empty on the others).
  output::OptimizerState gather_state() const;
  std::size_t state_bytes() const;  // this process's optimizer state
  // GPU parameters are then gathered through NCCL in device memory (null: through the host).
  void use_device_communicator(DeviceCommunicator* device_comm) { device_comm_ = device_comm; }

 private:
  Communicator& comm_;
  DeviceCommunicator* device_comm_ = nullptr;
  std::vector<int> owners_;
  std::unique_ptr<optim::Optimizer> local_;
};

// Bytes of optimizer state an optimizer holds (for the progress line).
std::size_t optimizer_state_bytes(const optim::Optimizer& optimizer);

}  // namespace attograd::train::distributed

#include "train/distributed/sharded_optimizer.h"

#include <cstdint>

#include "autograd/ops.h"
#include "train/distributed/data_parallel.h"
#include "train/output/safetensors.h"

namespace attograd::train::distributed {

ShardedOptimizer::ShardedOptimizer(std::vector<nn::NamedParameter> params, Communicator& comm,
                                   const std::function<std::unique_ptr<optim::Optimizer>(std::vector<nn::NamedParameter>)>& make)
    : optim::Optimizer(params, 0.0), comm_(comm), owners_(shard_owners(params, comm.size())) {
  std::vector<nn::NamedParameter> shard;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (owners_[i] == comm.rank()) shard.push_back(params[i]);
  local_ = make(std::move(shard));
  set_lr(local_->lr());
}

void ShardedOptimizer::step() {
  ++step_count_;
  local_->set_lr(lr());
  local_->step();
  gather_sharded_parameters(params_, owners_, comm_, device_comm_);
}

void ShardedOptimizer::load_state(const std::map<std::string, Tensor>& state, std::int64_t step_count) {
  local_->load_state(state, step_count);
  step_count_ = step_count;
}

output::OptimizerState ShardedOptimizer::gather_state() const {
  output::OptimizerState whole{name(), step_count(), {}};
  if (comm_.rank() == 0) whole.buffers = local_->state();
  // Each other process's shard travels as one safetensors blob: the format
  // already names, shapes and checks every buffer.
  for (int from = 1; from < comm_.size(); ++from) {
    std::string blob;
    if (comm_.rank() == from) {
      output::NamedTensors shard;
      for (const auto& [key, t] : local_->state()) shard.emplace_back(key, to_cpu(t));
      blob = output::serialize_safetensors(shard);
    }
    std::uint64_t bytes = blob.size();
    comm_.transfer(&bytes, sizeof bytes, from, 0);
    if (comm_.rank() == 0) blob.resize(bytes);
    comm_.transfer(blob.data(), bytes, from, 0);
    if (comm_.rank() == 0)
      for (auto& [key, t] : output::parse_safetensors(blob, "optimizer shard").tensors) whole.buffers.emplace(key, t);
  }
  return whole;
}

std::size_t ShardedOptimizer::state_bytes() const { return optimizer_state_bytes(*local_); }

std::size_t optimizer_state_bytes(const optim::Optimizer& optimizer) {
  std::size_t bytes = 0;
  for (const auto& [key, t] : optimizer.state())
    bytes += static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
  return bytes;
}

}  // namespace attograd::train::distributed

#include "train/distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <numeric>

#include <unistd.h>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "base/error.h"
#include "base/fnv.h"
#include "cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/shape.h"
#include "train/distributed/host_floats.h"

namespace attograd::train::distributed {
namespace {

}  // namespace

// ---- GradientReducer ------------------------------------------------------------------

GradientReducer::GradientReducer(std::vector<nn::NamedParameter> params, Communicator& comm,
                                 std::size_t bucket_bytes, DeviceCommunicator* device_comm)
    : params_(std::move(params)),
      comm_(comm),
      device_comm_(device_comm),
      bucket_of_(params_.size()),
      offset_(params_.size()),
      is_ready_(params_.size(), false) {
  check_float32(params_, "data parallel");
  AG_CHECK(bucket_bytes >= sizeof(float), "data parallel", "bucket size must be at least 4 bytes, got {}", bucket_bytes);
  std::vector<std::int64_t> sizes;  // elements per bucket
  for (std::size_t i = params_.size(); i-- > 0;) {  // backward finishes the last layers first
    if (buckets_.empty() || static_cast<std::size_t>(sizes.back()) * sizeof(float) >= bucket_bytes) {
      buckets_.emplace_back();
      sizes.push_back(0);
    }
    bucket_of_[i] = buckets_.size() - 1;
    offset_[i] = static_cast<std::size_t>(sizes.back());
    buckets_.back().params.push_back(i);
    sizes.back() += params_[i].tensor.numel();
    index_[params_[i].tensor.impl()] = i;
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    buckets_[b].flat = zeros({sizes[b]}, params_[buckets_[b].params.front()].tensor.options());
}

Tensor GradientReducer::slot(std::size_t i) const {
  const Tensor& p = params_[i].tensor;
  const Tensor& flat = buckets_[bucket_of_[i]].flat;
  return make_view(flat, p.sizes(), contiguous_strides(p.sizes()), flat.offset() + static_cast<std::int64_t>(offset_[i]));
}

bool GradientReducer::holds_in_place(std::size_t i) const {
  const Tensor& g = params_[i].tensor.grad();
  const Tensor& flat = buckets_[bucket_of_[i]].flat;
  return g.defined() && g.storage() == flat.storage() &&
         g.offset() == flat.offset() + static_cast<std::int64_t>(offset_[i]) && g.sizes() == params_[i].tensor.sizes() &&
         g.is_contiguous();
}

void GradientReducer::prepare() {
  NoGradGuard no_grad;
  for (Bucket& b : buckets_) kernels::fill_(b.flat, 0.0);
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].tensor.set_grad(slot(i));
}

std::function<void(const Tensor&)> GradientReducer::hook() {
  return [this](const Tensor& leaf) {
    const auto it = index_.find(leaf.impl());
    if (it != index_.end()) ready(it->second);
  };
}

void GradientReducer::ready(std::size_t i) {
  if (is_ready_[i]) return;
  is_ready_[i] = true;
  if (!holds_in_place(i)) {  // backward wrote a gradient of its own: bring it into the bucket
    NoGradGuard no_grad;
    const Tensor& grad = params_[i].tensor.grad();
    if (grad.defined())
      kernels::copy_(slot(i), grad);
    else
      kernels::fill_(slot(i), 0.0);
  }
  Bucket& b = buckets_[bucket_of_[i]];
  ++b.ready;
  // MPI pairs the processes' collectives by the order they start in, so every
  // process starts the buckets in index order, whatever order backward finishes
  // them in (it may differ between processes: one whose last micro-batch has no
  // counted targets runs no backward with the hook at all). A bucket finished
  // early waits for the ones before it, as in PyTorch's DDP.
  while (next_to_start_ < buckets_.size() && buckets_[next_to_start_].ready == buckets_[next_to_start_].params.size())
    start(buckets_[next_to_start_++]);
  // MPI moves a non-blocking collective along only inside MPI calls: poke the
  // ones in flight so they progress while backward computes.
  for (Bucket& other : buckets_)
    if (other.pending) other.pending->test();
}

void GradientReducer::start(Bucket& b) {
  if (device_comm_ && b.flat.device().is_cuda()) {
    b.pending = device_comm_->start_sum(b.flat.data<float>(), static_cast<std::size_t>(b.flat.numel()));
    return;
  }
  if (host_contiguous(b.flat)) {
    b.pending = comm_.start_sum(b.flat.data<float>(), static_cast<std::size_t>(b.flat.numel()));
    return;
  }
  b.staged.resize(static_cast<std::size_t>(b.flat.numel()));  // a GPU's gradients travel through host memory
  read_floats(b.flat, b.staged.data());
  b.pending = comm_.start_sum(b.staged.data(), b.staged.size());
}

double GradientReducer::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < params_.size(); ++i)  // the rest start now, still in index order
    if (!is_ready_[i]) ready(i);
  next_to_start_ = 0;
  for (Bucket& b : buckets_) {
    b.pending->wait();
    b.pending.reset();
    b.ready = 0;
    if (!b.staged.empty()) write_floats(b.flat, b.staged.data());
    b.flat.bump_version();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    is_ready_[i] = false;
    if (!holds_in_place(i)) params_[i].tensor.set_grad(slot(i));
  }
  return waited;
}

// ---- how a GPU's gradients travel ----------------------------------------------------

DeviceReduction choose_device_reduction(Communicator& comm, Device device) {
  if (device.is_cpu()) return {nullptr, "in host memory"};
  // Every process's wish ("1", "0", or "?" for a value that is neither), GPU and
  // machine, gathered first, so that every process decides alike and none is left
  // waiting in a collective the others skipped.
  const char* setting = std::getenv("ATTOGRAD_NCCL");
  const std::string wish = !setting || std::string(setting) == "1" ? "1" : std::string(setting) == "0" ? "0" : "?";
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::vector<std::string> all =
      comm.all_gather(fmt::format("{} {} on {}", wish, cuda::pci_bus_id(device.index), host));
  for (int r = 0; r < static_cast<int>(all.size()); ++r)  // every rank's value, before any rank's choice
    AG_CHECK(all[static_cast<std::size_t>(r)][0] != '?', "ATTOGRAD_NCCL",
             "must be 0 or 1 (or unset), but rank {} has '{}'", r,
             r == comm.rank() && setting ? setting : "another value");
  const std::string staged = "staged through host memory";
  if (!built_with_nccl()) return {nullptr, staged + " (this build has no NCCL)"};
  if (std::any_of(all.begin(), all.end(), [](const std::string& entry) { return entry[0] == '0'; }))
    return {nullptr, staged + " (ATTOGRAD_NCCL=0)"};
  std::map<std::string, int> first_on;  // "GPU on host" -> the first rank driving it
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const std::string gpu = all[static_cast<std::size_t>(r)].substr(2);
    if (const auto [it, fresh] = first_on.emplace(gpu, r); !fresh)
      return {nullptr, fmt::format("{} (ranks {} and {} share the GPU at {}; NCCL needs one per process)", staged,
                                   it->second, r, gpu)};
  }
  auto nccl = make_nccl_communicator(comm, device.index);
  const std::string how = "in device memory by " + nccl->engine();
  return {std::move(nccl), how};
}

// ---- parameters ----------------------------------------------------------------------

void broadcast_parameters(const std::vector<nn::NamedParameter>& params, Communicator& comm, int root,
                          DeviceCommunicator* device_comm) {
  gather_sharded_parameters(params, std::vector<int>(params.size(), root), comm, device_comm);
}

std::string parameter_checksum(const std::vector<nn::NamedParameter>& params) {
  std::uint64_t hash = kFnv1aOffset;
  std::vector<float> buffer;
  for (const auto& p : params) {
    buffer.resize(static_cast<std::size_t>(p.tensor.numel()));
    read_floats(p.tensor, buffer.data());
    hash = fnv1a64(buffer.data(), buffer.size() * sizeof(float), hash);
  }
  return fmt::format("{:016x}", hash);
}

// ---- ZeRO stage 1 --------------------------------------------------------------------

std::vector<int> shard_owners(const std::vector<nn::NamedParameter>& params, int processes) {
  AG_CHECK(processes >= 1, "shard", "needs at least one process, got {}", processes);
  std::vector<std::size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return params[a].tensor.numel() > params[b].tensor.numel();
  });
  std::vector<std::int64_t> held(static_cast<std::size_t>(processes), 0);
  std::vector<int> owners(params.size());
  for (std::size_t i : order) {
    const auto least = std::min_element(held.begin(), held.end()) - held.begin();
    owners[i] = static_cast<int>(least);
    held[static_cast<std::size_t>(least)] += params[i].tensor.numel();
  }
  return owners;
}

void gather_sharded_parameters(const std::vector<nn::NamedParameter>& params, const std::vector<int>& owners,
                               Communicator& comm, DeviceCommunicator* device_comm) {
  AG_CHECK(owners.size() == params.size(), "shard", "{} owners for {} parameters", owners.size(), params.size());
  const bool in_device_memory = device_comm && std::all_of(params.begin(), params.end(), [](const auto& p) {
    return p.tensor.device().is_cuda() && p.tensor.is_contiguous();
  });
  if (comm.size() == 1 && !in_device_memory) return;  // (a one-GPU NCCL group still runs: its tests)
  check_float32(params, "data parallel");
  NoGradGuard no_grad;
  if (in_device_memory) {  // one NCCL group, queued on the GPU: no copy through the host
    std::vector<DeviceCommunicator::Broadcast> buffers;
    for (std::size_t i = 0; i < params.size(); ++i)
      buffers.push_back(
          {params[i].tensor.data<float>(), static_cast<std::size_t>(params[i].tensor.numel()), owners[i]});
    device_comm->broadcast(buffers);
    for (const auto& p : params) p.tensor.bump_version();
    return;
  }
  std::vector<float> buffer;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i].tensor;
    buffer.resize(static_cast<std::size_t>(p.numel()));
    if (comm.rank() == owners[i]) read_floats(p, buffer.data());
    comm.broadcast(buffer.data(), buffer.size() * sizeof(float), owners[i]);
    if (comm.rank() != owners[i]) write_floats(p, buffer.data());
  }
}

}  // namespace attograd::train::distributed

#include "train/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "tensor/error.h"
#include "tensor/kernels.h"

namespace attograd::train {
namespace {

// Host float32 copies of tensors of any device and layout; the CPU's contiguous
// float32 tensors (every parameter and gradient of a CPU run) are read and
// written in place.
bool host_contiguous(const Tensor& t) { return t.device().is_cpu() && t.is_contiguous() && t.dtype() == DType::f32; }

void read_floats(const Tensor& t, float* dst) {
  if (host_contiguous(t)) {
    std::memcpy(dst, t.data<float>(), static_cast<std::size_t>(t.numel()) * sizeof(float));
    return;
  }
  const std::vector<float> values = to(to_cpu(t), DType::f32).to_vector<float>();
  std::copy(values.begin(), values.end(), dst);
}

void write_floats(const Tensor& t, const float* src) {
  if (host_contiguous(t)) {
    std::memcpy(t.data<float>(), src, static_cast<std::size_t>(t.numel()) * sizeof(float));
    t.bump_version();
    return;
  }
  kernels::copy_(t, to(from_vector(std::vector<float>(src, src + t.numel()), t.sizes(), t.device()), t.dtype()));
}

void check_float32(const std::vector<nn::NamedParameter>& params, const char* what) {
  for (const auto& p : params)
    AG_CHECK(p.tensor.dtype() == DType::f32, what, "parameter '{}' is {}; data-parallel training is float32",
             p.name, dtype_name(p.tensor.dtype()));
}

}  // namespace

// ---- GradientReducer ------------------------------------------------------------------

GradientReducer::GradientReducer(std::vector<nn::NamedParameter> params, Communicator& comm,
                                 std::size_t bucket_bytes)
    : params_(std::move(params)),
      comm_(comm),
      bucket_of_(params_.size()),
      offset_(params_.size()),
      is_ready_(params_.size(), false) {
  check_float32(params_, "data parallel");
  AG_CHECK(bucket_bytes >= sizeof(float), "data parallel", "bucket size must be at least 4 bytes, got {}", bucket_bytes);
  for (std::size_t i = params_.size(); i-- > 0;) {  // backward finishes the last layers first
    if (buckets_.empty() || buckets_.back().flat.size() * sizeof(float) >= bucket_bytes) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    bucket_of_[i] = buckets_.size() - 1;
    offset_[i] = b.flat.size();
    b.params.push_back(i);
    b.flat.resize(b.flat.size() + static_cast<std::size_t>(params_[i].tensor.numel()));
    index_[params_[i].tensor.impl()] = i;
  }
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
  Bucket& b = buckets_[bucket_of_[i]];
  const Tensor& grad = params_[i].tensor.grad();
  float* slot = b.flat.data() + offset_[i];
  if (grad.defined())
    read_floats(grad, slot);
  else
    std::fill_n(slot, params_[i].tensor.numel(), 0.0f);
  if (++b.ready == b.params.size()) start(b);
  // MPI moves a non-blocking collective along only inside MPI calls: poke the
  // ones in flight so they progress while backward computes.
  for (Bucket& other : buckets_)
    if (other.pending) other.pending->test();
}

void GradientReducer::start(Bucket& b) { b.pending = comm_.start_sum(b.flat.data(), b.flat.size()); }

double GradientReducer::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  // Buckets start in the same order on every process: the ones backward
  // completed (in backward's order, the same everywhere), then these, by index.
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!is_ready_[i]) ready(i);
  for (Bucket& b : buckets_) {
    b.pending->wait();
    b.pending.reset();
    b.ready = 0;
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    is_ready_[i] = false;
    const Tensor& p = params_[i].tensor;
    const float* summed = buckets_[bucket_of_[i]].flat.data() + offset_[i];
    if (!p.grad().defined() || !host_contiguous(p.grad()) || p.grad().sizes() != p.sizes())
      p.set_grad(zeros(p.sizes(), p.options()));
    write_floats(p.grad(), summed);
  }
  return waited;
}

// ---- parameters ----------------------------------------------------------------------

void broadcast_parameters(const std::vector<nn::NamedParameter>& params, Communicator& comm, int root) {
  if (comm.size() == 1) return;
  check_float32(params, "data parallel");
  NoGradGuard no_grad;
  std::vector<float> buffer;
  for (const auto& p : params) {
    buffer.resize(static_cast<std::size_t>(p.tensor.numel()));
    if (comm.rank() == root) read_floats(p.tensor, buffer.data());
    comm.broadcast(buffer.data(), buffer.size() * sizeof(float), root);
    if (comm.rank() != root) write_floats(p.tensor, buffer.data());
  }
}

std::string parameter_checksum(const std::vector<nn::NamedParameter>& params) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits
  std::vector<float> buffer;
  for (const auto& p : params) {
    buffer.resize(static_cast<std::size_t>(p.tensor.numel()));
    read_floats(p.tensor, buffer.data());
    const auto* bytes = reinterpret_cast<const unsigned char*>(buffer.data());
    for (std::size_t i = 0; i < buffer.size() * sizeof(float); ++i) {
      hash ^= bytes[i];
      hash *= 1099511628211ull;
    }
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
                               Communicator& comm) {
  AG_CHECK(owners.size() == params.size(), "shard", "{} owners for {} parameters", owners.size(), params.size());
  if (comm.size() == 1) return;
  NoGradGuard no_grad;
  std::vector<float> buffer;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i].tensor;
    buffer.resize(static_cast<std::size_t>(p.numel()));
    if (comm.rank() == owners[i]) read_floats(p, buffer.data());
    comm.broadcast(buffer.data(), buffer.size() * sizeof(float), owners[i]);
    if (comm.rank() != owners[i]) write_floats(p, buffer.data());
  }
}

}  // namespace attograd::train

#include "train/distributed/step.h"

#include <chrono>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/ops.h"
#include "base/error.h"

namespace attograd::train::distributed {

Tensor model_loss(nn::GPT& model, const Tensor& tokens, const Tensor& targets, const StepCompute& at) {
  const AutocastGuard autocast(at.dtype);  // the forward only: backward runs the graph it recorded
  return model.loss(to(tokens, at.device), to(targets, at.device), data::kIgnoreIndex);
}

Tensor weighted_piece_loss(nn::GPT& model, const data::Batch& batch, std::int64_t first, std::int64_t rows,
                           double batch_count, const StepCompute& at) {
  const Tensor targets = contiguous(narrow(batch.targets, 0, first, rows));
  const std::int64_t count = data::counted_targets(targets.to_vector<std::int64_t>());
  if (count == 0) return {};
  const Tensor tokens = contiguous(narrow(batch.tokens, 0, first, rows));
  return model_loss(model, tokens, targets, at) * (static_cast<double>(count) / batch_count);
}

StepGradients compute_gradients(nn::GPT& model, const data::Batch& batch, const StepCompute& at,
                                std::int64_t micro_batches, Communicator& comm, GradientReducer* reducer) {
  StepGradients result;
  if (comm.size() == 1 && micro_batches == 1) {  // the plain step, bit for bit as it always was
    const Tensor loss = model_loss(model, batch.tokens, batch.targets, at);
    backward(loss);
    result.loss = loss.item();
    return result;
  }

  const std::int64_t rows = batch.tokens.size(0);
  const std::int64_t pieces = comm.size() * micro_batches;
  AG_CHECK(rows % pieces == 0, "--batch", "{} sequences do not split into {} processes x --grad-accum {}", rows,
           comm.size(), micro_batches);
  const std::int64_t piece_rows = rows / pieces;
  const double global_count = static_cast<double>(data::counted_targets(batch.targets.to_vector<std::int64_t>()));
  if (reducer) reducer->prepare();  // backward accumulates into the all-reduce buckets
  double local_loss = 0;
  for (std::int64_t m = 0; m < micro_batches; ++m) {
    const Tensor loss = weighted_piece_loss(model, batch, (comm.rank() * micro_batches + m) * piece_rows, piece_rows,
                                            global_count, at);
    if (!loss.defined()) continue;  // the reducer counts this piece's gradients as zeros
    const bool last = m == micro_batches - 1;
    // Only the last piece's backward finishes the gradients, so only it starts their all-reduce.
    BackwardOptions options;
    if (last && reducer) options.on_leaf_grad_ready = reducer->hook();
    backward(loss, {}, options);
    local_loss += loss.item();
  }
  if (reducer) result.comm_seconds += reducer->finish();
  const auto t0 = std::chrono::steady_clock::now();
  comm.sum(&local_loss, 1);
  result.comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.loss = local_loss;
  return result;
}

}  // namespace attograd::train::distributed

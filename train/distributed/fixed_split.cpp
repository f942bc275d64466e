#include "train/distributed/fixed_split.h"

#include <bit>
#include <chrono>
#include <limits>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "base/error.h"
#include "train/distributed/host_floats.h"

namespace attograd::train::distributed {
namespace {

// Dropout counters set aside for one piece (4 numbers each, 2^30 numbers):
// piece p of a step draws from the step's first offset + p x this.
constexpr std::uint64_t kPieceCounters = std::uint64_t{1} << 28;

}  // namespace

void PairwiseSum::add(std::vector<float> values) {
  std::size_t level = 0;
  for (; (count_ >> level) & 1; ++level) {  // a carry: pair with the waiting sum of as many vectors
    const std::vector<float>& left = waiting_[level];
    AG_CHECK(left.size() == values.size(), "fixed split", "pieces of {} and {} values", left.size(), values.size());
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = left[i] + values[i];
    waiting_[level].clear();
  }
  if (waiting_.size() <= level) waiting_.resize(level + 1);
  waiting_[level] = std::move(values);
  ++count_;
}

std::vector<float> PairwiseSum::take() {
  AG_CHECK(std::has_single_bit(count_), "fixed split", "{} pieces are not a power of two", count_);
  std::vector<float> sum = std::move(waiting_[static_cast<std::size_t>(std::countr_zero(count_))]);
  waiting_.clear();
  count_ = 0;
  return sum;
}

void sum_over_processes_in_tree(std::vector<float>& values, Communicator& comm) {
  const int n = comm.size();
  AG_CHECK(std::has_single_bit(static_cast<unsigned>(n)), "--fixed-split", "needs a power-of-two process count, not {}",
           n);
  std::vector<float> partners(n > 1 ? values.size() : 0);
  // Before the exchange at distance d, process r holds the sum over the d processes
  // of its aligned block; its partner r ^ d holds the sibling block's.
  for (int distance = 1; distance < n; distance *= 2) {
    comm.exchange(values.data(), partners.data(), values.size(), comm.rank() ^ distance);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += partners[i];
  }
}

StepGradients fixed_split_gradients(nn::GPT& model, const data::Batch& batch, const StepCompute& at, std::int64_t pieces,
                                    Communicator& comm) {
  const std::int64_t rows = batch.tokens.size(0);
  AG_CHECK(pieces >= 1 && rows % pieces == 0 && pieces % comm.size() == 0, "--fixed-split",
           "{} pieces of {} sequences over {} processes: the pieces must divide the batch and the processes the pieces",
           pieces, rows, comm.size());
  const std::int64_t piece_rows = rows / pieces, mine = pieces / comm.size();
  const double global_count = static_cast<double>(data::counted_targets(batch.targets.to_vector<std::int64_t>()));
  const auto params = model.named_parameters();
  check_float32(params, "--fixed-split");
  std::size_t total = 0;
  for (const auto& p : params) total += static_cast<std::size_t>(p.tensor.numel());

  Generator& dropout = *model.drop.generator;
  const std::uint64_t first_offset = dropout.offset();
  AG_CHECK(
      first_offset <= std::numeric_limits<std::uint64_t>::max() - static_cast<std::uint64_t>(pieces) * kPieceCounters,
      "--fixed-split", "the dropout stream's offset {} has no room left for {} more pieces", first_offset, pieces);
  StepGradients result;
  PairwiseSum tree;
  std::vector<double> piece_losses(static_cast<std::size_t>(pieces), 0.0);  // this process's slots; zeros elsewhere
  for (std::int64_t m = 0; m < mine; ++m) {
    const std::int64_t piece = comm.rank() * mine + m;
    std::vector<float> grads(total, 0.0f);  // a piece with no counted target is a leaf of zeros
    const std::uint64_t start = first_offset + static_cast<std::uint64_t>(piece) * kPieceCounters;
    dropout.set_state(dropout.seed(), start);
    if (const Tensor loss = weighted_piece_loss(model, batch, piece * piece_rows, piece_rows, global_count, at);
        loss.defined()) {
      for (const auto& p : params) p.tensor.set_grad({});
      backward(loss);
      AG_CHECK(dropout.offset() - start <= kPieceCounters, "--fixed-split",
               "a piece drew {} dropout counters, more than the {} set aside for one: split the batch finer",
               dropout.offset() - start, kPieceCounters);
      piece_losses[static_cast<std::size_t>(piece)] = loss.item();
      std::size_t at = 0;
      for (const auto& p : params) {
        if (p.tensor.grad().defined()) read_floats(p.tensor.grad(), grads.data() + at);  // else not reached: zeros
        at += static_cast<std::size_t>(p.tensor.numel());
      }
    }
    tree.add(std::move(grads));
  }
  std::vector<float> sum = tree.take();
  dropout.set_state(dropout.seed(), first_offset + static_cast<std::uint64_t>(pieces) * kPieceCounters);

  const auto t0 = std::chrono::steady_clock::now();
  sum_over_processes_in_tree(sum, comm);
  // Each slot is one process's value plus zeros from the others: exact in any order.
  comm.sum(piece_losses.data(), piece_losses.size());
  result.comm_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (double piece_loss : piece_losses) result.loss += piece_loss;  // in piece order, everywhere

  std::size_t start = 0;
  for (const auto& p : params) {
    const auto n = static_cast<std::size_t>(p.tensor.numel());
    p.tensor.set_grad(from_vector(std::vector<float>(sum.begin() + static_cast<std::ptrdiff_t>(start),
                                                     sum.begin() + static_cast<std::ptrdiff_t>(start + n)),
                                  p.tensor.sizes(), p.tensor.device()));
    start += n;
  }
  return result;
}

}  // namespace attograd::train::distributed

#pragma once
// One training step's loss and gradients, on this process's share of the
// global batch. With N processes and K micro-batches (--grad-accum), process r
// takes rows [r B/N, (r+1) B/N) of the step's batch of B rows, in K pieces.
//
// Each piece's mean loss is weighted by its share of the targets that count
// in the whole global batch, so the weighted losses, summed over pieces and
// processes, are exactly the single-process loss (the mean over every counted
// target), and so are the summed gradients: a run's result does not depend on
// how many processes make it, up to float rounding.
#include <cstdint>

#include "nn/gpt.h"
#include "train/data/dataset.h"
#include "train/distributed/data_parallel.h"

namespace attograd::train::distributed {

// Where and in what a step computes: its device, and float32 or bfloat16 (the
// forward under autocast, autograd/autocast.h; the backward follows its graph).
struct StepCompute {
  Device device = Device::cpu();
  DType dtype = DType::f32;
};

// The model's mean loss of tokens over targets (both on the CPU), computed as `at` says.
Tensor model_loss(nn::GPT& model, const Tensor& tokens, const Tensor& targets, const StepCompute& at);

struct StepGradients {
  double loss = 0;          // the global batch's mean loss, the same on every process
  double comm_seconds = 0;  // waiting for the gradient all-reduce and the loss sum
};

// The loss of rows [first, first + rows) of the step's batch, weighted by their
// share of the batch's `batch_count` counted targets (see above), ready for
// backward. Undefined where those rows count no target: nothing to learn there.
Tensor weighted_piece_loss(nn::GPT& model, const data::Batch& batch, std::int64_t first, std::int64_t rows,
                           double batch_count, const StepCompute& at);

// Leaves the summed gradients in every parameter's .grad. `reducer` is null for one process.
StepGradients compute_gradients(nn::GPT& model, const data::Batch& batch, const StepCompute& at,
                                std::int64_t micro_batches, Communicator& comm, GradientReducer* reducer);

}  // namespace attograd::train::distributed

#pragma once
// The backward engine: an iterative walk of the graph in dependency order.
#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace attograd {

struct BackwardOptions {
  bool retain_graph = false;  // keep saved tensors so backward can run again
  // Called once for every leaf that requires grad and is reached by this backward,
  // as soon as its .grad is final for this pass (every contribution added), while
  // the rest of the graph may still be running. Data-parallel training starts a
  // gradient's all-reduce here, overlapping it with the rest of backward.
  std::function<void(const Tensor& leaf)> on_leaf_grad_ready = {};
};

// Backpropagates from `root`. With no `grad`, root must hold one element and
// its gradient is 1. Gradients accumulate into the .grad of leaves that
// require grad.
void backward(const Tensor& root, const Tensor& grad = {}, BackwardOptions options = {});

}  // namespace attograd

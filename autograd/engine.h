#pragma once
// The backward engine: an iterative walk of the graph in dependency order.
#include <vector>

#include "tensor/tensor.h"

namespace attograd {

struct BackwardOptions {
  bool retain_graph = false;  // keep saved tensors so backward can run again
};

// Backpropagates from `root`. With no `grad`, root must hold one element and
// its gradient is 1. Gradients accumulate into the .grad of leaves that
// require grad.
void backward(const Tensor& root, const Tensor& grad = {}, BackwardOptions options = {});

}  // namespace attograd

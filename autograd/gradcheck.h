#pragma once
// gradcheck, like torch.autograd.gradcheck: compares the analytic gradient of
// fn(inputs) with central differences in float64, over every element of every
// input that requires grad. The output is reduced to a scalar by a fixed
// random projection r (L = sum(fn(x) * r)), so one backward gives the
// analytic dL/dx and 2 * numel forwards give the numeric one.
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace attograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  std::uint64_t seed = 1234;  // of the projection r
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // on failure: op, input index, element index, analytic vs numeric
  int checked = 0;      // elements compared
};

// fn must be deterministic (re-seed any dropout generator inside it). Inputs
// that require grad must be float64 CPU leaves; they may be non-contiguous
// views, but not views whose elements overlap (stride 0 over a dim > 1).
GradcheckResult gradcheck(const std::string& name, const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options = {});

}  // namespace attograd

#pragma once
// Gradient clipping by global norm (Pascanu et al. 2013), as
// torch.nn.utils.clip_grad_norm_: when the L2 norm of all gradients together
// exceeds max_norm, every gradient is scaled by max_norm / norm.
#include <vector>

#include "nn/module.h"

namespace attograd::train::optim {

// Returns the norm before clipping; max_norm <= 0 only measures.
double clip_grad_norm(const std::vector<nn::NamedParameter>& params, double max_norm);

}  // namespace attograd::train::optim

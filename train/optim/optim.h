#pragma once
// train/optim/: optimisation (namespace attograd::train::optim).
//   optimizer.h  Optimizer, AdamW and SGD over a module's named parameters, as torch.optim
//   schedule.h   the learning rate: linear warm-up, then cosine decay
//   grad_clip.h  clipping gradients by their global norm
#include "train/optim/grad_clip.h"
#include "train/optim/optimizer.h"
#include "train/optim/schedule.h"

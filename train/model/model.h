#pragma once
// train/model/: the model a run trains, and what is done with it besides
// training (namespace attograd::train::model).
//   gpt.h       the GPT of a run's options and vocabulary (nn::GPT), its size and
//               backward memory, and its attention weights for the picture
//   evaluate.h  held-out loss and, for tasks, exact-match accuracy
//   generate.h  sampling tokens, with or without the key/value cache
#include "train/model/evaluate.h"
#include "train/model/generate.h"
#include "train/model/gpt.h"

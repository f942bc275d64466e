// Option structs are written with designated initializers that name only the
// fields differing from the defaults: `attention(q, k, v, {.causal = true})`.
// GCC's -Wextra warns "missing initializer for member" for an omitted member
// that has no default member initializer (a bare `Tensor mask;` did), which
// broke warning-free builds of code using the library (examples/). This file
// turns that warning into an error, so a new field without an initializer in
// one of these structs fails the build here.
#pragma GCC diagnostic error "-Wmissing-field-initializers"

#include "autograd/attention.h"
#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "helpers.h"
#include "nn/attention.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "train/optim/optimizer.h"

using namespace attograd;

TEST_CASE("options: designated initializers may omit any field, and omitted fields keep their defaults", "[options]") {
  const AttentionOptions attend{.causal = true};
  CHECK(attend.causal);
  CHECK_FALSE(attend.mask.defined());
  CHECK(attend.generator == nullptr);

  const nn::AttendOptions module_attend{.return_weights = true};
  CHECK(module_attend.return_weights);
  CHECK_FALSE(module_attend.mask.defined());
  CHECK(module_attend.cache == nullptr);

  const TensorOptions tensor{.dtype = DType::f64};
  CHECK(tensor.device == Device::cpu());
  const BackwardOptions backward_options{.retain_graph = true};
  CHECK(backward_options.retain_graph);
  const GradcheckOptions gradcheck_options{.atol = 1e-4};
  CHECK(gradcheck_options.rtol == 1e-3);
  const nn::LinearOptions linear{.bias = false};
  CHECK_FALSE(linear.bias);
  const nn::LayerNormOptions layer_norm{.bias = false};
  CHECK(layer_norm.eps == 1e-5);
  const nn::MLPOptions mlp{.expansion = 2};
  CHECK(mlp.bias);
  const nn::MultiHeadAttentionConfig mha{.d_model = 8, .causal = true};
  CHECK(mha.num_heads == 1);
  const nn::GPTConfig gpt{.n_layer = 1};
  CHECK(gpt.vocab_size == 65);
  const train::optim::AdamWOptions adamw{.lr = 3e-4};
  CHECK(adamw.weight_decay == 0.01);
  const train::optim::SGDOptions sgd{.momentum = 0.9};
  CHECK_FALSE(sgd.nesterov);
}

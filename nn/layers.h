#pragma once
// The basic layers. Each is built float32 on the CPU (Module::to converts)
// and initialised from a Generator passed in, so a model's weights are a
// function of its seed. The initialisations are torch's defaults; GPT
// re-initialises its own with GPT-2's scheme (nn/gpt.h).
#include <cstdint>

#include "nn/module.h"
#include "tensor/rng.h"

namespace attograd::nn {

struct LinearOptions {
  bool bias = true;
};

// y = x W^T + b with W (out, in), as torch.nn.Linear.
// Init: W and b ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, Generator& gen, LinearOptions options = {});
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }

  Tensor weight;  // (out, in), weight-decayed
  Tensor bias;    // (out), undefined without bias
};

// Rows of a (num, dim) table picked by int64 ids. Init: N(0, 1).
class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t dim, Generator& gen);
  Tensor forward(const Tensor& ids) const;
  Tensor operator()(const Tensor& ids) const { return forward(ids); }

  Tensor weight;  // (num, dim)
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool bias = true;
};

// Normalises the last dim to zero mean, unit variance, then scales and shifts.
// Init: weight 1, bias 0.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t dim, LayerNormOptions options = {});
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  // forward for an output that only feeds products (linear, matmul,
  // attention): under autocast it comes in their bfloat16, the cast they would
  // make, rounded as it is computed (autograd/ops.h); otherwise forward's. A
  // backward that reads it makes it again from x rather than keeping it.
  Tensor feeding_products(const Tensor& x) const;

  Tensor weight;  // (dim)
  Tensor bias;    // (dim), undefined without bias
  double eps;
};

// Inverted dropout, active in training mode only. Masks are drawn from
// `generator` (default_generator() when null), which must outlive the module.
class Dropout : public Module {
 public:
  explicit Dropout(double p, Generator* generator = nullptr);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }

  double p;
  Generator* generator;
};

// GPT-2's tanh-approximated GELU.
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
};

struct MLPOptions {
  bool bias = true;
  std::int64_t expansion = 4;  // hidden width = expansion * dim
};

// Position-wise feed-forward: proj(gelu(fc(x))), dim -> 4 dim -> dim.
class MLP : public Module {
 public:
  MLP(std::int64_t dim, Generator& gen, MLPOptions options = {});
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }

  Linear fc;  // dim -> hidden
  GELU act;
  Linear proj;  // hidden -> dim
};

}  // namespace attograd::nn

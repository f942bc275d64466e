#include "nn/layers.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/ops.h"

namespace attograd::nn {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, Generator& gen, LinearOptions options) {
  AG_CHECK(in_features > 0 && out_features > 0, "Linear", "features must be positive, got in {} and out {}",
           in_features, out_features);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight = register_parameter("weight", uniform({out_features, in_features}, -bound, bound, {}, gen), /*decay=*/true);
  if (options.bias) bias = register_parameter("bias", uniform({out_features}, -bound, bound, {}, gen));
}

Tensor Linear::forward(const Tensor& x) const { return linear(x, weight, bias); }

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t dim, Generator& gen) {
  AG_CHECK(num_embeddings > 0 && dim > 0, "Embedding", "sizes must be positive, got {} x {}", num_embeddings, dim);
  weight = register_parameter("weight", randn({num_embeddings, dim}, {}, gen));
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight, ids); }

LayerNorm::LayerNorm(std::int64_t dim, LayerNormOptions options) : eps(options.eps) {
  AG_CHECK(dim > 0, "LayerNorm", "dim must be positive, got {}", dim);
  weight = register_parameter("weight", ones({dim}));
  if (options.bias) bias = register_parameter("bias", zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }
Tensor LayerNorm::feeding_products(const Tensor& x) const {
  const bool narrowed = autocast_enabled() && x.dtype() == DType::f32;
  return layer_norm(x, weight, bias, eps, narrowed ? std::optional(DType::bf16) : std::nullopt, /*remade=*/true);
}

Dropout::Dropout(double p_, Generator* generator_) : p(p_), generator(generator_) {
  AG_CHECK(p >= 0 && p < 1, "Dropout", "p must be in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) const {
  return dropout(x, p, is_training(), generator ? *generator : default_generator());
}

Tensor GELU::forward(const Tensor& x) const { return gelu(x); }

MLP::MLP(std::int64_t dim, Generator& gen, MLPOptions options)
    : fc(dim, options.expansion * dim, gen, {.bias = options.bias}),
      proj(options.expansion * dim, dim, gen, {.bias = options.bias}) {
  register_module("fc", fc);
  register_module("act", act);
  register_module("proj", proj);
}

// proj(act(fc(x))) as one op, GELU's passes made by the products' kernel.
Tensor MLP::forward(const Tensor& x) const { return mlp(x, fc.weight, fc.bias, proj.weight, proj.bias); }

}  // namespace attograd::nn

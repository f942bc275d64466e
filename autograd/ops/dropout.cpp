// Inverted dropout with its backward. The mask comes from the counter-based
// RNG at (seed, offset) reserved from the generator, so every call draws a
// fresh mask and any device would draw the same one.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  AG_CHECK(x.defined(), "dropout", "input is an undefined tensor");
  AG_CHECK(p >= 0 && p < 1, "dropout", "p must be in [0, 1), got {}", p);  // p = 1 would scale by 1/0
  if (!training || p == 0) return x;
  const std::uint64_t offset = gen.reserve(static_cast<std::uint64_t>(x.numel()));
  const Tensor mask = kernels::dropout_mask(x.sizes(), p, gen.seed(), offset, x.options());
  // The backward makes the mask again from (seed, offset), the same bits,
  // rather than keeping it (autograd/node.h's Remake): a Philox evaluation per
  // element, against memory of x's size for as long as the graph lives.
  remade_from(mask, "dropout", {},
              [sizes = x.sizes(), p, seed = gen.seed(), offset, options = x.options()](const std::vector<Tensor>&) {
                return kernels::dropout_mask(sizes, p, seed, offset, options);
              });
  return record("dropout", kernels::binary(kernels::Binary::mul, x, mask), {x}, {mask},
                [](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: y = x * mask (mask = 0 or 1/(1-p)); so dx = g * mask
                  return {kernels::binary(kernels::Binary::mul, g, s[0])};
                });
}

}  // namespace attograd

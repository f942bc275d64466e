// cross_entropy: fused log-softmax + negative log-likelihood, with its backward.
#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets, std::int64_t ignore_index) {
  AG_CHECK(logits_in.defined() && targets.defined(), "cross_entropy", "logits and targets must be defined tensors");
  // In float32 under autocast: bfloat16 logits are widened by the kernel as it
  // reads them (no float32 copy of the (N, V) logits is kept for the backward),
  // and their gradient is rounded by it to bfloat16, as the cast's backward would.
  // Outside autocast, bfloat16 logits give a bfloat16 loss, as other ops' results.
  const Tensor& logits = logits_in;
  AG_CHECK(logits.dim() >= 1, "cross_entropy", "logits must have a class dim, got a scalar");
  const Shape lead(logits.sizes().begin(), logits.sizes().end() - 1);
  AG_CHECK(targets.sizes() == lead, "cross_entropy", "targets are {}, expected {} for logits {}",
           shape_str(targets.sizes()), shape_str(lead), shape_str(logits.sizes()));
  // The kernel sees (N, V) rows and (N) targets; a contiguous tensor views as that for free.
  const std::int64_t classes = logits.size(-1), rows = numel_of(lead);
  const Tensor flat = kernels::contiguous(logits);
  const Tensor logits2d = make_view(flat, {rows, classes}, contiguous_strides({rows, classes}), flat.offset());
  const Tensor targets_c = kernels::contiguous(targets);
  const Tensor targets1d = make_view(targets_c, {rows}, {1}, targets_c.offset());

  kernels::CrossEntropyResult r = kernels::cross_entropy_forward(logits2d, targets1d, ignore_index);
  const Tensor loss = record("cross_entropy", r.loss, {logits}, {logits2d, targets1d, r.lse},
                [ignore_index, count = r.count, sizes = logits.sizes()](
                    const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: loss = mean over counted rows of (lse - x[target]);
                  // so dx = (softmax(x) - onehot(target)) * g / count, 0 on ignored rows
                  const Tensor d = kernels::cross_entropy_backward(s[0], s[1], s[2], ignore_index, count, g.item());
                  return {make_view(d, sizes, contiguous_strides(sizes), d.offset())};
                });
  return logits.dtype() == DType::bf16 && !autocast_enabled() ? to(loss, DType::bf16) : loss;
}

}  // namespace attograd

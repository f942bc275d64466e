// embedding: rows of a weight table picked by int64 ids, with its backward.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  Tensor out = kernels::embedding_forward(weight, ids);  // ids.shape + (C)
  return record("embedding", out, {weight}, {ids},
                [rows = weight.size(0)](const Tensor& g, const std::vector<Tensor>& s) -> std::vector<Tensor> {
                  // forward: out[i] = weight[ids[i]]; so dweight[v] = sum of g[i] where ids[i] == v
                  return {kernels::embedding_backward(g, s[0], rows)};
                });
}

}  // namespace attograd

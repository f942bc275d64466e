// cat and split, with their backward. split returns narrow() views, so its
// backward is narrow's; cat's backward hands each input its slice of g.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace attograd {

Tensor cat(const std::vector<Tensor>& xs, std::int64_t dim) {
  AG_CHECK(!xs.empty(), "cat", "needs at least one tensor, got an empty list");
  AG_CHECK(xs[0].defined(), "cat", "tensor 0 is undefined");
  AG_CHECK(xs[0].dim() >= 1, "cat", "cannot concatenate scalars (tensor 0 is 0-d)");
  const int d = normalize_dim("cat", dim, xs[0].dim());
  std::vector<std::int64_t> lengths;  // of each input along d
  for (const Tensor& x : xs) lengths.push_back(x.defined() && x.dim() > d ? x.sizes()[d] : 0);
  return record("cat", kernels::cat(xs, d), xs, {},
                [d, lengths](const Tensor& g, const std::vector<Tensor>&) -> std::vector<Tensor> {
                  // forward: y = [x0, x1, ...] along d; so dx_i = g[start_i : start_i + len_i] along d
                  std::vector<Tensor> dxs;
                  std::int64_t start = 0;
                  for (std::int64_t len : lengths) {
                    dxs.push_back(narrow(g, d, start, len));
                    start += len;
                  }
                  return dxs;
                });
}

std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim) {
  AG_CHECK(x.defined(), "split", "input is an undefined tensor");
  AG_CHECK(split_size >= 1, "split", "split_size must be >= 1, got {}", split_size);
  AG_CHECK(x.dim() >= 1, "split", "cannot split a scalar");
  const int d = normalize_dim("split", dim, x.dim());
  const std::int64_t n = x.sizes()[d];
  std::vector<Tensor> pieces;
  for (std::int64_t start = 0; start < n; start += split_size)
    pieces.push_back(narrow(x, d, start, std::min(split_size, n - start)));
  if (pieces.empty()) pieces.push_back(narrow(x, d, 0, 0));  // an empty dim splits into one empty piece
  return pieces;
}

}  // namespace attograd

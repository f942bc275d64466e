// The backward engine. It counts, for every node reachable from the root, how
// many edges point at it; a node runs once all of its consumers have passed it
// their gradient (Kahn's algorithm), so each node runs exactly once and sees
// the sum of every contribution. No recursion anywhere: graphs can be
// arbitrarily deep.
#include "autograd/engine.h"

#include <unordered_map>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "tensor/kernels.h"

namespace attograd {
namespace {

// Adds g into the gradient buffer `slot` (defining it on first use). The
// first gradient is copied when it might alias memory someone else owns.
void accumulate(Tensor& slot, const Tensor& g) {
  if (!slot.defined())
    slot = g;
  else
    slot = kernels::binary(kernels::Binary::add, slot, g);
}

// Whether nothing but this handle can reach g's memory: the handle is the only
// one on its TensorImpl, no other tensor shares its storage, and g covers the
// whole storage contiguously.
bool owns_its_memory(const Tensor& g) {
  const std::shared_ptr<Storage>& storage = g.storage();
  return g.impl_ptr().use_count() == 1 && storage.use_count() == 1 && g.is_contiguous() && g.offset() == 0 &&
         storage->nbytes() == static_cast<std::size_t>(g.numel()) * dtype_size(g.dtype());
}

// Sets or adds g into the leaf's .grad. A first gradient that owns its memory
// becomes .grad itself, as PyTorch's AccumulateGrad steals one (copying the
// attention's dq, dk and dv cost 12 MB of memcpy per backward at T = 1024);
// any other is copied, since .grad must never alias a buffer that a later
// op, or the caller, could write into. g comes by value, moved in where the
// caller is done with it.
void accumulate_into_leaf(TensorImpl& leaf, Tensor g) {
  Tensor& grad = leaf.grad;
  if (grad.defined())
    kernels::add_(grad, g);
  else
    grad = owns_its_memory(g) ? std::move(g) : kernels::clone(g);
}

}  // namespace

void backward(const Tensor& root, const Tensor& grad_in, BackwardOptions options) {
  AG_CHECK(root.defined(), "backward", "called on an undefined tensor");
  AG_CHECK(root.requires_grad(), "backward",
           "the tensor {} does not require grad and has no grad_fn (nothing to differentiate)", root.str());
  Tensor grad = grad_in;
  if (!grad.defined()) {
    AG_CHECK(root.numel() == 1, "backward",
             "grad can be implicitly created only for one-element outputs, got {}; pass a gradient",
             shape_str(root.sizes()));
    grad = ones(root.sizes(), root.options());
  } else {
    AG_CHECK(grad.sizes() == root.sizes() && grad.dtype() == root.dtype() && grad.device() == root.device(),
             "backward", "gradient is {}, expected {}", grad.str(), root.str());
  }

  NoGradGuard no_grad;  // backward formulas use ops; they must not record
  if (!root.grad_fn()) {
    accumulate_into_leaf(*root.impl(), grad);
    if (options.on_leaf_grad_ready) options.on_leaf_grad_ready(root);
    return;
  }

  // Pass 1: dependency counts over the reachable graph, with an explicit stack;
  // with a leaf hook, leaves count their incoming edges too, to tell when their
  // .grad is final (a backward without one pays nothing for it).
  const auto& leaf_ready = options.on_leaf_grad_ready;
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<TensorImpl*, int> leaf_dependencies;
  std::vector<Node*> stack{root.grad_fn().get()};
  dependencies[root.grad_fn().get()] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->edges()) {
      if (e.leaf && leaf_ready) ++leaf_dependencies[e.leaf.get()];
      if (!e.node) continue;
      auto [it, inserted] = dependencies.try_emplace(e.node.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(e.node.get());
    }
  }

  // Pass 2: run nodes whose consumers are all done. Keep strong references
  // while running: release() below drops the edges that own later nodes.
  std::unordered_map<Node*, Tensor> grads;
  grads[root.grad_fn().get()] = grad;
  std::vector<std::shared_ptr<Node>> ready{root.grad_fn()};
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    Tensor g = std::move(grads[node.get()]);
    grads.erase(node.get());
    const std::vector<Edge> edges = node->edges();
    // A node none of whose consumers produced a gradient passes none on.
    std::vector<Tensor> input_grads = g.defined() ? node->apply(g) : std::vector<Tensor>(edges.size());
    if (!options.retain_graph) node->release();
    for (std::size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      Tensor& ig = input_grads[i];
      if (e.leaf) {
        if (ig.defined()) accumulate_into_leaf(*e.leaf, std::move(ig));
        if (leaf_ready && --leaf_dependencies[e.leaf.get()] == 0) leaf_ready(Tensor(e.leaf));
      } else if (e.node) {
        if (ig.defined()) accumulate(grads[e.node.get()], ig);
        if (--dependencies[e.node.get()] == 0) ready.push_back(e.node);
      }
    }
  }
}

}  // namespace attograd

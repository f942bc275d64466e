#pragma once
// A Node is the backward of one op application: it maps the gradient of the
// op's single output to gradients of its inputs. Nodes point at the nodes of
// their inputs (never at their own output), so the graph has no cycles;
// tensors saved for backward are held as detached aliases with the version
// they had when saved.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace attograd {

class Node;

// Where an input's gradient goes: the node that produced it, or (for a leaf
// that requires grad) straight into that leaf's .grad.
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<TensorImpl> leaf;
  bool valid() const { return node || leaf; }
};

// What an input looked like, to check the gradient that comes back for it.
struct InputMeta {
  Shape sizes;
  DType dtype;
  Device device;
};

struct SavedTensor {
  Tensor tensor;  // detached alias
  std::uint64_t version = 0;
};

// backward(grad_output, saved) -> one gradient per input (undefined = none).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad, const std::vector<Tensor>& saved)>;

class Node {
 public:
  Node(std::string name, std::vector<Edge> edges, std::vector<InputMeta> inputs, std::vector<SavedTensor> saved,
       BackwardFn fn);
  ~Node();  // iterative: a chain of 100,000 nodes must not recurse
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<Edge>& edges() const { return edges_; }
  bool released() const { return released_; }

  // Checks saved versions, runs the backward and checks each gradient
  // against its input's shape, dtype and device.
  std::vector<Tensor> apply(const Tensor& grad);
  // Frees saved tensors, the closure and the edges (after a backward without retain_graph).
  void release();

 private:
  friend void drop_edges(std::vector<Edge>& edges);
  std::string name_;
  std::vector<Edge> edges_;
  std::vector<InputMeta> inputs_;
  std::vector<SavedTensor> saved_;
  BackwardFn fn_;
  bool released_ = false;
};

// Drops edges without recursing through long chains (see node.cpp).
void drop_edges(std::vector<Edge>& edges);

// Records `out` as the result of op `name` applied to `inputs`, when grad mode
// is on and some input requires grad; returns `out` (now with a grad_fn).
// `saved` are the tensors the backward reads, passed back to it in order.
Tensor record(const char* name, Tensor out, const std::vector<Tensor>& inputs, const std::vector<Tensor>& saved,
              BackwardFn backward);

// True when grad mode is on and any of `inputs` requires grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);

}  // namespace attograd

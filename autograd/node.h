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

struct Remake;

// A tensor a backward reads: a detached alias with the version it had, or,
// where its storage can be made again (Storage::remake), the recipe and the
// alias's layout in place of the storage, which then need not outlive the
// forward.
struct SavedTensor {
  Tensor tensor;  // undefined when remade
  std::uint64_t version = 0;
  std::shared_ptr<const Remake> remake;
  Shape sizes, strides;
  std::int64_t offset = 0;
  std::weak_ptr<Storage> storage;  // while someone else keeps it, an in-place change is still caught
};

// How a storage's contents are made again: make(from's tensors) gives a tensor
// laid out as the storage was made (its views keep their offsets and
// strides), the same bits. Its inputs are checked for in-place changes as a
// node's saved tensors are. Set with remade_from by ops whose output a later
// op keeps while they keep what makes it anyway (layer_norm feeding products,
// gelu) or need nothing to make it (dropout's mask): a product keeps its
// input for its weight's gradient, so such a pair kept two activations where
// one makes both.
struct Remake {
  std::string op;                // whose output: for errors
  std::vector<SavedTensor> from;  // plain saves, never remade themselves
  std::function<Tensor(const std::vector<Tensor>&)> make;
  std::uint64_t version = 0;  // the storage's version when made: a later write stops the remaking
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

// t as a node keeps it for its backward (a recipe where its storage has one).
SavedTensor save(const Tensor& t);
// Marks out's storage as made again by make(from) for a backward that reads
// it (the same bits: the op's own kernel on the same inputs), from kept as
// they are. For ops whose node keeps `from` anyway, or that need nothing.
void remade_from(const Tensor& out, std::string op, const std::vector<Tensor>& from,
                 std::function<Tensor(const std::vector<Tensor>&)> make);

// True when grad mode is on and any of `inputs` requires grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);

}  // namespace attograd

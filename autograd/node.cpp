#include "autograd/node.h"

#include "autograd/grad_mode.h"
#include "tensor/storage.h"

namespace attograd {

namespace {
thread_local bool grad_mode = true;
}  // namespace

bool grad_enabled() { return grad_mode; }
void set_grad_enabled(bool enabled) { grad_mode = enabled; }

Node::Node(std::string name, std::vector<Edge> edges, std::vector<InputMeta> inputs, std::vector<SavedTensor> saved,
           BackwardFn fn)
    : name_(std::move(name)),
      edges_(std::move(edges)),
      inputs_(std::move(inputs)),
      saved_(std::move(saved)),
      fn_(std::move(fn)) {}

// Dropping a node's edges may destroy the next node, and so on: done naively
// that recursion overflows the stack on long chains. Instead take over the
// edges of every node we are the last owner of, iteratively.
void drop_edges(std::vector<Edge>& edges) {
  std::vector<std::shared_ptr<Node>> pending;
  for (auto& e : edges)
    if (e.node) pending.push_back(std::move(e.node));
  edges.clear();
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    if (n.use_count() == 1) {
      for (auto& e : n->edges_)
        if (e.node) pending.push_back(std::move(e.node));
      n->edges_.clear();
    }
    // n, if we were its last owner, is destroyed here with no edges left.
  }
}

Node::~Node() { drop_edges(edges_); }

namespace {

// A saved tensor as the backward reads it: checked for in-place changes since
// it was saved, and made again where it was saved as a recipe.
Tensor unpack(const SavedTensor& s, const std::string& op, std::size_t i) {
  if (s.tensor.defined()) {
    AG_CHECK(s.tensor.version() == s.version, op,
             "saved tensor #{} ({}) was modified in place after the forward (version {} now, {} when saved)", i,
             s.tensor.str(), s.tensor.version(), s.version);
    return s.tensor;
  }
  if (!s.remake) return {};
  if (const std::shared_ptr<Storage> kept = s.storage.lock())
    AG_CHECK(kept->version() == s.version, op,
             "saved tensor #{} ({}'s output) was modified in place after the forward (version {} now, {} when saved)",
             i, s.remake->op, kept->version(), s.version);
  std::vector<Tensor> from;
  for (std::size_t j = 0; j < s.remake->from.size(); ++j) from.push_back(unpack(s.remake->from[j], s.remake->op, j));
  const Tensor made = s.remake->make(from);
  return make_view(made, s.sizes, s.strides, s.offset);
}

}  // namespace

std::vector<Tensor> Node::apply(const Tensor& grad) {
  AG_CHECK(!released_, name_ + " backward",
           "trying to backward through the graph a second time (its saved tensors were freed); "
           "pass retain_graph = true to the first backward");
  std::vector<Tensor> saved;
  saved.reserve(saved_.size());
  for (std::size_t i = 0; i < saved_.size(); ++i) saved.push_back(unpack(saved_[i], name_ + " backward", i));
  std::vector<Tensor> grads = fn_(grad, saved);
  AG_CHECK(grads.size() == inputs_.size(), name_ + " backward", "returned {} gradients for {} inputs", grads.size(),
           inputs_.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined() || !edges_[i].valid()) continue;
    const InputMeta& m = inputs_[i];
    AG_CHECK(g.sizes() == m.sizes, name_ + " backward", "grad #{} is {}, expected {}", i, shape_str(g.sizes()),
             shape_str(m.sizes));
    AG_CHECK(g.dtype() == m.dtype, name_ + " backward", "grad #{} is {}, expected {}", i, dtype_name(g.dtype()),
             dtype_name(m.dtype));
    AG_CHECK(g.device() == m.device, name_ + " backward", "grad #{} is on {}, expected {}", i, g.device().str(),
             m.device.str());
  }
  return grads;
}

void Node::release() {
  released_ = true;
  saved_.clear();
  fn_ = nullptr;
  // The edges go too, so the rest of the graph is freed.
  drop_edges(edges_);
}

SavedTensor save(const Tensor& t) {
  if (!t.defined()) return {};
  const std::shared_ptr<Storage>& storage = t.storage();
  const std::shared_ptr<const Remake>& remake = storage ? storage->remake() : nullptr;
  if (remake && remake->version == t.version())
    return {.version = t.version(), .remake = remake, .sizes = t.sizes(), .strides = t.strides(),
            .offset = t.offset(), .storage = storage};
  return {.tensor = t.detach(), .version = t.version()};
}

void remade_from(const Tensor& out, std::string op, const std::vector<Tensor>& from,
                 std::function<Tensor(const std::vector<Tensor>&)> make) {
  std::vector<SavedTensor> kept;
  for (const Tensor& t : from)
    kept.push_back(t.defined() ? SavedTensor{.tensor = t.detach(), .version = t.version()} : SavedTensor{});
  out.storage()->set_remake(std::make_shared<const Remake>(
      Remake{.op = std::move(op), .from = std::move(kept), .make = std::move(make), .version = out.version()}));
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Tensor record(const char* name, Tensor out, const std::vector<Tensor>& inputs, const std::vector<Tensor>& saved,
              BackwardFn backward) {
  if (!any_requires_grad(inputs)) return out;
  std::vector<Edge> edges;
  std::vector<InputMeta> metas;
  for (const Tensor& t : inputs) {
    Edge e;
    if (t.defined() && t.requires_grad()) {
      if (t.grad_fn())
        e.node = t.grad_fn();
      else
        e.leaf = t.impl_ptr();
    }
    edges.push_back(std::move(e));
    metas.push_back(t.defined() ? InputMeta{t.sizes(), t.dtype(), t.device()} : InputMeta{{}, DType::f32, {}});
  }
  std::vector<SavedTensor> saves;
  for (const Tensor& t : saved) saves.push_back(save(t));
  // The output we return must not be the same handle as an input (a view op
  // on an unchanged layout returns a new alias, never the input itself).
  out.set_grad_fn(std::make_shared<Node>(name, std::move(edges), std::move(metas), std::move(saves),
                                         std::move(backward)));
  return out;
}

}  // namespace attograd

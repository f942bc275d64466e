#pragma once
// Module: a node of a model tree holding parameters and submodules, each under
// a name, so that every parameter has a hierarchical name
// ("blocks.0.attn.qkv.weight") used by state dicts, checkpoints and optimizers.
//
// Modules are held by value inside their parent and registered by reference,
// so a module never moves once built (copying and moving are disabled).
// Parameters are Tensor handles: the module's member (e.g. Linear::weight)
// and the registered entry are the same TensorImpl, so anything that changes
// a parameter in place (optimizers, load_state_dict, to()) is seen by both.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace attograd::nn {

struct NamedParameter {
  std::string name;  // hierarchical, dot-separated
  Tensor tensor;     // the parameter itself (a leaf that requires grad)
  bool decay;        // weight decay applies (2-D weights of Linear layers; not biases, norms, embeddings)
};

// name -> tensor, in memory. state_dict() values alias the parameters (clone to snapshot).
using StateDict = std::map<std::string, Tensor>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its submodules, depth first in
  // registration order; a parameter registered twice (tied weights) appears once,
  // under the first name it was reached by.
  std::vector<NamedParameter> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::int64_t num_parameters() const;  // elements, tied weights counted once
  // (name, module) for this module ("") and every submodule below it.
  std::vector<std::pair<std::string, Module*>> named_modules();

  // Training mode (dropout active) for this module and every submodule.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Forgets every parameter's .grad (it becomes undefined, as torch's set_to_none).
  void zero_grad();

  StateDict state_dict() const;
  // Copies every entry into the parameter of the same name (casting dtype, not
  // shape). All names and shapes are checked first; on any mismatch nothing
  // is changed and the error lists every missing, unexpected and mis-shaped entry.
  void load_state_dict(const StateDict& state);

  // Converts every parameter in place: the TensorImpl (what registered handles
  // and the module's members point to) gets the converted storage, so handles
  // stay valid. Gradients are dropped; optimizer state must be rebuilt after.
  void to(Device device);
  void to(DType dtype);

 protected:
  // Registers `t` as a parameter (sets requires_grad) and returns it.
  Tensor register_parameter(const std::string& name, Tensor t, bool decay = false);
  // Registers a submodule (a member of the derived class) under `name`.
  template <typename M>
  M& register_module(const std::string& name, M& module) {
    add_module(name, module);
    return module;
  }

 private:
  void add_module(const std::string& name, Module& module);
  void check_new_name(const std::string& name) const;

  struct Param {
    std::string name;
    Tensor tensor;
    bool decay;
  };
  std::vector<Param> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

// An indexed list of submodules of one type, named "0", "1", ... (so the
// parameters of the second block of a `blocks` list are "blocks.1.*").
template <typename M>
class ModuleList : public Module {
 public:
  M& append(std::unique_ptr<M> module) {
    items_.push_back(std::move(module));
    return register_module(std::to_string(items_.size() - 1), *items_.back());
  }
  std::size_t size() const { return items_.size(); }
  M& operator[](std::size_t i) const { return *items_.at(i); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<std::unique_ptr<M>> items_;
};

}  // namespace attograd::nn

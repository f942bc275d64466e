#include "nn/module.h"

#include <set>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "tensor/kernels.h"

namespace attograd::nn {

void Module::check_new_name(const std::string& name) const {
  AG_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module",
           "invalid name '{}': names are non-empty and contain no '.'", name);
  for (const auto& p : params_) AG_CHECK(p.name != name, "Module", "name '{}' is already a parameter", name);
  for (const auto& c : children_) AG_CHECK(c.first != name, "Module", "name '{}' is already a submodule", name);
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool decay) {
  check_new_name(name);
  AG_CHECK(t.defined() && is_floating(t.dtype()), "Module", "parameter '{}' must be a floating tensor, got {}", name,
           t.defined() ? t.str() : "undefined");
  t.set_requires_grad(true);
  params_.push_back({name, t, decay});
  return t;
}

void Module::add_module(const std::string& name, Module& module) {
  check_new_name(name);
  AG_CHECK(&module != this, "Module", "module '{}' cannot contain itself", name);
  children_.emplace_back(name, &module);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  // Explicit stack (children pushed in reverse) keeps depth-first registration order.
  std::vector<std::pair<std::string, Module*>> stack{{"", this}};
  while (!stack.empty()) {
    auto [prefix, m] = stack.back();
    stack.pop_back();
    out.emplace_back(prefix, m);
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it)
      stack.emplace_back(prefix.empty() ? it->first : prefix + "." + it->first, it->second);
  }
  return out;
}

std::vector<NamedParameter> Module::named_parameters() const {
  std::vector<NamedParameter> out;
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [prefix, m] : const_cast<Module*>(this)->named_modules())
    for (const Param& p : m->params_)
      if (seen.insert(p.tensor.impl()).second)
        out.push_back({prefix.empty() ? p.name : prefix + "." + p.name, p.tensor, p.decay});
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& p : named_parameters()) out.push_back(p.tensor);
  return out;
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& p : named_parameters()) n += p.tensor.numel();
  return n;
}

void Module::train(bool on) {
  for (auto& [name, m] : named_modules()) m->training_ = on;
}

void Module::zero_grad() {
  for (const auto& p : named_parameters()) p.tensor.set_grad({});
}

StateDict Module::state_dict() const {
  StateDict out;
  for (const auto& p : named_parameters()) out.emplace(p.name, p.tensor.detach());
  return out;
}

void Module::load_state_dict(const StateDict& state) {
  const std::vector<NamedParameter> params = named_parameters();
  std::vector<std::string> missing, unexpected, misshaped;
  std::set<std::string> known;
  for (const auto& p : params) {
    known.insert(p.name);
    auto it = state.find(p.name);
    if (it == state.end()) {
      missing.push_back(p.name);
    } else if (!it->second.defined() || it->second.sizes() != p.tensor.sizes()) {
      misshaped.push_back(fmt::format("{} is {}, expected {}", p.name,
                                      it->second.defined() ? shape_str(it->second.sizes()) : "undefined",
                                      shape_str(p.tensor.sizes())));
    }
  }
  for (const auto& [name, t] : state)
    if (!known.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    std::string message;
    auto add = [&](const char* what, const std::vector<std::string>& names) {
      if (names.empty()) return;
      if (!message.empty()) message += "; ";
      message += fmt::format("{} ({}): {}", what, names.size(), fmt::join(names, ", "));
    };
    add("missing", missing);
    add("unexpected", unexpected);
    add("mis-shaped", misshaped);
    fail("load_state_dict", "state dict does not match the module: {}", message);
  }
  NoGradGuard no_grad;
  for (const auto& p : params) kernels::copy_(p.tensor, state.at(p.name));  // bumps the version
}

namespace {
// Points `param`'s impl at `converted`'s storage and layout, so every handle sees it.
void replace_data(const Tensor& param, const Tensor& converted) {
  TensorImpl& impl = *param.impl();
  impl.storage = converted.storage();
  impl.sizes = converted.sizes();
  impl.strides = converted.strides();
  impl.offset = converted.offset();
  impl.dtype = converted.dtype();
  impl.grad = Tensor();
}
}  // namespace

void Module::to(Device device) {
  for (const auto& p : named_parameters())
    if (p.tensor.device() != device) replace_data(p.tensor, kernels::to_device(kernels::contiguous(p.tensor), device));
}

void Module::to(DType dtype) {
  AG_CHECK(is_floating(dtype), "Module::to", "parameters must stay floating, got {}", dtype_name(dtype));
  for (const auto& p : named_parameters())
    if (p.tensor.dtype() != dtype) replace_data(p.tensor, kernels::cast(p.tensor, dtype));
}

}  // namespace attograd::nn

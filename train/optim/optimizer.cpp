#include "train/optim/optimizer.h"

#include "autograd/grad_mode.h"
#include "tensor/kernels.h"

namespace attograd::train::optim {

Optimizer::Optimizer(std::vector<nn::NamedParameter> params, double lr) : params_(std::move(params)), lr_(lr) {
  for (const auto& p : params_)
    AG_CHECK(p.tensor.defined() && p.tensor.requires_grad() && p.tensor.is_leaf(), "optimizer",
             "parameter '{}' must be a leaf that requires grad", p.name);
  set_lr(lr);
}

void Optimizer::set_lr(double lr) {
  AG_CHECK(lr >= 0, "optimizer", "learning rate must be >= 0, got {}", lr);
  lr_ = lr;
}

void Optimizer::zero_grad() {
  for (const auto& p : params_) p.tensor.set_grad({});
}

namespace {

// Copies saved[prefix + name] into `buffer` (allocating it like `param` when undefined).
void restore(const std::map<std::string, Tensor>& saved, const std::string& key, const Tensor& param, Tensor& buffer) {
  auto it = saved.find(key);
  AG_CHECK(it != saved.end(), "optimizer", "state has no entry '{}'", key);
  AG_CHECK(it->second.sizes() == param.sizes(), "optimizer", "state '{}' is {}, the parameter {}", key,
           shape_str(it->second.sizes()), shape_str(param.sizes()));
  if (!buffer.defined()) buffer = zeros(param.sizes(), param.options());
  kernels::copy_(buffer, it->second);
}

}  // namespace

// ---- AdamW ------------------------------------------------------------------------

AdamW::AdamW(std::vector<nn::NamedParameter> params, AdamWOptions options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  AG_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1, "AdamW",
           "betas must be in [0, 1), got {} and {}", options.beta1, options.beta2);
  AG_CHECK(options.eps > 0 && options.weight_decay >= 0, "AdamW", "eps {} must be > 0 and weight_decay {} >= 0",
           options.eps, options.weight_decay);
  for (const auto& p : params_) {
    exp_avg_.push_back(zeros(p.tensor.sizes(), p.tensor.options()));
    exp_avg_sq_.push_back(zeros(p.tensor.sizes(), p.tensor.options()));
  }
}

void AdamW::step() {
  NoGradGuard no_grad;
  ++step_count_;
  // Every parameter in one call: on the GPU one launch per 32 parameters, not one each.
  std::vector<kernels::AdamWParameter> update;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (p.tensor.grad().defined()) update.push_back({p.tensor, p.tensor.grad(), exp_avg_[i], exp_avg_sq_[i], p.decay});
  }
  kernels::adamw_step_(update, {.lr = lr_,
                                .beta1 = options_.beta1,
                                .beta2 = options_.beta2,
                                .eps = options_.eps,
                                .weight_decay = options_.weight_decay,
                                .step = step_count_});
}

std::map<std::string, Tensor> AdamW::state() const {
  std::map<std::string, Tensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.emplace("exp_avg." + params_[i].name, exp_avg_[i]);
    out.emplace("exp_avg_sq." + params_[i].name, exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state(const std::map<std::string, Tensor>& state, std::int64_t step_count) {
  AG_CHECK(step_count >= 0, "AdamW", "step count must be >= 0, got {}", step_count);
  NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    restore(state, "exp_avg." + params_[i].name, params_[i].tensor, exp_avg_[i]);
    restore(state, "exp_avg_sq." + params_[i].name, params_[i].tensor, exp_avg_sq_[i]);
  }
  step_count_ = step_count;
}

// ---- SGD --------------------------------------------------------------------------

SGD::SGD(std::vector<nn::NamedParameter> params, SGDOptions options)
    : Optimizer(std::move(params), options.lr), options_(options), momentum_(params_.size()) {
  AG_CHECK(options.momentum >= 0 && options.weight_decay >= 0, "SGD", "momentum {} and weight_decay {} must be >= 0",
           options.momentum, options.weight_decay);
  AG_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0), "SGD",
           "nesterov needs momentum > 0 and dampening 0");
}

void SGD::step() {
  NoGradGuard no_grad;
  ++step_count_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (!p.tensor.grad().defined()) continue;
    Tensor g = p.tensor.grad();
    if (p.decay && options_.weight_decay > 0) {
      g = kernels::clone(g);
      kernels::add_(g, p.tensor, options_.weight_decay);  // g += wd p
    }
    if (options_.momentum > 0) {
      Tensor& buf = momentum_[i];
      if (!buf.defined()) {
        buf = kernels::clone(g);
      } else {
        kernels::add_(buf, buf, options_.momentum - 1.0);  // buf += (momentum - 1) buf, i.e. buf *= momentum
        kernels::add_(buf, g, 1.0 - options_.dampening);
      }
      if (options_.nesterov) {
        g = kernels::clone(g);
        kernels::add_(g, buf, options_.momentum);
      } else {
        g = buf;
      }
    }
    kernels::add_(p.tensor, g, -lr_);
  }
}

std::map<std::string, Tensor> SGD::state() const {
  std::map<std::string, Tensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (momentum_[i].defined()) out.emplace("momentum_buffer." + params_[i].name, momentum_[i]);
  return out;
}

void SGD::load_state(const std::map<std::string, Tensor>& state, std::int64_t step_count) {
  AG_CHECK(step_count >= 0, "SGD", "step count must be >= 0, got {}", step_count);
  NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string key = "momentum_buffer." + params_[i].name;
    if (state.count(key))
      restore(state, key, params_[i].tensor, momentum_[i]);
    else
      momentum_[i] = Tensor();  // not created yet when saved: the next step starts it from g
  }
  step_count_ = step_count;
}

}  // namespace attograd::train::optim

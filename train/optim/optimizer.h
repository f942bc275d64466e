#pragma once
// Optimizers over a module's named parameters, as torch.optim: AdamW
// (decoupled weight decay) and SGD with momentum. Updates are raw in-place
// kernels (no graph); each bumps the parameter's version, so a graph built
// before the step refuses to backward through the changed weights.
//
// Weight decay applies only to parameters whose NamedParameter::decay is set:
// Modules mark the 2-D weights of Linear layers, and nothing else (biases,
// LayerNorm parameters and embeddings are not decayed).
//
// State for checkpoints: step_count() and state(), a map from
// "<buffer>.<parameter name>" (e.g. "exp_avg.blocks.0.attn.qkv.weight") to the
// live buffer; load_state() copies such a map back.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/module.h"

namespace attograd::train::optim {

class Optimizer {
 public:
  Optimizer(std::vector<nn::NamedParameter> params, double lr);
  virtual ~Optimizer() = default;

  // One update of every parameter that has a gradient.
  virtual void step() = 0;
  virtual std::string name() const = 0;  // "adamw", "sgd": how checkpoints record it
  // Forgets every parameter's gradient (undefined, as torch's set_to_none).
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);  // e.g. every step, from a schedule
  std::int64_t step_count() const { return step_count_; }
  const std::vector<nn::NamedParameter>& params() const { return params_; }

  virtual std::map<std::string, Tensor> state() const = 0;
  // Restores buffers saved by state() and the step count; every parameter's
  // buffers must be present with matching shapes (the error names the missing ones).
  virtual void load_state(const std::map<std::string, Tensor>& state, std::int64_t step_count) = 0;

 protected:
  std::vector<nn::NamedParameter> params_;
  double lr_;
  std::int64_t step_count_ = 0;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: p *= 1 - lr * weight_decay, on decayed parameters only
};

// torch.optim.AdamW, with one fused kernel per parameter (kernels::adamw_step_).
// The step count is shared by all parameters (torch keeps one per parameter;
// they agree unless some parameter goes without a gradient).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<nn::NamedParameter> params, AdamWOptions options = {});
  void step() override;
  std::string name() const override { return "adamw"; }
  std::map<std::string, Tensor> state() const override;  // "exp_avg.<name>", "exp_avg_sq.<name>"
  void load_state(const std::map<std::string, Tensor>& state, std::int64_t step_count) override;
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;  // m and v, one per parameter, its shape
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2 (added to the gradient), on decayed parameters only
  bool nesterov = false;
};

// torch.optim.SGD: buf = momentum buf + (1 - dampening) g (buf = g on the first
// step); p -= lr (nesterov ? g + momentum buf : buf).
class SGD : public Optimizer {
 public:
  SGD(std::vector<nn::NamedParameter> params, SGDOptions options = {});
  void step() override;
  std::string name() const override { return "sgd"; }
  std::map<std::string, Tensor> state() const override;  // "momentum_buffer.<name>", once created
  void load_state(const std::map<std::string, Tensor>& state, std::int64_t step_count) override;

 private:
  SGDOptions options_;
  std::vector<Tensor> momentum_;  // undefined until a parameter's first step
};

}  // namespace attograd::train::optim

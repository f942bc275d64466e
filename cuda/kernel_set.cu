// Which set of kernels (SIMT or tensor cores) runs each op that has both:
// chosen from the environment at the op's first call, or by set_kernel_set.
#include <cstdlib>
#include <cstring>
#include <optional>

#include "base/error.h"
#include "cuda/runtime.h"

namespace attograd::cuda {
namespace {

struct OpChoice {
  const char* variable;  // the environment variable that chooses
  std::optional<KernelSet> chosen;
};

OpChoice& choice(KernelOp op) {
  static OpChoice attention{"ATTOGRAD_CUDA_ATTENTION", std::nullopt};
  static OpChoice matmul{"ATTOGRAD_CUDA_MATMUL", std::nullopt};
  return op == KernelOp::attention ? attention : matmul;
}

// A value that names no kernel set stops the op's first call with the variable's
// name, as ATTOGRAD_ATTENTION_ISA does on the CPU.
KernelSet from_environment(KernelOp op, const char* variable) {
  const char* env = std::getenv(variable);
  if (env == nullptr || *env == '\0') return KernelSet::simt;
  for (KernelSet k : {KernelSet::simt, KernelSet::tensor_core})
    if (std::strcmp(env, kernel_set_name(k)) == 0) return k;
  fail(kernel_op_name(op), "{}={} is not one of simt, tensor-core", variable, env);
}

}  // namespace

KernelSet kernel_set(KernelOp op) {
  OpChoice& c = choice(op);
  if (!c.chosen) c.chosen = from_environment(op, c.variable);
  return *c.chosen;
}

void set_kernel_set(KernelOp op, KernelSet kernels) { choice(op).chosen = kernels; }

}  // namespace attograd::cuda

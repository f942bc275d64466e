// Which set of kernels (SIMT or tensor cores) runs each op that has both, and
// whether the bfloat16 product takes the sm_90a kernels where they run:
// chosen from the environment at the op's first call, or by set_kernel_set
// and set_wgmma_products.
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

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

namespace {
std::optional<WgmmaProducts>& wgmma_choice() {
  static std::optional<WgmmaProducts> chosen;
  return chosen;
}
}  // namespace

WgmmaProducts wgmma_products() {
  std::optional<WgmmaProducts>& c = wgmma_choice();
  if (!c) {
    const char* env = std::getenv("ATTOGRAD_CUDA_WGMMA");
    const std::string value = env ? env : "";
    if (value == "" || value == "0")
      c = WgmmaProducts::off;
    else if (value == "1" || value == "tma")
      c = WgmmaProducts::tma;
    else if (value == "cp.async")
      c = WgmmaProducts::cp_async;
    else
      fail("matmul", "ATTOGRAD_CUDA_WGMMA={} is not one of 0, 1, tma, cp.async", value);
  }
  return *c;
}

void set_wgmma_products(WgmmaProducts chosen) { wgmma_choice() = chosen; }

}  // namespace attograd::cuda

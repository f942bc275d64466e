#include "autograd/autocast.h"

#include <memory>
#include <unordered_map>

#include "autograd/ops.h"
#include "base/error.h"

namespace attograd {

// One guard's state: its dtype and the parameters it has cast, keyed by their
// impl, each kept with the version it was cast at: an update in place
// invalidates its copy.
struct AutocastGuard::State {
  DType dtype;
  struct Cast {
    std::uint64_t version;
    Tensor low;
  };
  std::unordered_map<const void*, Cast> parameters;
};

namespace {
thread_local AutocastGuard::State* current = nullptr;
}  // namespace

AutocastGuard::AutocastGuard(DType dtype) : previous_(current) {
  AG_CHECK(dtype == DType::bf16 || dtype == DType::f32, "autocast", "the low precision is bfloat16 (or float32: off), got {}",
           dtype_name(dtype));
  current = new State{dtype, {}};
}

AutocastGuard::~AutocastGuard() {
  State* mine = current;
  current = previous_;
  delete mine;
}

bool autocast_enabled() { return current != nullptr && current->dtype == DType::bf16; }

Tensor autocast_low(const Tensor& x) {
  if (!autocast_enabled() || !x.defined() || !is_floating(x.dtype()) || x.dtype() == current->dtype) return x;
  if (!(x.is_leaf() && x.requires_grad())) return to(x, current->dtype);
  // Keyed by impl: the cast's graph edge holds the parameter, so no other
  // tensor can take its address while the guard keeps the cast.
  auto& cast = current->parameters[x.impl()];
  const std::uint64_t version = x.version();
  if (!cast.low.defined() || cast.version != version) cast = {version, to(x, current->dtype)};
  return cast.low;
}

Tensor autocast_float32(const Tensor& x) {
  if (!autocast_enabled() || !x.defined() || x.dtype() != DType::bf16) return x;
  return to(x, DType::f32);
}

}  // namespace attograd

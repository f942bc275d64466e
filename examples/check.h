#pragma once
// The one helper the examples share. Each example prints what its tutorial
// prints, then states its claims with check(): a false claim is reported on
// stderr and makes main return 1, so ctest fails on it while the program still
// shows everything it set out to show.
#include <cmath>
#include <cstddef>
#include <iostream>
#include <string_view>
#include <vector>

#include "tensor/tensor.h"

namespace examples {

inline int& failed_claims() {
  static int count = 0;
  return count;
}

// Prints "ok: claim" or "claim failed: claim", and remembers a failure.
inline bool check(bool holds, std::string_view claim) {
  if (holds) {
    std::cout << "  ok: " << claim << '\n';
  } else {
    std::cerr << "claim failed: " << claim << '\n';
    ++failed_claims();
  }
  return holds;
}

// What main returns: 0 when every claim held.
inline int exit_code() { return failed_claims() == 0 ? 0 : 1; }

// max |a - b| over all elements, computed on the host, independent of the
// library's ops. Equal values (infinities too) differ by 0; NaN anywhere, or
// different shapes, give NaN, so a check `max_abs_diff(a, b) < tol` fails on them.
inline double max_abs_diff(const attograd::Tensor& a, const attograd::Tensor& b) {
  if (a.sizes() != b.sizes()) return NAN;
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double largest = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = x[i] == y[i] ? 0.0 : std::fabs(x[i] - y[i]);  // equal infinities differ by 0
    if (!(d <= largest)) largest = d;  // NaN wins
  }
  return largest;
}

}  // namespace examples

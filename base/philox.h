#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011): the value
// at position i depends only on (seed, counter), so a CUDA kernel reproduces
// exactly what the CPU draws, in any order, and backward can regenerate a
// dropout mask from its (seed, offset). Plain arithmetic on integers, with no
// tensor in sight: the CPU kernels (tensor/), the CUDA kernels (cuda/) and the
// program's data streams (train/) all draw from it.
#include <cstdint>

#include "base/host_device.h"

namespace attograd {

// Philox4x32-10 on a 128-bit counter (c0..c3) and 64-bit key; usable from CUDA too.
struct Philox4 {
  std::uint32_t v[4];
};

// The key's words at round r: each round adds the Weyl constants.
constexpr std::uint32_t kPhiloxKeyStep0 = 0x9E3779B9u, kPhiloxKeyStep1 = 0xBB67AE85u;

// One Philox4x32 round on the counter words c0..c3 with the round's key words
// k0, k1. cpu/philox_block.h runs it on many counters at once.
AG_HOST_DEVICE inline void philox_round(std::uint32_t& c0, std::uint32_t& c1, std::uint32_t& c2, std::uint32_t& c3,
                                        std::uint32_t k0, std::uint32_t k1) {
  const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
  const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
  c0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;
  c1 = static_cast<std::uint32_t>(p1);
  c2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;
  c3 = static_cast<std::uint32_t>(p0);
}

AG_HOST_DEVICE inline Philox4 philox4x32(std::uint64_t counter, std::uint64_t key) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter), c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = 0, c3 = 0;
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    philox_round(c0, c1, c2, c3, k0, k1);
    k0 += kPhiloxKeyStep0;
    k1 += kPhiloxKeyStep1;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) from 24 random bits (exactly representable in float32).
AG_HOST_DEVICE inline float uniform_from_bits(std::uint32_t bits) { return (bits >> 8) * (1.0f / 16777216.0f); }

// Element i of a stream draws from counter (offset + i / 4), lane i % 4.
AG_HOST_DEVICE inline float philox_uniform(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  return uniform_from_bits(philox4x32(offset + i / 4, seed).v[i % 4]);
}

}  // namespace attograd

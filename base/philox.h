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

// The key words of each of the ten rounds, worked out once for a key. A CUDA
// kernel that has them among its parameters reads each round's words from its
// constant bank as an operand of the round's exclusive or, where
// philox4x32(counter, key) adds the Weyl steps again for every draw.
struct PhiloxRoundKeys {
  std::uint32_t k0[10], k1[10];
};

AG_HOST_DEVICE inline PhiloxRoundKeys philox_round_keys(std::uint64_t key) {
  PhiloxRoundKeys keys{};
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    keys.k0[round] = k0, keys.k1[round] = k1;
    k0 += kPhiloxKeyStep0;
    k1 += kPhiloxKeyStep1;
  }
  return keys;
}

// philox4x32(counter, key) with key's round words given.
AG_HOST_DEVICE inline Philox4 philox4x32(std::uint64_t counter, const PhiloxRoundKeys& keys) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter), c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = 0, c3 = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) philox_round(c0, c1, c2, c3, keys.k0[round], keys.k1[round]);
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) from 24 random bits (exactly representable in float32).
AG_HOST_DEVICE inline float uniform_from_bits(std::uint32_t bits) { return (bits >> 8) * (1.0f / 16777216.0f); }

// The bits of a draw below which its uniform is below `threshold`, for a
// threshold in [0, 1): uniform_from_bits(bits) < threshold exactly when
// bits < drop_bits_below(threshold), one integer compare where the uniform is
// a shift, a conversion and a multiply before its compare. The uniform is
// k 2^-24 for k = bits >> 8, and k < threshold 2^24 (a product exact in
// float32) exactly when k < ceil(threshold 2^24) = c, that is when bits < c 2^8;
// c is at most 2^24 - 1 for a float32 below 1.
AG_HOST_DEVICE inline std::uint32_t drop_bits_below(float threshold) {
  if (!(threshold > 0.0f)) return 0;
  const float scaled = threshold * 16777216.0f;
  std::uint32_t c = static_cast<std::uint32_t>(scaled);
  if (static_cast<float>(c) < scaled) ++c;  // ceil, without <cmath> on the device
  return c >= (1u << 24) ? 0xFFFFFFFFu : c << 8;
}

// Element i of a stream draws from counter (offset + i / 4), lane i % 4.
AG_HOST_DEVICE inline float philox_uniform(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  return uniform_from_bits(philox4x32(offset + i / 4, seed).v[i % 4]);
}

}  // namespace attograd

#pragma once
// FNV-1a, 64 bits: a fast hash for telling files, texts and weights apart
// (fingerprints, checksums), not for security.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace attograd {

inline constexpr std::uint64_t kFnv1aOffset = 14695981039346656037ull;

// Continues `hash` over `bytes`; start from kFnv1aOffset.
inline std::uint64_t fnv1a64(const void* bytes, std::size_t n, std::uint64_t hash = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (std::size_t i = 0; i < n; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}
inline std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t hash = kFnv1aOffset) {
  return fnv1a64(bytes.data(), bytes.size(), hash);
}

}  // namespace attograd

#include "train/data/shards.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace attograd::train::data {

std::uint16_t TokenSpan::operator[](std::int64_t i) const {
  std::uint16_t token;
  std::memcpy(&token, data + 2 * i, sizeof token);
  return token;
}

TokenSpan parse_token_bytes(std::string_view bytes, TokenFormat format, std::string_view name, std::string_view flag) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  if (format == TokenFormat::nanogpt_bin) {
    AG_CHECK(bytes.size() % 2 == 0, flag, "{}: {} bytes, an odd length (nanoGPT's .bin holds uint16 tokens)", name,
             bytes.size());
    return {data, static_cast<std::int64_t>(bytes.size() / 2)};
  }
  AG_CHECK(bytes.size() >= kShardHeaderBytes, flag,
           "{}: {} bytes, shorter than an llm.c shard's header of {} (or a nanoGPT .bin: --data-format nanogpt)", name,
           bytes.size(), kShardHeaderBytes);
  std::int32_t header[3];
  std::memcpy(header, data, sizeof header);
  AG_CHECK(header[0] == kShardMagic, flag, "{}: wrong magic {} (an llm.c shard starts with {})", name, header[0],
           kShardMagic);
  AG_CHECK(header[1] == kShardVersion, flag, "{}: version {}, not {} (uint16 tokens)", name, header[1],
           kShardVersion);
  const std::size_t token_bytes = bytes.size() - kShardHeaderBytes;
  AG_CHECK(header[2] >= 0 && token_bytes % 2 == 0 && static_cast<std::size_t>(header[2]) == token_bytes / 2, flag,
           "{}: the header counts {} tokens, the file holds {} bytes of them ({})", name, header[2], token_bytes,
           static_cast<std::size_t>(std::max(header[2], 0)) * 2 > token_bytes ? "the count runs past the end"
                                                                                : "bytes left over");
  return {data + kShardHeaderBytes, header[2]};
}

TokenFile::TokenFile(const std::string& path, TokenFormat format, std::string_view flag)
    : path_(path), flag_(flag), file_(path, flag) {
  file_.advise_random();  // windows are drawn anywhere: no read-ahead of the whole file
  span_ = parse_token_bytes(file_.bytes(), format, path, flag);
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)), flag_(std::move(other.flag_)), file_(std::move(other.file_)),
      span_(std::exchange(other.span_, {})) {}

TokenFile::~TokenFile() = default;

void TokenFile::check_range(std::int64_t first, std::int64_t n) const {
  AG_CHECK(first >= 0 && n >= 0 && first + n <= span_.count, flag_, "{}: tokens [{}, {}) are outside its {}", path_,
           first, first + n, span_.count);
}

void TokenFile::read(std::int64_t first, std::int64_t n, std::int64_t vocab_size, std::int64_t* out) const {
  check_range(first, n);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t token = span_[first + i];
    AG_CHECK(token < vocab_size, flag_, "{}: token {} at position {} is not below the model's vocabulary of {}",
             path_, token, first + i, vocab_size);
    out[i] = token;
  }
}

std::string_view TokenFile::token_bytes(std::int64_t first, std::int64_t n) const {
  check_range(first, n);
  return {reinterpret_cast<const char*>(span_.data) + 2 * first, static_cast<std::size_t>(2 * n)};
}

std::string shard_bytes(const std::vector<std::uint16_t>& tokens) {
  std::int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  AG_CHECK(tokens.size() <= static_cast<std::size_t>(INT32_MAX), "prepare",
           "a shard of {} tokens is past the header's int32 count", tokens.size());
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::string bytes(kShardHeaderBytes + 2 * tokens.size(), '\0');
  std::memcpy(bytes.data(), header, kShardHeaderBytes);
  if (!tokens.empty()) std::memcpy(bytes.data() + kShardHeaderBytes, tokens.data(), 2 * tokens.size());
  return bytes;
}

}  // namespace attograd::train::data

#pragma once
// Token files on disk, as llm.c and nanoGPT write them, read through a
// memory map (nothing is read whole, so a file may be any size):
// - llm.c's shards: a header of 256 int32 (magic 20240520, version 1, the
//   token count, the rest zero), then the tokens as uint16;
// - nanoGPT's train.bin / val.bin: the tokens as uint16, no header.
// And the writer of llm.c's shards (attograd prepare).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "train/files.h"

namespace attograd::train::data {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::int32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderInts = 256;
inline constexpr std::size_t kShardHeaderBytes = kShardHeaderInts * sizeof(std::int32_t);

enum class TokenFormat { llmc_shard, nanogpt_bin };

// The tokens a file's bytes hold, checked: for a shard the magic, the version
// and a count that matches the bytes after the header; for either an even
// number of token bytes. `name` (the file) and `flag` name them in errors:
// "[--data] f.bin: wrong magic 1234 (an llm.c shard starts with 20240520)".
struct TokenSpan {
  const unsigned char* data = nullptr;  // the first token's bytes (any alignment)
  std::int64_t count = 0;
  std::uint16_t operator[](std::int64_t i) const;
};
TokenSpan parse_token_bytes(std::string_view bytes, TokenFormat format, std::string_view name, std::string_view flag);

// One token file, mapped read-only for the life of the object.
class TokenFile {
 public:
  TokenFile(const std::string& path, TokenFormat format, std::string_view flag = "--data");
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&&) = delete;
  TokenFile(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  std::int64_t size() const { return span_.count; }
  // Tokens [first, first + n) into out as int64, each checked to be below
  // vocab_size ("[--data] f.bin: token 50257 at position 12 is not below the
  // model's vocabulary of 50257"): a file is checked where it is read.
  void read(std::int64_t first, std::int64_t n, std::int64_t vocab_size, std::int64_t* out) const;
  // The raw little-endian bytes of tokens [first, first + n), unchecked (for fingerprints).
  std::string_view token_bytes(std::int64_t first, std::int64_t n) const;

 private:
  void check_range(std::int64_t first, std::int64_t n) const;

  std::string path_, flag_;
  MappedFile file_;
  TokenSpan span_;
};

// The bytes of an llm.c shard holding `tokens`.
std::string shard_bytes(const std::vector<std::uint16_t>& tokens);

}  // namespace attograd::train::data

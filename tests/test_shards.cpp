// Token files on disk (train/data/shards.h): llm.c's shards and nanoGPT's
// .bin, read through a memory map, every bad file one error naming it.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "program_helpers.h"
#include "base/error.h"
#include "train/data/shards.h"

namespace attograd::test {
namespace {

using train::data::kShardHeaderBytes;
using train::data::shard_bytes;
using train::data::TokenFile;
using train::data::TokenFormat;

// An llm.c header with the given fields, then `token_bytes` bytes of tokens.
std::string header(std::int32_t magic, std::int32_t version, std::int32_t count, std::size_t token_bytes) {
  std::vector<std::int32_t> ints(256, 0);
  ints[0] = magic, ints[1] = version, ints[2] = count;
  std::string bytes(kShardHeaderBytes + token_bytes, '\x01');
  std::memcpy(bytes.data(), ints.data(), kShardHeaderBytes);
  return bytes;
}

std::vector<std::int64_t> read_all(const TokenFile& file, std::int64_t vocab) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(file.size()));
  file.read(0, file.size(), vocab, out.data());
  return out;
}

}  // namespace

TEST_CASE("shards: an llm.c shard and a nanoGPT .bin read back the tokens written", "[shards]") {
  TempDir dir;
  const std::vector<std::uint16_t> tokens = {50256, 15496, 995, 0, 65535, 13};
  write_text(dir / "train_000001.bin", shard_bytes(tokens));
  const TokenFile shard(dir / "train_000001.bin", TokenFormat::llmc_shard);
  REQUIRE(shard.size() == 6);
  CHECK(read_all(shard, 65536) == std::vector<std::int64_t>(tokens.begin(), tokens.end()));
  std::vector<std::int64_t> window(3);
  shard.read(2, 3, 65536, window.data());
  CHECK(window == std::vector<std::int64_t>{995, 0, 65535});

  const std::string raw = shard_bytes(tokens).substr(kShardHeaderBytes);
  write_text(dir / "train.bin", raw);
  const TokenFile bin(dir / "train.bin", TokenFormat::nanogpt_bin);
  CHECK(read_all(bin, 65536) == read_all(shard, 65536));

  write_text(dir / "empty.bin", shard_bytes({}));
  CHECK(TokenFile(dir / "empty.bin", TokenFormat::llmc_shard).size() == 0);
}

TEST_CASE("shards: a bad token file is one error naming it and what is wrong", "[shards][errors]") {
  TempDir dir;
  const auto refused = [&](const std::string& bytes, TokenFormat format) -> std::string {
    write_text(dir / "bad.bin", bytes);
    try {
      TokenFile file(dir / "bad.bin", format);
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const auto llmc = TokenFormat::llmc_shard;
  CHECK_THAT(refused(header(20240801, 1, 0, 0), llmc), Catch::Contains("[--data]") && Catch::Contains("bad.bin") &&
                                                           Catch::Contains("wrong magic 20240801"));
  CHECK_THAT(refused(header(20240520, 2, 0, 0), llmc), Catch::Contains("version 2"));
  CHECK_THAT(refused(header(20240520, 1, 10, 8), llmc),
             Catch::Contains("counts 10 tokens") && Catch::Contains("runs past the end"));
  CHECK_THAT(refused(header(20240520, 1, 2, 8), llmc), Catch::Contains("bytes left over"));
  CHECK_THAT(refused(header(20240520, 1, -1, 0), llmc), Catch::Contains("counts -1 tokens"));
  CHECK_THAT(refused(std::string(100, 'x'), llmc), Catch::Contains("shorter than an llm.c shard's header"));
  CHECK_THAT(refused("abc", TokenFormat::nanogpt_bin), Catch::Contains("3 bytes, an odd length"));
  CHECK_THAT(refused(header(20240520, 1, 2, 4), llmc), Catch::Contains("(accepted)"));
  CHECK_THROWS_WITH(TokenFile(dir / "missing.bin", llmc), Catch::Contains("cannot read") && Catch::Contains("missing.bin"));
  CHECK_THROWS_WITH(TokenFile(dir.path.string(), llmc), Catch::Contains("not a regular file"));

  write_text(dir / "big_ids.bin", shard_bytes({1, 2, 50257, 3}));
  const TokenFile file(dir / "big_ids.bin", llmc);
  std::vector<std::int64_t> out(4);
  CHECK_THROWS_WITH(file.read(0, 4, 50257, out.data()),
                    Catch::Contains("token 50257 at position 2") && Catch::Contains("vocabulary of 50257"));
  CHECK_NOTHROW(file.read(0, 2, 50257, out.data()));
  CHECK_THROWS_WITH(file.read(3, 2, 50257, out.data()), Catch::Contains("tokens [3, 5) are outside its 4"));
}

TEST_CASE("shards: a shard of 4 GiB is mapped, not read: its last window reads at once", "[shards]") {
  TempDir dir;
  const std::int32_t count = 2'000'000'000;  // 4 GB of tokens, a sparse file: no disk space, no reading
  const std::string path = dir / "huge.bin";
  write_text(path, header(20240520, 1, count, 0));
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(kShardHeaderBytes) + 2 * static_cast<off_t>(count)) == 0);
  ::close(fd);
  const TokenFile huge(path, TokenFormat::llmc_shard);
  CHECK(huge.size() == count);
  std::vector<std::int64_t> window(1025, -1);
  huge.read(count - 1025, 1025, 50257, window.data());
  CHECK(window == std::vector<std::int64_t>(1025, 0));
}

}  // namespace attograd::test

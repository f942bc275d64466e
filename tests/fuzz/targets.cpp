#include "targets.h"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "train/data/bpe.h"
#include "train/data/shards.h"
#include "train/data/text_data.h"
#include "train/data/tokenizer.h"
#include "train/data/vocabulary.h"
#include "autograd/grad_mode.h"
#include "train/output/checkpoint.h"
#include "train/output/hf_gpt2.h"

namespace attograd::fuzz {

int checkpoint(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const train::output::LoadedCheckpoint ckpt = train::output::parse_checkpoint(bytes, "fuzz.safetensors");
    // A checkpoint that loads is used: its vocabulary survives its JSON and, where it has text
    // (GPT-2's files are never read from a checkpoint), decodes every id.
    const train::data::Vocabulary& vocabulary = ckpt.info.vocabulary;
    if (!(train::data::Vocabulary::from_json(vocabulary.to_json()) == vocabulary)) __builtin_trap();
    if (vocabulary.has_text()) {
      std::vector<std::int64_t> ids(static_cast<std::size_t>(vocabulary.size()));
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i);
      (void)vocabulary.decode(ids);
    }
  } catch (const Error&) {
  }
  return 0;
}

int text(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view text = input;
  std::optional<train::data::Tokenizer> vocabulary;
  try {
    if (const auto nul = input.find('\0'); nul != std::string_view::npos) {
      vocabulary = train::data::Tokenizer::from_json(std::string(input.substr(0, nul)));
      text = input.substr(nul + 1);
    }
    const train::data::TextData loaded(std::string(text), "fuzz.txt", 1, vocabulary);
    // Whatever loads round-trips: the text through its ids, the vocabulary through its JSON.
    const train::data::Tokenizer& tok = loaded.vocabulary().characters();
    if (tok.decode(tok.encode(text)) != text) __builtin_trap();
    if (train::data::Tokenizer::from_json(tok.to_json()).to_json() != tok.to_json()) __builtin_trap();
    (void)loaded.default_prompt();
    (void)loaded.unigram_entropy();
    for (const std::int64_t block : {1, 2, 5}) {
      try {
        loaded.check_block(block);
      } catch (const Error&) {
        continue;  // too short for this block: refused, as a run would be
      }
      (void)loaded.train_batch(3, 2, block);
      const std::int64_t windows = loaded.eval_sequences(block);
      (void)loaded.eval_batch(0, std::min<std::int64_t>(2, windows), block);
      (void)loaded.eval_batch(windows - 1, 1, block);
    }
  } catch (const Error&) {
  }
  return 0;
}

int shard(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (const auto format : {train::data::TokenFormat::llmc_shard, train::data::TokenFormat::nanogpt_bin}) {
    try {
      const train::data::TokenSpan span = train::data::parse_token_bytes(bytes, format, "fuzz.bin", "--data");
      if (span.count < 0 || span.data + 2 * span.count > reinterpret_cast<const unsigned char*>(bytes.data()) + size)
        __builtin_trap();
      std::uint32_t sum = 0;
      for (std::int64_t i = 0; i < span.count; ++i) sum += span[i];
      (void)sum;
    } catch (const Error&) {
    }
  }
  return 0;
}

int hf(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return 0;
  try {
    const train::output::HfGpt2 loaded = train::output::parse_hf_gpt2(input.substr(0, nul), input.substr(nul + 1), "fuzz");
    // Every tensor the config names was in the file, so the model is no larger than the input.
    nn::GPT model(loaded.config);
    model.load_state_dict(loaded.state);
    NoGradGuard no_grad;
    (void)model.forward(from_vector(std::vector<std::int64_t>{0}, {1, 1}));
  } catch (const Error&) {
  }
  return 0;
}

int tokenizer(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t first = input.find('\0');
  const std::size_t second = first == std::string_view::npos ? first : input.find('\0', first + 1);
  if (second == std::string_view::npos) return 0;
  try {
    const train::data::BpeTokenizer t = train::data::BpeTokenizer::from_files(
        std::string(input.substr(0, first)), std::string(input.substr(first + 1, second - first - 1)), "fuzz");
    const std::string_view text = input.substr(second + 1);
    for (const bool special : {false, true})
      if (t.decode(t.encode(text, special)) != text) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace attograd::fuzz

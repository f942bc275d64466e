#include "train/data/dataset.h"

#include "base/error.h"
#include "train/data/tasks.h"
#include "train/data/text_data.h"
#include "train/data/token_data.h"
#include "train/files.h"

namespace attograd::train::data {

namespace {

// The vocabulary new token data is read with: GPT-2's files, or a number of ids.
Vocabulary token_vocabulary(const DatasetSpec& spec) {
  AG_CHECK(!spec.tokenizer.empty() || spec.vocab_size > 0, "--data",
           "token files need their vocabulary: --tokenizer DIR (GPT-2's encoder.json and vocab.bpe) or --vocab-size N");
  if (spec.tokenizer.empty()) return Vocabulary::of_ids(spec.vocab_size);
  Vocabulary gpt2 = Vocabulary::load_gpt2(spec.tokenizer, "--tokenizer");
  AG_CHECK(spec.vocab_size == 0 || spec.vocab_size >= gpt2.size(), "--vocab-size",
           "{} is smaller than the tokenizer in '{}' ({} tokens): it may only pad it", spec.vocab_size, spec.tokenizer,
           gpt2.size());
  return gpt2;
}

}  // namespace

bool reads_token_files(const DatasetSpec& spec) {
  if (spec.data.empty()) return false;
  if (spec.format == "text") return false;
  if (spec.format == "shards" || spec.format == "nanogpt") return true;
  return looks_like_token_files(spec.data);
}

std::unique_ptr<Dataset> make_dataset(const DatasetSpec& spec, const Vocabulary* vocabulary,
                                      const std::string& fingerprint) {
  if (reads_token_files(spec)) {
    const TokenFormat format = spec.format == "nanogpt" ? TokenFormat::nanogpt_bin : TokenFormat::llmc_shard;
    const TokenFiles files = find_token_files(spec.data, spec.val_data, format);  // the files' errors first
    return std::make_unique<TokenData>(files, format, vocabulary ? *vocabulary : token_vocabulary(spec), spec.seed,
                                       fingerprint);
  }
  AG_CHECK(spec.val_data.empty(), "--val-data", "applies to token files, not to a text file (its last 10% is held out)");
  if (!spec.data.empty()) {
    AG_CHECK(spec.tokenizer.empty() && spec.vocab_size == 0, spec.tokenizer.empty() ? "--vocab-size" : "--tokenizer",
             "applies to token files: a text file is read as characters (GPT-2 tokens: attograd prepare it first)");
    AG_CHECK(!vocabulary || vocabulary->kind() == Vocabulary::Kind::characters, "--data",
             "'{}' is a text file, but the model reads token ids (give it token files)", spec.data);
    const std::string text = read_file(spec.data, "--data", kMaxTextBytes);
    return std::make_unique<TextData>(text, spec.data, spec.seed,
                                      vocabulary ? std::optional<Tokenizer>(vocabulary->characters()) : std::nullopt,
                                      fingerprint);
  }
  return std::make_unique<Task>(TaskSpec{parse_task(spec.task), spec.task_size, spec.seed, spec.heldout});
}

}  // namespace attograd::train::data

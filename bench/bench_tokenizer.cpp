// GPT-2's tokenizer (train/data/bpe.h) encoding a corpus, beside tiktoken's
// encode_ordinary_batch on the same documents (bench/tiktoken_reference.py):
//   tokenize/gpt2: encode_batch of the corpus's documents (split at blank
//       lines, as the Python side splits them) on ATTOGRAD_THREADS threads.
// Needs ATTOGRAD_GPT2_TOKENIZER (a folder with encoder.json and vocab.bpe:
// tests/reference/gpt2_tokenizer.py fetch DIR) and ATTOGRAD_BENCH_TEXT (a
// UTF-8 file); without them the case says so and skips.
// Counters: bytes (of text, a rate) and tokens (a rate).
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "bench_common.h"
#include "train/data/bpe.h"
#include "train/files.h"

namespace attograd::bench {
namespace {

std::vector<std::string_view> documents(const std::string& text) {
  std::vector<std::string_view> docs;
  std::size_t begin = 0;
  for (std::size_t at; (at = text.find("\n\n", begin)) != std::string::npos; begin = at + 2)
    docs.emplace_back(text.data() + begin, at - begin);
  docs.emplace_back(text.data() + begin, text.size() - begin);
  return docs;
}

void tokenize_gpt2(benchmark::State& state) {
  const char* dir = std::getenv("ATTOGRAD_GPT2_TOKENIZER");
  const char* file = std::getenv("ATTOGRAD_BENCH_TEXT");
  if (!dir || !file) {
    state.SkipWithError("set ATTOGRAD_GPT2_TOKENIZER (encoder.json, vocab.bpe) and ATTOGRAD_BENCH_TEXT (UTF-8 text)");
    return;
  }
  apply_threads(state);
  const train::data::BpeTokenizer tokenizer = train::data::BpeTokenizer::load(dir);
  const std::string text = train::read_file(file, "ATTOGRAD_BENCH_TEXT", std::uint64_t(1) << 32);
  const std::vector<std::string_view> docs = documents(text);
  // Checked once: the documents' ids decode to their bytes.
  std::int64_t tokens = 0;
  for (const auto& ids : tokenizer.encode_batch(docs)) tokens += static_cast<std::int64_t>(ids.size());
  for (std::size_t i = 0; i < docs.size(); i += 97)
    if (tokenizer.decode(tokenizer.encode(docs[i])) != docs[i]) {
      state.SkipWithError("a document does not decode to its bytes");
      return;
    }
  for (auto _ : state) benchmark::DoNotOptimize(tokenizer.encode_batch(docs));
  state.counters["bytes"] = benchmark::Counter(static_cast<double>(text.size()), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(tokenize_gpt2)->Name("tokenize/gpt2")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

}  // namespace
}  // namespace attograd::bench

#pragma once
// `attograd prepare`: text to token shards in llm.c's format, in bounded
// memory whatever the input's size. Each document (a file, or what stdin
// holds) is <|endoftext|> then its tokens, as llm.c's and nanoGPT's scripts
// join documents; the documents are read a chunk at a time, encoded on every
// thread a batch of chunks at a time, and written in order into shards of at
// most shard_tokens; the last val_fraction of the tokens become the
// validation shards (as nanoGPT splits a text: the end is held out).
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace attograd::train::data {

struct PrepareOptions {
  std::string tokenizer;                     // a folder with GPT-2's encoder.json and vocab.bpe
  std::vector<std::string> inputs;           // files, folders (their files, sorted), "-" for stdin
  std::string out;                           // a folder for train_NNNNNN.bin and val_NNNNNN.bin
  double val_fraction = 0.1;                 // in [0, 1)
  std::int64_t shard_tokens = 100'000'000;   // llm.c's FineWeb shards hold 1e8
  std::size_t batch_bytes = std::size_t(32) << 20;  // text encoded at a time over the threads
  std::FILE* stdin_stream = stdin;           // what "-" reads (tests give another)
};

struct PrepareProgress {
  std::int64_t bytes_read = 0, total_bytes = -1;  // -1: not known ahead (stdin)
  std::int64_t documents = 0, tokens = 0;
  double seconds = 0;
};

struct PrepareSummary {
  PrepareProgress done;
  std::int64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;  // paths, in order
};

// Throws attograd::Error naming the flag or file on a bad input: a missing
// file, invalid UTF-8 (with its byte offset), an out folder that already holds
// shards. `progress` is called after each batch.
PrepareSummary prepare_shards(const PrepareOptions& options,
                              const std::function<void(const PrepareProgress&)>& progress = {});

}  // namespace attograd::train::data

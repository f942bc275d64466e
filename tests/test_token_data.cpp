// Training on token files (train/data/token_data.h) and what a model's ids
// stand for (train/data/vocabulary.h): which files a run reads, windows drawn
// across them as a function of (seed, step), the held-out tiling, runs that
// resume bit for bit, and GPT-2 vocabularies kept in checkpoints by fingerprint.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "bpe_files.h"
#include "program_helpers.h"
#include "base/error.h"
#include "train/cli/commands.h"
#include "train/data/shards.h"
#include "train/data/token_data.h"
#include "train/data/vocabulary.h"
#include "train/output/safetensors.h"

namespace attograd::test {
namespace {

namespace fs = std::filesystem;
using train::data::TokenData;
using train::data::TokenFiles;
using train::data::TokenFormat;
using train::data::Vocabulary;

// A shard holding first, first + 1, ..., first + count - 1.
void write_counting_shard(const std::string& path, std::uint16_t first, std::size_t count) {
  std::vector<std::uint16_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), first);
  write_text(path, train::data::shard_bytes(tokens));
}

std::vector<std::int64_t> values(const Tensor& t) {
  const auto* p = t.data<std::int64_t>();
  return {p, p + t.numel()};
}

// A small GPT-2 style tokenizer in `dir` (bytes, "th", "the", " the").
void write_small_tokenizer(const std::string& dir) {
  SmallVocabulary({{"t", "h"}, {"th", "e"}, {" ", "the"}}).write(dir);
}

// The names of the tensors whose bits differ between two checkpoints (or that one of them lacks).
std::vector<std::string> differing_tensors(const std::string& a_path, const std::string& b_path) {
  const train::output::Safetensors a = train::output::load_safetensors(a_path), b = train::output::load_safetensors(b_path);
  std::vector<std::string> differing;
  for (const auto& [name, t] : a.tensors) {
    const auto other = b.tensors.find(name);
    if (other == b.tensors.end() || other->second.sizes() != t.sizes() || other->second.dtype() != t.dtype() ||
        std::memcmp(t.raw_data(), other->second.raw_data(), t.numel() * dtype_size(t.dtype())) != 0)
      differing.push_back(name);
  }
  for (const auto& [name, t] : b.tensors)
    if (!a.tensors.contains(name)) differing.push_back(name);
  return differing;
}

// `attograd train` of a tiny model (1 layer, width 16, 2 heads, block 8, batch 4, quiet) with `args`,
// which must succeed; returns what it printed.
std::string train_tiny(std::vector<std::string> args) {
  args.insert(args.begin(), {"train", "--layers", "1", "--width", "16", "--heads", "2", "--block", "8", "--batch", "4",
                             "--quiet"});
  const CliResult r = cli(args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  return r.out;
}

train::TrainOptions tiny_token_run(const std::string& data, const std::string& out) {
  train::TrainOptions o;
  o.data = data;
  o.vocab_size = 1000;
  o.layers = 1, o.heads = 2, o.width = 16, o.block = 8;
  o.batch = 4, o.steps = 6, o.warmup = 2, o.lr = 1e-2, o.dropout = 0.1;
  o.eval_interval = 3;
  o.out = out;
  o.quiet = true;
  return o;
}

}  // namespace

TEST_CASE("token files: a folder's train and val shards, a glob, a file and its val twin", "[tokens]") {
  TempDir dir;
  fs::create_directories(dir / "shards");
  for (const char* name : {"train_000001.bin", "train_000000.bin", "val_000000.bin"})
    write_counting_shard(dir / (std::string("shards/") + name), 0, 10);
  const TokenFiles folder = train::data::find_token_files(dir / "shards", "", TokenFormat::llmc_shard);
  CHECK(folder.train == std::vector<std::string>{dir / "shards/train_000000.bin", dir / "shards/train_000001.bin"});
  CHECK(folder.validation == std::vector<std::string>{dir / "shards/val_000000.bin"});

  const TokenFiles glob = train::data::find_token_files(dir / "shards/train_*.bin", "", TokenFormat::llmc_shard);
  CHECK(glob.train == folder.train);
  CHECK(glob.validation == folder.validation);  // train_*.bin's twin: val_*.bin

  fs::create_directories(dir / "nano");
  write_text(dir / "nano/train.bin", std::string(20, '\0'));
  write_text(dir / "nano/val.bin", std::string(20, '\0'));
  const TokenFiles nano = train::data::find_token_files(dir / "nano", "", TokenFormat::nanogpt_bin);
  CHECK(nano.train == std::vector<std::string>{dir / "nano/train.bin"});
  CHECK(nano.validation == std::vector<std::string>{dir / "nano/val.bin"});
  CHECK(train::data::find_token_files(dir / "nano/train.bin", "", TokenFormat::nanogpt_bin).validation ==
        nano.validation);

  CHECK(train::data::token_data_name(dir / "shards") == "shards");
  CHECK(train::data::token_data_name(dir / "shards/train_*.bin") == "shards");
  CHECK(train::data::token_data_name(dir / "nano/train.bin") == "train");
  CHECK(train::data::looks_like_token_files(dir / "nano/train.bin"));
  CHECK_FALSE(train::data::looks_like_token_files(dir / "book.txt"));
}

TEST_CASE("token files: a missing set, a pattern with no val twin, a file in both sets are refused", "[tokens][errors]") {
  TempDir dir;
  write_counting_shard(dir / "train_a.bin", 0, 10);
  write_counting_shard(dir / "other.bin", 0, 10);
  const auto error = [&](const std::string& data, const std::string& val) {
    try {
      train::data::find_token_files(data, val, TokenFormat::llmc_shard);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error(dir / "train_a.bin", ""),
             Catch::Contains("[--val-data] cannot read") && Catch::Contains("val_a.bin': no such file"));
  CHECK_THAT(error(dir / "other.bin", ""), Catch::Contains("[--val-data] is needed") && Catch::Contains("no \"train\""));
  CHECK_THAT(error(dir / "*.bin", ""), Catch::Contains("[--val-data] is needed"));
  CHECK_THAT(error(dir / "*.bin", dir / "other.bin"),
             Catch::Contains("[--val-data]") && Catch::Contains("other.bin' is a training file too"));
  CHECK_THAT(error(dir / "nothing_*.bin", dir / "other.bin"), Catch::Contains("[--data]") && Catch::Contains("matches no file"));
  CHECK(error(dir / "train_a.bin", dir / "other.bin") == "no error");
}

TEST_CASE("token data: windows within one file each, drawn from every file, a pure function of the step", "[tokens]") {
  TempDir dir;
  write_counting_shard(dir / "train_0.bin", 0, 100);
  write_counting_shard(dir / "train_1.bin", 500, 300);
  write_counting_shard(dir / "val_0.bin", 900, 50);
  const TokenFiles files = train::data::find_token_files(dir / "train_*.bin", "", TokenFormat::llmc_shard);
  const TokenData data(files, TokenFormat::llmc_shard, Vocabulary::of_ids(1000), 7);
  CHECK(data.train_tokens() == 400);
  CHECK(data.validation_tokens() == 50);
  const std::int64_t block = 16;
  std::int64_t from_first = 0, from_second = 0;
  for (std::uint64_t step = 0; step < 50; ++step) {
    const train::data::Batch b = data.train_batch(step, 8, block);
    const std::vector<std::int64_t> x = values(b.tokens), y = values(b.targets);
    for (std::int64_t r = 0; r < 8; ++r) {
      const std::int64_t start = x[r * block];
      // Consecutive tokens of one file: a window never crosses into the next file.
      for (std::int64_t t = 0; t < block; ++t) {
        CHECK(x[r * block + t] == start + t);
        CHECK(y[r * block + t] == start + t + 1);
      }
      const bool first = start + block < 100, second = start >= 500 && start + block < 800;
      CHECK((first || second));
      from_first += first, from_second += second;
    }
  }
  // Windows are drawn in proportion to each file's windows: 84 and 284 of 368.
  CHECK(from_first > 40);
  CHECK(from_second > 3 * from_first / 2);
  CHECK(values(data.train_batch(3, 8, block).tokens) == values(data.train_batch(3, 8, block).tokens));
  CHECK(values(data.train_batch(3, 8, block).tokens) != values(data.train_batch(4, 8, block).tokens));
  const TokenData reseeded(files, TokenFormat::llmc_shard, Vocabulary::of_ids(1000), 8);
  CHECK(values(reseeded.train_batch(3, 8, block).tokens) != values(data.train_batch(3, 8, block).tokens));
}

TEST_CASE("token data: the held-out windows tile each validation file in order, every one of them", "[tokens]") {
  TempDir dir;
  write_counting_shard(dir / "train.bin", 0, 100);
  write_counting_shard(dir / "val_0.bin", 200, 35);  // (35 - 1) / 8 = 4 windows
  write_counting_shard(dir / "val_1.bin", 300, 17);  // 2 windows
  const TokenFiles files = train::data::find_token_files(dir / "train.bin", dir / "val_*.bin", TokenFormat::llmc_shard);
  const TokenData data(files, TokenFormat::llmc_shard, Vocabulary::of_ids(1000), 1);
  REQUIRE(data.eval_sequences(8) == 6);
  const std::vector<std::int64_t> starts = {200, 208, 216, 224, 300, 308};
  for (std::int64_t first = 0; first < 6; ++first)
    for (std::int64_t count = 1; first + count <= 6; ++count) {
      const train::data::Batch b = data.eval_batch(first, count, 8);
      const std::vector<std::int64_t> x = values(b.tokens), y = values(b.targets);
      for (std::int64_t r = 0; r < count; ++r) {
        CHECK(x[r * 8] == starts[first + r]);
        CHECK(y[r * 8 + 7] == starts[first + r] + 8);
      }
    }
  CHECK_THROWS_WITH(data.eval_batch(5, 2, 8), Catch::Contains("outside the 6 windows"));
  CHECK_THROWS_WITH(data.check_block(40), Catch::Contains("[--val-data] no validation file holds a window of --block 40"));
  CHECK_THROWS_WITH(data.check_block(100), Catch::Contains("[--data] no training file holds a window of --block 100"));
}

TEST_CASE("token data: an id past the vocabulary is one error naming the file and position", "[tokens][errors]") {
  TempDir dir;
  write_counting_shard(dir / "train.bin", 0, 100);
  write_counting_shard(dir / "val.bin", 0, 100);
  const TokenFiles files = train::data::find_token_files(dir / "train.bin", "", TokenFormat::llmc_shard);
  const TokenData data(files, TokenFormat::llmc_shard, Vocabulary::of_ids(50), 1);
  CHECK_THROWS_WITH(data.eval_batch(0, 12, 8),
                    Catch::Contains("val.bin: token 50 at position 50 is not below the model's vocabulary of 50"));
  const CliResult r = cli({"train", "--data", dir / "train.bin", "--vocab-size", "50", "--out", dir / "run", "--steps",
                           "2", "--layers", "1", "--width", "16", "--block", "8", "--quiet"});
  CHECK(r.code != 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_THAT(r.err, Catch::Contains("[--data]") && Catch::Contains("is not below the model's vocabulary of 50"));
}

TEST_CASE("token runs: N + N resumed steps give bitwise the weights of 2N, and other tokens are refused", "[tokens]") {
  TempDir dir;
  fs::create_directories(dir / "data");
  write_counting_shard(dir / "data/train_000000.bin", 0, 400);
  write_counting_shard(dir / "data/train_000001.bin", 400, 300);
  write_counting_shard(dir / "data/val_000000.bin", 700, 200);
  train::TrainOptions whole = tiny_token_run(dir / "data", dir / "whole");
  train::cli::train_command(whole, null_out());
  train::TrainOptions first = whole;
  first.out = dir / "split";
  first.stop_at = 3;
  train::cli::train_command(first, null_out());
  train::TrainOptions rest;
  rest.resume = dir / "split/ckpt.safetensors";
  rest.quiet = true;
  rest.steps = 0, rest.eval_interval = 3;
  CHECK(train::cli::train_command(rest, null_out()).steps_done == 6);
  CHECK(differing_tensors(dir / "whole/ckpt.safetensors", dir / "split/ckpt.safetensors").empty());
  CHECK(train::output::load_safetensors(dir / "whole/ckpt.safetensors").metadata.at("vocab") == R"({"ids":1000})");

  // The data moved: --data names it again; other tokens are not the same run.
  fs::rename(dir / "data", dir / "moved");
  const CliResult moved = cli({"train", "--resume", dir / "whole/ckpt.safetensors", "--data", dir / "moved", "--steps",
                               "7", "--quiet"});
  INFO(moved.err);
  CHECK(moved.code == 0);
  write_counting_shard(dir / "moved/train_000001.bin", 401, 300);
  const CliResult other = cli({"train", "--resume", dir / "whole/ckpt.safetensors", "--data", dir / "moved",
                               "--steps", "8", "--quiet"});
  CHECK(other.code != 0);
  CHECK_THAT(other.err, Catch::Contains("[--resume]") && Catch::Contains("are not the tokens the checkpoint was trained on"));
}

TEST_CASE("token runs: a shard of 3 GiB trains a step, mapped and never read whole", "[tokens]") {
  TempDir dir;
  const std::int32_t count = 1'500'000'000;
  const std::string path = dir / "train_huge.bin";
  write_counting_shard(path, 0, 0);
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  std::int32_t header[3] = {train::data::kShardMagic, train::data::kShardVersion, count};
  REQUIRE(::pwrite(fd, header, sizeof header, 0) == sizeof header);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(train::data::kShardHeaderBytes) + 2 * static_cast<off_t>(count)) == 0);
  ::close(fd);
  write_counting_shard(dir / "val_huge.bin", 0, 100);
  train::TrainOptions o = tiny_token_run(path, dir / "run");
  o.steps = 1, o.eval_interval = 1, o.vocab_size = 50257;
  const train::cli::TrainSummary s = train::cli::train_command(o, null_out());
  CHECK(s.steps_done == 1);
  CHECK(std::isfinite(s.val_loss));
}

TEST_CASE("vocabularies: kept as JSON, GPT-2's by fingerprint, its files attached and checked", "[tokens][tokenizer]") {
  TempDir dir;
  fs::create_directories(dir / "small");
  write_small_tokenizer(dir / "small");
  const Vocabulary gpt2 = Vocabulary::load_gpt2(dir / "small", "--tokenizer");
  CHECK(gpt2.kind() == Vocabulary::Kind::gpt2);
  CHECK(gpt2.size() == 260);
  CHECK(gpt2.end_of_text() == 259);
  CHECK(gpt2.encode(" the<|endoftext|>", "test") == std::vector<std::int64_t>{258, 259});
  CHECK(gpt2.decode({258, 259}) == " the<|endoftext|>");

  // A checkpoint keeps which tokenizer and where, not the files.
  const Vocabulary kept = Vocabulary::from_json(gpt2.to_json());
  CHECK(kept == gpt2);
  CHECK_FALSE(kept.has_text());
  CHECK_THROWS_WITH(kept.decode({1}), Catch::Contains("give --tokenizer DIR"));
  CHECK(kept.attached("", "--tokenizer").decode({258}) == " the");

  // Moved: named again; another tokenizer of the same size is refused by its fingerprint.
  fs::rename(dir / "small", dir / "moved");
  CHECK_THROWS_WITH(kept.attached("", "--tokenizer"), Catch::Contains("[--tokenizer]") && Catch::Contains("is gone"));
  CHECK(kept.attached(dir / "moved", "--tokenizer").folder() == fs::absolute(dir / "moved").string());
  fs::create_directories(dir / "other");
  SmallVocabulary({{"t", "h"}, {"th", "e"}, {"e", " "}}).write(dir / "other");
  CHECK_THROWS_WITH(kept.attached(dir / "other", "--tokenizer"), Catch::Contains("is not the one the model was trained with"));

  // Ids alone: sized, no text until a tokenizer of that size is attached.
  const Vocabulary ids = Vocabulary::from_json(R"({"ids": 260})");
  CHECK(ids.size() == 260);
  CHECK_THROWS_WITH(ids.encode("x", "--prompt"), Catch::Contains("no tokenizer"));
  CHECK(ids.attached(dir / "moved", "--tokenizer").kind() == Vocabulary::Kind::gpt2);
  CHECK_THROWS_WITH(Vocabulary::of_ids(300).attached(dir / "moved", "--tokenizer"),
                    Catch::Contains("holds 260 tokens, but the model was trained on 300 token ids"));

  // Characters as before: a JSON array.
  CHECK(Vocabulary::from_json(R"(["a","b"])").size() == 2);
  for (const char* bad : {R"({"ids": 0})", R"({"ids": -3})", R"({"gpt2": {"size": 5}})", R"({"bpe": 1})", "7"})
    CHECK_THROWS_WITH(Vocabulary::from_json(bad), Catch::Contains("[tokenizer]"));
}

TEST_CASE("token runs with GPT-2's tokenizer: train, eval with perplexity, sample text", "[tokens][tokenizer]") {
  TempDir dir;
  fs::create_directories(dir / "tok");
  write_small_tokenizer(dir / "tok");
  fs::create_directories(dir / "data");
  const Vocabulary vocabulary = Vocabulary::load_gpt2(dir / "tok", "--tokenizer");
  const std::vector<std::int64_t> document = vocabulary.encode(" the cat<|endoftext|>", "test");
  REQUIRE(document.size() == 6);  // " the", then the bytes of " cat", then <|endoftext|>
  std::vector<std::uint16_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.insert(tokens.end(), document.begin(), document.end());
  write_text(dir / "data/train_000000.bin", train::data::shard_bytes(tokens));
  write_text(dir / "data/val_000000.bin", train::data::shard_bytes({tokens.begin(), tokens.begin() + 120}));
  const CliResult r = cli({"train", "--data", dir / "data", "--tokenizer", dir / "tok", "--out", dir / "run",
                           "--layers", "1", "--width", "16", "--heads", "2", "--block", "12", "--batch", "8", "--steps",
                           "80", "--lr", "3e-2", "--warmup", "5", "--dropout", "0", "--eval-interval", "80", "--quiet"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("GPT-2's tokenizer, vocabulary 260"));
  const std::string ckpt = dir / "run/ckpt.safetensors";
  const CliResult e = cli({"eval", "--ckpt", ckpt});
  CHECK(e.code == 0);
  CHECK_THAT(e.out, Catch::Contains("windows of 12 tokens") && Catch::Contains("perplexity"));
  // Unconditional: from <|endoftext|>; the one document there is, learnt in 80 steps.
  train::cli::SampleOptions greedy;
  greedy.ckpt = ckpt, greedy.tokens = 5, greedy.temperature = 0;
  const std::string text = train::cli::sample_command(greedy, null_out());
  CHECK(text == "<|endoftext|> the cat");
  // A document ends at <|endoftext|>, unless --no-stop.
  const CliResult stop = cli({"sample", "--ckpt", ckpt, "--temperature", "0", "--max-tokens", "20"});
  CHECK(stop.out == "<|endoftext|> the cat<|endoftext|>\n");
  const CliResult on = cli({"sample", "--ckpt", ckpt, "--temperature", "0", "--max-tokens", "7", "--no-stop"});
  CHECK(on.out == "<|endoftext|> the cat<|endoftext|> the\n");
  // Several samples, each its own, between nanoGPT's separators; a prompt from a file.
  write_text(dir / "prompt.txt", " the");
  const CliResult many = cli({"sample", "--ckpt", ckpt, "--prompt-file", dir / "prompt.txt", "--num-samples", "3",
                              "--temperature", "3", "--max-tokens", "6", "--seed", "4"});
  INFO(many.err);
  REQUIRE(many.code == 0);
  std::size_t separators = 0;
  for (auto at = many.out.find("\n---------------\n"); at != std::string::npos; at = many.out.find("\n---------------\n", at + 1))
    ++separators;
  CHECK(separators == 2);
  CHECK(many.out.rfind(" the", 0) == 0);
  CHECK_THAT(cli({"sample", "--ckpt", ckpt, "--prompt", "x", "--prompt-file", dir / "prompt.txt"}).err,
             Catch::Contains("[--prompt-file] cannot go with --prompt"));
  fs::rename(dir / "tok", dir / "tok2");
  const CliResult gone = cli({"sample", "--ckpt", ckpt});
  CHECK(gone.code != 0);
  CHECK_THAT(gone.err, Catch::Contains("[--tokenizer]") && Catch::Contains("give --tokenizer DIR"));
  CHECK(cli({"sample", "--ckpt", ckpt, "--tokenizer", dir / "tok2", "--prompt", " the"}).code == 0);
}

}  // namespace attograd::test

namespace attograd::test {

TEST_CASE("keep-best keeps the weights of the lowest held-out loss, and changes nothing of the run", "[tokens]") {
  TempDir dir;
  fs::create_directories(dir / "data");
  write_counting_shard(dir / "data/train_000000.bin", 0, 600);
  write_counting_shard(dir / "data/val_000000.bin", 600, 200);
  const std::vector<std::string> run = {"--data", dir / "data", "--vocab-size", "800", "--steps", "8",
                                        "--eval-interval", "2", "--lr", "0.05"};
  std::vector<std::string> plain_args = run, best_args = run;
  plain_args.insert(plain_args.end(), {"--out", dir / "plain"});
  best_args.insert(best_args.end(), {"--out", dir / "best", "--keep-best"});
  train_tiny(plain_args);
  train_tiny(best_args);
  std::vector<double> losses;
  std::ifstream metrics(dir / "best/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (line.find("\"eval\"") != std::string::npos) losses.push_back(nlohmann::json::parse(line)["val_loss"].get<double>());
  REQUIRE(losses.size() == 4);
  const train::output::LoadedCheckpoint best = train::output::load_checkpoint(dir / "best/best.safetensors");
  REQUIRE(best.info.val_loss.has_value());
  CHECK(*best.info.val_loss == *std::min_element(losses.begin(), losses.end()));
  CHECK(best.info.step == 2 * (std::min_element(losses.begin(), losses.end()) - losses.begin() + 1));
  CHECK(best.optimizer_name.empty());
  // What a resumed run reads of it: the metadata alone, the same.
  const train::output::CheckpointInfo info = train::output::read_checkpoint_info(dir / "best/best.safetensors", "test");
  CHECK(info.val_loss == best.info.val_loss);
  CHECK(info.step == best.info.step);
  // Keeping the best changes nothing of the run itself.
  CHECK(differing_tensors(dir / "plain/ckpt.safetensors", dir / "best/ckpt.safetensors").empty());
}

TEST_CASE("samples while training: printed every --sample-interval steps, the run's weights unchanged", "[tokens][tokenizer]") {
  TempDir dir;
  fs::create_directories(dir / "tok");
  write_small_tokenizer(dir / "tok");
  const Vocabulary vocabulary = Vocabulary::load_gpt2(dir / "tok", "test");
  const std::vector<std::int64_t> document = vocabulary.encode(" the cat<|endoftext|>", "test");
  std::vector<std::uint16_t> tokens;
  for (int i = 0; i < 100; ++i) tokens.insert(tokens.end(), document.begin(), document.end());
  fs::create_directories(dir / "data");
  write_text(dir / "data/train_000000.bin", train::data::shard_bytes(tokens));
  write_text(dir / "data/val_000000.bin", train::data::shard_bytes(tokens));
  const std::vector<std::string> run = {"--data", dir / "data", "--tokenizer", dir / "tok", "--steps", "6",
                                        "--eval-interval", "3", "--dropout", "0.1"};
  std::vector<std::string> plain_args = run, sampled_args = run;
  plain_args.insert(plain_args.end(), {"--out", dir / "plain"});
  sampled_args.insert(sampled_args.end(), {"--out", dir / "sampled", "--sample-interval", "2"});
  const std::string plain = train_tiny(plain_args);
  const std::string sampled = train_tiny(sampled_args);
  CHECK(plain.find("sample at step") == std::string::npos);
  for (const char* step : {"sample at step 2:\n<|endoftext|>", "sample at step 4:\n", "sample at step 6:\n"})
    CHECK_THAT(sampled, Catch::Contains(step));
  CHECK(differing_tensors(dir / "plain/ckpt.safetensors", dir / "sampled/ckpt.safetensors").empty());
  CHECK(train::output::load_safetensors(dir / "plain/ckpt.safetensors").metadata.at("rng") ==
        train::output::load_safetensors(dir / "sampled/ckpt.safetensors").metadata.at("rng"));
}

}  // namespace attograd::test

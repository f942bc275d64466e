// The attograd program: argument errors, tasks, text data, safetensors and
// checkpoints (round trip, malformed files), resume equality, determinism,
// generation with and without the KV cache, evaluation, and the files a run
// writes. Every run is a tiny model for a few steps.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "autograd/attention.h"
#include "autograd/grad_mode.h"
#include "cuda/runtime.h"
#include "helpers.h"
#include "program_helpers.h"
#include "cpu/fma_peak.h"
#include "cpu/parallel.h"
#include "tensor/storage.h"
#include "train/cli/cli.h"
#include "train/cli/commands.h"
#include "train/cli/progress.h"
#include "train/data/tasks.h"
#include "train/data/text_data.h"
#include "train/data/utf8.h"
#include "train/model/evaluate.h"
#include "train/model/generate.h"
#include "train/model/gpt.h"
#include "train/optim/grad_clip.h"
#include "train/optim/schedule.h"
#include "train/output/checkpoint.h"
#include "train/output/safetensors.h"
#include "train/output/svg.h"

using namespace attograd;
using namespace attograd::test;
namespace fs = std::filesystem;

namespace {

// A tiny run: one layer, width 16, a few steps, quiet, into `dir`.
train::TrainOptions tiny(const std::string& dir, const std::string& task = "sort") {
  train::TrainOptions o;
  o.task = task;
  o.task_size = task == "add" ? 2 : 4;
  o.heldout = 50;
  o.layers = 1, o.heads = 2, o.width = 16;
  o.block = train::data::task_sequence_length(train::data::parse_task(task), o.task_size) - 1;
  o.batch = 8, o.steps = 6, o.warmup = 2, o.lr = 1e-2;
  o.eval_interval = 3;
  o.out = dir;
  o.quiet = true;
  return o;
}

// Bitwise equality of two tensors' bytes.
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const Tensor ca = kernels::contiguous(a), cb = kernels::contiguous(b);
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.numel() * dtype_size(ca.dtype())) == 0;
}

std::string long_english_text() {
  std::string s;
  for (int i = 0; i < 40; ++i)
    s += "The quick brown fox jumps over the lazy dog, and the dog sleeps on in the sun. ";
  return s;
}

}  // namespace

// ---- the command line ------------------------------------------------------------

// A flag's default as CLI11 writes it: "--steps INT=400" up to 2.2 (Debian 12 has 2.1), "--steps INT [400]"
// from 2.3 on (Ubuntu 24.04, the GPU machine, has it).
bool shows_default(const std::string& help, const std::string& flag, const std::string& value) {
  return help.find(flag + "=" + value) != std::string::npos ||
         help.find(flag + " [" + value + "]") != std::string::npos;
}

TEST_CASE("help shows every command and the defaults", "[train]") {
  const CliResult top = cli({"--help"});
  CHECK(top.code == 0);
  for (const char* cmd : {"train", "sample", "eval", "attention"}) CHECK_THAT(top.out, Catch::Contains(cmd));
  const CliResult train = cli({"train", "--help"});
  CHECK(train.code == 0);
  INFO(train.out);
  CHECK(shows_default(train.out, "--steps INT", "400"));
  CHECK(shows_default(train.out, "--lr FLOAT", "0.005"));
  CHECK_THAT(train.out, Catch::Contains("never to biases, LayerNorm or embeddings"));
  for (const char* cmd : {"sample", "eval", "attention"}) {
    const CliResult r = cli({cmd, "--help"});
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("--ckpt"));
  }
  const std::string sample_help = cli({"sample", "--help"}).out;
  INFO(sample_help);
  CHECK(shows_default(sample_help, "--temperature FLOAT", "1"));
  CHECK(cli({"--version"}).out.find("attograd 0.") == 0);
}

TEST_CASE("presets: the task chooses the defaults, the block fits one problem", "[train]") {
  train::TrainOptions o;
  CHECK(train::preset_for(o, false).block == 16);  // sort 8: 17 tokens, the model sees 16
  o.task = "add";
  const train::TrainOptions add = train::preset_for(o, false);
  CHECK(add.task_size == 2);
  CHECK(add.block == 8);
  CHECK(add.layers == 3);
  CHECK(add.steps == 1200);
  o.task_size = 3;
  CHECK(train::preset_for(o, true).block == 11);
  o.task = "sort";
  o.data = "book.txt";
  CHECK(train::preset_for(o, false).block == 64);
  CHECK(train::preset_for(o, false).dropout > 0);
  train::TrainOptions bad;
  bad.block = 10;
  REQUIRE_THROWS_WITH(train::validate(bad), Catch::Contains("[--block] sort with --task-size 8 needs a block of at least 16"));
}

TEST_CASE("invalid flags: one line on stderr naming the flag and value, non-zero exit, no run directory",
          "[train]") {
  TempDir tmp;
  const std::string out = tmp / "run";
  write_text(tmp / "empty.txt", "");
  write_text(tmp / "bad.txt", std::string("ab\xC3\x28", 4));
  write_text(tmp / "a_file", "x");
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expect;  // substrings of the error line
  };
  const std::vector<Case> cases = {
      {{"--layers", "0"}, {"[--layers]", "0"}},
      {{"--width", "-8"}, {"[--width]", "-8"}},
      {{"--batch", "0"}, {"[--batch]", "0"}},
      {{"--steps", "0"}, {"[--steps]", "0"}},
      {{"--block", "0"}, {"[--block]", "0"}},
      {{"--heads", "3", "--width", "64"}, {"[--heads]", "3", "64"}},
      {{"--lr", "nan"}, {"[--lr]", "nan"}},
      {{"--lr", "inf"}, {"[--lr]", "inf"}},
      {{"--lr", "-1"}, {"[--lr]", "-1"}},
      {{"--dropout", "1"}, {"[--dropout]", "1"}},
      {{"--grad-clip", "-1"}, {"[--grad-clip]"}},
      {{"--task", "multiply"}, {"[--task]", "multiply"}},
      {{"--task-size", "0"}, {"[--task-size]", "0"}},
      {{"--optimizer", "lion"}, {"[--optimizer]", "lion"}},
      {{"--threads", "-2"}, {"[--threads]", "-2"}},
      {{"--device", "tpu"}, {"[--device]", "tpu"}},
      {{"--dtype", "bf16"}, {"[--dtype] unknown dtype 'bf16' (float32, bfloat16)"}},
      {{"--data", tmp / "missing.txt"}, {"[--data]", "missing.txt"}},
      {{"--data", tmp / "empty.txt"}, {"[--data", "empty"}},
      {{"--data", tmp.path.string()}, {"[--data]", "*train*.bin' matches no file"}},
      {{"--data", tmp.path.string(), "--data-format", "text"}, {"[--data]", "is a directory"}},
      {{"--data", tmp / "bad.txt"}, {"invalid UTF-8 at byte 3"}},
      {{"--layers", "two"}, {"--layers", "two"}},
      {{"--no-such-flag"}, {"--no-such-flag"}},
      {{"--task-size", "1"}, {"[--task-size]", "sort of size 1 has 10 problems", "--seed 1337"}},
      {{"--data", ""}, {"[--data] is empty"}},
      {{"--resume", ""}, {"[--resume] is empty"}},
      {{"--data", tmp / "bad.txt", "--task-size", "4"}, {"[--task-size] applies to the tasks, not to --data"}},
      {{"--data", tmp / "bad.txt", "--heldout", "4"}, {"[--heldout] applies to the tasks, not to --data"}},
      {{"--momentum", "0.5"}, {"[--momentum] applies to SGD, not to --optimizer adamw"}},
      {{"--attention-memory", "-2"}, {"[--attention-memory]", "-2"}},
      {{"--device", "cuda", "--attention-memory", "8"}, {"[--attention-memory] applies to the CPU's attention"}},
      {{"--optimizer", "sgd", "--beta2", "0.9"}, {"[--beta2] applies to AdamW, not to --optimizer sgd"}},
      {{"--schedule", "step"}, {"[--schedule] unknown schedule 'step' (cosine, linear, constant, wsd)"}},
      {{"--decay-fraction", "0.1"}, {"[--decay-fraction] applies to --schedule wsd, not to cosine"}},
      {{"--schedule", "wsd", "--decay-fraction", "0"}, {"[--decay-fraction] must be in (0, 1], got 0"}},
      // About 11 TB of activations: refused up front, not killed by the kernel mid-step.
      {{"--batch", "1048576", "--width", "1024", "--layers", "8"},
       {"[--batch] 1048576 sequences", "raise --grad-accum"}},
      {{"--batch", "1048576", "--width", "1024", "--layers", "8", "--block", "1024", "--fixed-split", "1024"},
       {"[--batch] 1048576 sequences of 1024 tokens in 1024 micro-batch(es)", "raise --fixed-split"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"train", "--out", out, "--quiet"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliResult r = cli(args);
    INFO(fmt::format("args {} -> {}", fmt::join(c.args, " "), r.err));
    CHECK(r.code != 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    for (const auto& e : c.expect) CHECK_THAT(r.err, Catch::Contains(e));
    CHECK_FALSE(fs::exists(out));
  }
  // An output directory that cannot be created.
  const CliResult r = cli({"train", "--out", tmp / "a_file/run", "--steps", "1", "--quiet"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("[--out]") && Catch::Contains("a_file"));
  // CUDA: this build's answer, whichever it is, names the flag. (With a device,
  // emulated ones too, there is no error to check, and no run is started: its
  // held-out evaluation alone takes minutes on the emulator under the sanitizers.)
  const auto cuda_run = [&] { return cli({"train", "--out", out, "--device", "cuda", "--steps", "1", "--quiet"}); };
  if (!cuda::built_with_cuda()) {
    const CliResult cuda = cuda_run();
    CHECK(cuda.code != 0);
    CHECK_THAT(cuda.err, Catch::Contains("[--device] cuda: this build has no CUDA backend"));
    CHECK_FALSE(fs::exists(out));
  } else if (cuda::device_count() == 0) {  // says why, in the runtime's words (an old driver, say)
    const CliResult cuda = cuda_run();
    CHECK(cuda.code != 0);
    CHECK(std::count(cuda.err.begin(), cuda.err.end(), '\n') == 1);
    CHECK_THAT(cuda.err, Catch::Contains("[--device] cuda: no CUDA device is present (cudaError"));
    CHECK_FALSE(fs::exists(out));
  }
  // The other commands.
  CHECK(cli({"sample"}).code != 0);  // --ckpt is required
  const CliResult missing = cli({"eval", "--ckpt", tmp / "nope.safetensors"});
  CHECK(missing.code != 0);
  CHECK_THAT(missing.err, Catch::Contains("nope.safetensors"));
}

// The memory check counts the probability tiles the attention keeps for
// backward (their bytes are checked against the allocation in
// test_attention.cpp): on heads of 64 values or more and at most 8 times as
// long, within 64 MiB a layer.
TEST_CASE("the memory estimate counts the probabilities each layer's attention keeps", "[train]") {
  train::TrainOptions o;
  o.block = 4096;
  o.width = 64;
  o.heads = 1;
  o.layers = 3;
  const double tile = (64 * 64 + 64) * sizeof(float);
  CHECK(train::model::backward_memory(o, 65, 1).probs_bytes == 0);  // automatic: 4096 positions, past 8 x 64
  o.attention_memory = 64;
  CHECK(train::model::backward_memory(o, 65, 1).probs_bytes == 3 * 2080 * tile);  // 64 x 65 / 2 causal tiles a head
  CHECK(train::model::backward_memory(o, 65, 2).probs_bytes == 3 * 2080 * tile);  // 69 MB a layer: one head's fits
  CHECK(train::model::backward_memory(o, 65, 4).probs_bytes == 3 * 2080 * tile);
  o.attention_memory = -1;
  o.block = 512;  // 512 x 512 / 2 probabilities, as many as q, k, v and the output's 4 x 512 x 64: kept
  CHECK(train::model::backward_memory(o, 65, 1).probs_bytes == 3 * 36 * tile);
  o.block = 520;  // one more position past 8 x 64: none
  CHECK(train::model::backward_memory(o, 65, 1).probs_bytes == 0);
  o.block = 100;
  CHECK(train::model::backward_memory(o, 65, 5).probs_bytes == 3 * 5 * 3 * tile);
  const double activations = train::model::backward_memory(o, 65, 5).activation_bytes;
  // 10 floats a layer and width per token, and the fused head and loss's chunk of logits (all 500 rows
  // here; their gradient written over them) and the head's gradient.
  CHECK(activations == (5 * 100 * 10.0 * 3 * 64 + 500 * 65 + 65 * 64) * sizeof(float));
  // GPT-2's vocabulary: a chunk of 128 MiB of logits whatever the batch, not the whole batch's.
  o.block = 1024, o.width = 768, o.layers = 12, o.heads = 12;
  const double head = train::model::backward_memory(o, 50304, 16).activation_bytes -
                      16 * 1024 * 10.0 * 12 * 768 * sizeof(float);
  CHECK(head == (640.0 * 50304 + 50304 * 768) * sizeof(float));
  o.block = 100, o.width = 64, o.layers = 3, o.heads = 1;
  o.heads = 2;  // heads of 32 values keep none
  CHECK(train::model::backward_memory(o, 65, 5).probs_bytes == 0);
  CHECK(train::model::backward_memory(o, 65, 5).activation_bytes == activations);
  o.attention_memory = 1;  // unless --attention-memory is given: 1 MiB holds the 10 heads' 3 tiles
  CHECK(train::model::backward_memory(o, 65, 5).probs_bytes == 3 * 10 * 3 * tile);
  o.heads = 1;
  o.block = 4096;
  o.attention_memory = 100;  // 3 of 4 heads' 34.6 MB
  CHECK(train::model::backward_memory(o, 65, 4).probs_bytes == 3 * 3 * 2080 * tile);
  o.attention_memory = 0;
  CHECK(train::model::backward_memory(o, 65, 4).probs_bytes == 0);
}

// --attention-memory reaches every layer's attention, and the estimate is what
// a training forward holds.
TEST_CASE("the attention memory flag sets what the model's attention keeps, as the estimate says", "[train]") {
  train::TrainOptions o;
  o.block = 100;  // 3 causal tiles a head
  o.width = 64;
  o.heads = 1;
  o.layers = 2;
  const std::int64_t batch = 2;
  Generator gen(5);
  const Tensor tokens = kernels::cast(kernels::unary(kernels::Unary::mul_scalar, rand({batch, 100}, {DType::f64}, gen),
                                                     64.99),
                                      DType::i64);
  const auto held = [&](std::int64_t mib) {
    o.attention_memory = mib;
    CHECK(train::model::gpt_config(o, 65).saved_probs_limit == (mib < 0 ? kAutoSavedProbsLimit : mib << 20));
    const auto model = train::model::build_model(o, 65);
    const std::size_t before = cpu_alloc_stats().bytes_in_use;
    const Tensor loss = model->loss(tokens, tokens);
    return static_cast<double>(cpu_alloc_stats().bytes_in_use - before);
  };
  const double none = held(0);
  o.attention_memory = 1;
  const double tiles = train::model::backward_memory(o, 65, batch).probs_bytes;
  CHECK(tiles == 2 * 2 * 3 * (64 * 64 + 64) * sizeof(float));
  CHECK(held(1) == none + tiles);
  CHECK(held(-1) == none + tiles);  // automatic: heads of 64 values
}

// Under mpirun every process parses the same command line, and rank 0 alone
// reports a mistake in it. A rank variable with no launch of several
// processes around it (left in a shell, say) must not silence the error.
TEST_CASE("a command-line error is reported by rank 0 of a launch, and by a process no launch started", "[train]") {
  const auto says_error = [] {
    const CliResult r = cli({"train", "--no-such-flag"});
    CHECK(r.code == 2);
    return r.err.find("attograd: error: ") != std::string::npos && r.err.find("--no-such-flag") != std::string::npos;
  };
  CHECK(says_error());
  {
    const ScopedEnv rank("OMPI_COMM_WORLD_RANK", "1"), size("OMPI_COMM_WORLD_SIZE", nullptr);
    CHECK(says_error());  // a stray rank, no launch
  }
  {
    const ScopedEnv rank("OMPI_COMM_WORLD_RANK", "3"), size("OMPI_COMM_WORLD_SIZE", "2");
    CHECK(says_error());  // not a rank of this launch
  }
  {
    const ScopedEnv rank("OMPI_COMM_WORLD_RANK", "0"), size("OMPI_COMM_WORLD_SIZE", "2");
    CHECK(says_error());
  }
  const ScopedEnv rank("OMPI_COMM_WORLD_RANK", "1"), size("OMPI_COMM_WORLD_SIZE", "2");
  CHECK_FALSE(says_error());  // rank 1 of 2: rank 0 speaks for it
}

// ---- tasks -------------------------------------------------------------------------

TEST_CASE("task generators give correct answers", "[train]") {
  train::data::Task sort({train::data::TaskKind::sort, 8, 1, 10});
  train::data::Problem p = sort.make({3, 1, 4, 1, 5, 9, 2, 6});
  CHECK(p.prompt == "31415926=");
  CHECK(p.answer == "11234569");
  CHECK(train::data::Task({train::data::TaskKind::reverse, 8, 1, 10}).make({3, 1, 4, 1, 5, 9, 2, 6}).answer == "62951413");
  CHECK(train::data::Task({train::data::TaskKind::copy, 8, 1, 10}).make({3, 1, 4, 1, 5, 9, 2, 6}).answer == "31415926");
  train::data::Task add({train::data::TaskKind::add, 2, 1, 10});
  p = add.make({0, 7, 4, 5});
  CHECK(p.prompt == "07+45=");
  CHECK(p.answer == "250");  // 52, least significant digit first, 3 digits
  CHECK(add.make({9, 9, 9, 9}).answer == "891");  // 198
  CHECK(add.sequence_length() == 9);
  CHECK(sort.sequence_length() == 17);

  // Every training draw is a valid problem: check the answers independently.
  for (std::uint64_t i = 0; i < 200; ++i) {
    const train::data::Problem a = add.train_problem(i);
    const int x = std::stoi(a.prompt.substr(0, 2)), y = std::stoi(a.prompt.substr(3, 2));
    std::string want = fmt::format("{:03}", x + y);
    std::reverse(want.begin(), want.end());
    CHECK(a.answer == want);
    const train::data::Problem s = sort.train_problem(i);
    std::string digits = s.prompt.substr(0, 8);
    std::sort(digits.begin(), digits.end());
    CHECK(s.answer == digits);
  }
  REQUIRE_THROWS_WITH(train::data::parse_task("mul"), Catch::Contains("[--task] unknown task 'mul'"));
}

TEST_CASE("held-out problems never appear in training, and about one in ten is held out", "[train]") {
  // add with 2-digit operands: all 10,000 problems enumerated.
  train::data::Task add({train::data::TaskKind::add, 2, 42, 100000});
  std::set<std::string> heldout;
  for (const auto& p : add.heldout()) heldout.insert(p.prompt);
  CHECK(heldout.size() == add.heldout().size());  // distinct
  CHECK(heldout.size() > 850);
  CHECK(heldout.size() < 1150);
  for (std::uint64_t i = 0; i < 20000; ++i) CHECK(heldout.count(add.train_problem(i).prompt) == 0);
  // Every problem is either held out or a possible training draw, never both.
  std::set<std::string> trained;
  for (std::uint64_t i = 0; i < 150000; ++i) trained.insert(add.train_problem(i).prompt);
  CHECK(trained.size() + heldout.size() == 10000);

  // sort with 8 digits: sampled held-out set, disjoint from 20,000 training draws.
  train::data::Task sort({train::data::TaskKind::sort, 8, 42, 2000});
  REQUIRE(sort.heldout().size() == 2000);
  std::set<std::string> sort_heldout;
  for (const auto& p : sort.heldout()) sort_heldout.insert(p.prompt);
  CHECK(sort_heldout.size() == 2000);
  for (std::uint64_t i = 0; i < 20000; ++i) CHECK(sort_heldout.count(sort.train_problem(i).prompt) == 0);
  // A different seed splits differently.
  train::data::Task other({train::data::TaskKind::add, 2, 43, 100000});
  std::set<std::string> other_heldout;
  for (const auto& p : other.heldout()) other_heldout.insert(p.prompt);
  CHECK(other_heldout != heldout);
}

TEST_CASE("task batches: loss only on answer positions, a pure function of the step", "[train]") {
  train::data::Task sort({train::data::TaskKind::sort, 4, 7, 10});
  const train::data::Batch b = sort.train_batch(3, 5, 8);
  REQUIRE(b.tokens.sizes() == Shape{5, 8});
  const auto tokens = b.tokens.to_vector<std::int64_t>(), targets = b.targets.to_vector<std::int64_t>();
  for (int r = 0; r < 5; ++r) {
    const train::data::Problem p = sort.train_problem(3 * 5 + r);
    CHECK(sort.vocabulary().decode({tokens.begin() + r * 8, tokens.begin() + r * 8 + 8}) == (p.prompt + p.answer).substr(0, 8));
    for (int t = 0; t < 8; ++t) {
      // Positions 0..3 predict prompt tokens 1..4 ("=" is the 5th): ignored; 4..7 predict the answer.
      if (t < 4) CHECK(targets[r * 8 + t] == train::data::kIgnoreIndex);
      else CHECK(sort.vocabulary().characters().symbol(targets[r * 8 + t]) == static_cast<char32_t>(p.answer[t - 4]));
    }
  }
  CHECK(same_bits(sort.train_batch(3, 5, 8).tokens, b.tokens));
  CHECK_FALSE(same_bits(sort.train_batch(4, 5, 8).tokens, b.tokens));
  REQUIRE_THROWS_WITH(sort.train_batch(0, 5, 7), Catch::Contains("[--block]"));
}

// ---- text ----------------------------------------------------------------------------

TEST_CASE("UTF-8 decoding reports invalid bytes with their offset", "[train]") {
  CHECK(train::data::decode_utf8("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80") == std::vector<char32_t>{'a', 0xE9, 0x20AC, 0x1F600});
  CHECK(train::data::encode_utf8(std::vector<char32_t>{'a', 0xE9, 0x20AC, 0x1F600}) == "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  REQUIRE_THROWS_WITH(train::data::decode_utf8("abc\xFF"), Catch::Contains("invalid UTF-8 at byte 3"));
  REQUIRE_THROWS_WITH(train::data::decode_utf8("ab\xC3"), Catch::Contains("at byte 2") && Catch::Contains("truncated"));
  REQUIRE_THROWS_WITH(train::data::decode_utf8("\xC0\xAF"), Catch::Contains("overlong"));
  REQUIRE_THROWS_WITH(train::data::decode_utf8("x\xED\xA0\x80"), Catch::Contains("at byte 1") && Catch::Contains("surrogate"));
  REQUIRE_THROWS_WITH(train::data::decode_utf8("\x80"), Catch::Contains("at byte 0"));
}

TEST_CASE("text data: vocabulary by code point, disjoint split, contiguous windows", "[train]") {
  const std::string text = "h\xC3\xA9llo w\xC3\xB6rld, " + long_english_text();
  train::data::TextData data(text, "mem.txt", 5);
  const train::data::Tokenizer& tok = data.vocabulary().characters();
  CHECK(tok.contains(0xE9));
  CHECK(tok.contains(0xF6));
  CHECK(tok.decode(tok.encode(text)) == text);
  const auto n = static_cast<std::int64_t>(train::data::decode_utf8(text).size());
  CHECK(data.train_tokens() + data.validation_tokens() == n);
  CHECK(std::abs(data.validation_tokens() - n / 10) <= 1);
  CHECK(data.unigram_entropy() > 1.0);

  const train::data::Batch b = data.train_batch(2, 4, 16);
  REQUIRE(b.tokens.sizes() == Shape{4, 16});
  const auto x = b.tokens.to_vector<std::int64_t>(), y = b.targets.to_vector<std::int64_t>();
  const std::string train_text = tok.decode(tok.encode(text)).substr(0);  // same text
  const auto ids = tok.encode(text);
  for (int r = 0; r < 4; ++r) {
    // The row is a window of the training split and the targets are it shifted by one.
    for (int t = 0; t + 1 < 16; ++t) CHECK(y[r * 16 + t] == x[r * 16 + t + 1]);
    bool found = false;
    for (std::int64_t s = 0; s + 17 <= data.train_tokens() && !found; ++s)
      found = std::equal(x.begin() + r * 16, x.begin() + r * 16 + 16, ids.begin() + s) && ids[s + 16] == y[r * 16 + 15];
    CHECK(found);
  }
  const train::data::Batch eval = data.eval_batch(0, 3, 16);
  CHECK(eval.tokens.to_vector<std::int64_t>()[0] == ids[data.train_tokens()]);  // validation starts after training
  REQUIRE_THROWS_WITH(data.train_batch(0, 1, 100000), Catch::Contains("[--data]") && Catch::Contains("too short"));
  // A checkpoint's vocabulary must cover a new file.
  REQUIRE_THROWS_WITH(train::data::TextData("xyz!", "new.txt", 1, train::data::Tokenizer::from_text("xyz")),
                      Catch::Contains("'!' is not in the model's vocabulary"));
  REQUIRE(train::data::Tokenizer::from_json(tok.to_json()).size() == tok.size());
}

// ---- schedule, clipping ---------------------------------------------------------------

TEST_CASE("learning rate: linear warm-up then cosine to min_lr", "[train]") {
  train::TrainOptions o;
  o.lr = 1.0, o.warmup = 10, o.steps = 110, o.min_lr_ratio = 0.1;
  CHECK(train::optim::learning_rate(o, 1) == Approx(0.1));
  CHECK(train::optim::learning_rate(o, 10) == Approx(1.0));
  CHECK(train::optim::learning_rate(o, 60) == Approx(0.55));  // halfway through the cosine
  CHECK(train::optim::learning_rate(o, 110) == Approx(0.1));
  o.warmup = 0;
  CHECK(train::optim::learning_rate(o, 1) < 1.0);
  CHECK(train::optim::learning_rate(o, 1) > 0.99);
}

TEST_CASE("learning rate: linear, constant and warmup-stable-decay schedules after the same warm-up", "[train]") {
  train::TrainOptions o;
  o.lr = 1.0, o.warmup = 10, o.steps = 110, o.min_lr_ratio = 0.1;
  const auto lr = [&](std::int64_t step) { return train::optim::learning_rate(o, step); };
  o.schedule = "linear";
  CHECK(lr(5) == Approx(0.5));
  CHECK(lr(10) == Approx(1.0));
  CHECK(lr(60) == Approx(0.55));  // halfway down the line
  CHECK(lr(85) == Approx(0.325));
  CHECK(lr(110) == Approx(0.1));
  o.schedule = "constant";
  CHECK(lr(5) == Approx(0.5));
  for (std::int64_t step : {10, 60, 110}) CHECK(lr(step) == 1.0);
  o.schedule = "wsd", o.decay_fraction = 0.2;  // stable to step 88, then down over the last 22
  CHECK(lr(5) == Approx(0.5));
  CHECK(lr(60) == 1.0);
  CHECK(lr(88) == 1.0);
  CHECK(lr(99) == Approx(0.55));
  CHECK(lr(110) == Approx(0.1));
  o.decay_fraction = 1.0;  // the whole run decays, but not the warm-up
  CHECK(lr(10) == Approx(1.0));
  CHECK(lr(60) == Approx(0.55));
  // A run's schedule is in its checkpoint's config.
  o.schedule = "wsd", o.decay_fraction = 0.3;
  const train::TrainOptions back = train::config_from_json(train::config_to_json(o));
  CHECK(back.schedule == "wsd");
  CHECK(back.decay_fraction == 0.3);
  CHECK(train::config_from_json(R"({"task":"sort","task_size":4,"heldout":10,"data":"","layers":1,"heads":1,"width":8,"block":8,"dropout":0,"optimizer":"adamw","batch":2,"steps":3,"lr":0.1,"warmup":0,"min_lr_ratio":0.1,"weight_decay":0,"beta1":0.9,"beta2":0.99,"momentum":0.9,"grad_clip":1,"seed":1})")
            .schedule == "cosine");  // before there was a choice
}

TEST_CASE("gradient clipping by global norm", "[train]") {
  Tensor a = from({3, 0}, {2}), b = from({4}, {1});
  a.set_requires_grad(true), b.set_requires_grad(true);
  a.set_grad(from({3, 0}, {2}));
  b.set_grad(from({4}, {1}));
  const std::vector<nn::NamedParameter> params = {{"a", a, true}, {"b", b, false}};
  CHECK(train::optim::clip_grad_norm(params, 10) == Approx(5));  // under the limit: unchanged
  CHECK(a.grad().to_vector<float>() == std::vector<float>{3, 0});
  CHECK(train::optim::clip_grad_norm(params, 1) == Approx(5));
  CHECK(a.grad().to_vector<float>()[0] == Approx(0.6).epsilon(1e-5));
  CHECK(b.grad().to_vector<float>()[0] == Approx(0.8).epsilon(1e-5));
}

// The passes clipping makes over every gradient: against a long double sum of
// the float64 squares; the same bits on 1 and 2 threads (fixed chunks of 65536,
// so sizes around them); scale_ with mul_scalar's bits; float64 too; bad lists refused.
TEST_CASE("sum_of_squares and scale_ over many tensors: float64 sums in a fixed order, mul_scalar's bits", "[train]") {
  for (const DType dtype : {DType::f32, DType::f64}) {
    INFO(dtype_name(dtype));
    std::vector<Tensor> tensors;
    long double want = 0;
    std::uint64_t seed = 40;
    for (const std::int64_t n : {0, 1, 7, 65536, 70001, 131073}) {
      Generator gen(seed++);
      tensors.push_back(kernels::cast(randn({n}, {DType::f64}, gen), dtype));
      const Tensor wide = kernels::cast(tensors.back(), DType::f64);
      for (const double x : wide.to_vector<double>()) want += static_cast<long double>(x) * x;
    }
    const int threads = get_num_threads();
    set_num_threads(1);
    const double one_thread = kernels::sum_of_squares(tensors);
    set_num_threads(2);
    const double two_threads = kernels::sum_of_squares(tensors);
    set_num_threads(threads);
    CHECK(std::memcmp(&one_thread, &two_threads, sizeof(double)) == 0);
    CHECK(std::abs(two_threads - static_cast<double>(want)) <= 1e-13 * static_cast<double>(want));

    std::vector<Tensor> expected;
    for (const Tensor& t : tensors) expected.push_back(kernels::unary(kernels::Unary::mul_scalar, t, 0.3));
    kernels::scale_(tensors, 0.3);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      INFO("tensor " << i);
      CHECK(kernels::cast(tensors[i], DType::f64).to_vector<double>() ==
            kernels::cast(expected[i], DType::f64).to_vector<double>());  // exact: float32 widens exactly
    }
  }
  CHECK(kernels::sum_of_squares({}) == 0.0);
  Generator gen(50);
  const Tensor base = randn({3, 4}, {DType::f32}, gen);
  const Tensor transposed = make_view(base, {4, 3}, {1, 4}, 0);
  CHECK_THROWS_WITH(kernels::sum_of_squares({base, transposed}),
                    Catch::Contains("sum_of_squares") && Catch::Contains("tensor 1 of 2 is not contiguous"));
  CHECK_THROWS_WITH(kernels::scale_({kernels::cast(base, DType::bf16)}, 2.0), Catch::Contains("scale_"));
  CHECK_THROWS_WITH(kernels::sum_of_squares({base, kernels::cast(base, DType::f64)}), Catch::Contains("sum_of_squares"));
}

// A gradient in another layout (a transposed view) or in bfloat16 is clipped as the others are.
TEST_CASE("gradient clipping takes gradients of any layout and bfloat16 ones", "[train]") {
  Tensor a = from({3, 0, 0, 0}, {2, 2}), b = from({4}, {1});
  a.set_requires_grad(true), b.set_requires_grad(true);
  const Tensor g = from({3, 0, 0, 0}, {2, 2});
  a.set_grad(make_view(g, {2, 2}, {1, 2}, 0));  // transposed: not contiguous
  b.set_grad(kernels::cast(from({4}, {1}), DType::bf16));
  const std::vector<nn::NamedParameter> params = {{"a", a, true}, {"b", b, false}};
  CHECK(train::optim::clip_grad_norm(params, 1) == Approx(5));
  CHECK(a.grad().at({0, 0}) == Approx(0.6).epsilon(1e-5));
  CHECK(kernels::cast(b.grad(), DType::f32).to_vector<float>()[0] == Approx(0.8).epsilon(1e-2));
}

// ---- safetensors ------------------------------------------------------------------------

TEST_CASE("safetensors round trip and layout", "[train]") {
  const Tensor f = from({1.5f, -2.f, 3.25f, 0.f, 7.f, 8.f}, {2, 3});
  const Tensor d = from<double>({1e-300, 2.5}, {2});
  const Tensor i = from_vector(std::vector<std::int64_t>{-1, 2, 1LL << 40}, {3});
  const Tensor s = scalar_tensor(4.0);
  const std::string bytes = train::output::serialize_safetensors({{"w", f}, {"d", d}, {"i", i}, {"s", s}, {"empty", zeros({0, 3})}},
                                                  {{"note", "héllo"}, {"json", "{\"a\": 1}"}});
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);  // data starts aligned
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  CHECK(header["w"]["dtype"] == "F32");
  CHECK(header["w"]["shape"] == nlohmann::json::array({2, 3}));
  CHECK(header["w"]["data_offsets"] == nlohmann::json::array({0, 24}));
  CHECK(header["d"]["dtype"] == "F64");
  CHECK(header["i"]["dtype"] == "I64");
  CHECK(header["__metadata__"]["note"] == "héllo");
  CHECK(bytes.size() == 8 + n + 24 + 16 + 24 + 4);

  const train::output::Safetensors back = train::output::parse_safetensors(bytes);
  CHECK(same_bits(back.tensors.at("w"), f));
  CHECK(same_bits(back.tensors.at("d"), d));
  CHECK(same_bits(back.tensors.at("i"), i));
  CHECK(back.tensors.at("s").dim() == 0);
  CHECK(back.tensors.at("empty").sizes() == Shape{0, 3});
  CHECK(back.metadata.at("json") == "{\"a\": 1}");

  // A non-contiguous view is written as its values.
  const Tensor t = transpose(f, 0, 1);
  CHECK(same_bits(train::output::parse_safetensors(train::output::serialize_safetensors({{"t", t}})).tensors.at("t"), contiguous(t)));
  REQUIRE_THROWS_WITH(train::output::serialize_safetensors({{"m", zeros({2}, {DType::b8})}}), Catch::Contains("'m'"));

  TempDir tmp;
  train::output::save_safetensors(tmp / "x.safetensors", {{"w", f}}, {{"k", "v"}});
  CHECK(same_bits(train::output::load_safetensors(tmp / "x.safetensors").tensors.at("w"), f));
  for (const auto& entry : fs::directory_iterator(tmp.path))  // no temporary left behind
    CHECK(entry.path().filename() == "x.safetensors");
  REQUIRE_THROWS_WITH(train::output::save_safetensors(tmp / "no/such/dir/x.safetensors", {{"w", f}}), Catch::Contains("cannot write"));
}

TEST_CASE("safetensors: a read of some tensors leaves the others unread, and still checks every entry", "[train]") {
  const Tensor f = from({1.5f, -2.f, 3.25f}, {3}), g = from({4.f, 5.f}, {2});
  const std::string bytes = train::output::serialize_safetensors({{"keep", f}, {"skip", g}});
  const train::output::SafetensorsRead only_keep{.wanted = [](const std::string& name) { return name == "keep"; }};
  const train::output::Safetensors back = train::output::parse_safetensors(bytes, "x", only_keep);
  CHECK(back.tensors.size() == 1);
  CHECK(same_bits(back.tensors.at("keep"), f));
  // The unread tensor's entry claims a shape its bytes do not hold: refused all the same.
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  std::string header = bytes.substr(8, n);
  const std::size_t shape = header.find("[2]");
  REQUIRE(shape != std::string::npos);
  header.replace(shape, 3, "[3]");
  const std::string damaged = bytes.substr(0, 8) + header + bytes.substr(8 + n);
  CHECK_THROWS_WITH(train::output::parse_safetensors(damaged, "x", only_keep), Catch::Contains("'skip' data_offsets"));
  // From a file: mapped, each tensor's pages let go once copied, the same values.
  TempDir tmp;
  train::output::save_safetensors(tmp / "x.safetensors", {{"keep", f}, {"skip", g}});
  const train::output::Safetensors loaded = train::output::load_safetensors(tmp / "x.safetensors", "--ckpt", only_keep);
  CHECK(loaded.tensors.size() == 1);
  CHECK(same_bits(loaded.tensors.at("keep"), f));
}

TEST_CASE("malformed safetensors files give clear errors", "[train]") {
  const std::string good = train::output::serialize_safetensors({{"a", from({1, 2}, {2})}, {"b", from({3, 4, 5}, {3})}});
  std::uint64_t n;
  std::memcpy(&n, good.data(), 8);
  const std::string data = good.substr(8 + n);
  const auto with_header = [&](const std::string& json, const std::string& body) {
    std::string s(8, '\0');
    const std::uint64_t len = json.size();
    std::memcpy(s.data(), &len, 8);
    return s + json + body;
  };
  const auto with_length = [&](std::uint64_t len) {
    std::string s = good;
    std::memcpy(s.data(), &len, 8);
    return s;
  };
  struct Case {
    std::string bytes, expect;
  };
  const std::vector<Case> cases = {
      {"", "truncated"},
      {good.substr(0, 5), "truncated"},
      {good.substr(0, 8 + n - 3), "truncated"},
      {good.substr(0, good.size() - 4), "out of range: the data section holds 16 bytes"},
      {good + "xx", "the data section holds 22 bytes but the tensors cover 20"},
      {with_length(train::output::kMaxSafetensorsHeader + 1), "exceeds the limit"},
      {with_length(~std::uint64_t{0}), "exceeds the limit"},
      {with_header("{not json", ""), "not valid JSON"},
      {with_header("[1, 2]", ""), "must be a JSON object"},
      {with_header(R"({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})", "abcd"), "unknown dtype"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [2]}})", "abcdefgh"), "needs dtype, shape and data_offsets"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", "abcdefgh"), "non-negative"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 80]}})", "abcdefgh"), "out of range"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", "abcdefgh"), "out of range"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "abcdefgh"), "needs 12"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 8]}})",
                   "abcdefgh"),
       "'a' shape"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                   std::string(12, 'x')),
       "overlaps"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                       "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                   std::string(12, 'x')),
       "gap"},
      {with_header(R"({"__metadata__": {"k": 1}})", ""), "__metadata__ 'k' is not a string"},
      {with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]}})", "abcd"), "data_offsets"},
  };
  for (const Case& c : cases) {
    INFO(c.expect);
    REQUIRE_THROWS_WITH(train::output::parse_safetensors(c.bytes, "f.safetensors"),
                        Catch::Contains("[f.safetensors]") && Catch::Contains(c.expect));
  }
  CHECK(train::output::parse_safetensors(with_header(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", data.substr(0, 8)))
            .tensors.size() == 1);
}

// ---- whole runs --------------------------------------------------------------------------

TEST_CASE("a tiny run writes a checkpoint, metrics.jsonl and loss.svg", "[train]") {
  TempDir tmp;
  train::TrainOptions o = tiny(tmp / "run");
  const train::cli::TrainSummary s = train::cli::train_command(o, null_out());
  CHECK(s.steps_done == 6);
  REQUIRE(s.accuracy.has_value());
  CHECK(std::isfinite(s.val_loss));

  // metrics.jsonl: one train record per step and one eval record per evaluation, in order.
  std::ifstream in(tmp / "run/metrics.jsonl");
  std::string line;
  std::vector<nlohmann::json> records;
  while (std::getline(in, line)) records.push_back(nlohmann::json::parse(line));
  REQUIRE(records.size() == 6 + 2);
  std::int64_t train_steps = 0, evals = 0;
  for (const auto& r : records) {
    if (r["kind"] == "train") {
      CHECK(r["step"] == ++train_steps);
      CHECK(r["loss"].get<double>() > 0);
      CHECK(r["lr"].get<double>() > 0);
      CHECK(r["tokens_per_s"].get<double>() > 0);
      CHECK(r.contains("grad_norm"));
    } else {
      CHECK(r["kind"] == "eval");
      CHECK(r["step"] == 3 * ++evals);
      CHECK(r["val_loss"].get<double>() > 0);
      CHECK(r["accuracy"].get<double>() >= 0);
    }
  }

  const std::string svg = file_text(tmp / "run/loss.svg");
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") == svg.size() - 7);
  CHECK_THAT(svg, Catch::Contains(">step<") && Catch::Contains("loss (cross-entropy") &&
                      Catch::Contains("validation") && Catch::Contains("<polyline"));
  // Balanced elements: every opened tag is closed or self-closing.
  std::size_t opened = 0, closed = 0, self_closed = 0;
  for (std::size_t p = svg.find('<'); p != std::string::npos; p = svg.find('<', p + 1)) {
    if (svg[p + 1] == '/') ++closed;
    else ++opened;
  }
  for (std::size_t p = svg.find("/>"); p != std::string::npos; p = svg.find("/>", p + 1)) ++self_closed;
  CHECK(opened == closed + self_closed);

  const train::output::LoadedCheckpoint ck = train::output::load_checkpoint(tmp / "run/ckpt.safetensors");
  CHECK(ck.info.step == 6);
  CHECK(ck.info.config.task == "sort");
  CHECK(ck.info.config.width == 16);
  CHECK(ck.optimizer_name == "adamw");
  CHECK(ck.optimizer_steps == 6);
  CHECK(ck.optimizer_state.count("exp_avg.wte.weight") == 1);
  CHECK(ck.info.vocabulary.size() == 12);
}

TEST_CASE("checkpoint round trip: parameters bitwise, config, vocabulary, bad checkpoints refused", "[train]") {
  TempDir tmp;
  train::TrainOptions o = tiny(tmp / "run");
  o.dropout = 0.1;
  train::cli::train_command(o, null_out());
  const std::string path = tmp / "run/ckpt.safetensors";
  const train::output::LoadedCheckpoint a = train::output::load_checkpoint(path);
  // Save what was loaded and load it again: every tensor and the metadata survive.
  train::output::save_checkpoint(tmp / "again.safetensors", *a.model, nullptr, a.info);
  const train::output::LoadedCheckpoint b = train::output::load_checkpoint(tmp / "again.safetensors");
  const auto pa = a.model->named_parameters(), pb = b.model->named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t k = 0; k < pa.size(); ++k) {
    CHECK(pa[k].name == pb[k].name);
    CHECK(same_bits(pa[k].tensor, pb[k].tensor));
  }
  CHECK(train::config_to_json(a.info.config) == train::config_to_json(b.info.config));
  CHECK(a.info.vocabulary.to_json() == b.info.vocabulary.to_json());
  CHECK(a.model->drop.generator->offset() == b.model->drop.generator->offset());
  CHECK(a.model->drop.generator->offset() > 0);  // dropout drew numbers

  // Not a checkpoint, a wrong shape, a truncated file.
  train::output::save_safetensors(tmp / "plain.safetensors", {{"w", zeros({2})}});
  REQUIRE_THROWS_WITH(train::output::load_checkpoint(tmp / "plain.safetensors"), Catch::Contains("not an attograd checkpoint"));
  train::output::Safetensors raw = train::output::load_safetensors(path);
  raw.tensors["wpe.weight"] = zeros({3, 16});
  train::output::NamedTensors named(raw.tensors.begin(), raw.tensors.end());
  train::output::save_safetensors(tmp / "shape.safetensors", named, raw.metadata);
  REQUIRE_THROWS_WITH(train::output::load_checkpoint(tmp / "shape.safetensors"), Catch::Contains("wpe.weight"));
  const std::string bytes = file_text(path);
  write_text(tmp / "cut.safetensors", bytes.substr(0, bytes.size() / 2));
  REQUIRE_THROWS_WITH(train::output::load_checkpoint(tmp / "cut.safetensors"), Catch::Contains("cut.safetensors"));
  const CliResult r = cli({"sample", "--ckpt", tmp / "cut.safetensors"});
  CHECK(r.code != 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("bfloat16 runs: the checkpoint keeps the dtype and float32 weights, resumes bit for bit, evaluates either way",
          "[train][bf16]") {
  TempDir tmp;
  train::TrainOptions whole = tiny(tmp / "whole");
  whole.dtype = "bfloat16";
  whole.dropout = 0.2;
  whole.steps = 8;
  train::cli::train_command(whole, null_out());
  train::TrainOptions first = whole;
  first.out = tmp / "split";
  first.stop_at = 4;
  train::cli::train_command(first, null_out());
  train::TrainOptions rest;
  rest.resume = tmp / "split/ckpt.safetensors";  // no --dtype: the checkpoint's
  rest.quiet = true;
  rest.steps = 0;
  rest.eval_interval = 3;
  train::cli::train_command(rest, null_out());
  const train::output::Safetensors a = train::output::load_safetensors(tmp / "whole/ckpt.safetensors");
  const train::output::Safetensors b = train::output::load_safetensors(tmp / "split/ckpt.safetensors");
  CHECK(nlohmann::json::parse(a.metadata.at("config"))["dtype"] == "bfloat16");
  for (const auto& [name, t] : a.tensors) {
    INFO(name);
    CHECK(t.dtype() == DType::f32);  // master weights and optimizer state
    CHECK(same_bits(t, b.tensors.at(name)));
  }
  const std::string ckpt = tmp / "whole/ckpt.safetensors";
  const double in_bf16 = train::cli::eval_command({.ckpt = ckpt}, null_out()).loss;
  const double in_f32 = train::cli::eval_command({.ckpt = ckpt, .dtype = "float32"}, null_out()).loss;
  CHECK(in_bf16 != in_f32);  // the checkpoint's dtype by default, float32 when asked
  CHECK(std::abs(in_bf16 - in_f32) <= 8 * kBf16UnitRoundoff * in_f32);
  CHECK_FALSE(train::cli::sample_command({.ckpt = ckpt, .tokens = 5}, null_out()).empty());
}

TEST_CASE("resume: N steps + N resumed steps give bitwise the parameters of 2N steps", "[train]") {
  for (const std::string optimizer : {"adamw", "sgd"}) {
    TempDir tmp;
    train::TrainOptions whole = tiny(tmp / "whole");
    whole.dropout = 0.2;  // the dropout generator's state must be restored too
    whole.optimizer = optimizer;
    whole.steps = 8;
    train::cli::train_command(whole, null_out());

    train::TrainOptions first = whole;
    first.out = tmp / "split";
    first.stop_at = 4;
    CHECK(train::cli::train_command(first, null_out()).steps_done == 4);
    train::TrainOptions rest;
    rest.resume = tmp / "split/ckpt.safetensors";
    rest.quiet = true;
    rest.steps = 0;          // the checkpoint's
    rest.eval_interval = 3;  // the run's own setting, as the whole run's
    CHECK(train::cli::train_command(rest, null_out()).steps_done == 8);

    const train::output::Safetensors a = train::output::load_safetensors(tmp / "whole/ckpt.safetensors");
    const train::output::Safetensors b = train::output::load_safetensors(tmp / "split/ckpt.safetensors");
    REQUIRE(a.tensors.size() == b.tensors.size());
    INFO(optimizer);
    for (const auto& [name, t] : a.tensors) {
      INFO(name);
      CHECK(same_bits(t, b.tensors.at(name)));  // parameters and optimizer state
    }
    CHECK(a.metadata.at("rng") == b.metadata.at("rng"));
    // The resumed run's metrics.jsonl holds the whole history: 8 steps, once each.
    std::ifstream in(tmp / "split/metrics.jsonl");
    std::string line;
    std::int64_t train_lines = 0;
    while (std::getline(in, line)) train_lines += nlohmann::json::parse(line)["kind"] == "train";
    CHECK(train_lines == 8);
  }
  // Model flags cannot change on resume.
  TempDir tmp;
  train::cli::train_command(tiny(tmp / "r"), null_out());
  const CliResult r = cli({"train", "--resume", tmp / "r/ckpt.safetensors", "--width", "32"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("[--resume] --width cannot be changed"));
}

TEST_CASE("same seed and threads give the same loss curve, another seed does not", "[train]") {
  TempDir tmp;
  const auto losses = [&](const std::string& dir, std::uint64_t seed) {
    train::TrainOptions o = tiny(tmp / dir, "add");
    o.seed = seed;
    o.dropout = 0.1;
    train::cli::train_command(o, null_out());
    std::vector<double> out;
    std::ifstream in(tmp / dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      out.push_back(j["kind"] == "train" ? j["loss"].get<double>() : j["val_loss"].get<double>());
    }
    return out;
  };
  const auto a = losses("a", 11), b = losses("b", 11), c = losses("c", 12);
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("text runs: train, eval and sample on a small file", "[train]") {
  TempDir tmp;
  write_text(tmp / "fox.txt", long_english_text());
  const CliResult r = cli({"train", "--data", tmp / "fox.txt", "--out", tmp / "run", "--layers", "1", "--width", "16",
                           "--heads", "2", "--block", "16", "--batch", "4", "--steps", "4", "--eval-interval", "2",
                           "--quiet"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("unigram entropy"));
  const std::string ckpt = tmp / "run/ckpt.safetensors";
  const train::cli::EvalSummary e = train::cli::eval_command({.ckpt = ckpt}, null_out());
  CHECK(e.loss > 0);
  CHECK_FALSE(e.accuracy.has_value());
  const std::string text = train::cli::sample_command({.ckpt = ckpt, .prompt = "The ", .tokens = 20, .seed = 3}, null_out());
  CHECK(text.rfind("The ", 0) == 0);
  CHECK(train::data::decode_utf8(text).size() == 24);
  const CliResult bad = cli({"sample", "--ckpt", ckpt, "--prompt", "Zebra"});
  CHECK(bad.code != 0);
  CHECK_THAT(bad.err, Catch::Contains("[--prompt] 'Z' is not in the model's vocabulary"));
}

TEST_CASE("eval reads every window of the validation split, and --max-batches caps it and says so", "[train]") {
  // A text whose validation split holds more than 500 windows of 4 characters: more than the 256
  // that training-time evaluations read, and more than one evaluation batch (500 rows).
  TempDir tmp;
  std::string text;
  for (int i = 0; text.size() < 24000; ++i) text += fmt::format("{} foxes jump over {} dogs. ", i % 97, i % 13);
  write_text(tmp / "fox.txt", text);
  const std::int64_t block = 4;
  const CliResult trained = cli({"train", "--data", tmp / "fox.txt", "--out", tmp / "run", "--layers", "1", "--width",
                                 "16", "--heads", "2", "--block", "4", "--batch", "4", "--steps", "2",
                                 "--eval-interval", "2", "--quiet"});
  INFO(trained.err);
  REQUIRE(trained.code == 0);
  const std::string ckpt = tmp / "run/ckpt.safetensors";

  // The windows, worked out here from the file: the last 10% of its characters, tiled from the start
  // by non-overlapping windows of block inputs and block shifted targets.
  train::output::LoadedCheckpoint ck = train::output::load_checkpoint(ckpt);
  const std::vector<std::int64_t> ids = ck.info.vocabulary.encode(text, "test");
  const auto n = static_cast<std::int64_t>(ids.size());
  const std::int64_t split = std::llround(static_cast<double>(n) * 0.9);
  const std::int64_t windows = (n - split - 1) / block;
  REQUIRE(windows > 500);
  REQUIRE(windows < 1000);  // two evaluation batches
  // The mean loss over the first `count` windows: the log-softmax by hand, in double, 7 windows per pass.
  const auto mean_loss = [&](std::int64_t count) {
    NoGradGuard no_grad;
    ck.model->eval();
    double sum = 0;
    for (std::int64_t w0 = 0; w0 < count; w0 += 7) {
      const std::int64_t B = std::min<std::int64_t>(7, count - w0);
      std::vector<std::int64_t> x(ids.begin() + split + w0 * block, ids.begin() + split + (w0 + B) * block);
      const std::int64_t V = ck.info.vocabulary.size();
      const auto logits = ck.model->forward(from_vector(x, {B, block})).to_vector<float>();  // (B, T, V)
      for (std::int64_t i = 0; i < B * block; ++i) {
        const float* row = logits.data() + i * V;
        const double top = *std::max_element(row, row + V);
        double z = 0;
        for (std::int64_t v = 0; v < V; ++v) z += std::exp(row[v] - top);
        sum += top + std::log(z) - row[ids[split + w0 * block + i + 1]];
      }
    }
    return sum / static_cast<double>(count * block);
  };

  // Training-time evaluations read the first 256 windows, and say so.
  CHECK_THAT(trained.out, Catch::Contains(fmt::format("over the first 256 of {} validation windows", windows)));
  double logged = -1;  // the step-2 evaluation's loss, at full precision
  std::ifstream metrics(tmp / "run/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (const auto j = nlohmann::json::parse(line); j["kind"] == "eval") logged = j["val_loss"].get<double>();
  CHECK(logged == Approx(mean_loss(256)).margin(1e-5));
  // `eval` reads all of them.
  const CliResult all = cli({"eval", "--ckpt", ckpt});
  INFO(all.err);
  REQUIRE(all.code == 0);
  CHECK_THAT(all.out, Catch::Contains(fmt::format("over the whole validation split: all {} windows of 4 characters "
                                                  "({} tokens)",
                                                  windows, train::model::thousands(windows * block))));
  const train::cli::EvalSummary e = train::cli::eval_command({.ckpt = ckpt}, null_out());
  CHECK(e.examples == windows);
  CHECK(e.heldout == windows);
  CHECK(e.targets == windows * block);
  CHECK(e.loss == Approx(mean_loss(windows)).margin(1e-5));
  CHECK(std::abs(e.loss - mean_loss(256)) > 1e-4);  // so the cap would have shown

  // --max-batches 1: the first 500 windows, and the line says so; 2 or more: all of them.
  const CliResult capped = cli({"eval", "--ckpt", ckpt, "--max-batches", "1"});
  REQUIRE(capped.code == 0);
  CHECK_THAT(capped.out, Catch::Contains(fmt::format("over the first 500 of {} windows of 4 characters of the "
                                                     "validation split (2,000 tokens; --max-batches 1 of 2 batches)",
                                                     windows)));
  const train::cli::EvalSummary first = train::cli::eval_command({.ckpt = ckpt, .max_batches = 1}, null_out());
  CHECK(first.examples == 500);
  CHECK(first.heldout == windows);
  CHECK(first.loss == Approx(mean_loss(500)).margin(1e-5));
  for (const std::int64_t n_batches : {2, 3, 1000000})
    CHECK(train::cli::eval_command({.ckpt = ckpt, .max_batches = n_batches}, null_out()).examples == windows);

  // Bad values: one line naming the flag and the value, a non-zero exit.
  for (const std::string bad : {"0", "-1", "two", "99999999999999999999"}) {
    const CliResult r = cli({"eval", "--ckpt", ckpt, "--max-batches", bad});
    INFO(bad << " -> " << r.err);
    CHECK(r.code != 0);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Catch::Contains("--max-batches") && Catch::Contains(bad));
  }
}

TEST_CASE("a long pass shows its progress after a delay: in place on a terminal, every tenth otherwise", "[train]") {
  std::FILE* plain = std::tmpfile();
  train::cli::CountProgress lines(plain, "eval", "windows", {.interactive = false, .delay_s = 0});
  for (int done = 1; done <= 20; ++done) lines.update(done, 20);
  lines.finish();
  // 2, 4, ..., 18 of 20: nine lines; the end is the caller's own line.
  const std::string text = read_all(plain);
  CHECK(std::count(text.begin(), text.end(), '\n') == 9);
  CHECK(text.rfind("eval: 2/20 windows (10%)  ETA 0:00\n", 0) == 0);
  CHECK_THAT(text, Catch::Contains("eval: 18/20 windows (90%)"));
  CHECK(text.find('\r') == std::string::npos);

  std::FILE* terminal = std::tmpfile();
  train::cli::CountProgress live(terminal, "eval", "windows", {.interactive = true, .delay_s = 0});
  live.update(3, 10);
  live.finish();
  CHECK(read_all(terminal) == "\r\033[Keval: 3/10 windows (30%)  ETA 0:00\r\033[K");

  std::FILE* quiet = std::tmpfile();
  train::cli::CountProgress short_pass(quiet, "eval", "windows", {.interactive = false, .delay_s = 60});
  for (int done = 1; done <= 10; ++done) short_pass.update(done, 10);
  short_pass.finish();
  CHECK(read_all(quiet).empty());
}

// ---- generation, evaluation, attention ----------------------------------------------------

TEST_CASE("generation with the KV cache gives the tokens of generation without it", "[train]") {
  train::TrainOptions o = tiny("unused");
  o.block = 12;
  auto model = train::model::build_model(o, 12);
  const std::vector<std::int64_t> prompt = {1, 2, 3, 4, 5};
  for (const double temperature : {0.0, 1.0, 0.7}) {
    train::model::GenerateOptions g{.tokens = 30, .temperature = temperature, .top_k = temperature == 0.7 ? 3 : 0, .seed = 9};
    // 30 tokens past a 12-token block: the context restarts (and the cache refills) several times.
    g.use_cache = true;
    const auto cached = train::model::generate(*model, prompt, g);
    g.use_cache = false;
    const auto uncached = train::model::generate(*model, prompt, g);
    INFO("temperature " << temperature);
    CHECK(cached.size() == 35);
    CHECK(cached == uncached);
  }
  // A prompt longer than the block is cropped, not refused.
  const std::vector<std::int64_t> long_prompt(20, 3);
  CHECK(train::model::generate(*model, long_prompt, {.tokens = 2}).size() == 22);
  REQUIRE_THROWS_WITH(train::model::generate(*model, {}, {}), Catch::Contains("prompt"));
  // pick_token: greedy is argmax, top-1 is argmax at any temperature.
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f};
  CHECK(train::model::pick_token(logits, {.temperature = 0}, 0.99) == 1);
  CHECK(train::model::pick_token(logits, {.temperature = 5, .top_k = 1}, 0.99) == 1);
  CHECK(train::model::pick_token(logits, {.temperature = 1, .top_k = 2}, 0.999) == 3);
  CHECK(train::model::pick_token(logits, {.temperature = 1}, 0.0) == 0);
  // top-p: probabilities e^0, e^2, e^1, e^3 (0.03, 0.24, 0.09, 0.64): 0.6 keeps token 3 alone, 0.7 tokens 3 and 1.
  const std::vector<float> ranked = {0.0f, 2.0f, 1.0f, 3.0f};
  for (double u : {0.0, 0.5, 0.999}) CHECK(train::model::pick_token(ranked, {.top_p = 0.6}, u) == 3);
  CHECK(train::model::pick_token(ranked, {.top_p = 0.7}, 0.1) == 1);
  CHECK(train::model::pick_token(ranked, {.top_p = 0.7}, 0.9) == 3);
  CHECK(train::model::pick_token(ranked, {.top_p = 1.0}, 0.0) == 0);
  // Padded rows past vocab_limit are never drawn, greedy or not.
  CHECK(train::model::pick_token(ranked, {.temperature = 0, .vocab_limit = 3}, 0.5) == 1);
  for (double u : {0.0, 0.5, 0.999}) CHECK(train::model::pick_token(ranked, {.vocab_limit = 3}, u) != 3);
  // Generation ends after the stop token; each stream is its own draws, stream 0 the default.
  const std::vector<std::int64_t> greedy = train::model::generate(*model, {3, 1}, {.tokens = 6, .temperature = 0});
  const std::vector<std::int64_t> stopped =
      train::model::generate(*model, {3, 1}, {.tokens = 6, .temperature = 0, .stop_token = greedy[2]});
  CHECK(stopped == std::vector<std::int64_t>(greedy.begin(), greedy.begin() + 3));
  const auto drawn = [&](std::uint64_t stream) {
    return train::model::generate(*model, {3}, {.tokens = 30, .temperature = 2, .seed = 5, .stream = stream});
  };
  CHECK(drawn(0) == train::model::generate(*model, {3}, {.tokens = 30, .temperature = 2, .seed = 5}));
  CHECK(drawn(1) != drawn(0));
  CHECK(drawn(1) == drawn(1));
  REQUIRE_THROWS_WITH(train::model::generate(*model, {3}, {.top_p = 0}), Catch::Contains("[--top-p] must be in (0, 1]"));
}

TEST_CASE("exact match from one forward pass equals greedy decoding of every answer", "[train]") {
  TempDir tmp;
  train::TrainOptions o = tiny(tmp / "run", "add");
  o.layers = 2, o.width = 32, o.batch = 32, o.steps = 200, o.warmup = 10, o.eval_interval = 200, o.heldout = 120;
  train::cli::train_command(o, null_out());
  train::output::LoadedCheckpoint ck = train::output::load_checkpoint(tmp / "run/ckpt.safetensors");
  train::data::Task task({train::data::TaskKind::add, 2, o.seed, o.heldout});
  const train::model::EvalResult fast = train::model::evaluate(*ck.model, task);
  std::int64_t exact = 0;
  const train::data::Tokenizer& tok = task.vocabulary().characters();
  for (const train::data::Problem& p : task.heldout()) {
    const auto seq = train::model::generate(*ck.model, tok.encode(p.prompt),
                              {.tokens = static_cast<std::int64_t>(p.answer.size()), .temperature = 0});
    exact += tok.decode({seq.begin() + static_cast<std::ptrdiff_t>(p.prompt.size()), seq.end()}) == p.answer;
  }
  REQUIRE(fast.accuracy.has_value());
  CHECK(fast.examples == static_cast<std::int64_t>(task.heldout().size()));
  CHECK(*fast.accuracy == Approx(static_cast<double>(exact) / task.heldout().size()).margin(1e-12));
  // Some but not all right after 200 steps (about half), so the comparison means something.
  CHECK(exact > 0);
  CHECK(exact < static_cast<std::int64_t>(task.heldout().size()));
  // `eval` on a task reads every held-out problem, as training's evaluations do.
  const train::cli::EvalSummary e = train::cli::eval_command({.ckpt = tmp / "run/ckpt.safetensors"}, null_out());
  CHECK(e.accuracy == fast.accuracy);
  CHECK(e.examples == static_cast<std::int64_t>(task.heldout().size()));
  CHECK(e.heldout == e.examples);
  CHECK(e.targets == e.examples * 3);  // 3 answer digits each
  const CliResult line = cli({"eval", "--ckpt", tmp / "run/ckpt.safetensors"});
  CHECK_THAT(line.out, Catch::Contains(fmt::format("over all {} held-out problems (360 answer tokens), exact match {:.2f}%",
                                                   task.heldout().size(), 100 * *fast.accuracy)));
}

TEST_CASE("attention command draws every head as a causal heat map", "[train]") {
  TempDir tmp;
  train::cli::train_command(tiny(tmp / "run"), null_out());
  train::output::LoadedCheckpoint ck = train::output::load_checkpoint(tmp / "run/ckpt.safetensors");
  const Tensor tokens = from_vector(ck.info.vocabulary.encode("3141=", "test"), {1, 5});
  const auto maps = train::model::attention_weights(*ck.model, tokens);
  REQUIRE(maps.size() == 1);     // layers
  REQUIRE(maps[0].size() == 2);  // heads
  for (const auto& head : maps[0]) {
    REQUIRE(head.size() == 25);
    for (int q = 0; q < 5; ++q) {
      double row = 0;
      for (int k = 0; k < 5; ++k) {
        row += head[q * 5 + k];
        if (k > q) CHECK(head[q * 5 + k] == 0.0f);  // causal: no key after the query
      }
      CHECK(row == Approx(1.0).epsilon(1e-5));
    }
  }
  const CliResult r = cli({"attention", "--ckpt", tmp / "run/ckpt.safetensors", "--text", "3141=", "--out",
                           tmp / "att.svg"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const std::string svg = file_text(tmp / "att.svg");
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK_THAT(svg, Catch::Contains("layer 0, head 1"));
  CHECK(std::count(svg.begin(), svg.end(), '\n') > 50);
  const CliResult too_long = cli({"attention", "--ckpt", tmp / "run/ckpt.safetensors", "--text",
                                  std::string(40, '1'), "--out", tmp / "att2.svg"});
  CHECK(too_long.code != 0);
  CHECK_THAT(too_long.err, Catch::Contains("[--text]"));
  CHECK_FALSE(fs::exists(tmp / "att2.svg"));
}

// ---- the targets (accuracy only; timings are measured by hand, see the report) ----------

// --dtype bfloat16, the issue's targets: the default task to 99% held-out exact
// match, and a char-LM's validation loss within 2% of float32's after 300 steps.
TEST_CASE("bfloat16: the default run reaches 99% and a char-LM stays within 2% of float32", "[train][slow][bf16]") {
  TempDir tmp;
  const CliResult r = cli({"train", "--out", tmp / "sort", "--quiet", "--dtype", "bfloat16"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const train::cli::EvalSummary e = train::cli::eval_command({.ckpt = tmp / "sort/ckpt.safetensors"}, null_out());
  REQUIRE(e.accuracy.has_value());
  CHECK(*e.accuracy >= 0.99);
  std::string text;
  for (int i = 0; i < 400; ++i) text += fmt::format("line {} of a text to model, with {} words in it.\n", i, i % 17);
  write_text(tmp / "book.txt", text);
  double loss[2];
  for (int i = 0; i < 2; ++i) {
    const std::string dtype = i == 0 ? "float32" : "bfloat16";
    const CliResult t = cli({"train", "--data", tmp / "book.txt", "--steps", "300", "--out", tmp / dtype, "--quiet",
                             "--dtype", dtype});
    INFO(t.out << t.err);
    REQUIRE(t.code == 0);
    loss[i] = train::cli::eval_command({.ckpt = tmp / (dtype + "/ckpt.safetensors")}, null_out()).loss;
  }
  CHECK(std::abs(loss[1] - loss[0]) <= 0.02 * loss[0]);
}

TEST_CASE("the default run and the add preset reach 99% held-out exact match", "[train][slow]") {
  for (const auto& task : {std::vector<std::string>{}, std::vector<std::string>{"--task", "add"}}) {
    TempDir tmp;
    std::vector<std::string> args = {"train", "--out", tmp / "run", "--quiet"};
    args.insert(args.end(), task.begin(), task.end());
    const CliResult r = cli(args);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    const train::cli::EvalSummary e = train::cli::eval_command({.ckpt = tmp / "run/ckpt.safetensors"}, null_out());
    REQUIRE(e.accuracy.has_value());
    CHECK(*e.accuracy >= 0.99);
    CHECK(e.examples >= 900);
  }
}

TEST_CASE("the progress line's MFU: a step's model FLOPs over this CPU's measured FMA peak", "[train]") {
  // GPT-2 small at batch 1: the products 3 x (12 x (24 T C^2 + 2 C T (T + 1)) + 2 T C V).
  nn::GPTConfig gpt2{.vocab_size = 50304, .block_size = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768};
  const double T = 1024, C = 768;
  CHECK(train::model::step_flops(gpt2, 1) == Approx(3 * (12 * (24 * T * C * C + 2 * C * T * (T + 1)) + 2 * T * C * 50304)));
  CHECK(train::model::step_flops(gpt2, 4) == Approx(4 * train::model::step_flops(gpt2, 1)));
  if (cpu::fma_chains().empty() || !cpu::fma_chains().back().supported()) {
    WARN("skipped: no FMA chains for this CPU (x86-64 with AVX2 or AVX-512 only)");
    return;
  }
  CHECK(cpu::fma_peak_flops(2) > 1e9);  // any CPU with AVX2 does more than a GFLOP/s a core
  TempDir tmp;
  train::TrainOptions o = tiny(tmp / "run");
  o.quiet = false;
  std::FILE* out = std::tmpfile();
  train::cli::train_command(o, out);
  const std::string printed = read_all(out);  // closes it
  CHECK_THAT(printed, Catch::Contains("GFLOP/s of float32 FMA on") && Catch::Contains("MFU "));
}

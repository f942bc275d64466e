// A run's weights out to Hugging Face's layout and back in (attograd export,
// a folder read wherever a checkpoint is), and new runs started from weights
// (train --init-from): the same model on both sides, the new run's own data,
// schedule and block, and every mismatch refused in one line.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bpe_files.h"
#include "program_helpers.h"
#include "train/cli/commands.h"
#include "train/data/shards.h"
#include "autograd/ops.h"
#include "train/data/vocabulary.h"
#include "train/model/gpt.h"
#include "train/output/checkpoint.h"
#include "train/output/safetensors.h"

namespace attograd::test {
namespace {

namespace fs = std::filesystem;

// A token run of a small GPT-2 style tokenizer, trained a few steps: dir/run/ckpt.safetensors.
struct SmallBpeRun {
  TempDir dir;
  std::string ckpt;
  SmallBpeRun() {
    fs::create_directories(dir / "tok");
    SmallVocabulary({{"t", "h"}, {"th", "e"}, {" ", "the"}}).write(dir / "tok");
    const train::data::Vocabulary vocabulary = train::data::Vocabulary::load_gpt2(dir / "tok", "test");
    const std::vector<std::int64_t> document = vocabulary.encode(" the cat sat<|endoftext|>", "test");
    std::vector<std::uint16_t> tokens;
    for (int i = 0; i < 200; ++i) tokens.insert(tokens.end(), document.begin(), document.end());
    fs::create_directories(dir / "data");
    write_text(dir / "data/train_000000.bin", train::data::shard_bytes(tokens));
    write_text(dir / "data/val_000000.bin", train::data::shard_bytes({tokens.begin(), tokens.begin() + 200}));
    const CliResult r = cli({"train", "--data", dir / "data", "--tokenizer", dir / "tok", "--out", dir / "run",
                             "--layers", "2", "--width", "16", "--heads", "2", "--block", "16", "--batch", "4",
                             "--steps", "6", "--eval-interval", "6", "--quiet"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    ckpt = dir / "run/ckpt.safetensors";
  }
};

std::vector<float> floats(const Tensor& t) {
  const float* p = t.data<float>();
  return {p, p + t.numel()};
}

}  // namespace

TEST_CASE("export: a checkpoint as Hugging Face's GPT-2 reads back as the same model, tokenizer and all", "[hf]") {
  SmallBpeRun run;
  const CliResult e = cli({"export", "--ckpt", run.ckpt, "--hf", run.dir / "hf"});
  INFO(e.err);
  REQUIRE(e.code == 0);
  CHECK_THAT(e.out, Catch::Contains("vocabulary 260, with GPT-2's tokenizer"));
  for (const char* name : {"config.json", "model.safetensors", "vocab.json", "merges.txt"})
    CHECK(fs::exists(run.dir / (std::string("hf/") + name)));

  const train::output::LoadedCheckpoint a = train::output::load_checkpoint(run.ckpt);
  const train::output::LoadedCheckpoint b = train::output::load_checkpoint(run.dir / "hf");
  CHECK(b.info.vocabulary.kind() == train::data::Vocabulary::Kind::gpt2);
  CHECK(b.info.vocabulary.attached(run.dir / "tok", "test").decode({258}) == " the");  // the same tokenizer
  for (const auto& p : a.model->named_parameters()) {
    INFO(p.name);
    CHECK(floats(p.tensor) == floats(b.model->state_dict().at(p.name)));
  }
  // The folder evaluates and samples as the checkpoint does.
  const auto eval = [&](const std::string& ckpt) {
    return train::cli::eval_command({.ckpt = ckpt, .data = run.dir / "data"}, null_out()).loss;
  };
  CHECK(eval(run.ckpt) == eval(run.dir / "hf"));
  train::cli::SampleOptions greedy;
  greedy.tokens = 8, greedy.temperature = 0;
  greedy.ckpt = run.ckpt;
  const std::string from_ckpt = train::cli::sample_command(greedy, null_out());
  greedy.ckpt = run.dir / "hf";
  CHECK(train::cli::sample_command(greedy, null_out()) == from_ckpt);

  // Exported again from the folder: the same bytes.
  REQUIRE(cli({"export", "--ckpt", run.dir / "hf", "--hf", run.dir / "hf2"}).code == 0);
  for (const char* name : {"config.json", "model.safetensors", "vocab.json", "merges.txt"})
    CHECK(file_text(run.dir / (std::string("hf/") + name)) == file_text(run.dir / (std::string("hf2/") + name)));
}

TEST_CASE("a checkpoint's weights read alone are the whole read's, its optimizer's state left unread", "[hf]") {
  SmallBpeRun run;
  const train::output::LoadedCheckpoint whole = train::output::load_checkpoint(run.ckpt);
  const train::output::LoadedCheckpoint weights =
      train::output::load_checkpoint(run.ckpt, "--ckpt", train::output::CheckpointParts::weights);
  REQUIRE(!whole.optimizer_state.empty());
  CHECK(weights.optimizer_state.empty());
  CHECK(weights.info.step == whole.info.step);
  for (const auto& p : whole.model->named_parameters()) {
    INFO(p.name);
    CHECK(floats(p.tensor) == floats(weights.model->state_dict().at(p.name)));
  }
}

TEST_CASE("init-from: a new run starts from the weights with its own data, schedule and cropped block", "[hf]") {
  SmallBpeRun run;
  REQUIRE(cli({"export", "--ckpt", run.ckpt, "--hf", run.dir / "hf"}).code == 0);
  // One step at a learning rate too small to move a float32 weight: the weights are the source's.
  const CliResult r = cli({"train", "--init-from", run.dir / "hf", "--data", run.dir / "data", "--out", run.dir / "ft",
                           "--steps", "1", "--lr", "1e-20", "--warmup", "0", "--block", "8", "--dropout", "0",
                           "--quiet"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const train::output::LoadedCheckpoint source = train::output::load_checkpoint(run.ckpt);
  const train::output::LoadedCheckpoint tuned = train::output::load_checkpoint(run.dir / "ft/ckpt.safetensors");
  CHECK(tuned.info.config.block == 8);
  CHECK(tuned.info.config.layers == 2);
  CHECK(tuned.info.vocabulary.kind() == train::data::Vocabulary::Kind::gpt2);
  const auto tuned_state = tuned.model->state_dict();
  for (const auto& [name, t] : source.model->state_dict()) {
    INFO(name);
    const std::vector<float> want = floats(t), got = floats(tuned_state.at(name));
    if (name == "wpe.weight") {
      REQUIRE(got.size() == 8 * 16);  // the first 8 positions
      CHECK(std::equal(got.begin(), got.end(), want.begin()));
    } else {
      CHECK(got == want);
    }
  }

  const auto error = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"train", "--out", run.dir / "refused", "--quiet"});
    const CliResult bad = cli(args);
    CHECK(bad.code != 0);
    CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
    CHECK_FALSE(fs::exists(run.dir / "refused"));
    return bad.err;
  };
  CHECK_THAT(error({"--init-from", run.ckpt, "--data", run.dir / "data", "--width", "32"}),
             Catch::Contains("[--width] comes from the weights of --init-from"));
  CHECK_THAT(error({"--init-from", run.ckpt, "--data", run.dir / "data", "--block", "17"}),
             Catch::Contains("[--block] 17 is longer than the 16 positions"));
  CHECK_THAT(error({"--init-from", run.ckpt, "--resume", run.ckpt}), Catch::Contains("[--init-from] starts a new run"));
  CHECK_THAT(error({"--resume", run.dir / "hf"}), Catch::Contains("[--resume]") && Catch::Contains("--init-from"));
  CHECK_THAT(error({"--init-from", run.ckpt, "--task", "sort"}),
             Catch::Contains("[--init-from]") && Catch::Contains("another vocabulary (260 tokens) than the sort task's"));
  CHECK_THAT(error({"--init-from", run.dir / "missing"}), Catch::Contains("[--init-from]") && Catch::Contains("missing"));
}

}  // namespace attograd::test

namespace attograd::test {

TEST_CASE("a padded vocabulary: padded logits enter no loss, their rows never learn, export writes the tokens' rows",
          "[hf][tokens]") {
  SmallBpeRun run;
  const CliResult r = cli({"train", "--data", run.dir / "data", "--tokenizer", run.dir / "tok", "--vocab-size", "320",
                           "--out", run.dir / "padded", "--layers", "1", "--width", "16", "--heads", "2", "--block", "8",
                           "--batch", "4", "--steps", "4", "--eval-interval", "4", "--quiet"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const train::output::LoadedCheckpoint padded = train::output::load_checkpoint(run.dir / "padded/ckpt.safetensors");
  padded.model->eval();  // no dropout: the two losses below see the same logits
  const nn::GPT& model = *padded.model;
  REQUIRE(model.config().vocab_size == 320);
  REQUIRE(model.config().token_count == 260);
  // The loss is over the 260 tokens' logits: not the cross-entropy over all 320 rows.
  const Tensor tokens = from_vector(std::vector<std::int64_t>{258, 3, 5, 259, 258, 7}, {1, 6});
  const Tensor targets = from_vector(std::vector<std::int64_t>{3, 5, 259, 258, 7, 1}, {1, 6});
  const Tensor logits = model.forward(tokens);
  const double loss = model.loss(tokens, targets).item();
  CHECK(loss == Approx(cross_entropy(narrow(logits, -1, 0, 260), targets).item()).epsilon(1e-6));
  CHECK(loss != Approx(cross_entropy(logits, targets).item()).epsilon(1e-6));
  // No gradient reaches the padded rows: after training they are as initialised.
  const std::unique_ptr<nn::GPT> fresh = train::model::build_model(padded.info.config, 260);
  const std::vector<float> trained = floats(model.wte.weight), initial = floats(fresh->wte.weight);
  CHECK(std::equal(trained.begin() + 260 * 16, trained.end(), initial.begin() + 260 * 16));
  CHECK_FALSE(std::equal(trained.begin(), trained.begin() + 260 * 16, initial.begin()));
  // Transformers sees the tokens' 260 rows.
  REQUIRE(cli({"export", "--ckpt", run.dir / "padded/ckpt.safetensors", "--hf", run.dir / "hf"}).code == 0);
  CHECK(train::output::load_checkpoint(run.dir / "hf").model->config().vocab_size == 260);
}

}  // namespace attograd::test

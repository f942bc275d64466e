// Reliability of the attograd program: bad flags and hostile files get one
// clear error line and leave nothing behind; SIGINT and SIGTERM stop a run at
// a step it can resume from exactly; kill -9 in the middle of writing a
// checkpoint never damages the previous one; a NaN loss stops the run keeping
// the last good checkpoint; and the fuzzers' seed corpus and saved crashes are
// replayed through their targets. (test_train.cpp holds the first tables of bad
// flags and malformed safetensors files; these extend them.)
//
// Interrupted runs are real processes: the built `attograd` binary (its path
// is build_paths.h's kAttogradBinary) is started with posix_spawn, signalled
// and waited for.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "child_process.h"
#include "fuzz/targets.h"
#include "helpers.h"
#include "program_helpers.h"
#include "cpu/blas_setup.h"
#include "cpu/matmul_f32/sgemm.h"
#include "train/cli/cli.h"
#include "train/cli/commands.h"
#include "train/data/tasks.h"
#include "train/data/text_data.h"
#include "train/files.h"
#include "train/model/gpt.h"
#include "train/output/checkpoint.h"
#include "train/output/metrics.h"
#include "train/output/run_directory.h"
#include "train/output/safetensors.h"


using namespace attograd;
using namespace attograd::test;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

std::int64_t lines(const std::string& s) { return std::count(s.begin(), s.end(), '\n'); }

// A tiny task run's flags: steps take milliseconds.
std::vector<std::string> tiny_run(const std::string& out, std::int64_t steps) {
  return {"train",    "--task",    "sort", "--task-size", "4",   "--layers",        "1",
          "--width",  "16",        "--heads", "2",         "--batch", "8",          "--dropout",
          "0.1",      "--steps",   std::to_string(steps), "--heldout", "20",       "--threads",
          "1",        "--out",     out,    "--quiet"};
}

// ---- checkpoints as bytes ------------------------------------------------------

// A real checkpoint of a tiny sort run (AdamW state included), made once.
const std::string& good_checkpoint() {
  static const std::string bytes = [] {
    TempDir tmp;
    train::TrainOptions o;
    o.task_size = 2, o.heldout = 20, o.layers = 1, o.heads = 2, o.width = 8, o.block = 4;
    o.batch = 4, o.steps = 2, o.eval_interval = 2, o.out = tmp / "run", o.quiet = true, o.threads = 0;
    train::cli::train_command(o, null_out());
    return file_text(tmp / "run/ckpt.safetensors");
  }();
  return bytes;
}

// The checkpoint with its header JSON edited in place (offsets and data untouched).
std::string edit_header(const std::function<void(nlohmann::ordered_json&)>& edit) {
  const std::string& bytes = good_checkpoint();
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  edit(header);
  const std::string json = header.dump();
  std::string out(8, '\0');
  const std::uint64_t len = json.size();
  std::memcpy(out.data(), &len, 8);
  return out + json + bytes.substr(8 + n);
}

// The checkpoint with tensors or metadata changed, written again as valid safetensors.
std::string edit_contents(const std::function<void(std::map<std::string, Tensor>&, train::output::Metadata&)>& edit) {
  train::output::Safetensors file = train::output::parse_safetensors(good_checkpoint());
  edit(file.tensors, file.metadata);
  return train::output::serialize_safetensors(train::output::NamedTensors(file.tensors.begin(), file.tensors.end()), file.metadata);
}

std::string edit_config(const std::function<void(nlohmann::json&)>& edit) {
  return edit_contents([&](auto&, train::output::Metadata& m) {
    nlohmann::json config = nlohmann::json::parse(m.at("config"));
    edit(config);
    m["config"] = config.dump();
  });
}

}  // namespace

// ---- bad flags -------------------------------------------------------------------

TEST_CASE("every train flag is validated: one line naming the flag and value, exit 1 or 2, no run directory",
          "[reliability]") {
  TempDir tmp;
  const std::string out = tmp / "run";
  write_text(tmp / "short.txt", "only a few characters of text here, for sure not enough.");
  write_text(tmp / "binary.gif", std::string("GIF89a\x01\x00\x01\x00\x00\x00\x00", 13));
  write_text(tmp / "a_file", "x");
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expect;  // substrings of the error line
  };
  // test_train.cpp covers --layers 0, --width -8, --batch 0, --steps 0, --block 0,
  // --heads 3 --width 64, --lr nan/inf/-1, --dropout 1, --grad-clip -1, --task
  // multiply, --task-size 0, --optimizer lion, --threads -2, --device tpu, a missing,
  // empty, directory or invalid UTF-8 --data, a non-number and an unknown flag.
  const std::vector<Case> cases = {
      {{"--layers", "-3"}, {"[--layers]", "-3"}},
      {{"--layers", "1000"}, {"[--layers]", "1000"}},
      {{"--width", "0"}, {"[--width]", "0"}},
      {{"--width", "100000"}, {"[--width]", "100000"}},
      {{"--heads", "0"}, {"[--heads]", "0"}},
      {{"--heads", "-4"}, {"[--heads]", "-4"}},
      {{"--heads", "5", "--width", "16"}, {"[--heads]", "5", "16"}},
      {{"--block", "-1"}, {"[--block]", "-1"}},
      {{"--block", "100000"}, {"[--block]", "100000"}},
      {{"--task", "add", "--block", "3"}, {"[--block]", "3"}},
      {{"--batch", "-5"}, {"[--batch]", "-5"}},
      {{"--batch", "2000000"}, {"[--batch]", "2000000"}},
      {{"--steps", "-1"}, {"[--steps]", "-1"}},
      {{"--steps", "99999999999999999999"}, {"--steps", "99999999999999999999"}},
      {{"--lr", "0"}, {"[--lr]", "0"}},
      {{"--lr", "-inf"}, {"[--lr]", "-inf"}},
      {{"--lr", "fast"}, {"--lr", "fast"}},
      {{"--dropout", "nan"}, {"[--dropout]", "nan"}},
      {{"--dropout", "-0.1"}, {"[--dropout]", "-0.1"}},
      {{"--warmup", "-1"}, {"[--warmup]", "-1"}},
      {{"--min-lr-ratio", "2"}, {"[--min-lr-ratio]", "2"}},
      {{"--weight-decay", "-0.5"}, {"[--weight-decay]", "-0.5"}},
      {{"--weight-decay", "inf"}, {"[--weight-decay]", "inf"}},
      {{"--beta1", "1"}, {"[--beta1]", "1"}},
      {{"--beta2", "-0.5"}, {"[--beta2]", "-0.5"}},
      {{"--optimizer", "sgd", "--momentum", "1.5"}, {"[--momentum]", "1.5"}},
      {{"--grad-clip", "nan"}, {"[--grad-clip]", "nan"}},
      {{"--task-size", "65"}, {"[--task-size]", "65"}},
      {{"--heldout", "0"}, {"[--heldout]", "0"}},
      {{"--eval-interval", "0"}, {"[--eval-interval]", "0"}},
      {{"--stop-at", "-1"}, {"[--stop-at]", "-1"}},
      {{"--threads", "5000"}, {"[--threads]", "5000"}},
      {{"--attention-memory", "2000000"}, {"[--attention-memory]", "2000000"}},
      {{"--attention-memory", "lots"}, {"--attention-memory", "lots"}},
      {{"--seed", "-1"}, {"--seed", "-1"}},
      {{"--task", ""}, {"[--task]", "''"}},
      {{"--task", "sort", "--data", tmp / "short.txt"}, {"[--task]", "--data"}},
      // Data: a block longer than the file allows, a binary file, a path through a file.
      {{"--data", tmp / "short.txt", "--block", "64"}, {"[--data]", "short.txt", "--block 64"}},
      {{"--data", tmp / "binary.gif"}, {"[--data", "binary.gif", "binary", "NUL byte at byte 7"}},
      {{"--data", tmp / "binary.gif", "--data-format", "shards"}, {"[--val-data] is needed", "binary.gif"}},
      {{"--data", tmp / "nothing_*.bin"}, {"[--data]", "nothing_*.bin' matches no file"}},
      {{"--data-format", "csv", "--data", tmp / "binary.gif"}, {"[--data-format] unknown format 'csv'"}},
      {{"--vocab-size", "100"}, {"[--vocab-size] applies to --data, not to the tasks"}},
      {{"--data", tmp / "a_file/book.txt"}, {"[--data]", "a_file/book.txt", "cannot read"}},
      // Output: a file where the directory would be, a directory that cannot be created.
      {{"--out", tmp / "a_file"}, {"[--out]", "a_file", "not a directory"}},
      // Resuming: nothing there, not a checkpoint, a flag fixed by the checkpoint.
      {{"--resume", tmp / "none.safetensors"}, {"[--resume]", "none.safetensors"}},
      {{"--resume", tmp / "a_file"}, {"a_file", "truncated"}},
      {{"--resume", tmp.path.string()}, {"[--resume]", "not a regular file"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"train", "--quiet"};
    if (std::find(c.args.begin(), c.args.end(), "--out") == c.args.end()) args.insert(args.end(), {"--out", out});
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliResult r = cli(args);
    INFO(fmt::format("args {} -> {}", fmt::join(c.args, " "), r.err));
    CHECK((r.code == 1 || r.code == 2));
    CHECK(lines(r.err) == 1);
    CHECK(r.err.rfind("attograd: error: ", 0) == 0);
    for (const auto& e : c.expect) CHECK_THAT(r.err, Catch::Contains(e));
    CHECK_FALSE(fs::exists(out));
  }
  CHECK(fs::exists(tmp / "a_file"));  // untouched
}

TEST_CASE("an output directory that cannot be written is refused before anything is made", "[reliability]") {
  TempDir tmp;
  if (::geteuid() != 0) {
    fs::create_directories(tmp / "locked");
    fs::permissions(tmp / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    const CliResult r = cli({"train", "--out", tmp / "locked/run", "--steps", "1", "--quiet"});
    CHECK(r.code == 1);
    CHECK(lines(r.err) == 1);
    CHECK_THAT(r.err, Catch::Contains("[--out]") && Catch::Contains("not writable"));
    fs::permissions(tmp / "locked", fs::perms::owner_all);
    CHECK(fs::is_empty(tmp / "locked"));
  }
  // root may write anywhere; /proc still refuses a new directory (the check passes, mkdir fails).
  const CliResult r = cli({"train", "--out", "/proc/attograd_no_such_run", "--steps", "1", "--quiet"});
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  CHECK_THAT(r.err, Catch::Contains("[--out]") && Catch::Contains("/proc/attograd_no_such_run"));
  CHECK_FALSE(fs::exists("/proc/attograd_no_such_run"));
}

TEST_CASE("a run directory made for a run that fails before its first checkpoint is removed again",
          "[reliability]") {
  TempDir tmp;
  {
    train::output::RunDirectory made(tmp.path / "a/b/c", "");
    CHECK(fs::is_directory(tmp.path / "a/b/c"));
    write_text(tmp / "a/b/c/metrics.jsonl", "{}\n");
  }
  CHECK_FALSE(fs::exists(tmp.path / "a"));  // everything it created, and only that
  CHECK(fs::exists(tmp.path));
  {
    train::output::RunDirectory made(tmp.path / "kept", "");
    made.keep();
  }
  CHECK(fs::is_directory(tmp.path / "kept"));
  fs::create_directories(tmp.path / "existing");
  { train::output::RunDirectory made(tmp.path / "existing", ""); }
  CHECK(fs::is_directory(tmp.path / "existing"));  // it was there before: never removed
}

TEST_CASE("sample, eval and attention validate their flags too", "[reliability]") {
  TempDir tmp;
  train::TrainOptions o;
  o.task_size = 2, o.heldout = 20, o.layers = 1, o.heads = 2, o.width = 8, o.block = 4;
  o.batch = 4, o.steps = 1, o.out = tmp / "run", o.quiet = true;
  train::cli::train_command(o, null_out());
  const std::string ckpt = tmp / "run/ckpt.safetensors";
  write_text(tmp / "binary.bin", std::string("\x7f" "ELF\x02\x01\x01\x00", 8));
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {{"sample", "--ckpt", ckpt, "--temperature", "-1"}, {"[--temperature]", "-1"}},
      {{"sample", "--ckpt", ckpt, "--temperature", "nan"}, {"[--temperature]", "nan"}},
      {{"sample", "--ckpt", ckpt, "--top-k", "-2"}, {"[--top-k]", "-2"}},
      {{"sample", "--ckpt", ckpt, "--tokens", "-1"}, {"[--tokens]", "-1"}},
      {{"sample", "--ckpt", ckpt, "--tokens", "2000000"}, {"[--tokens]", "2000000"}},
      {{"sample", "--ckpt", ckpt, "--prompt", ""}, {"[--prompt]"}},
      {{"sample", "--ckpt", ckpt, "--prompt", "12x"}, {"[--prompt]", "'x'"}},
      {{"sample", "--ckpt", ckpt, "--prompt", std::string("1\xFF", 2)}, {"[--prompt]", "invalid UTF-8 at byte 1"}},
      {{"sample", "--ckpt", ckpt, "--device", "gpu"}, {"[--device]", "gpu"}},
      {{"sample", "--ckpt", ckpt, "--threads", "-1"}, {"[--threads]", "-1"}},
      {{"sample", "--ckpt", "/dev/zero"}, {"[--ckpt]", "/dev/zero", "not a regular file"}},
      {{"eval", "--ckpt", ckpt, "--data", tmp / "binary.bin"}, {"[--data]", "sort task"}},
      {{"eval", "--ckpt", tmp / "missing.safetensors"}, {"[--ckpt]", "missing.safetensors"}},
      {{"eval", "--ckpt", tmp / "binary.bin"}, {"binary.bin", "exceeds the limit"}},
      {{"eval", "--ckpt", ckpt, "--max-batches", "0"}, {"[--max-batches]", "0"}},
      {{"eval", "--ckpt", ckpt, "--max-batches", "-4"}, {"[--max-batches]", "-4"}},
      {{"attention", "--ckpt", ckpt, "--text", ""}, {"[--text]"}},
      {{"attention", "--ckpt", ckpt, "--text", "12", "--out", tmp / "no/such/dir/a.svg"}, {"[--out]", "a.svg"}},
  };
  for (const Case& c : cases) {
    const CliResult r = cli(c.args);
    INFO(fmt::format("args {} -> {}", fmt::join(c.args, " "), r.err));
    CHECK(r.code == 1);
    CHECK(lines(r.err) == 1);
    for (const auto& e : c.expect) CHECK_THAT(r.err, Catch::Contains(e));
  }
}

// ---- text data ---------------------------------------------------------------------

TEST_CASE("text data: invalid UTF-8 deep in a file, binary files, endless files", "[reliability]") {
  std::string text(5000, 'a');
  text[1234] = '\xC3';  // a lead byte whose continuation is missing
  REQUIRE_THROWS_WITH(train::data::TextData(text, "big.txt", 1),
                      Catch::Contains("[--data big.txt]") && Catch::Contains("invalid UTF-8 at byte 1235"));
  text = std::string(5000, 'a') + "\xE2\x82";  // truncated by the end of the file
  REQUIRE_THROWS_WITH(train::data::TextData(text, "cut.txt", 1), Catch::Contains("at byte 5000") && Catch::Contains("truncated"));
  REQUIRE_THROWS_WITH(train::data::TextData(std::string("text\0more", 9), "nul.txt", 1),
                      Catch::Contains("binary") && Catch::Contains("NUL byte at byte 4"));
  REQUIRE_THROWS_WITH(train::data::TextData("", "empty.txt", 1), Catch::Contains("empty"));
  // With a checkpoint's vocabulary, a character outside it is named.
  REQUIRE_THROWS_WITH(train::data::TextData("ab\xE2\x82\xAC", "euro.txt", 1, train::data::Tokenizer::from_text("ab")),
                      Catch::Contains("'\xE2\x82\xAC' is not in the model's vocabulary"));
  // Reads stop one byte past the limit: /dev/zero is refused, not read forever.
  REQUIRE_THROWS_WITH(train::read_file("/dev/zero", "--data", 1000),
                      Catch::Contains("[--data] '/dev/zero' holds more than 1000 bytes"));
  TempDir tmp;
  write_text(tmp / "exact.txt", std::string(1000, 'x'));
  CHECK(train::read_file(tmp / "exact.txt", "--data", 1000).size() == 1000);
}

// ---- checkpoints are untrusted input --------------------------------------------------

TEST_CASE("the checkpoint size check counts exactly the parameters a model allocates", "[reliability]") {
  const std::tuple<int, int, int, int, int> configs[] = {{1, 8, 2, 4, 12}, {2, 16, 4, 9, 65}, {3, 48, 4, 26, 12},
                                                        {1, 6, 3, 1, 1}};
  for (const auto& [layers, width, heads, block, vocab] : configs) {
    train::TrainOptions o;
    o.layers = layers, o.width = width, o.heads = heads, o.block = block;
    CHECK(train::model::parameter_count(train::model::gpt_config(o, vocab)) == train::model::build_model(o, vocab)->num_parameters());
  }
}

TEST_CASE("hostile checkpoints: every malformed field is a clear error naming the file", "[reliability]") {
  REQUIRE_NOTHROW(train::output::parse_checkpoint(good_checkpoint(), "good"));
  const std::string& good = good_checkpoint();
  std::uint64_t header_len;
  std::memcpy(&header_len, good.data(), 8);
  struct Case {
    std::string name, bytes, expect;
  };
  const auto with_length = [&](std::uint64_t n) {
    std::string s = good;
    std::memcpy(s.data(), &n, 8);
    return s;
  };
  const auto set_meta = [&](const std::string& key, const std::string& value) {
    return edit_contents([&](auto&, train::output::Metadata& m) { m[key] = value; });
  };
  const std::vector<Case> cases = {
      // The layout (test_train.cpp covers each safetensors rule on a small file).
      {"empty", "", "truncated"},
      {"header length beyond the file", with_length(good.size()), "truncated"},
      {"header length 2^63", with_length(std::uint64_t{1} << 63), "exceeds the limit"},
      {"header cut", good.substr(0, 8 + header_len / 2), "truncated"},
      {"data cut", good.substr(0, good.size() - 100), "out of range"},
      {"JSON broken", std::string(good).replace(8, 1, "#"), "not valid JSON"},
      {"offsets past the data", edit_header([](auto& h) { h["wte.weight"]["data_offsets"][1] = 1u << 30; }),
       "out of range"},
      {"overlapping tensors", edit_header([](auto& h) {
         // Slide ln_f.weight 16 bytes into the tensor before it.
         const std::uint64_t begin = h["ln_f.weight"]["data_offsets"][0].template get<std::uint64_t>() - 16;
         h["ln_f.weight"]["data_offsets"] = {begin, begin + 32};
       }),
       "'ln_f.weight' data [3984, 4016) overlaps"},
      {"unknown dtype", edit_header([](auto& h) { h["wte.weight"]["dtype"] = "F16"; }), "unknown dtype"},
      {"BF16 of the wrong byte size", edit_header([](auto& h) { h["wte.weight"]["dtype"] = "BF16"; }),
       "BF16 of shape [12,8] needs 192"},
      {"shape disagrees with offsets", edit_header([](auto& h) { h["wte.weight"]["shape"] = {12, 9}; }), "needs"},
      {"shape of 2^40 x 2^40", edit_header([](auto& h) { h["wte.weight"]["shape"] = {1ull << 40, 1ull << 40}; }),
       "needs"},
      // The metadata.
      {"no metadata", edit_header([](auto& h) { h.erase("__metadata__"); }), "not an attograd checkpoint"},
      {"another format", set_meta("format", "attograd.checkpoint.v0"), "unsupported checkpoint format"},
      {"config not JSON", set_meta("config", "{"), "config metadata is malformed"},
      {"config not an object", set_meta("config", "[1]"), "must be a JSON object"},
      {"config field missing", edit_config([](auto& c) { c.erase("width"); }), "width"},
      {"config float for an int", edit_config([](auto& c) { c["layers"] = 1e300; }), "'layers' has the wrong type"},
      {"config string for an int", edit_config([](auto& c) { c["width"] = "8"; }), "'width' has the wrong type"},
      {"config int out of range", edit_config([](auto& c) { c["task_size"] = 1ll << 40; }), "out of range"},
      {"config negative seed", edit_config([](auto& c) { c["seed"] = -1; }), "'seed' has the wrong type"},
      {"config invalid value", edit_config([](auto& c) { c["heads"] = 3; }), "[--heads] 3 heads do not divide"},
      {"config unknown task", edit_config([](auto& c) { c["task"] = "divide"; }), "unknown task 'divide'"},
      {"config nan lr", edit_config([](auto& c) { c["lr"] = nullptr; }), "'lr' has the wrong type"},
      {"vocab not JSON", set_meta("vocab", "[\"a\""), "vocabulary is not valid JSON"},
      {"vocab empty", set_meta("vocab", "[]"), "non-empty"},
      {"vocab entry two characters", set_meta("vocab", R"(["ab"])"), "not one code point"},
      {"vocab duplicates", set_meta("vocab", R"(["a","a"])"), "duplicate"},
      {"vocab not the task's", set_meta("vocab", R"(["0","1","2","3","4","5","6","7","8","9","+","-"])"),
       "not the sort task's"},
      {"step negative", set_meta("step", "-1"), "step '-1' is not a count"},
      {"step not a number", set_meta("step", "12abc"), "is not a count"},
      {"step too large", set_meta("step", "99999999999999999999"), "is not a count"},
      {"rng not JSON", set_meta("rng", "x"), "malformed checkpoint metadata"},
      {"rng seed a string", set_meta("rng", R"({"dropout_seed": "1", "dropout_offset": 0})"), "dropout_seed"},
      {"optimizer unknown", set_meta("optimizer", R"({"name": "adam", "step_count": 1})"), "unknown optimizer 'adam'"},
      {"optimizer negative steps", set_meta("optimizer", R"({"name": "adamw", "step_count": -1})"),
       "step_count -1 is not in [0, the checkpoint's step"},
      {"optimizer steps past the step", set_meta("optimizer", R"({"name": "adamw", "step_count": 9223372036854775807})"),
       "step_count 9223372036854775807 is not in [0"},
      {"optimizer fractional steps", set_meta("optimizer", R"({"name": "adamw", "step_count": 1.5})"),
       "integer step_count"},
      // The tensors against the model the config describes.
      {"tensor missing", edit_contents([](auto& t, auto&) { t.erase("ln_f.bias"); }), "missing (1): ln_f.bias"},
      {"tensor unexpected", edit_contents([](auto& t, auto&) { t["extra"] = zeros({2}); }), "unexpected (1): extra"},
      {"tensor mis-shaped",
       edit_contents([](auto& t, auto&) { t["blocks.0.attn.qkv.weight"] = transpose(t["blocks.0.attn.qkv.weight"], 0, 1); }),
       "blocks.0.attn.qkv.weight is"},
      {"tensor float64", edit_contents([](auto& t, auto&) { t["ln_f.weight"] = to(t["ln_f.weight"], DType::f64); }),
       "'ln_f.weight' is float64, expected float32"},
      {"a NaN weight", edit_contents([](auto& t, auto&) {
         Tensor w = kernels::clone(t["ln_f.weight"]);
         w.template data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
         t["ln_f.weight"] = w;
       }),
       "tensor 'ln_f.weight' holds nan at element 3: a damaged file"},
      {"an infinite optimizer moment", edit_contents([](auto& t, auto&) {
         Tensor m = kernels::clone(t["optim.exp_avg_sq.ln_f.bias"]);
         m.template data<float>()[0] = std::numeric_limits<float>::infinity();
         t["optim.exp_avg_sq.ln_f.bias"] = m;
       }),
       "tensor 'optim.exp_avg_sq.ln_f.bias' holds inf at element 0"},
      {"optimizer state int64",
       edit_contents([](auto& t, auto&) { t["optim.exp_avg.ln_f.bias"] = zeros({8}, {DType::i64}); }),
       "optimizer state 'optim.exp_avg.ln_f.bias' is int64"},
      {"vocabulary larger than the model",
       edit_contents([](auto&, train::output::Metadata& m) {
         nlohmann::json config = nlohmann::json::parse(m["config"]);
         config["data"] = "book.txt";
         m["config"] = config.dump();
         m["vocab"] = R"(["0","1","2","3","4","5","6","7","8","9","+","=","x"])";
       }),
       "the vocabulary holds 13 symbols but wte.weight has 12 rows"},
      // A config that asks for a huge model is refused before allocating it.
      {"config of 256 layers x 65536 wide",
       edit_config([](auto& c) { c["layers"] = 256, c["width"] = 65536, c["heads"] = 1, c["block"] = 65536; }),
       "describes 13198653521920 parameters, but its tensors hold 1016"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    REQUIRE_THROWS_WITH(train::output::parse_checkpoint(c.bytes, "hostile.safetensors"),
                        Catch::StartsWith("[hostile.safetensors]") && Catch::Contains(c.expect));
  }
  // Every truncation: refused, never read past the end.
  for (std::size_t n = 0; n < good.size(); n += 13) {
    INFO("truncated to " << n << " bytes");
    REQUIRE_THROWS_AS(train::output::parse_checkpoint(good.substr(0, n), "cut.safetensors"), Error);
  }
  // Through the program: one line on stderr, exit 1.
  TempDir tmp;
  write_text(tmp / "huge.safetensors", cases.back().bytes);
  for (const char* command : {"sample", "eval"}) {
    const CliResult r = cli({command, "--ckpt", tmp / "huge.safetensors"});
    CHECK(r.code == 1);
    CHECK(lines(r.err) == 1);
    CHECK_THAT(r.err, Catch::Contains("huge.safetensors") && Catch::Contains("parameters"));
  }
  const CliResult r = cli({"train", "--resume", tmp / "huge.safetensors", "--out", tmp / "run"});
  CHECK(r.code == 1);
  CHECK_FALSE(fs::exists(tmp / "run"));
  // Optimizer state is checked when a run resumes from it, before its directory is made.
  write_text(tmp / "optim.safetensors",
             edit_contents([](auto& t, auto&) { t["optim.exp_avg_sq.ln_f.bias"] = zeros({9}); }));
  write_text(tmp / "no_optim.safetensors", edit_contents([](auto& t, auto&) { t.erase("optim.exp_avg.wpe.weight"); }));
  for (const auto& [file, expect] : {std::pair{"optim.safetensors", "'exp_avg_sq.ln_f.bias' is [9]"},
                                     std::pair{"no_optim.safetensors", "no entry 'exp_avg.wpe.weight'"}}) {
    const CliResult resumed = cli({"train", "--resume", tmp / file, "--out", tmp / "resumed", "--steps", "4"});
    INFO(resumed.err);
    CHECK(resumed.code == 1);
    CHECK(lines(resumed.err) == 1);
    CHECK_THAT(resumed.err, Catch::Contains(expect));
    CHECK_FALSE(fs::exists(tmp / "resumed"));
  }
}

TEST_CASE("an unknown or too wide ATTOGRAD_ATTENTION_ISA is one line naming it, exit 1, no run", "[reliability]") {
  for (const std::string value : {"avx1024", "AVX2", ""}) {
    INFO("ATTOGRAD_ATTENTION_ISA=" << value);
    TempDir tmp;
    Child run(tiny_run(tmp / "a", 2), tmp.path, {"ATTOGRAD_ATTENTION_ISA=" + value});
    const int code = run.exit_code();
    if (value.empty()) {  // unset in effect: the widest path, and a normal run
      CHECK(code == 0);
      continue;
    }
    CHECK(code == 1);
    CHECK(run.err() == "attograd: error: [attention] ATTOGRAD_ATTENTION_ISA=" + value +
                           " is not one of avx512, avx2, baseline\n");
    CHECK_FALSE(fs::exists(tmp / "a/ckpt.safetensors"));
  }
}

TEST_CASE("an unknown ATTOGRAD_F32_GEMM is one line naming it, exit 1, no run, and a known one trains", "[reliability]") {
  TempDir tmp;
  Child bad(tiny_run(tmp / "a", 2), tmp.path, {"ATTOGRAD_F32_GEMM=mkl"});
  CHECK(bad.exit_code() == 1);
  CHECK(bad.err() == "attograd: error: [matmul] ATTOGRAD_F32_GEMM=mkl is not one of avx512, avx2, portable, openblas\n");
  CHECK_FALSE(fs::exists(tmp / "a/ckpt.safetensors"));
  Child portable(tiny_run(tmp / "b", 2), tmp.path, {"ATTOGRAD_F32_GEMM=portable"});
  INFO("stderr: " << portable.err());
  CHECK(portable.exit_code() == 0);
}

TEST_CASE("an unknown ATTOGRAD_CUDA_ATTENTION or ATTOGRAD_CUDA_MATMUL is one line naming it, exit 1, no run",
          "[reliability]") {
  SKIP_WITHOUT_CUDA();
  for (const auto& [variable, op] :
       {std::pair{"ATTOGRAD_CUDA_ATTENTION", "attention"}, {"ATTOGRAD_CUDA_MATMUL", "matmul"}}) {
    INFO(variable);
    TempDir tmp;
    std::vector<std::string> args = tiny_run(tmp / "a", 2);
    args.insert(args.end(), {"--device", "cuda"});
    Child run(args, tmp.path, {std::string(variable) + "=tensor_core"});  // the name is tensor-core
    CHECK(run.exit_code() == 1);
    CHECK(run.err() ==
          fmt::format("attograd: error: [{}] {}=tensor_core is not one of simt, tensor-core\n", op, variable));
    CHECK_FALSE(fs::exists(tmp / "a"));
  }
}

TEST_CASE("an unknown ATTOGRAD_CUDA_WGMMA is one line naming it, exit 1, no run", "[reliability]") {
  SKIP_WITHOUT_CUDA();
  TempDir tmp;
  std::vector<std::string> args = tiny_run(tmp / "a", 2);
  args.insert(args.end(), {"--device", "cuda", "--dtype", "bfloat16"});
  Child run(args, tmp.path, {"ATTOGRAD_CUDA_WGMMA=yes"});
  CHECK(run.exit_code() == 1);
  CHECK(run.err() == "attograd: error: [matmul] ATTOGRAD_CUDA_WGMMA=yes is not one of 0, 1, tma, cp.async\n");
  CHECK_FALSE(fs::exists(tmp / "a/ckpt.safetensors"));
}

// Some environments set OPENBLAS_CORETYPE (this project's workplace sets Haswell):
// on an AVX-512 CPU where OpenBLAS does float32's products that halves every
// one, so the run says so; where our own kernel does them it changes nothing.
TEST_CASE("OPENBLAS_CORETYPE that narrows OpenBLAS's kernels on an AVX-512 CPU gets a one-line note", "[reliability]") {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  const bool avx512 = false;
#endif
  for (const std::string kernel : {"openblas", ""})
    for (const std::string value : {"Haswell", "SkylakeX", ""}) {
      INFO("OPENBLAS_CORETYPE=" << value << " ATTOGRAD_F32_GEMM=" << kernel);
      TempDir tmp;
      Child run(tiny_run(tmp / "a", 1), tmp.path, {"OPENBLAS_CORETYPE=" + value, "ATTOGRAD_F32_GEMM=" + kernel});
      if (value == "SkylakeX" && !avx512) {  // its kernels would die of an illegal instruction
        CHECK(run.exit_code() == 1);
        CHECK(run.err() == "attograd: error: [matmul] OPENBLAS_CORETYPE=SkylakeX gives OpenBLAS its SkylakeX kernels, "
                           "which need AVX-512: this CPU lacks it (unset it)\n");
        CHECK_FALSE(fs::exists(tmp / "a"));  // no run begun
        continue;
      }
      REQUIRE(run.exit_code() == 0);
      const std::string note = "note: OPENBLAS_CORETYPE=Haswell keeps OpenBLAS on its Haswell kernels on this AVX-512 CPU";
      if (value == "Haswell" && avx512 && kernel == "openblas")  // by default ours does float32 there
        CHECK_THAT(run.out(), Catch::Contains(note));
      else
        CHECK_THAT(run.out(), !Catch::Contains("note: OPENBLAS_CORETYPE"));
      CHECK_THAT(run.out(), Catch::Contains(", float32 (" + (kernel.empty() ? std::string(avx512 ? "avx512" : "openblas") : kernel) + ")"));
    }
}

// Without bfloat16 instructions (as ATTOGRAD_BF16_ISA=widen runs) the header
// names the float32 kernel the widened products run on: ours where it runs
// (it widens as it packs), OpenBLAS only when ATTOGRAD_F32_GEMM asks for it.
TEST_CASE("a bfloat16 run without bfloat16 instructions names the float32 kernel its products run on", "[reliability][bf16]") {
  const bool avx512 = cpu::f32_kernel_runs_here(cpu::F32Kernel::avx512);
  const bool avx2 = cpu::f32_kernel_runs_here(cpu::F32Kernel::avx2);
  for (const std::string kernel : {"openblas", ""}) {
    INFO("ATTOGRAD_F32_GEMM=" << kernel);
    TempDir tmp;
    std::vector<std::string> args = tiny_run(tmp / "a", 1);
    args.insert(args.end(), {"--dtype", "bfloat16"});
    Child run(args, tmp.path, {"ATTOGRAD_BF16_ISA=widen", "ATTOGRAD_F32_GEMM=" + kernel});
    REQUIRE(run.exit_code() == 0);
    const std::string ours = avx512 ? "avx512" : avx2 ? "avx2" : "openblas";
    CHECK_THAT(run.out(), Catch::Contains(", bfloat16 (widen: " + (kernel.empty() ? ours : kernel) + ")"));
  }
}

// OpenBLAS 0.3.21 (Debian 12's) took an Emerald Rapids Xeon (family 6 model
// 207), which its tables do not know, for a Prescott: SSE3 kernels, a ninth of
// the speed of every float32 product. Where it falls back so, and the user did
// not choose, prepare_blas gives it this CPU's kernels.
TEST_CASE("OpenBLAS's generic fallback kernels are replaced by the CPU's own, a user's choice is kept", "[reliability][blas]") {
  cpu::VectorIsa avx512_bf16, avx512, avx2, sse;
  avx512_bf16.avx2_fma = avx512_bf16.avx512 = avx512_bf16.avx512_bf16 = true;
  avx512.avx2_fma = avx512.avx512 = true;
  avx2.avx2_fma = true;
  CHECK(std::string(cpu::blas_kernels_instead_of("Prescott", avx512_bf16)) == "Cooperlake");
  CHECK(std::string(cpu::blas_kernels_instead_of("Prescott", avx512)) == "SkylakeX");
  CHECK(std::string(cpu::blas_kernels_instead_of("Katmai", avx2)) == "Haswell");
  CHECK(cpu::blas_kernels_instead_of("Prescott", sse) == nullptr);  // nothing better to give
  for (const char* known : {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen"})
    CHECK(cpu::blas_kernels_instead_of(known, avx512_bf16) == nullptr);  // OpenBLAS's own pick of a known CPU
  CHECK(std::string(cpu::blas_kernels_need("SkylakeX", avx2)) == "AVX-512");
  CHECK(std::string(cpu::blas_kernels_need("Cooperlake", avx512)) == "AVX512_BF16");
  CHECK(std::string(cpu::blas_kernels_need("Haswell", sse)) == "AVX2 and FMA");
  for (const char* runs : {"Haswell", "Zen", "Prescott"}) CHECK(cpu::blas_kernels_need(runs, avx2) == nullptr);
  CHECK(cpu::blas_kernels_need("SapphireRapids", avx512_bf16) == nullptr);

  // This process: after prepare_blas, OpenBLAS runs no generic kernels on a CPU with AVX2
  // (unless OPENBLAS_CORETYPE chose them); a CLI run whose user chose them keeps them.
  prepare_blas();
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if ((!forced || !*forced) && cpu::this_cpu_vector_isa().avx2_fma) {
    INFO("OpenBLAS core: " << cpu::blas_kernels_in_use());
    CHECK(cpu::blas_kernels_instead_of(cpu::blas_kernels_in_use(), cpu::this_cpu_vector_isa()) == nullptr);
  }
  TempDir tmp;
  Child forced_run(tiny_run(tmp / "a", 1), tmp.path, {"OPENBLAS_CORETYPE=Prescott"});
  REQUIRE(forced_run.exit_code() == 0);
  CHECK_THAT(forced_run.out(), !Catch::Contains("attograd gave it"));  // the user's choice stands
}

// ---- interrupted runs ------------------------------------------------------------------

TEST_CASE("SIGINT and SIGTERM and SIGHUP finish the step, save, exit 128 + signal, and --resume continues exactly",
          "[reliability]") {
  for (const int signo : {SIGINT, SIGTERM, SIGHUP}) {
    const std::string name = signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : "SIGHUP";
    INFO(name);
    TempDir tmp;
    const std::string ckpt = tmp / "a/ckpt.safetensors";
    // A long run (no evaluation before the signal), stopped once it is a few steps in.
    std::vector<std::string> args = tiny_run(tmp / "a", 1000000);
    args.insert(args.end(), {"--eval-interval", "1000000"});
    Child run(args, tmp.path);
    REQUIRE(wait_until([&] { return lines(file_text(tmp / "a/metrics.jsonl")) >= 3; }));
    run.signal(signo);
    CHECK(run.exit_code() == 128 + signo);
    const std::string err = run.err();
    INFO("stderr: " << err);
    std::smatch m;
    REQUIRE(std::regex_search(err, m, std::regex("stopped by " + name + " after step ([0-9]+)")));
    const std::int64_t stopped = std::stoll(m[1]);
    CHECK(stopped >= 3);
    CHECK_THAT(err, Catch::Contains("--resume " + ckpt));
    CHECK(lines(err) == 1);
    CHECK_THAT(run.out(), Catch::Contains(name + ": saving step " + std::to_string(stopped)));
    REQUIRE(train::output::load_checkpoint(ckpt).info.step == stopped);

    // Resumed to a few steps further, it equals one run straight there.
    const std::string until = std::to_string(stopped + 3);
    Child resumed({"train", "--resume", ckpt, "--stop-at", until, "--threads", "1", "--quiet"}, tmp.path);
    CHECK(resumed.exit_code() == 0);
    args = tiny_run(tmp / "b", 1000000);
    args.insert(args.end(), {"--eval-interval", "1000000", "--stop-at", until});
    Child straight(args, tmp.path);
    CHECK(straight.exit_code() == 0);
    require_same_checkpoint(ckpt, tmp / "b/ckpt.safetensors");
  }
}

// ---- the run directory: never another run's files -----------------------------------------

TEST_CASE("a run directory holding another run is refused, one in use is locked, the default is numbered",
          "[reliability]") {
  TempDir tmp;
  const fs::path dir = tmp / "run";
  const std::string ckpt = (dir / "ckpt.safetensors").string();
  REQUIRE(cli(tiny_run(dir.string(), 2)).code == 0);
  const std::string checkpoint = file_text(ckpt), metrics = file_text(dir / "metrics.jsonl");

  // A new run into it: refused, and nothing of the old run touched.
  const CliResult again = cli(tiny_run(dir.string(), 3));
  INFO("stderr: " << again.err);
  CHECK(again.code == 1);
  CHECK(lines(again.err) == 1);
  CHECK_THAT(again.err, Catch::Contains("[--out]") && Catch::Contains("holds another run's checkpoint") &&
                            Catch::Contains("--resume " + ckpt));
  CHECK(file_text(ckpt) == checkpoint);
  CHECK(file_text(dir / "metrics.jsonl") == metrics);
  // So is a run resumed from a checkpoint elsewhere.
  REQUIRE(cli(tiny_run(tmp / "other", 2)).code == 0);
  const CliResult elsewhere =
      cli({"train", "--resume", tmp / "other/ckpt.safetensors", "--out", dir.string(), "--steps", "3", "--quiet"});
  CHECK_THAT(elsewhere.err, Catch::Contains("holds another run's checkpoint"));
  CHECK(file_text(ckpt) == checkpoint);

  // While a run holds the directory's lock, a second run there (resuming it) is refused at once.
  {
    const int fd = ::open((dir / ".attograd.lock").c_str(), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
    const CliResult locked = cli({"train", "--resume", ckpt, "--steps", "3", "--threads", "1", "--quiet"});
    ::close(fd);
    CHECK(locked.code == 1);
    CHECK_THAT(locked.err, Catch::Contains("[--out] '" + dir.string() + "' is in use by another attograd run"));
    CHECK(file_text(ckpt) == checkpoint);
  }
  // Resuming it, with the lock free, continues in it; so does resuming a copy kept beside it.
  CHECK(cli({"train", "--resume", ckpt, "--steps", "3", "--threads", "1", "--quiet"}).code == 0);
  CHECK(train::output::load_checkpoint(ckpt).info.step == 3);
  fs::copy_file(ckpt, dir / "step3.safetensors");
  CHECK(cli({"train", "--resume", ckpt, "--steps", "4", "--threads", "1", "--quiet"}).code == 0);
  const CliResult rolled_back =
      cli({"train", "--resume", (dir / "step3.safetensors").string(), "--steps", "4", "--threads", "1", "--quiet"});
  INFO("stderr: " << rolled_back.err);
  CHECK(rolled_back.code == 0);
  CHECK(train::output::load_checkpoint(ckpt).info.step == 4);

  // A run file that is not a file is refused before any step is spent.
  fs::create_directories(tmp / "odd/ckpt.safetensors");
  const CliResult odd = cli(tiny_run(tmp / "odd", 2));
  CHECK_THAT(odd.err, Catch::Contains("[--out]") && Catch::Contains("is not a regular file"));

  // The default directory of a new run skips the ones holding runs.
  CHECK(train::output::first_free_run_dir(tmp / "fresh") == tmp / "fresh");
  CHECK(train::output::first_free_run_dir(dir) == fs::path(dir.string() + "-2"));
  fs::create_directories(dir.string() + "-2");
  write_text(dir.string() + "-2/ckpt.safetensors", "x");
  CHECK(train::output::first_free_run_dir(dir) == fs::path(dir.string() + "-3"));
  // A run still before its first checkpoint holds its directory too.
  train::output::RunDirectory running(dir.string() + "-3", "");
  CHECK(train::output::first_free_run_dir(dir) == fs::path(dir.string() + "-4"));
}

TEST_CASE("a text run resumes from any directory, and only on the text it was trained on", "[reliability]") {
  TempDir tmp;
  fs::create_directories(tmp / "data");
  fs::create_directories(tmp / "elsewhere");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the cat sat on the mat. "[i % 24];
  write_text(tmp / "data/book.txt", text);
  const std::string ckpt = tmp / "run/ckpt.safetensors";
  // attograd started in `dir` (Child starts it in this process's directory).
  const auto in_dir = [&](const std::string& dir, std::vector<std::string> args) {
    args.insert(args.begin(), {"-c", "cd \"$0\" && exec \"$@\"", dir, kAttogradBinary});
    return std::make_unique<Child>(args, tmp.path, std::vector<std::string>{}, "/bin/sh");
  };
  const auto first = in_dir(tmp / "data", {"train", "--data", "book.txt", "--layers", "1", "--width", "16", "--heads",
                                           "2", "--block", "8", "--batch", "4", "--steps", "2", "--threads", "1",
                                           "--out", tmp / "run", "--quiet"});
  REQUIRE(first->exit_code() == 0);
  // From another directory: the checkpoint names the text by its absolute path.
  const auto resumed = in_dir(tmp / "elsewhere", {"train", "--resume", ckpt, "--steps", "3", "--threads", "1", "--quiet"});
  CHECK(resumed->exit_code() == 0);
  REQUIRE(train::output::load_checkpoint(ckpt).info.step == 3);
  // The text moved (a project copied elsewhere): --data names it again, and its fingerprint vouches for it.
  fs::rename(tmp / "data", tmp / "moved");
  const auto moved = in_dir(tmp / "elsewhere", {"train", "--resume", ckpt, "--data", tmp / "moved/book.txt", "--steps",
                                                "4", "--threads", "1", "--quiet"});
  CHECK(moved->exit_code() == 0);
  REQUIRE(train::output::load_checkpoint(ckpt).info.step == 4);
  // The same characters in another order, or a new one: the run would not be the same one.
  std::reverse(text.begin(), text.end());
  for (const std::string& changed_text : {text, text + "Z"}) {
    write_text(tmp / "moved/book.txt", changed_text);
    const auto changed = in_dir(tmp / "elsewhere", {"train", "--resume", ckpt, "--steps", "5", "--threads", "1", "--quiet"});
    CHECK(changed->exit_code() == 1);
    INFO("stderr: " << changed->err());
    CHECK_THAT(changed->err(), Catch::Contains("[--resume]") && Catch::Contains("is not the text") &&
                                  Catch::Contains("400 bytes, FNV-1a 64"));
    CHECK(lines(changed->err()) == 1);
  }
  CHECK(train::output::load_checkpoint(ckpt).info.step == 4);
}

TEST_CASE("atomic writes refuse to replace what is not a regular file", "[reliability]") {
  TempDir tmp;
  const std::string fifo = tmp / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  REQUIRE_THROWS_WITH(train::write_file_atomically("--out", fifo, "x"),
                      Catch::Contains("[--out] cannot write '" + fifo + "': it exists and is not a regular file"));
  CHECK(fs::is_fifo(fifo));
  fs::create_directories(tmp / "dir");
  REQUIRE_THROWS_WITH(train::write_file_atomically("loss.svg", tmp / "dir", "x"), Catch::Contains("[loss.svg]"));
  CHECK(fs::is_directory(tmp / "dir"));
  // Through a link to a regular file: the link is replaced by the file, as before.
  write_text(tmp / "target", "old");
  fs::create_symlink(tmp / "target", tmp / "link");
  train::write_file_atomically("--out", tmp / "link", "new");
  CHECK(file_text(tmp / "link") == "new");
}

TEST_CASE("output that cannot be written is an error, not exit 0", "[reliability]") {
  if (!fs::exists("/dev/full")) {
    WARN("skipped: no /dev/full");
    return;
  }
  std::FILE* full = std::fopen("/dev/full", "w");
  REQUIRE(full);
  TempDir tmp;
  std::FILE* err = std::tmpfile();
  CHECK(train::cli::run_cli({"--help"}, full, err) == 1);
  std::fclose(full);
  std::rewind(err);
  char line[256] = {};
  CHECK(std::fgets(line, sizeof line, err) != nullptr);
  std::fclose(err);
  CHECK_THAT(std::string(line), Catch::Contains("[stdout] cannot write the output"));
}

TEST_CASE("a FIFO as --data waits for its writer, for a while, not for ever", "[reliability]") {
  TempDir tmp;
  const std::string fifo = tmp / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  REQUIRE_THROWS_WITH(train::read_file(fifo, "--data", 1000, 200),
                      Catch::Contains("[--data] '" + fifo + "' is a FIFO, and nothing wrote to it within 0.2 s"));
  // A writer that comes after the reader has started (cat book.txt > fifo, started second).
  std::thread writer([&] {
    std::this_thread::sleep_for(100ms);
    std::ofstream(fifo) << "some text";
  });
  CHECK(train::read_file(fifo, "--data", 1000, 10000) == "some text");
  writer.join();
}

TEST_CASE("metrics that cannot be written stop the run with an error", "[reliability]") {
  if (!fs::exists("/dev/full")) {
    WARN("skipped: no /dev/full");
    return;
  }
  train::output::MetricsLog log("/dev/full", 0);
  REQUIRE_THROWS_WITH(log.log(train::output::TrainRecord{1, 2.0, 0.1, 1.0, 100.0, 0.5}), Catch::Contains("[metrics] cannot write '/dev/full'"));
}

TEST_CASE("under nohup SIGHUP stays ignored, before a stop signal and after it", "[reliability]") {
  TempDir tmp;
  std::vector<std::string> args = tiny_run(tmp / "a", 1000000);
  args.insert(args.end(), {"--eval-interval", "1000000"});
  args.insert(args.begin(), kAttogradBinary);
  // Checkpoint writes pause halfway (a test-only hook): a signal can arrive while it saves.
  Child run(args, tmp.path, {"ATTOGRAD_TEST_WRITE_PAUSE_MS=1000"}, "nohup");
  REQUIRE(wait_until([&] { return lines(file_text(tmp / "a/metrics.jsonl")) >= 3; }));
  run.signal(SIGHUP);
  const std::int64_t before = lines(file_text(tmp / "a/metrics.jsonl"));
  CHECK(wait_until([&] { return lines(file_text(tmp / "a/metrics.jsonl")) > before + 2; }));  // still stepping
  // SIGTERM stops it; a SIGHUP while it saves must not kill it (the handler once re-enabled SIGHUP).
  run.signal(SIGTERM);
  REQUIRE(wait_until([&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(tmp.path / "a", ec))
      if (e.path().filename().string().rfind(".ckpt.safetensors.tmp", 0) == 0) return true;
    return false;
  }));
  run.signal(SIGHUP);
  CHECK(run.exit_code() == 128 + SIGTERM);
  CHECK_THAT(run.err(), Catch::Contains("stopped by SIGTERM"));
}

namespace {

// Starts `args` with every file write pausing halfway for `pause_ms` (a
// test-only hook), waits for a half-written temporary of `name` in `dir`, and
// kills the run there. Returns the temporary.
fs::path kill_while_writing(const std::vector<std::string>& args, const fs::path& dir, const std::string& name,
                            int pause_ms, const TempDir& tmp) {
  Child run(args, tmp.path, {"ATTOGRAD_TEST_WRITE_PAUSE_MS=" + std::to_string(pause_ms)});
  fs::path temporary;
  REQUIRE(wait_until([&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().rfind("." + name + ".tmp", 0) == 0 && fs::file_size(e.path(), ec) > 0)
        return temporary = e.path(), true;
    return false;
  }));
  run.signal(SIGKILL);
  const int status = run.wait();
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  return temporary;
}

}  // namespace

TEST_CASE("kill -9 in the middle of a checkpoint write or of resume's metrics rewrite leaves the old file whole",
          "[reliability]") {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  const std::string ckpt = (dir / "ckpt.safetensors").string(), metrics = (dir / "metrics.jsonl").string();
  Child first(tiny_run(dir, 10), tmp.path);  // steps 1-10; saves at 10
  REQUIRE(first.exit_code() == 0);
  const std::string before = file_text(ckpt), history = file_text(metrics);
  REQUIRE(train::output::load_checkpoint(ckpt).info.step == 10);
  const std::vector<std::string> resume = {"train", "--resume", ckpt, "--steps",   "20",
                                           "--eval-interval", "1", "--threads", "1", "--quiet"};

  // A resumed run first rewrites metrics.jsonl without the steps after its checkpoint's.
  const fs::path half_metrics = kill_while_writing(resume, dir, "metrics.jsonl", 60000, tmp);
  CHECK(file_text(half_metrics.string()).size() < history.size());
  CHECK(file_text(metrics) == history);
  CHECK(file_text(ckpt) == before);

  // The next run writes a checkpoint every step (after its metrics, which pause too, and go on).
  const fs::path temporary = kill_while_writing(resume, dir, "ckpt.safetensors", 3000, tmp);
  // Killed mid-write: the temporary holds half a checkpoint, the checkpoint is the old one, whole.
  const std::string half = file_text(temporary.string());
  CHECK(half.size() < before.size());
  CHECK_THROWS_AS(train::output::parse_checkpoint(half, "half"), Error);
  CHECK(file_text(ckpt) == before);
  CHECK(train::output::load_checkpoint(ckpt).info.step == 10);
  CHECK_THAT(file_text(metrics), Catch::StartsWith(history));

  // Resuming from it works, and clears the litter.
  Child again({"train", "--resume", ckpt, "--steps", "12", "--threads", "1", "--quiet"}, tmp.path);
  CHECK(again.exit_code() == 0);
  CHECK(train::output::load_checkpoint(ckpt).info.step == 12);
  CHECK_FALSE(fs::exists(temporary));
  CHECK_FALSE(fs::exists(half_metrics));
}

TEST_CASE("a loss that becomes NaN or infinite stops the run naming the step, keeping the last good checkpoint",
          "[reliability]") {
  TempDir tmp;
  // A learning rate of 1e30 blows the weights up after the first update.
  std::vector<std::string> args = tiny_run(tmp / "run", 50);
  args.insert(args.end(), {"--lr", "1e30", "--eval-interval", "1", "--grad-clip", "0"});
  const CliResult r = cli(args);
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  std::smatch m;
  REQUIRE(std::regex_search(r.err, m, std::regex("\\[train\\] the (loss|gradient norm) became (NaN|\\+inf|-inf) at step ([0-9]+)")));
  const std::int64_t bad_step = std::stoll(m[3]);
  CHECK(bad_step >= 2);
  const std::string ckpt = tmp / "run/ckpt.safetensors";
  CHECK_THAT(r.err, Catch::Contains("the last good checkpoint is " + ckpt + " (step " + std::to_string(bad_step - 1) +
                                    ")"));
  const train::output::LoadedCheckpoint kept = train::output::load_checkpoint(ckpt);
  CHECK(kept.info.step == bad_step - 1);
  for (const auto& p : kept.model->named_parameters())
    for (float v : contiguous(p.tensor).to_vector<float>()) REQUIRE(std::isfinite(v));
}

// ---- the fuzzers' inputs --------------------------------------------------------------------

TEST_CASE("fuzz seed corpus and saved crashes run cleanly through their targets", "[reliability]") {
  const fs::path root(kFuzzDir);
  for (const auto& [name, target] : {std::pair{std::string("checkpoint"), &fuzz::checkpoint},
                                     std::pair{std::string("text"), &fuzz::text},
                                     std::pair{std::string("shard"), &fuzz::shard},
                                     std::pair{std::string("tokenizer"), &fuzz::tokenizer},
                                     std::pair{std::string("hf"), &fuzz::hf}}) {
    std::int64_t inputs = 0;
    for (const char* kind : {"corpus", "regressions"}) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(root / kind / name, ec)) {
        if (!e.is_regular_file() || e.path().filename().string()[0] == '.') continue;
        INFO(e.path().string());
        const std::string bytes = file_text(e.path().string());
        CHECK(target(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()) == 0);
        ++inputs;
      }
    }
    INFO(name);
    CHECK(inputs >= 5);  // the seed corpus is there
  }
}

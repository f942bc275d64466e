// GPT-2 weights in Hugging Face's layout (train/output/hf_gpt2.h): folders
// written and read back to the byte, folders made by hand in transformers'
// layout, every refusal in one line naming its key, and attograd's logits
// against GPT-2's forward computed by numpy from the folder alone
// (tests/reference/gpt2_numpy.py), and against transformers' own where a
// folder it made is named (tests/reference/hf_transformers_check.py).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "bpe_files.h"
#include "build_paths.h"
#include "child_process.h"
#include "program_helpers.h"
#include "tensor/kernels.h"
#include "tensor/rng.h"
#include "train/model/generate.h"
#include "train/output/hf_gpt2.h"
#include "train/output/safetensors.h"

namespace attograd::test {

namespace {

using train::output::HfGpt2;
using train::output::read_hf_gpt2;
using train::output::write_hf_gpt2;

nn::GPTConfig hf_tiny_config(bool tie, std::int64_t vocab = 100) {
  nn::GPTConfig c;
  c.vocab_size = vocab;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.tie_weights = tie;
  return c;
}

// Every parameter drawn at random, LayerNorms and biases included, so that a
// tensor put in the wrong place or left untransposed changes the logits.
std::unique_ptr<nn::GPT> hf_random_gpt(const nn::GPTConfig& c, std::uint64_t seed = 7) {
  auto model = std::make_unique<nn::GPT>(c);
  NoGradGuard no_grad;
  Generator gen(seed);
  for (const nn::NamedParameter& p : model->named_parameters())
    kernels::copy_(p.tensor, normal(p.tensor.sizes(), 0.0, 0.3, p.tensor.options(), gen));
  model->eval();
  return model;
}

std::unique_ptr<nn::GPT> hf_model_of(const HfGpt2& hf) {
  auto model = std::make_unique<nn::GPT>(hf.config);
  model->load_state_dict(hf.state);
  model->eval();
  return model;
}

std::vector<std::int64_t> hf_tokens(std::int64_t n, std::int64_t vocab) {
  std::vector<std::int64_t> t;
  for (std::int64_t i = 0; i < n; ++i) t.push_back((i * 37 + 11) % vocab);
  return t;
}

std::vector<float> hf_logits(const nn::GPT& model, const std::vector<std::int64_t>& tokens) {
  NoGradGuard no_grad;
  const std::int64_t n = static_cast<std::int64_t>(tokens.size());
  return contiguous(model(from_vector(tokens, {1, n}))).to_vector<float>();
}

void hf_check_same_parameters(const nn::GPT& a, const nn::GPT& b) {
  const nn::StateDict sa = a.state_dict(), sb = b.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (const auto& [name, t] : sa) {
    INFO(name);
    REQUIRE(sb.contains(name));
    CHECK(t.sizes() == sb.at(name).sizes());
    CHECK(contiguous(t).to_vector<float>() == contiguous(sb.at(name)).to_vector<float>());
  }
}

// The one-line error reading `dir` gives, or "(no error)".
std::string hf_error(const std::string& dir) {
  try {
    read_hf_gpt2(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

nlohmann::json hf_read_json(const std::string& path) { return nlohmann::json::parse(file_text(path)); }

}  // namespace

TEST_CASE("hf_gpt2: a model written in Hugging Face's layout reads back with the same parameters and logits", "[hf]") {
  for (bool tie : {true, false}) {
    INFO("tied: " << tie);
    TempDir dir;
    const auto model = hf_random_gpt(hf_tiny_config(tie));
    write_hf_gpt2(dir / "hf", *model);
    const HfGpt2 hf = read_hf_gpt2(dir / "hf");
    CHECK(hf.config.n_layer == 2);
    CHECK(hf.config.n_head == 4);
    CHECK(hf.config.n_embd == 32);
    CHECK(hf.config.block_size == 16);
    CHECK(hf.config.vocab_size == 100);
    CHECK(hf.config.tie_weights == tie);
    const auto back = hf_model_of(hf);
    hf_check_same_parameters(*model, *back);
    const std::vector<std::int64_t> tokens = hf_tokens(16, 100);
    CHECK(hf_logits(*model, tokens) == hf_logits(*back, tokens));

    const train::output::Safetensors file = train::output::load_safetensors(dir / "hf/model.safetensors");
    CHECK(file.metadata == train::output::Metadata{{"format", "pt"}});
    CHECK(file.tensors.at("transformer.h.0.attn.c_attn.weight").sizes() == Shape{32, 96});
    CHECK(file.tensors.at("transformer.h.1.mlp.c_proj.weight").sizes() == Shape{128, 32});
    CHECK(file.tensors.contains("lm_head.weight") == !tie);
    const nlohmann::json config = hf_read_json(dir / "hf/config.json");
    CHECK(config["tie_word_embeddings"] == tie);
    CHECK(config["activation_function"] == "gelu_new");
    CHECK(config["model_type"] == "gpt2");
    CHECK(config["bos_token_id"].is_null());
  }
}

TEST_CASE("hf_gpt2: writing what was read gives the same bytes", "[hf]") {
  for (bool tie : {true, false}) {
    INFO("tied: " << tie);
    TempDir dir;
    write_hf_gpt2(dir / "a", *hf_random_gpt(hf_tiny_config(tie)));
    write_hf_gpt2(dir / "b", *hf_model_of(read_hf_gpt2(dir / "a")));
    write_hf_gpt2(dir / "c", *hf_model_of(read_hf_gpt2(dir / "b")));
    for (const char* file : {"config.json", "model.safetensors"}) {
      INFO(file);
      CHECK(file_text(dir / "a/" + file) == file_text(dir / "b/" + file));
      CHECK(file_text(dir / "b/" + file) == file_text(dir / "c/" + file));
    }
  }
}

TEST_CASE("hf_gpt2: a padded vocabulary is written as its first vocab_size rows", "[hf]") {
  for (bool tie : {true, false}) {
    INFO("tied: " << tie);
    TempDir dir;
    const auto model = hf_random_gpt(hf_tiny_config(tie, 104));
    write_hf_gpt2(dir / "hf", *model, {.vocab_size = 100});
    const HfGpt2 hf = read_hf_gpt2(dir / "hf");
    CHECK(hf.config.vocab_size == 100);
    CHECK(hf_read_json(dir / "hf/config.json")["vocab_size"] == 100);
    const std::vector<std::int64_t> tokens = hf_tokens(16, 100);
    const std::vector<float> padded = hf_logits(*model, tokens), written = hf_logits(*hf_model_of(hf), tokens);
    REQUIRE(written.size() == 16 * 100);
    for (std::size_t t = 0; t < 16; ++t)
      for (std::size_t v = 0; v < 100; ++v) REQUIRE(written[t * 100 + v] == padded[t * 104 + v]);
    CHECK_THROWS_WITH(write_hf_gpt2(dir / "bad", *model, {.vocab_size = 105}),
                      Catch::Contains("vocab_size 105") && Catch::Contains("104"));
  }
}

TEST_CASE("hf_gpt2: GPT-2's vocabulary is written with <|endoftext|> as bos and eos", "[hf]") {
  TempDir dir;
  nn::GPTConfig c = hf_tiny_config(true, 50304);
  c.n_layer = 1;
  write_hf_gpt2(dir / "hf", nn::GPT(c), {.vocab_size = 50257});
  const nlohmann::json config = hf_read_json(dir / "hf/config.json");
  CHECK(config["vocab_size"] == 50257);
  CHECK(config["bos_token_id"] == 50256);
  CHECK(config["eos_token_id"] == 50256);
  CHECK(read_hf_gpt2(dir / "hf").state.at("wte.weight").sizes() == Shape{50257, 32});
}

namespace {

// Tensor k's element i in the hand-made folder: m / 1024 with m < 2048, exact in
// a half, unique within each tensor.
float hf_hand_value(std::size_t k, std::int64_t i) {
  return static_cast<float>((static_cast<std::int64_t>(k) * 37 + i) % 2048) / 1024;
}

// v's bytes as `dtype` stores it: F32 as it is, BF16 its top half (truncated),
// F16 its half, which these values have exactly; and the value read back.
std::string hf_hand_bytes(float v, const std::string& dtype) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (dtype == "F32") return std::string(reinterpret_cast<const char*>(&bits), 4);
  std::uint16_t h = static_cast<std::uint16_t>(bits >> 16);
  if (dtype == "F16")
    h = bits == 0 ? 0 : static_cast<std::uint16_t>(((((bits >> 23) & 0xffu) - 112) << 10) | ((bits >> 13) & 0x3ffu));
  return std::string(reinterpret_cast<const char*>(&h), 2);
}
float hf_hand_read(float v, const std::string& dtype) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (dtype == "BF16") bits &= 0xffff0000u;
  std::memcpy(&v, &bits, 4);
  return v;
}

// A GPT-2 folder as older transformers wrote it, made here byte by byte:
// n_ctx for n_positions, no "transformer." prefix, the causal-mask buffers, no
// lm_head (tied), tensors in `dtype`.
void hf_write_by_hand(const std::string& dir, const std::string& dtype) {
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", R"({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 8, "n_embd": 8, "n_head": 2, "n_layer": 1,
    "vocab_size": 10})");
  const std::vector<std::pair<std::string, Shape>> shapes = {
      {"wte.weight", {10, 8}},          {"wpe.weight", {8, 8}},          {"h.0.ln_1.weight", {8}},
      {"h.0.ln_1.bias", {8}},           {"h.0.attn.bias", {1, 1, 8, 8}}, {"h.0.attn.masked_bias", {}},
      {"h.0.attn.c_attn.weight", {8, 24}}, {"h.0.attn.c_attn.bias", {24}}, {"h.0.attn.c_proj.weight", {8, 8}},
      {"h.0.attn.c_proj.bias", {8}},    {"h.0.ln_2.weight", {8}},        {"h.0.ln_2.bias", {8}},
      {"h.0.mlp.c_fc.weight", {8, 32}}, {"h.0.mlp.c_fc.bias", {32}},     {"h.0.mlp.c_proj.weight", {32, 8}},
      {"h.0.mlp.c_proj.bias", {8}},     {"ln_f.weight", {8}},            {"ln_f.bias", {8}}};
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  std::string data;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const std::size_t begin = data.size();
    std::int64_t n = 1;
    for (std::int64_t d : shapes[k].second) n *= d;
    for (std::int64_t i = 0; i < n; ++i) data += hf_hand_bytes(hf_hand_value(k, i), dtype);
    header[shapes[k].first] = {{"dtype", dtype}, {"shape", shapes[k].second}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string json = header.dump();
  const std::uint64_t length = json.size();
  write_text(dir + "/model.safetensors", std::string(reinterpret_cast<const char*>(&length), 8) + json + data);
}

}  // namespace

TEST_CASE("hf_gpt2: a folder in transformers' older layout, made by hand, loads with Conv1D weights transposed",
          "[hf]") {
  for (const std::string dtype : {"F32", "F16", "BF16"}) {
    INFO(dtype);
    TempDir dir;
    hf_write_by_hand(dir / "hf", dtype);
    const HfGpt2 hf = read_hf_gpt2(dir / "hf");
    CHECK(hf.config.block_size == 8);
    CHECK(hf.config.vocab_size == 10);
    CHECK(hf.config.tie_weights);
    CHECK(hf.state.size() == 16);  // the buffers are not parameters
    const Tensor qkv = hf.state.at("blocks.0.attn.qkv.weight");
    REQUIRE(qkv.sizes() == Shape{24, 8});
    REQUIRE(qkv.dtype() == DType::f32);
    auto stored = [&](std::size_t k, std::int64_t i) { return hf_hand_read(hf_hand_value(k, i), dtype); };
    // c_attn.weight is tensor 6: its (in 3, out 17) value is at qkv (17, 3).
    CHECK(qkv.to_vector<float>()[17 * 8 + 3] == stored(6, 3 * 24 + 17));
    CHECK(hf.state.at("blocks.0.mlp.proj.weight").sizes() == Shape{8, 32});
    CHECK(hf.state.at("blocks.0.mlp.proj.weight").to_vector<float>()[1] == stored(14, 8));
    CHECK(hf.state.at("wpe.weight").to_vector<float>()[9] == stored(1, 9));
    CHECK(hf.state.at("ln_f.bias").to_vector<float>()[2] == stored(17, 2));
    CHECK(hf_logits(*hf_model_of(hf), {1, 2, 3}).size() == 3 * 10);
  }
}

TEST_CASE("hf_gpt2: F16 is widened only where asked: a checkpoint's reader refuses it", "[hf]") {
  TempDir dir;
  hf_write_by_hand(dir / "hf", "F16");
  CHECK_THROWS_WITH(train::output::load_safetensors(dir / "hf/model.safetensors"),
                    Catch::Contains("has unknown dtype \"F16\" (F32, F64, I64, BF16)"));
  CHECK(train::output::load_safetensors(dir / "hf/model.safetensors", "--ckpt", {.widen_f16 = true})
            .tensors.at("wte.weight")
            .dtype() == DType::f32);
}

namespace {

// A valid folder of the tiny model in dir/hf, its config.json changed by `edit`.
template <typename Edit>
std::string hf_with_config(const TempDir& dir, bool tie, Edit edit) {
  write_hf_gpt2(dir / "hf", *hf_random_gpt(hf_tiny_config(tie)));
  nlohmann::json config = hf_read_json(dir / "hf/config.json");
  edit(config);
  write_text(dir / "hf/config.json", config.dump());
  return dir / "hf";
}

// The same with its tensors changed by `edit`.
template <typename Edit>
std::string hf_with_tensors(const TempDir& dir, bool tie, Edit edit) {
  write_hf_gpt2(dir / "hf", *hf_random_gpt(hf_tiny_config(tie)));
  train::output::Safetensors file = train::output::load_safetensors(dir / "hf/model.safetensors");
  edit(file.tensors);
  const train::output::NamedTensors tensors(file.tensors.begin(), file.tensors.end());
  write_text(dir / "hf/model.safetensors", train::output::serialize_safetensors(tensors));
  return dir / "hf";
}

// The error names the file and holds every one of `words`, on one line.
void hf_check_refusal(const std::string& error, const std::string& file, const std::vector<std::string>& words) {
  INFO(error);
  CHECK(error.rfind("[" + file, 0) == 0);
  CHECK(error.find('\n') == std::string::npos);
  for (const std::string& w : words) CHECK(error.find(w) != std::string::npos);
}

}  // namespace

TEST_CASE("hf_gpt2: a config.json attograd cannot honour is refused in one line naming the key and value", "[hf]") {
  struct Case {
    const char* key;
    nlohmann::json value;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {"activation_function", "relu", {"activation_function", "\"relu\""}},
      {"activation_function", "gelu", {"activation_function", "\"gelu\""}},
      {"layer_norm_epsilon", 1e-6, {"layer_norm_epsilon", "1e-06"}},
      {"scale_attn_by_inverse_layer_idx", true, {"scale_attn_by_inverse_layer_idx is true"}},
      {"reorder_and_upcast_attn", true, {"reorder_and_upcast_attn is true"}},
      {"add_cross_attention", true, {"add_cross_attention is true"}},
      {"scale_attn_weights", false, {"scale_attn_weights is false"}},
      {"n_inner", 100, {"n_inner is 100", "128"}},
      {"model_type", "gpt_neo", {"model_type", "\"gpt_neo\""}},
      {"n_head", 5, {"n_embd 32 is not a multiple of n_head 5"}},
      {"n_layer", -1, {"n_layer is -1"}},
      {"n_embd", std::int64_t{1} << 40, {"n_embd is 1099511627776"}},
      {"vocab_size", "100", {"vocab_size is \"100\""}},
      {"tie_word_embeddings", 1, {"tie_word_embeddings is 1"}},
  };
  for (const Case& c : cases) {
    INFO(c.key << " = " << c.value.dump());
    TempDir dir;
    const std::string folder = hf_with_config(dir, true, [&](nlohmann::json& j) { j[c.key] = c.value; });
    hf_check_refusal(hf_error(folder), folder + "/config.json", c.words);
  }
  TempDir dir;
  const std::string folder = hf_with_config(dir, true, [](nlohmann::json& j) { j.erase("n_positions"), j.erase("n_ctx"); });
  hf_check_refusal(hf_error(folder), folder + "/config.json", {"n_positions is missing"});
}

TEST_CASE("hf_gpt2: gelu_pytorch_tanh, GPT-2's GELU by another name, is read", "[hf]") {
  TempDir dir;
  const std::string folder =
      hf_with_config(dir, true, [](nlohmann::json& j) { j["activation_function"] = "gelu_pytorch_tanh"; });
  CHECK(hf_error(folder) == "(no error)");
}

TEST_CASE("hf_gpt2: a missing, unexpected, mis-shaped or mis-typed tensor is refused in one line naming it", "[hf]") {
  using Tensors = std::map<std::string, Tensor>;
  TempDir dir;
  const std::string file = dir / "hf/model.safetensors";
  SECTION("missing") {
    const std::string f = hf_with_tensors(dir, true, [](Tensors& t) { t.erase("transformer.h.1.mlp.c_fc.bias"); });
    hf_check_refusal(hf_error(f), file, {"'h.1.mlp.c_fc.bias' is missing"});
  }
  SECTION("a whole layer missing") {
    const std::string f = hf_with_config(dir, true, [](nlohmann::json& j) { j["n_layer"] = 3; });
    hf_check_refusal(hf_error(f), file, {"'h.2.ln_1.weight' is missing", "n_layer 3"});
  }
  SECTION("more layers than the file could hold, refused before a list of them is made") {
    const std::string f = hf_with_config(dir, true, [](nlohmann::json& j) { j["n_layer"] = (1LL << 31) - 1; });
    hf_check_refusal(hf_error(f), file, {"holds 28 weights, too few for config.json's n_layer 2147483647"});
  }
  SECTION("unexpected") {
    const std::string f =
        hf_with_tensors(dir, true, [](Tensors& t) { t["transformer.h.2.ln_1.weight"] = zeros({32}); });
    hf_check_refusal(hf_error(f), file, {"unexpected tensor 'h.2.ln_1.weight'", "[32]"});
  }
  SECTION("mis-shaped") {
    const std::string f = hf_with_tensors(dir, true, [](Tensors& t) {
      t["transformer.h.0.attn.c_attn.weight"] = zeros({96, 32});  // Linear's layout, not Conv1D's
    });
    hf_check_refusal(hf_error(f), file, {"'h.0.attn.c_attn.weight' is [96,32]", "[32,96]"});
  }
  SECTION("mis-typed") {
    const std::string f =
        hf_with_tensors(dir, true, [](Tensors& t) { t["transformer.ln_f.bias"] = zeros({32}, {DType::f64}); });
    hf_check_refusal(hf_error(f), file, {"'transformer.ln_f.bias'", "float64"});
  }
  SECTION("twice") {
    const std::string f = hf_with_tensors(dir, true, [](Tensors& t) { t["wpe.weight"] = t["transformer.wpe.weight"]; });
    hf_check_refusal(hf_error(f), file, {"'wpe.weight' is there twice"});
  }
  SECTION("an lm_head.weight of its own while tie_word_embeddings is true") {
    const std::string f = hf_with_tensors(dir, true, [](Tensors& t) { t["lm_head.weight"] = zeros({100, 32}); });
    hf_check_refusal(hf_error(f), file, {"'lm_head.weight' differs from wte.weight", "tie_word_embeddings is true"});
  }
  SECTION("no lm_head.weight while tie_word_embeddings is false") {
    const std::string f = hf_with_tensors(dir, false, [](Tensors& t) { t.erase("lm_head.weight"); });
    hf_check_refusal(hf_error(f), file, {"'lm_head.weight' is missing", "tie_word_embeddings is false"});
  }
}

TEST_CASE("hf_gpt2: an lm_head.weight equal to wte.weight reads as tied", "[hf]") {
  TempDir dir;
  const std::string f = hf_with_tensors(dir, true, [](std::map<std::string, Tensor>& t) {
    t["lm_head.weight"] = t["transformer.wte.weight"];
  });
  const HfGpt2 hf = read_hf_gpt2(f);
  CHECK(hf.config.tie_weights);
  CHECK_FALSE(hf.state.contains("lm_head.weight"));
}

namespace {

// The largest |a - b| over the largest |b|: float32 against a float64 reference.
double hf_relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 0, error = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(b[i]));
    error = std::max(error, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return error / scale;
}

}  // namespace

// numpy reads the folder attograd wrote on its own (tests/reference/gpt2_numpy.py):
// its forward, in float64, is GPT2LMHeadModel's, so equal logits mean the
// folder holds the function attograd computes.
TEST_CASE("hf_gpt2: attograd's logits and loss are GPT-2's as numpy computes them from the written folder", "[hf]") {
  const std::string python = reference_python();
  if (python.empty()) {
    WARN("skipped: no reference Python with numpy (set ATTOGRAD_REFERENCE_PYTHON, or run .ci/install-deps)");
    return;
  }
  const std::string script = (std::filesystem::path(kSourceDir) / "tests/reference/gpt2_numpy.py").string();
  for (bool tie : {true, false}) {
    INFO("tied: " << tie);
    TempDir dir;
    const auto model = hf_random_gpt(hf_tiny_config(tie));
    write_hf_gpt2(dir / "hf", *model);
    const std::vector<std::int64_t> tokens = hf_tokens(16, 100);
    write_text(dir / "ids.json", nlohmann::json{{"tokens", tokens}}.dump());
    Child numpy({script, dir / "hf", dir / "ids.json", dir / "out.json"}, dir.path, {}, python);
    const int code = numpy.exit_code();
    if (code == 2) {
      WARN("skipped: " << numpy.err());
      return;
    }
    REQUIRE(code == 0);
    const nlohmann::json want = hf_read_json(dir / "out.json");
    std::vector<double> logits;
    for (const auto& row : want["logits"]) for (double v : row) logits.push_back(v);
    const double error = hf_relative_error(hf_logits(*model, tokens), logits);
    INFO("largest logit error over the largest logit: " << error);
    CHECK(error < 1e-5);

    NoGradGuard no_grad;
    const Tensor inputs = from_vector(std::vector<std::int64_t>(tokens.begin(), tokens.end() - 1), {1, 15});
    const Tensor targets = from_vector(std::vector<std::int64_t>(tokens.begin() + 1, tokens.end()), {1, 15});
    const double loss = model->loss(inputs, targets).to_vector<float>()[0], want_loss = want["loss"].get<double>();
    INFO("loss " << loss << ", numpy's " << want_loss);
    CHECK(std::abs(loss - want_loss) < 1e-5 * std::abs(want_loss));
  }
}

// transformers' own GPT2LMHeadModel, where tests/reference/hf_transformers_check.py
// made a folder (ATTOGRAD_HF_REFERENCE=DIR): DIR/hf its save_pretrained,
// DIR/reference.json the tokens and greedy continuation, DIR/logits.f32 its
// float32 logits of the tokens. Writes DIR/export for the script's verify-export.
TEST_CASE("hf_gpt2: a folder transformers saved gives its logits and greedy continuation", "[hf][transformers]") {
  const char* set = std::getenv("ATTOGRAD_HF_REFERENCE");
  if (!set || !*set) {
    WARN("skipped: ATTOGRAD_HF_REFERENCE names no folder made by tests/reference/hf_transformers_check.py");
    return;
  }
  const std::string dir = set;
  const nlohmann::json ref = hf_read_json(dir + "/reference.json");
  const std::vector<std::int64_t> tokens = ref["tokens"].get<std::vector<std::int64_t>>();
  const std::vector<std::int64_t> continuation = ref["continuation"].get<std::vector<std::int64_t>>();
  const std::string bytes = file_text(dir + "/logits.f32");
  std::vector<double> want(bytes.size() / sizeof(float));
  for (std::size_t i = 0; i < want.size(); ++i) {
    float v;
    std::memcpy(&v, bytes.data() + i * sizeof(float), sizeof(float));
    want[i] = v;
  }

  const HfGpt2 hf = read_hf_gpt2(dir + "/hf");
  const auto model = hf_model_of(hf);
  const double error = hf_relative_error(hf_logits(*model, tokens), want);
  WARN("largest logit error over the largest logit, against transformers: " << error);
  CHECK(error < 1e-5);

  train::model::GenerateOptions greedy;
  greedy.tokens = static_cast<std::int64_t>(continuation.size());
  greedy.temperature = 0;
  const std::vector<std::int64_t> out = train::model::generate(*model, tokens, greedy);
  CHECK(std::vector<std::int64_t>(out.begin() + static_cast<std::ptrdiff_t>(tokens.size()), out.end()) ==
        continuation);
  write_hf_gpt2(dir + "/export", *model);
}

}  // namespace attograd::test

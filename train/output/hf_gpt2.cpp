#include "train/output/hf_gpt2.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "base/error.h"
#include "tensor/kernels.h"
#include "train/files.h"
#include "train/output/safetensors.h"

namespace attograd::train::output {

namespace {

constexpr const char* kHfPrefix = "transformer.";
constexpr const char* kLmHead = "lm_head.weight";
constexpr std::int64_t kHfMaxSize = (std::int64_t{1} << 31) - 1;
constexpr std::uint64_t kHfMaxConfigBytes = 1 << 20;

// One GPT-2 tensor in both layouts.
struct HfTensor {
  std::string hf;    // transformers' name, without "transformer."
  std::string ours;  // nn::GPT's name
  Shape hf_shape;    // as stored in model.safetensors
  bool conv1d;       // stored (in, out): transposed to Linear's (out, in) and back
};

// Every tensor of a GPT2LMHeadModel of config c's sizes, in transformers' order;
// lm_head.weight last, and only when untied.
std::vector<HfTensor> hf_gpt2_tensors(const nn::GPTConfig& c) {
  const std::int64_t C = c.n_embd, V = c.vocab_size;
  std::vector<HfTensor> out = {{"wte.weight", "wte.weight", {V, C}, false},
                               {"wpe.weight", "wpe.weight", {c.block_size, C}, false}};
  for (std::int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = fmt::format("h.{}.", i), b = fmt::format("blocks.{}.", i);
    auto add = [&](const char* hf, const char* ours, Shape shape, bool conv1d) {
      out.push_back({h + hf, b + ours, std::move(shape), conv1d});
    };
    add("ln_1.weight", "ln_1.weight", {C}, false);
    add("ln_1.bias", "ln_1.bias", {C}, false);
    add("attn.c_attn.weight", "attn.qkv.weight", {C, 3 * C}, true);
    add("attn.c_attn.bias", "attn.qkv.bias", {3 * C}, false);
    add("attn.c_proj.weight", "attn.out_proj.weight", {C, C}, true);
    add("attn.c_proj.bias", "attn.out_proj.bias", {C}, false);
    add("ln_2.weight", "ln_2.weight", {C}, false);
    add("ln_2.bias", "ln_2.bias", {C}, false);
    add("mlp.c_fc.weight", "mlp.fc.weight", {C, 4 * C}, true);
    add("mlp.c_fc.bias", "mlp.fc.bias", {4 * C}, false);
    add("mlp.c_proj.weight", "mlp.proj.weight", {4 * C, C}, true);
    add("mlp.c_proj.bias", "mlp.proj.bias", {C}, false);
  }
  out.push_back({"ln_f.weight", "ln_f.weight", {C}, false});
  out.push_back({"ln_f.bias", "ln_f.bias", {C}, false});
  if (!c.tie_weights) out.push_back({kLmHead, kLmHead, {V, C}, false});
  return out;
}

// ---- config.json ------------------------------------------------------------------

std::int64_t hf_size(const nlohmann::json& j, const std::string& what, const char* key) {
  AG_CHECK(j.contains(key), what, "{} is missing", key);
  const nlohmann::json& v = j[key];
  AG_CHECK(v.is_number_integer() && v.get<std::int64_t>() > 0 && v.get<std::int64_t>() <= kHfMaxSize, what,
           "{} is {}, expected a positive integer below 2^31", key, v.dump());
  return v.get<std::int64_t>();
}

// A boolean key that must hold `want` (absent: transformers' default, which is `want`).
void hf_require_flag(const nlohmann::json& j, const std::string& what, const char* key, bool want, const char* why) {
  if (!j.contains(key) || j[key].is_null()) return;
  AG_CHECK(j[key].is_boolean() && j[key].get<bool>() == want, what, "{} is {}; {}", key, j[key].dump(), why);
}

// What config.json asks for that attograd's GPT does not compute is refused, key by key.
void hf_check_config(const nlohmann::json& j, const std::string& what, std::int64_t n_embd) {
  if (j.contains("model_type"))
    AG_CHECK(j["model_type"] == "gpt2", what, "model_type is {}, expected \"gpt2\"", j["model_type"].dump());
  if (j.contains("activation_function"))
    AG_CHECK(j["activation_function"] == "gelu_new" || j["activation_function"] == "gelu_pytorch_tanh", what,
             "activation_function is {}; attograd's GPT computes gelu_new (GPT-2's tanh approximation) only",
             j["activation_function"].dump());
  if (j.contains("layer_norm_epsilon"))
    AG_CHECK(j["layer_norm_epsilon"].is_number() && j["layer_norm_epsilon"].get<double>() == 1e-5, what,
             "layer_norm_epsilon is {}; attograd's LayerNorm uses 1e-5", j["layer_norm_epsilon"].dump());
  if (j.contains("n_inner") && !j["n_inner"].is_null())
    AG_CHECK(j["n_inner"].is_number_integer() && j["n_inner"].get<std::int64_t>() == 4 * n_embd, what,
             "n_inner is {}; attograd's MLP is 4 n_embd = {} wide", j["n_inner"].dump(), 4 * n_embd);
  hf_require_flag(j, what, "scale_attn_weights", true, "attograd scales attention by 1/sqrt(head size)");
  hf_require_flag(j, what, "scale_attn_by_inverse_layer_idx", false, "attograd does not scale by layer");
  hf_require_flag(j, what, "reorder_and_upcast_attn", false, "attograd does not compute that attention variant");
  hf_require_flag(j, what, "add_cross_attention", false, "attograd's GPT has no cross-attention");
}

// The sizes and the tie flag config.json gives (tie_weights: tie_word_embeddings).
nn::GPTConfig hf_parse_config(std::string_view text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, "not valid JSON: {}", e.what());
  }
  AG_CHECK(j.is_object(), path, "expected a JSON object, got {}", j.type_name());
  nn::GPTConfig c;
  c.n_layer = hf_size(j, path, "n_layer");
  c.n_head = hf_size(j, path, "n_head");
  c.n_embd = hf_size(j, path, "n_embd");
  c.vocab_size = hf_size(j, path, "vocab_size");
  c.block_size = hf_size(j, path, j.contains("n_positions") || !j.contains("n_ctx") ? "n_positions" : "n_ctx");
  AG_CHECK(c.n_embd % c.n_head == 0, path, "n_embd {} is not a multiple of n_head {}", c.n_embd, c.n_head);
  hf_check_config(j, path, c.n_embd);
  c.tie_weights = true;
  if (j.contains("tie_word_embeddings")) {
    AG_CHECK(j["tie_word_embeddings"].is_boolean(), path, "tie_word_embeddings is {}, expected true or false",
             j["tie_word_embeddings"].dump());
    c.tie_weights = j["tie_word_embeddings"].get<bool>();
  }
  // attograd has one dropout rate: the folder's where its three agree (an export
  // writes it back as it came), else none.
  c.dropout = 0.0;
  const auto rate = [&](const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0; };
  const double resid = rate("resid_pdrop");
  if (resid == rate("embd_pdrop") && resid == rate("attn_pdrop") && resid >= 0 && resid < 1) c.dropout = resid;
  return c;
}

// ---- model.safetensors ------------------------------------------------------------

bool hf_same_values(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.raw_data(), b.raw_data(), a.numel() * sizeof(float)) == 0;
}

// The file's tensors under transformers' names without the prefix, float32;
// the attention buffers left out. F16 (widened by the reader) and BF16 become float32.
std::map<std::string, Tensor> hf_tensors(Safetensors file, const std::string& path) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : file.tensors) {
    const bool prefixed = name.rfind(kHfPrefix, 0) == 0;
    const std::string bare = prefixed ? name.substr(std::strlen(kHfPrefix)) : name;
    if (bare.ends_with(".attn.bias") || bare.ends_with(".attn.masked_bias")) continue;
    AG_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, path,
             "'{}' is {}; GPT-2's weights are read as F32, F16 or BF16", name, dtype_name(t.dtype()));
    AG_CHECK(!out.contains(bare), path, "'{}' is there twice, with and without the '{}' prefix", bare, kHfPrefix);
    out.emplace(bare, t.dtype() == DType::f32 ? t : kernels::cast(t, DType::f32));
  }
  return out;
}

// Whether lm_head.weight (taken out of `tensors`) is tied to wte.weight: refuses
// a file whose head transformers would read otherwise than attograd.
bool hf_take_head(std::map<std::string, Tensor>& tensors, const nn::GPTConfig& config, const std::string& path,
                  std::optional<Tensor>* head) {
  auto it = tensors.find(kLmHead);
  if (it == tensors.end()) {
    AG_CHECK(config.tie_weights, path, "'{}' is missing and config.json's tie_word_embeddings is false", kLmHead);
    return true;
  }
  *head = it->second;
  tensors.erase(it);
  auto wte = tensors.find("wte.weight");
  if (wte != tensors.end() && hf_same_values(**head, wte->second)) return true;
  AG_CHECK(!config.tie_weights, path,
           "'{}' differs from wte.weight but config.json's tie_word_embeddings is true (transformers would use wte)",
           kLmHead);
  return false;
}

}  // namespace

namespace {
// The model config.json and the tensors describe; the paths name the two files in errors.
HfGpt2 hf_gpt2(std::string_view config_json, Safetensors file, const std::string& config_path,
               const std::string& path) {
  HfGpt2 out;
  out.config = hf_parse_config(config_json, config_path);
  std::map<std::string, Tensor> tensors = hf_tensors(std::move(file), path);
  std::optional<Tensor> head;
  out.config.tie_weights = hf_take_head(tensors, out.config, path, &head);
  if (head && !out.config.tie_weights) tensors.emplace(kLmHead, *head);

  // The list of expected tensors grows with n_layer (12 a layer): bounded by the file's first.
  AG_CHECK(out.config.n_layer <= static_cast<std::int64_t>(tensors.size()), path,
           "holds {} weights, too few for config.json's n_layer {}", tensors.size(), out.config.n_layer);
  NoGradGuard no_grad;
  const std::vector<HfTensor> expected = hf_gpt2_tensors(out.config);
  std::set<std::string> known;
  for (const HfTensor& e : expected) {
    known.insert(e.hf);
    auto it = tensors.find(e.hf);
    AG_CHECK(it != tensors.end(), path, "'{}' is missing (n_layer {}, tie_word_embeddings {})", e.hf,
             out.config.n_layer, out.config.tie_weights);
    AG_CHECK(it->second.sizes() == e.hf_shape, path, "'{}' is {}, but config.json's sizes make it {}", e.hf,
             shape_str(it->second.sizes()), shape_str(e.hf_shape));
    out.state[e.ours] = e.conv1d ? kernels::contiguous(transpose(it->second, 0, 1)) : it->second;
  }
  for (const auto& [name, t] : tensors)
    AG_CHECK(known.contains(name), path, "unexpected tensor '{}' {} (not a GPT2LMHeadModel weight for n_layer {})",
             name, shape_str(t.sizes()), out.config.n_layer);
  return out;
}
}  // namespace

HfGpt2 read_hf_gpt2(const std::string& dir) {
  const std::filesystem::path folder(dir);
  const std::string config_path = (folder / "config.json").string(), path = (folder / "model.safetensors").string();
  const std::string config_json = read_file(config_path, config_path.c_str(), kHfMaxConfigBytes);
  std::error_code ec;
  AG_CHECK(std::filesystem::exists(path, ec) || !std::filesystem::exists(path + ".index.json", ec), path,
           "missing: a sharded checkpoint (model.safetensors.index.json) is not read");
  return hf_gpt2(config_json, load_safetensors(path, path.c_str(), {.widen_f16 = true}), config_path, path);
}

HfGpt2 parse_hf_gpt2(std::string_view config_json, std::string_view safetensors, const std::string& where) {
  const std::string path = where + "/model.safetensors";
  return hf_gpt2(config_json, parse_safetensors(safetensors, path, {.widen_f16 = true}), where + "/config.json", path);
}

// ---- writing ----------------------------------------------------------------------

namespace {

std::string hf_config_json(const nn::GPTConfig& c, std::int64_t vocab_size) {
  const bool gpt2_tokens = vocab_size >= 50257;  // GPT-2's <|endoftext|> is token 50256
  nlohmann::json j = {  // keys sorted, as transformers writes them
      {"activation_function", "gelu_new"},
      {"architectures", {"GPT2LMHeadModel"}},
      {"attn_pdrop", c.dropout},
      {"bos_token_id", gpt2_tokens ? nlohmann::json(50256) : nlohmann::json(nullptr)},
      {"embd_pdrop", c.dropout},
      {"eos_token_id", gpt2_tokens ? nlohmann::json(50256) : nlohmann::json(nullptr)},
      {"initializer_range", 0.02},
      {"layer_norm_epsilon", 1e-5},
      {"model_type", "gpt2"},
      {"n_ctx", c.block_size},
      {"n_embd", c.n_embd},
      {"n_head", c.n_head},
      {"n_inner", nullptr},
      {"n_layer", c.n_layer},
      {"n_positions", c.block_size},
      {"reorder_and_upcast_attn", false},
      {"resid_pdrop", c.dropout},
      {"scale_attn_by_inverse_layer_idx", false},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", c.tie_weights},
      {"torch_dtype", "float32"},
      {"use_cache", true},
      {"vocab_size", vocab_size}};
  return j.dump(2) + "\n";
}

}  // namespace

void write_hf_gpt2(const std::string& dir, const nn::GPT& model, const HfExportOptions& options) {
  nn::GPTConfig c = model.config();
  AG_CHECK(c.bias, dir, "the model has no biases; GPT-2 has them in every Linear and LayerNorm");
  AG_CHECK(options.vocab_size >= 0 && options.vocab_size <= c.vocab_size, dir,
           "vocab_size {} to write must be between 1 and the model's {}", options.vocab_size, c.vocab_size);
  if (options.vocab_size > 0) c.vocab_size = options.vocab_size;
  const std::filesystem::path folder(dir);
  const std::string config_path = (folder / "config.json").string(), path = (folder / "model.safetensors").string();
  check_replaceable(dir, config_path);
  check_replaceable(dir, path);

  NoGradGuard no_grad;
  const nn::StateDict state = model.state_dict();
  NamedTensors tensors;
  for (const HfTensor& e : hf_gpt2_tensors(c)) {
    Tensor t = kernels::to_device(state.at(e.ours).detach(), Device::cpu());
    if (t.dtype() != DType::f32) t = kernels::cast(t, DType::f32);
    if (e.hf == "wte.weight" || e.hf == kLmHead) t = narrow(t, 0, 0, c.vocab_size);
    t = kernels::contiguous(e.conv1d ? transpose(t, 0, 1) : t);
    tensors.emplace_back(e.hf == kLmHead ? e.hf : kHfPrefix + e.hf, t);
  }
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  AG_CHECK(!ec, dir, "cannot create the folder: {}", ec.message());
  write_safetensors("model.safetensors", path, tensors, {{"format", "pt"}});
  write_file_atomically("config.json", config_path, hf_config_json(c, c.vocab_size));
}

}  // namespace attograd::train::output

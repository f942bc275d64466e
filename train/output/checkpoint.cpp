#include "train/output/checkpoint.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "train/data/tasks.h"
#include "train/model/gpt.h"
#include "train/output/hf_gpt2.h"
#include "train/output/safetensors.h"

namespace attograd::train::output {

namespace {
constexpr std::string_view kOptimPrefix = "optim.";

const std::string& entry(const Metadata& m, const std::string& key, const std::string& path) {
  const auto it = m.find(key);
  AG_CHECK(it != m.end(), path, "not an attograd checkpoint: no '{}' in __metadata__", key);
  return it->second;
}

// Parameters a config may describe beyond what the file holds before the model
// is refused unbuilt (4 MiB of float32): within it, building the model and
// loading its state dict names each missing or mis-shaped tensor.
constexpr std::int64_t kUnheldParameterSlack = std::int64_t{1} << 20;

// Training stops before an update that would make a weight non-finite, and
// saves nothing of that step, so a NaN or infinity in a checkpoint is damage:
// refused here, not evaluated, sampled from or trained on.
void check_finite(const std::string& name, const Tensor& t, const std::string& path) {
  const float* values = t.data<float>();  // float32 and contiguous, as loaded
  for (std::int64_t i = 0; i < t.numel(); ++i)
    AG_CHECK(std::isfinite(values[i]), path, "tensor '{}' holds {} at element {}: a damaged file", name, values[i], i);
}

// The model's tensors (names without "optim.") must be float32, and the model
// the config describes must be about the size of the tensors the file holds:
// the config may ask for any size, the file only holds what it holds.
void check_parameters_fit(const nn::StateDict& params, const TrainOptions& config, const data::Vocabulary& vocab,
                          const std::string& path) {
  std::int64_t held = 0;
  for (const auto& [name, t] : params) {
    AG_CHECK(t.dtype() == DType::f32, path, "parameter '{}' is {}, expected float32", name, dtype_name(t.dtype()));
    held += t.numel();
  }
  const nn::GPTConfig model = model::gpt_config(config, vocab.size());
  const auto wte = params.find("wte.weight");
  if (wte != params.end() && wte->second.dim() == 2)
    AG_CHECK(wte->second.size(0) == model.vocab_size, path,
             "the vocabulary holds {} symbols{} but wte.weight has {} rows: they belong to different models",
             vocab.size(),
             model.vocab_size != vocab.size() ? fmt::format(" ({} rows with the config's vocab_size)", model.vocab_size)
                                              : "",
             wte->second.size(0));
  const std::int64_t wanted = model::parameter_count(model);
  AG_CHECK(wanted <= held + kUnheldParameterSlack, path,
           "its config ({} layers, width {}, block {}, vocabulary {}) describes {} parameters, but its tensors hold {}",
           config.layers, config.width, config.block, vocab.size(), wanted, held);
}

// What the metadata says of the run, each field checked.
CheckpointInfo checkpoint_info(const Metadata& meta, const std::string& path) {
  AG_CHECK(entry(meta, "format", path) == kCheckpointFormat, path, "unsupported checkpoint format '{}' (expected {})",
           entry(meta, "format", path), kCheckpointFormat);

  CheckpointInfo info;
  // The config and vocabulary name their own fields in errors; say which file they came from.
  try {
    info.config = config_from_json(entry(meta, "config", path));
    info.vocabulary = data::Vocabulary::from_json(entry(meta, "vocab", path));
  } catch (const Error& e) {
    fail(path, "invalid checkpoint metadata: {}", e.what());
  }
  // A task's batches are drawn with the task's own vocabulary: the saved one must be it.
  AG_CHECK(!info.config.data.empty() || info.vocabulary == data::Vocabulary::of_characters(data::Task::symbols()),
           path, "its vocabulary ({} symbols) is not the {} task's (the digits, '+' and '=')", info.vocabulary.size(),
           info.config.task);
  if (const auto data = meta.find("data"); data != meta.end()) info.data_fingerprint = data->second;
  if (const auto loss = meta.find("val_loss"); loss != meta.end()) {
    char* end = nullptr;
    const double value = std::strtod(loss->second.c_str(), &end);
    AG_CHECK(!loss->second.empty() && *end == '\0' && std::isfinite(value) && value >= 0, path,
             "val_loss '{}' is not a finite loss", loss->second);
    info.val_loss = value;
  }
  const std::string& step = entry(meta, "step", path);
  const auto digits = step.find_first_not_of("0123456789");
  AG_CHECK(!step.empty() && step.size() <= 18 && digits == std::string::npos, path, "step '{}' is not a count", step);
  info.step = std::stoll(step);
  return info;
}

LoadedCheckpoint from_safetensors(Safetensors file, const std::string& path) {
  const Metadata& meta = file.metadata;
  LoadedCheckpoint out;
  out.info = checkpoint_info(meta, path);
  try {
    const auto rng = nlohmann::json::parse(entry(meta, "rng", path));
    const auto optim = nlohmann::json::parse(entry(meta, "optimizer", path));
    // Integers are checked as integers: a float such as 1e300 would overflow the conversion.
    AG_CHECK(rng.is_object() && rng.contains("dropout_seed") && rng.contains("dropout_offset") &&
                 rng["dropout_seed"].is_number_unsigned() && rng["dropout_offset"].is_number_unsigned(),
             path, "rng metadata {} needs unsigned dropout_seed and dropout_offset", rng.dump());
    AG_CHECK(optim.is_object() && optim.contains("step_count") && optim["step_count"].is_number_integer(), path,
             "optimizer metadata {} needs an integer step_count", optim.dump());
    out.optimizer_name = optim.at("name").get<std::string>();
    out.optimizer_steps = optim.at("step_count").get<std::int64_t>();
    AG_CHECK(out.optimizer_name.empty() || out.optimizer_name == "adamw" || out.optimizer_name == "sgd", path,
             "unknown optimizer '{}' (adamw, sgd)", out.optimizer_name);
    // One optimizer step per training step: a larger count is a damaged file (and near
    // INT64_MAX, the next step's count would overflow).
    AG_CHECK(out.optimizer_steps >= 0 && out.optimizer_steps <= out.info.step, path,
             "optimizer step_count {} is not in [0, the checkpoint's step {}]", out.optimizer_steps, out.info.step);

    nn::StateDict params;
    for (auto& [name, t] : file.tensors) {
      if (name.rfind(kOptimPrefix, 0) == 0) {
        AG_CHECK(t.dtype() == DType::f32, path, "optimizer state '{}' is {}, expected float32", name,
                 dtype_name(t.dtype()));
        check_finite(name, t, path);
        out.optimizer_state.emplace(name.substr(kOptimPrefix.size()), t);
      } else {
        params.emplace(name, t);
      }
    }
    check_parameters_fit(params, out.info.config, out.info.vocabulary, path);
    for (const auto& [name, t] : params) check_finite(name, t, path);
    out.model = model::build_model(out.info.config, out.info.vocabulary.size());
    try {
      out.model->load_state_dict(params);  // names and shapes all checked, nothing changed on error
    } catch (const Error& e) {
      fail(path, "parameters do not fit the model its config describes: {}", e.what());
    }
    out.model->drop.generator->set_state(rng.at("dropout_seed").get<std::uint64_t>(),
                                         rng.at("dropout_offset").get<std::uint64_t>());
  } catch (const nlohmann::json::exception& e) {
    fail(path, "malformed checkpoint metadata: {}", e.what());
  }
  return out;
}

}  // namespace

OptimizerState optimizer_state(const optim::Optimizer* optimizer) {
  if (!optimizer) return {};
  return {optimizer->name(), optimizer->step_count(), optimizer->state()};
}

void save_checkpoint(const std::string& path, const nn::GPT& model, const OptimizerState& optimizer,
                     const CheckpointInfo& info) {
  NamedTensors tensors;
  for (const auto& p : model.named_parameters()) tensors.emplace_back(p.name, p.tensor);
  for (const auto& [name, t] : optimizer.buffers) tensors.emplace_back(std::string(kOptimPrefix) + name, t);

  const Generator& dropout = *model.drop.generator;
  Metadata meta;
  meta["format"] = kCheckpointFormat;
  meta["step"] = std::to_string(info.step);
  meta["config"] = config_to_json(info.config);
  meta["vocab"] = info.vocabulary.to_json();
  meta["rng"] = nlohmann::json{{"data_seed", info.config.seed},
                               {"dropout_seed", dropout.seed()},
                               {"dropout_offset", dropout.offset()}}
                    .dump();
  meta["optimizer"] = nlohmann::json{{"name", optimizer.name}, {"step_count", optimizer.step_count}}.dump();
  if (!info.data_fingerprint.empty()) meta["data"] = info.data_fingerprint;
  if (info.val_loss) meta["val_loss"] = fmt::format("{:.17g}", *info.val_loss);
  save_safetensors(path, tensors, meta);
}

bool is_hf_folder(const std::string& path) {
  return std::filesystem::is_directory(path) && std::filesystem::exists(std::filesystem::path(path) / "config.json");
}

LoadedCheckpoint load_hf_folder(const std::string& dir) {
  HfGpt2 hf = read_hf_gpt2(dir);
  AG_CHECK(hf.config.tie_weights, dir, "its lm_head is not tied to wte: attograd's GPT ties them");
  LoadedCheckpoint out;
  TrainOptions& c = out.info.config;
  c.task.clear();  // no data of its own: neither a task nor a text
  c.layers = hf.config.n_layer, c.heads = hf.config.n_head, c.width = hf.config.n_embd;
  c.block = hf.config.block_size, c.dropout = hf.config.dropout;
  c.dtype = "float32";
  // Its tokenizer where the folder holds one (as save_pretrained writes it), else ids of its size.
  const data::BpeFiles files = data::BpeFiles::in(dir);
  out.info.vocabulary = std::filesystem::exists(files.encoder) ? data::Vocabulary::load_gpt2(dir, dir)
                                                                : data::Vocabulary::of_ids(hf.config.vocab_size);
  AG_CHECK(out.info.vocabulary.size() == hf.config.vocab_size, dir,
           "its tokenizer holds {} tokens but its config's vocab_size is {}", out.info.vocabulary.size(),
           hf.config.vocab_size);
  c.vocab_size = hf.config.vocab_size;
  out.model = model::build_model(c, hf.config.vocab_size);
  out.model->load_state_dict(hf.state);
  return out;
}

LoadedCheckpoint load_checkpoint(const std::string& path, const char* flag, CheckpointParts parts) {
  if (is_hf_folder(path)) return load_hf_folder(path);
  SafetensorsRead read;
  if (parts == CheckpointParts::weights)
    read.wanted = [](const std::string& name) { return name.rfind(kOptimPrefix, 0) != 0; };
  Safetensors file = load_safetensors(path, flag, read);
  return from_safetensors(std::move(file), path);
}

CheckpointInfo read_checkpoint_info(const std::string& path, const char* flag) {
  const Safetensors file = load_safetensors(path, flag, {.wanted = [](const std::string&) { return false; }});
  return checkpoint_info(file.metadata, path);
}

LoadedCheckpoint parse_checkpoint(std::string_view bytes, const std::string& what) {
  return from_safetensors(parse_safetensors(bytes, what), what);
}

}  // namespace attograd::train::output

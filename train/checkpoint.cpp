#include "train/checkpoint.h"

#include <nlohmann/json.hpp>

#include "tensor/error.h"
#include "train/model.h"
#include "train/safetensors.h"

namespace attograd {

namespace {
constexpr std::string_view kOptimPrefix = "optim.";

std::string optimizer_name(const train::Optimizer* o) {
  if (!o) return "";
  if (dynamic_cast<const train::AdamW*>(o)) return "adamw";
  if (dynamic_cast<const train::SGD*>(o)) return "sgd";
  return "unknown";
}

const std::string& entry(const Metadata& m, const std::string& key, const std::string& path) {
  const auto it = m.find(key);
  AG_CHECK(it != m.end(), path, "not an attograd checkpoint: no '{}' in __metadata__", key);
  return it->second;
}
}  // namespace

void save_checkpoint(const std::string& path, const nn::GPT& model, const train::Optimizer* optimizer,
                     const CheckpointInfo& info) {
  NamedTensors tensors;
  for (const auto& p : model.named_parameters()) tensors.emplace_back(p.name, p.tensor);
  if (optimizer)
    for (const auto& [name, t] : optimizer->state()) tensors.emplace_back(std::string(kOptimPrefix) + name, t);

  const Generator& dropout = *model.drop.generator;
  Metadata meta;
  meta["format"] = kCheckpointFormat;
  meta["step"] = std::to_string(info.step);
  meta["config"] = config_to_json(info.config);
  meta["vocab"] = info.tokenizer.to_json();
  meta["rng"] = nlohmann::json{{"data_seed", info.config.seed},
                               {"dropout_seed", dropout.seed()},
                               {"dropout_offset", dropout.offset()}}
                    .dump();
  meta["optimizer"] =
      nlohmann::json{{"name", optimizer_name(optimizer)}, {"step_count", optimizer ? optimizer->step_count() : 0}}
          .dump();
  save_safetensors(path, tensors, meta);
}

LoadedCheckpoint load_checkpoint(const std::string& path) {
  Safetensors file = load_safetensors(path);
  const Metadata& meta = file.metadata;
  AG_CHECK(entry(meta, "format", path) == kCheckpointFormat, path, "unsupported checkpoint format '{}' (expected {})",
           entry(meta, "format", path), kCheckpointFormat);

  LoadedCheckpoint out;
  out.info.config = config_from_json(entry(meta, "config", path));
  out.info.tokenizer = Tokenizer::from_json(entry(meta, "vocab", path));
  try {
    const std::string& step = entry(meta, "step", path);
    std::size_t used = 0;
    out.info.step = std::stoll(step, &used);
    AG_CHECK(used == step.size() && out.info.step >= 0, path, "step '{}' is not a count", step);
    const auto rng = nlohmann::json::parse(entry(meta, "rng", path));
    const auto optim = nlohmann::json::parse(entry(meta, "optimizer", path));
    out.optimizer_name = optim.at("name").get<std::string>();
    out.optimizer_steps = optim.at("step_count").get<std::int64_t>();

    nn::StateDict params;
    for (auto& [name, t] : file.tensors) {
      if (name.rfind(kOptimPrefix, 0) == 0) out.optimizer_state.emplace(name.substr(kOptimPrefix.size()), t);
      else params.emplace(name, t);
    }
    out.model = build_model(out.info.config, out.info.tokenizer.size());
    try {
      out.model->load_state_dict(params);  // names and shapes all checked, nothing changed on error
    } catch (const Error& e) {
      fail(path, "parameters do not fit the model its config describes: {}", e.what());
    }
    out.model->drop.generator->set_state(rng.at("dropout_seed").get<std::uint64_t>(),
                                         rng.at("dropout_offset").get<std::uint64_t>());
  } catch (const nlohmann::json::exception& e) {
    fail(path, "malformed checkpoint metadata: {}", e.what());
  } catch (const std::logic_error& e) {  // std::stoll
    fail(path, "malformed checkpoint metadata: step '{}'", entry(meta, "step", path));
  }
  return out;
}

}  // namespace attograd

#include "train/output/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "train/files.h"
#include "train/output/safetensors.h"

namespace attograd::train::output {

namespace {
nlohmann::json to_json(const TrainRecord& r) {
  return {{"kind", "train"}, {"step", r.step},           {"loss", r.loss},
          {"lr", r.lr},       {"grad_norm", r.grad_norm}, {"tokens_per_s", r.tokens_per_s},
          {"elapsed_s", r.elapsed_s}};
}

nlohmann::json to_json(const EvalRecord& r) {
  nlohmann::json j = {{"kind", "eval"}, {"step", r.step}, {"val_loss", r.val_loss}, {"elapsed_s", r.elapsed_s}};
  if (r.accuracy) j["accuracy"] = *r.accuracy;
  return j;
}

// NaN and infinities are written as null by the JSON library; read them back as NaN.
double number(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::nan("");
}
}  // namespace

MetricsLog::MetricsLog(std::string path, std::int64_t resume_step) : path_(std::move(path)) {
  if (resume_step > 0) {
    std::string kept;  // the earlier steps' lines, in their order
    std::ifstream in(path_);
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;  // a torn last line
      const std::int64_t step = j["step"].get<std::int64_t>();
      if (step > resume_step) continue;
      kept += j.dump() + '\n';
      if (j.value("kind", "") == "train")
        train_.push_back({step, number(j, "loss"), number(j, "lr"), number(j, "grad_norm"), number(j, "tokens_per_s"),
                          number(j, "elapsed_s")});
      else if (j.value("kind", "") == "eval")
        eval_.push_back({step, number(j, "val_loss"),
                         j.contains("accuracy") ? std::optional<double>(number(j, "accuracy")) : std::nullopt,
                         number(j, "elapsed_s")});
    }
    // They replace the file whole (a temporary renamed over it), so that a
    // crash here never leaves a resumed run's history cut short.
    in.close();
    write_file_atomically("metrics", path_, kept);
  }
  file_ = std::fopen(path_.c_str(), resume_step > 0 ? "a" : "w");
  AG_CHECK(file_, "--out", "cannot write '{}': {}", path_, std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write_line(const std::string& line) {
  const bool written = std::fputs(line.c_str(), file_) >= 0 && std::fputc('\n', file_) != EOF && std::fflush(file_) == 0;
  AG_CHECK(written, "metrics", "cannot write '{}': {}", path_, std::strerror(errno));
}

void MetricsLog::log(const TrainRecord& r) {
  train_.push_back(r);
  write_line(to_json(r).dump());
}

void MetricsLog::log(const EvalRecord& r) {
  eval_.push_back(r);
  write_line(to_json(r).dump());
}

}  // namespace attograd::train::output

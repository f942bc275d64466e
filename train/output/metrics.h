#pragma once
// metrics.jsonl: one JSON object per line, a "train" record per step and an
// "eval" record per evaluation, flushed as written so a crashed or running
// job can be plotted. Kept in memory too, for loss.svg.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace attograd::train::output {

struct TrainRecord {
  std::int64_t step = 0;  // 1-based: the step just taken
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, elapsed_s = 0;
};

struct EvalRecord {
  std::int64_t step = 0;
  double val_loss = 0;
  std::optional<double> accuracy;  // exact match on held-out answers (tasks only)
  double elapsed_s = 0;
};

class MetricsLog {
 public:
  // Starts `path` afresh; when resuming at `resume_step`, keeps the file's
  // records up to that step and drops later ones (from the interrupted run).
  explicit MetricsLog(std::string path, std::int64_t resume_step = 0);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void log(const TrainRecord& r);
  void log(const EvalRecord& r);
  const std::vector<TrainRecord>& train() const { return train_; }
  const std::vector<EvalRecord>& eval() const { return eval_; }

 private:
  void write_line(const std::string& line);
  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<TrainRecord> train_;
  std::vector<EvalRecord> eval_;
};

}  // namespace attograd::train::output

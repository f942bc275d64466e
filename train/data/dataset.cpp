#include "train/data/dataset.h"

#include "train/data/tasks.h"
#include "train/data/text_data.h"
#include "train/files.h"

namespace attograd::train::data {

std::unique_ptr<Dataset> make_dataset(const DatasetSpec& spec, const Tokenizer* vocabulary,
                                      const std::string& fingerprint) {
  if (!spec.text_file.empty()) {
    const std::string text = read_file(spec.text_file, "--data", kMaxTextBytes);
    return std::make_unique<TextData>(text, spec.text_file, spec.seed,
                                      vocabulary ? std::optional<Tokenizer>(*vocabulary) : std::nullopt, fingerprint);
  }
  return std::make_unique<Task>(TaskSpec{parse_task(spec.task), spec.task_size, spec.seed, spec.heldout});
}

}  // namespace attograd::train::data

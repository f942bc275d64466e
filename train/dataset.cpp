#include "train/dataset.h"

#include "train/options.h"
#include "train/tasks.h"
#include "train/text_data.h"

namespace attograd {

std::unique_ptr<Dataset> make_dataset(const TrainOptions& options, const Tokenizer* vocabulary,
                                      const std::string& fingerprint) {
  if (!options.data.empty()) {
    const std::string text = read_text_file(options.data, "--data");
    return std::make_unique<TextData>(text, options.data, options.seed,
                                      vocabulary ? std::optional<Tokenizer>(*vocabulary) : std::nullopt, fingerprint);
  }
  return std::make_unique<Task>(TaskSpec{parse_task(options.task), options.task_size, options.seed, options.heldout});
}

}  // namespace attograd

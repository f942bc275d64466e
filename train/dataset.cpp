#include "train/dataset.h"

#include "tensor/error.h"

#include "train/options.h"
#include "train/tasks.h"
#include "train/text_data.h"

namespace attograd {

std::unique_ptr<Dataset> make_dataset(const TrainOptions& options, const Tokenizer* vocabulary,
                                      const std::string& fingerprint) {
  if (!options.data.empty()) {
    const std::string text = read_text_file(options.data, "--data");
    // Before decoding: another text may hold characters the vocabulary lacks, and
    // "not the text" is the error that says what happened.
    AG_CHECK(fingerprint.empty() || text_fingerprint(text) == fingerprint, "--resume",
             "'{}' is not the text the checkpoint was trained on ({} now, {} then): a run continues only on its "
             "own data",
             options.data, text_fingerprint(text), fingerprint);
    return std::make_unique<TextData>(text, options.data, options.seed,
                                      vocabulary ? std::optional<Tokenizer>(*vocabulary) : std::nullopt);
  }
  return std::make_unique<Task>(TaskSpec{parse_task(options.task), options.task_size, options.seed, options.heldout});
}

}  // namespace attograd

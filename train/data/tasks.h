#pragma once
// Synthetic sequence tasks, generated from a seed:
//   sort     "31415926=" -> "11234569"   (sort the digits)
//   reverse  "31415926=" -> "62951413"
//   copy     "31415926=" -> "31415926"
//   add      "07+45="    -> "250"        (the sum, n+1 digits, least significant first)
// The sum is written least significant digit first, as minGPT's adder does, so
// each answer digit depends only on digits the model has already seen (its carry).
//
// One problem in ten is held out, decided by a hash of (seed, prompt): the
// held-out set and the training draws are disjoint by construction, without
// keeping a set of either. Loss is taken on the answer positions only.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/data/dataset.h"

namespace attograd::train::data {

enum class TaskKind { sort, reverse, copy, add };
const char* task_name(TaskKind kind);
// "sort" -> TaskKind::sort; throws "[--task] unknown task 'x' (sort, reverse, copy, add)".
TaskKind parse_task(const std::string& name);
int default_task_size(TaskKind kind);  // 8 digits for sort/reverse/copy, 2-digit operands for add
// Tokens in a whole problem, prompt + answer: 2n + 1 for the digit tasks, 3n + 3 for add.
std::int64_t task_sequence_length(TaskKind kind, int size);
// Tokens in an answer: n for the digit tasks, n + 1 for add.
std::int64_t task_answer_length(TaskKind kind, int size);

struct TaskSpec {
  TaskKind kind = TaskKind::sort;
  int size = 8;               // digits per sequence, or per operand for add
  std::uint64_t seed = 1337;
  std::int64_t heldout = 2000;  // held-out problems evaluated (all of them when fewer exist)
};

struct Problem {
  std::string prompt;  // "31415926="
  std::string answer;  // "11234569"
};

class Task final : public Dataset {
 public:
  static constexpr int kMaxSize = 64;
  static constexpr std::uint32_t kHeldoutOneIn = 10;

  explicit Task(TaskSpec spec);
  // Every task's symbols: the digits, '+' and '='.
  static Tokenizer symbols();
  const TaskSpec& spec() const { return spec_; }
  // Tokens of a whole problem, prompt + answer; the model sees sequence_length() - 1 of them.
  std::int64_t sequence_length() const;
  std::int64_t prompt_length() const;

  // The problem made of these digits (size digits; 2 * size for add: a then b).
  Problem make(const std::vector<int>& digits) const;
  bool is_heldout(const Problem& p) const;
  // Training draw number `index`: never a held-out problem.
  Problem train_problem(std::uint64_t index) const;
  const std::vector<Problem>& heldout() const { return heldout_; }

  // Dataset
  const Vocabulary& vocabulary() const override { return vocabulary_; }
  Batch train_batch(std::uint64_t step, std::int64_t batch, std::int64_t block) const override;
  // The held-out rows are heldout(), in order: every held-out problem.
  std::int64_t eval_sequences(std::int64_t block) const override;
  Batch eval_batch(std::int64_t first, std::int64_t count, std::int64_t block) const override;
  bool has_answers() const override { return true; }
  std::string default_prompt() const override;

  // Rows of (tokens, targets) for these problems.
  Batch to_batch(const std::vector<Problem>& problems) const;

 private:
  std::vector<int> draw_digits(CounterRng& rng) const;
  int digit_count() const { return spec_.kind == TaskKind::add ? 2 * spec_.size : spec_.size; }
  void build_heldout();

  TaskSpec spec_;
  Vocabulary vocabulary_;
  std::vector<Problem> heldout_;
};

}  // namespace attograd::train::data

#include "train/data/tasks.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "base/error.h"
#include "base/fnv.h"

namespace attograd::train::data {

namespace {
// Keys that separate the task's random streams from one another (and from the
// model's initialisation, which also starts from the seed).
constexpr std::uint64_t kHeldoutHashKey = 0x68656c646f7574ULL;  // "heldout"
constexpr std::uint64_t kHeldoutDrawKey = 0x6576616c736574ULL;  // "evalset"
// Problem spaces up to this size are enumerated to find every held-out problem.
constexpr double kEnumerateLimit = 1e6;
}  // namespace

const char* task_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::sort: return "sort";
    case TaskKind::reverse: return "reverse";
    case TaskKind::copy: return "copy";
    case TaskKind::add: return "add";
  }
  return "?";
}

TaskKind parse_task(const std::string& name) {
  for (TaskKind k : {TaskKind::sort, TaskKind::reverse, TaskKind::copy, TaskKind::add})
    if (name == task_name(k)) return k;
  fail("--task", "unknown task '{}' (sort, reverse, copy, add)", name);
}

int default_task_size(TaskKind kind) { return kind == TaskKind::add ? 2 : 8; }

std::int64_t task_sequence_length(TaskKind kind, int size) {
  return kind == TaskKind::add ? 3 * std::int64_t{size} + 3 : 2 * std::int64_t{size} + 1;
}

std::int64_t task_answer_length(TaskKind kind, int size) { return kind == TaskKind::add ? size + 1 : size; }

Tokenizer Task::symbols() { return Tokenizer::from_text("0123456789+="); }

Task::Task(TaskSpec spec) : spec_(spec), vocabulary_(Vocabulary::of_characters(symbols())) {
  AG_CHECK(spec_.size >= 1 && spec_.size <= kMaxSize, "--task-size", "must be in [1, {}], got {}", kMaxSize,
           spec_.size);
  AG_CHECK(spec_.heldout >= 1 && spec_.heldout <= 100000, "--heldout", "must be in [1, 100000], got {}",
           spec_.heldout);
  build_heldout();
}

std::int64_t Task::prompt_length() const {
  return spec_.kind == TaskKind::add ? 2 * spec_.size + 2 : spec_.size + 1;
}

std::int64_t Task::sequence_length() const { return task_sequence_length(spec_.kind, spec_.size); }

Problem Task::make(const std::vector<int>& digits) const {
  AG_CHECK(static_cast<int>(digits.size()) == digit_count(), "task", "{} needs {} digits, got {}",
           task_name(spec_.kind), digit_count(), digits.size());
  Problem p;
  for (int i = 0; i < spec_.size; ++i) p.prompt += static_cast<char>('0' + digits[i]);
  if (spec_.kind == TaskKind::add) {
    p.prompt += '+';
    for (int i = 0; i < spec_.size; ++i) p.prompt += static_cast<char>('0' + digits[spec_.size + i]);
  }
  p.prompt += '=';
  std::vector<int> answer(digits.begin(), digits.begin() + spec_.size);
  switch (spec_.kind) {
    case TaskKind::sort: std::sort(answer.begin(), answer.end()); break;
    case TaskKind::reverse: std::reverse(answer.begin(), answer.end()); break;
    case TaskKind::copy: break;
    case TaskKind::add: {
      // Schoolbook addition from the least significant digit, which is also the order we write it in.
      answer.clear();
      int carry = 0;
      for (int i = spec_.size - 1; i >= 0; --i) {
        const int s = digits[i] + digits[spec_.size + i] + carry;
        answer.push_back(s % 10);
        carry = s / 10;
      }
      answer.push_back(carry);
      break;
    }
  }
  for (int d : answer) p.answer += static_cast<char>('0' + d);
  return p;
}

bool Task::is_heldout(const Problem& p) const {
  return philox4x32(fnv1a64(p.prompt), spec_.seed ^ kHeldoutHashKey).v[0] % kHeldoutOneIn == 0;
}

std::vector<int> Task::draw_digits(CounterRng& rng) const {
  std::vector<int> digits(digit_count());
  for (int& d : digits) d = static_cast<int>(rng.below(10));
  return digits;
}

Problem Task::train_problem(std::uint64_t index) const {
  CounterRng rng(spec_.seed, index);
  for (;;) {
    Problem p = make(draw_digits(rng));
    if (!is_heldout(p)) return p;
  }
}

void Task::build_heldout() {
  const double space = std::pow(10.0, digit_count());
  if (space <= kEnumerateLimit) {
    // Small spaces: every held-out problem, in a seeded random order, the first `heldout` of them.
    const int n = digit_count();
    std::vector<int> digits(n);
    for (std::int64_t code = 0; code < static_cast<std::int64_t>(space); ++code) {
      std::int64_t c = code;
      for (int i = n - 1; i >= 0; --i, c /= 10) digits[i] = static_cast<int>(c % 10);
      Problem p = make(digits);
      if (is_heldout(p)) heldout_.push_back(std::move(p));
    }
    // A tiny space (sort of 1 digit has 10 problems) may hold out none of them, or all.
    AG_CHECK(!heldout_.empty() && static_cast<double>(heldout_.size()) < space, "--task-size",
             "{} of size {} has {:.0f} problems, and --seed {} holds out {} of them: nothing to {} (use a larger "
             "--task-size or another --seed)",
             task_name(spec_.kind), spec_.size, space, spec_.seed, heldout_.size(),
             heldout_.empty() ? "evaluate on" : "train on");
    CounterRng rng(spec_.seed ^ kHeldoutDrawKey, 0);
    for (std::size_t i = heldout_.size(); i > 1; --i) std::swap(heldout_[i - 1], heldout_[rng.below(i)]);
    if (static_cast<std::int64_t>(heldout_.size()) > spec_.heldout) heldout_.resize(spec_.heldout);
    return;
  }
  // Large spaces: random problems until `heldout` distinct held-out ones are found
  // (about ten draws each; the space holds far more than 100,000 of them).
  std::unordered_set<std::string> seen;
  for (std::uint64_t stream = 0; static_cast<std::int64_t>(heldout_.size()) < spec_.heldout; ++stream) {
    CounterRng rng(spec_.seed ^ kHeldoutDrawKey, stream);
    Problem p = make(draw_digits(rng));
    if (is_heldout(p) && seen.insert(p.prompt).second) heldout_.push_back(std::move(p));
  }
}

std::string Task::default_prompt() const {
  return heldout_.empty() ? train_problem(0).prompt : heldout_[0].prompt;
}

Batch Task::to_batch(const std::vector<Problem>& problems) const {
  const std::int64_t B = static_cast<std::int64_t>(problems.size()), L = sequence_length(), T = L - 1;
  const std::int64_t answer_from = prompt_length();  // index in the sequence of the first answer token
  std::vector<std::int64_t> tokens(B * T), targets(B * T);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::vector<std::int64_t> seq = vocabulary_.characters().encode(problems[b].prompt + problems[b].answer);
    for (std::int64_t t = 0; t < T; ++t) {
      tokens[b * T + t] = seq[t];
      // Position t predicts sequence element t + 1: only answer elements carry loss.
      targets[b * T + t] = t + 1 >= answer_from ? seq[t + 1] : kIgnoreIndex;
    }
  }
  return {from_vector(tokens, {B, T}), from_vector(targets, {B, T})};
}

Batch Task::train_batch(std::uint64_t step, std::int64_t batch, std::int64_t block) const {
  AG_CHECK(sequence_length() - 1 <= block, "--block", "{} {} needs a block size of at least {}, got {}",
           task_name(spec_.kind), spec_.size, sequence_length() - 1, block);
  std::vector<Problem> problems;
  problems.reserve(batch);
  for (std::int64_t b = 0; b < batch; ++b) problems.push_back(train_problem(step * batch + b));
  return to_batch(problems);
}

std::int64_t Task::eval_sequences(std::int64_t block) const {
  AG_CHECK(sequence_length() - 1 <= block, "--block", "{} {} needs a block size of at least {}, got {}",
           task_name(spec_.kind), spec_.size, sequence_length() - 1, block);
  return static_cast<std::int64_t>(heldout_.size());
}

Batch Task::eval_batch(std::int64_t first, std::int64_t count, std::int64_t block) const {
  const std::int64_t problems = eval_sequences(block);
  AG_CHECK(first >= 0 && count >= 1 && first <= problems - count, "eval",
           "problems [{}, {}) are outside the {} held-out problems", first, first + count, problems);
  return to_batch({heldout_.begin() + first, heldout_.begin() + first + count});
}

}  // namespace attograd::train::data

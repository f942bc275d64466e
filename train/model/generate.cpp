#include "train/model/generate.h"

#include <algorithm>
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "base/error.h"
#include "base/philox.h"

namespace attograd::train::model {

namespace {
// Zeroes every probability outside the smallest set of the likeliest ones that
// holds `top_p` of `total` (ties in the order of their ids).
void keep_nucleus(std::vector<double>& p, double total, double top_p) {
  std::vector<std::int64_t> order(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return p[a] > p[b]; });
  double kept = 0;
  std::size_t n = 0;
  while (n < order.size() && p[order[n]] > 0 && (n == 0 || kept < top_p * total)) kept += p[order[n++]];
  for (std::size_t i = n; i < order.size(); ++i) p[order[i]] = 0;
}
}  // namespace

std::int64_t pick_token(const std::vector<float>& all_logits, const GenerateOptions& options, double uniform) {
  // Padded rows are no token: never drawn.
  const std::vector<float> logits(all_logits.begin(),
                                  options.vocab_limit > 0 && options.vocab_limit < static_cast<std::int64_t>(all_logits.size())
                                      ? all_logits.begin() + options.vocab_limit
                                      : all_logits.end());
  const auto V = static_cast<std::int64_t>(logits.size());
  if (options.temperature == 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  // Top-k: everything below the k-th largest logit is excluded (ties at the threshold are kept).
  float threshold = -INFINITY;
  if (options.top_k > 0 && options.top_k < V) {
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(), std::greater<float>());
    threshold = sorted[options.top_k - 1];
  }
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(V);
  double total = 0;
  for (std::int64_t i = 0; i < V; ++i) {
    p[i] = logits[i] >= threshold ? std::exp((logits[i] - top) / options.temperature) : 0.0;
    total += p[i];
  }
  if (options.top_p < 1) {
    keep_nucleus(p, total, options.top_p);
    total = 0;
    for (double x : p) total += x;
  }
  // Inverse CDF; the last token with probability takes any rounding remainder.
  double cumulative = 0, target = uniform * total;
  std::int64_t last = 0;
  for (std::int64_t i = 0; i < V; ++i) {
    if (p[i] == 0) continue;
    last = i;
    cumulative += p[i];
    if (target < cumulative) return i;
  }
  return last;
}

std::vector<std::int64_t> generate(nn::GPT& model, const std::vector<std::int64_t>& prompt,
                                   const GenerateOptions& options, Device device) {
  AG_CHECK(!prompt.empty(), "generate", "the prompt must hold at least one token");
  AG_CHECK(std::isfinite(options.temperature) && options.temperature >= 0, "--temperature",
           "must be finite and >= 0, got {}", options.temperature);
  AG_CHECK(options.top_k >= 0, "--top-k", "must be >= 0, got {}", options.top_k);
  AG_CHECK(std::isfinite(options.top_p) && options.top_p > 0 && options.top_p <= 1, "--top-p",
           "must be in (0, 1], got {}", options.top_p);
  AG_CHECK(options.tokens >= 0, "--tokens", "must be >= 0, got {}", options.tokens);
  NoGradGuard no_grad;
  model.eval();
  const std::int64_t block = model.config().block_size;
  const auto as_tensor = [&](std::vector<std::int64_t>::const_iterator begin, std::vector<std::int64_t>::const_iterator end) {
    const std::vector<std::int64_t> ids(begin, end);
    return to(from_vector(ids, {1, static_cast<std::int64_t>(ids.size())}), device);
  };
  const auto last_row = [](const Tensor& logits) {  // (1, T, V) -> the last position's V logits
    return to_cpu(contiguous(select(select(logits, 0, 0), 0, logits.size(1) - 1))).to_vector<float>();
  };

  const AutocastGuard autocast(options.dtype);
  std::vector<std::int64_t> seq = prompt;
  std::size_t start = seq.size() > static_cast<std::size_t>(block) ? seq.size() - block : 0;
  nn::KVCache cache = model.make_cache();
  bool refill = true;  // the cache does not hold seq[start:] yet
  for (std::int64_t i = 0; i < options.tokens; ++i) {
    if (seq.size() - start > static_cast<std::size_t>(block)) {
      start = seq.size() - std::max<std::int64_t>(1, block / 2);
      refill = true;
    }
    Tensor logits;  // (1, n, V)
    if (!options.use_cache) {
      logits = model.forward(as_tensor(seq.begin() + start, seq.end()));
    } else if (refill) {
      cache.clear();
      logits = model.forward(as_tensor(seq.begin() + start, seq.end()), cache);
      refill = false;
    } else {
      logits = model.forward(as_tensor(seq.end() - 1, seq.end()), cache);
    }
    // Streams start 2^40 counters apart: no sample's draws are another's.
    const double u = philox_uniform(options.seed, options.stream << 40, static_cast<std::uint64_t>(i));
    seq.push_back(pick_token(last_row(logits), options, u));
    if (seq.back() == options.stop_token) break;
  }
  return seq;
}

}  // namespace attograd::train::model

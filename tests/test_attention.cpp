// The attention op (fused and composed) and MultiHeadAttention: known values,
// float64 gradchecks, fused == composed, causal / padding / dropout semantics.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include "autograd/attention.h"
#include "helpers.h"
#include "nn/attention.h"
#include "cpu/attention/attention.h"
#include "cpu/linear_heads.h"
#include "cpu/parallel.h"

using namespace attograd;
using namespace attograd::test;
using nn::MultiHeadAttention;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Copies `values` into a parameter (or a view of one) without recording.
void set(const Tensor& param, const Tensor& values) {
  NoGradGuard no_grad;
  kernels::copy_(param, values);
}

// A random bool tensor, true with probability p_hidden.
Tensor random_mask(const Shape& sizes, double p_hidden, std::uint64_t seed) {
  Generator gen(seed);
  return kernels::binary(kernels::Binary::lt, rand(sizes, {}, gen), full({}, p_hidden));
}

// Hides every key of query row `row` of batch 0, head 0 in a (B, H, Tq, Tk) mask.
Tensor hide_row(Tensor mask, std::int64_t row) {
  Tensor m = kernels::clone(mask);
  bool* p = m.data<bool>();
  const std::int64_t tk = m.size(3);
  for (std::int64_t j = 0; j < tk; ++j) p[row * tk + j] = true;
  return m;
}

struct Run {
  Tensor out, weights, dq, dk, dv;
};

// attention(q, k, v) with fresh leaf copies of the inputs (keeping their
// strides), then a backward of sum(out * r).
Run run_attention(const Tensor& q0, const Tensor& k0, const Tensor& v0, AttentionOptions options, AttentionImpl impl,
                  std::uint64_t dropout_seed = 99) {
  // A new leaf on the same storage and strides: both runs read identical inputs.
  auto fresh = [](const Tensor& x) {
    Tensor t = x.detach();
    t.set_requires_grad(true);
    return t;
  };
  Tensor q = fresh(q0), k = fresh(k0), v = fresh(v0);
  Generator gen(dropout_seed);
  options.generator = &gen;
  options.impl = impl;
  AttentionOutput a = attention(q, k, v, options);
  Generator rg(5);
  backward(a.out, randn(a.out.sizes(), a.out.options(), rg));
  return {a.out, a.weights, q.grad(), k.grad(), v.grad()};
}

// Values of shape (B, H, T, D) in `dtype`, N(0, 1); a transposed (non-contiguous) view when asked.
Tensor input(const Shape& sizes, std::uint64_t seed, DType dtype, bool transposed = false) {
  Generator gen(seed);
  if (!transposed) return randn(sizes, {dtype}, gen);
  Shape swapped = sizes;
  std::swap(swapped[2], swapped[3]);
  return transpose(randn(swapped, {dtype}, gen), 2, 3);
}

// The fused backward's ways to the probabilities: recomputed from the
// log-sum-exp (saved_probs_limit 0), the forward's tiles kept (a limit that
// holds every shape here, whatever its D), and both in one call: the tiles of
// the first half of the heads kept, the others' recomputed.
struct ProbsPath {
  const char* name;
  enum Keep { none, all, first_half } keep;
  // The saved_probs_limit that does it for `heads` (B * H) heads of Tq queries and Tk keys.
  std::int64_t limit(std::int64_t heads, std::int64_t Tq, std::int64_t Tk, bool causal, DType dtype) const {
    if (keep != first_half) return keep == all ? std::int64_t(1) << 30 : 0;
    return kernels::attention_probs_bytes((heads + 1) / 2, Tq, Tk, causal, dtype_size(dtype),
                                          std::numeric_limits<std::int64_t>::max());
  }
};
constexpr ProbsPath kProbsPaths[] = {
    {"recomputed", ProbsPath::none}, {"saved", ProbsPath::all}, {"saved for half the heads", ProbsPath::first_half}};

void require_same_runs(const Run& a, const Run& b, DType dtype) {
  const double atol = atol_for(dtype), rtol = rtol_for(dtype);
  INFO("out diff " << max_abs_diff(a.out, b.out) << ", dq " << max_abs_diff(a.dq, b.dq) << ", dk "
                   << max_abs_diff(a.dk, b.dk) << ", dv " << max_abs_diff(a.dv, b.dv));
  CHECK(all_close(a.out, b.out, atol, rtol));
  CHECK(all_close(a.dq, b.dq, atol, rtol));
  CHECK(all_close(a.dk, b.dk, atol, rtol));
  CHECK(all_close(a.dv, b.dv, atol, rtol));
}

// An MHA in float64 with every parameter a leaf, for gradcheck.
std::unique_ptr<MultiHeadAttention> make_mha(nn::MultiHeadAttentionConfig config, std::uint64_t seed = 3) {
  Generator gen(seed);
  auto mha = std::make_unique<MultiHeadAttention>(config, gen);
  mha->to(DType::f64);
  return mha;
}

std::vector<Tensor> with_params(std::vector<Tensor> inputs, const nn::Module& m) {
  for (const Tensor& p : m.parameters()) inputs.push_back(p);
  return inputs;
}

}  // namespace

// ---- known values --------------------------------------------------------------------

TEST_CASE("attention: a tiny causal MHA matches hand-computed values", "[attention]") {
  // T = 3, C = 2, one head. x = [[1,0],[0,1],[1,1]]; W_q = I; W_k swaps the two
  // features; W_v = diag(2, 1) with b_v = [0, 1]; W_o = I with b_o = [0.5, -0.5].
  // So q = x, k = [[0,1],[1,0],[1,1]], v = [[2,1],[0,2],[2,2]], scores q.k / sqrt(2):
  //   row 0 sees key 0 only:            w = [1]              out = v0 + b_o = [2.5, 0.5]
  //   row 1: s = [1, 0] / sqrt(2):       w = [0.669761549327, 0.330238450673]
  //          out = [2 w0, w0 + 2 w1] + b_o = [1.839523098653, 0.830238450673]
  //   row 2: s = [1, 1, 2] / sqrt(2):    w = [0.248255078258, 0.248255078258, 0.503489843485]
  //          out = [2 w0 + 2 w2, w0 + 2 w1 + 2 w2] + b_o = [2.003489843485, 1.251744921742]
  const std::vector<double> expected_out = {2.5, 0.5, 1.839523098653, 0.830238450673, 2.003489843485, 1.251744921742};
  const std::vector<double> expected_w = {
      1, 0, 0, 0.669761549327, 0.330238450673, 0, 0.248255078258, 0.248255078258, 0.503489843485};
  for (DType dtype : {DType::f32, DType::f64}) {
    for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
      Generator gen(1);
      MultiHeadAttention mha({.d_model = 2, .num_heads = 1, .causal = true, .impl = impl}, gen);
      mha.to(dtype);
      set(mha.w_q(), from({1, 0, 0, 1}, {2, 2}));
      set(mha.w_k(), from({0, 1, 1, 0}, {2, 2}));
      set(mha.w_v(), from({2, 0, 0, 1}, {2, 2}));
      set(mha.qkv.bias, from({0, 0, 0, 0, 0, 1}, {6}));
      set(mha.out_proj.weight, from({1, 0, 0, 1}, {2, 2}));
      set(mha.out_proj.bias, from({0.5, -0.5}, {2}));
      const Tensor x = kernels::cast(from({1, 0, 0, 1, 1, 1}, {1, 3, 2}), dtype);
      const nn::AttendResult r = mha.forward(x, x, x, {.return_weights = true});
      const auto out = r.out.to_vector<double>(), w = r.weights.to_vector<double>();
      REQUIRE(r.weights.sizes() == Shape{1, 1, 3, 3});
      for (std::size_t i = 0; i < expected_out.size(); ++i) CHECK(std::abs(out[i] - expected_out[i]) < 1e-6);
      for (std::size_t i = 0; i < expected_w.size(); ++i) CHECK(std::abs(w[i] - expected_w[i]) < 1e-6);
    }
  }
}

TEST_CASE("attention: d_model not divisible by num_heads is an error that says so", "[attention][errors]") {
  Generator gen(1);
  REQUIRE_THROWS_WITH(MultiHeadAttention({.d_model = 10, .num_heads = 3}, gen),
                      Catch::Contains("d_model 10 is not divisible by num_heads 3"));
  MultiHeadAttention mha({.d_model = 8, .num_heads = 2}, gen);
  REQUIRE_THROWS_WITH(mha(zeros({2, 3, 6})), Catch::Contains("d_model = 8"));
  REQUIRE_THROWS_WITH(
      attention(zeros({1, 2, 3, 4}), zeros({1, 2, 5, 4}), zeros({1, 2, 5, 4}), {.mask = zeros({3, 4}, {DType::b8})}),
      Catch::Contains("mask [3,4] does not broadcast"));
  REQUIRE_THROWS_WITH(attention(zeros({1, 2, 3, 4}), zeros({1, 2, 5, 4}), zeros({1, 2, 5, 4}), {.mask = zeros({3, 5})}),
                      Catch::Contains("mask must be bool"));
}

// The kernels are public (tensor/kernels.h): a caller that skips autograd, and
// so the forward's checks, still gets an error naming the backward, not a
// read past the mask or q (the CUDA kernels index by the four dims unchecked).
TEST_CASE("attention: the backward kernel checks its operands and mask itself", "[attention][errors]") {
  const Tensor q = zeros({1, 2, 3, 4}), kv = zeros({1, 2, 5, 4});
  const kernels::AttentionForwardResult f = kernels::attention_forward(q, kv, kv, {}, {});
  auto backward = [&](const Tensor& qb, const Tensor& k, const Tensor& mask) {
    return kernels::attention_backward(f.out, qb, k, kv, mask, f.out, f.lse, {}, {});
  };
  CHECK_NOTHROW(backward(q, kv, zeros({3, 5}, {DType::b8})));
  CHECK_THROWS_WITH(backward(q, kv, zeros({3, 4}, {DType::b8})),
                    Catch::StartsWith("[attention backward]") &&
                        Catch::Contains("mask [3,4] does not broadcast to the scores (B, H, Tq, Tk) = [1,2,3,5]"));
  CHECK_THROWS_WITH(backward(q, kv, zeros({1, 1, 1, 3, 5}, {DType::b8})),
                    Catch::Contains("mask [1,1,1,3,5] does not broadcast"));
  CHECK_THROWS_WITH(backward(q, kv, zeros({3, 5})), Catch::Contains("mask must be bool"));
  CHECK_THROWS_WITH(backward(q, zeros({1, 2, 5, 3}), {}), Catch::Contains("must share B, H and D"));
}

// The forward keeps its probability tiles only within the budget, and a
// backward given them equals one that recomputes them.
TEST_CASE("attention: the forward keeps its probabilities within probs_budget, and the backward uses them",
          "[attention]") {
  struct Case {
    const char* name;
    std::int64_t B, H, Tq, Tk, D;
    bool causal;
    std::int64_t tiles;  // 64 x 64 tiles per head that some query sees
  };
  const Case cases[] = {
      {"causal, three query blocks", 2, 3, 150, 150, 8, true, 6},
      {"causal, Tq > Tk", 1, 2, 200, 70, 8, true, 7},
      {"causal, Tq < Tk", 1, 2, 70, 200, 8, true, 3},
      {"no causal flag", 1, 2, 70, 130, 8, false, 6},
  };
  for (const Case& c : cases)
    for (DType dtype : {DType::f32, DType::f64})
      DYNAMIC_SECTION(c.name << " " << dtype_name(dtype)) {
        const Tensor q = input({c.B, c.H, c.Tq, c.D}, 1, dtype), k = input({c.B, c.H, c.Tk, c.D}, 2, dtype),
                     v = input({c.B, c.H, c.Tk, c.D}, 3, dtype), dout = input({c.B, c.H, c.Tq, c.D}, 4, dtype);
        // Each tile holds 64 x 64 probabilities and 64 maxima.
        const std::int64_t bytes = c.B * c.H * c.tiles * (64 * 64 + 64) * static_cast<std::int64_t>(dtype_size(dtype));
        const std::int64_t heads = c.B * c.H, head_bytes = bytes / heads;
        kernels::AttentionKernelOptions ko{.causal = c.causal, .scale = 0.3, .probs_budget = head_bytes - 1};
        const kernels::AttentionForwardResult none = kernels::attention_forward(q, k, v, {}, ko);
        CHECK_FALSE(none.probs.defined());
        const kernels::AttentionGrads recomputed =
            kernels::attention_backward(dout, q, k, v, {}, none.out, none.lse, {}, ko);
        CHECK(max_abs_diff(recomputed.dq, zeros(q.sizes(), q.options())) > 1e-3);
        // Whole heads, as many as fit: 1, all but one, all (and no more for a larger budget).
        for (const std::int64_t budget : {head_bytes, bytes - 1, bytes, 2 * bytes}) {
          INFO("budget " << budget << " bytes, " << head_bytes << " a head");
          ko.probs_budget = budget;
          const kernels::AttentionForwardResult f = kernels::attention_forward(q, k, v, {}, ko);
          REQUIRE(f.probs.defined());
          const std::int64_t kept = std::min(heads, budget / head_bytes);
          CHECK(f.probs.numel() * static_cast<std::int64_t>(dtype_size(dtype)) == kept * head_bytes);
          CHECK(kernels::attention_probs_bytes(heads, c.Tq, c.Tk, c.causal, dtype_size(dtype), budget) ==
                kept * head_bytes);
          const kernels::AttentionGrads saved =
              kernels::attention_backward(dout, q, k, v, {}, f.out, f.lse, f.probs, ko);
          const double atol = atol_for(dtype), rtol = rtol_for(dtype);
          CHECK(all_close(saved.dq, recomputed.dq, atol, rtol));
          CHECK(all_close(saved.dk, recomputed.dk, atol, rtol));
          CHECK(all_close(saved.dv, recomputed.dv, atol, rtol));
        }
        // With one head's budget the backward reads head (0, 0)'s tiles and recomputes the
        // others': zeroed tiles change that head's gradients alone.
        ko.probs_budget = head_bytes;
        const kernels::AttentionForwardResult first = kernels::attention_forward(q, k, v, {}, ko);
        const kernels::AttentionGrads zeroed = kernels::attention_backward(
            dout, q, k, v, {}, first.out, first.lse, zeros(first.probs.sizes(), first.probs.options()), ko);
        for (std::int64_t b = 0; b < c.B; ++b)
          for (std::int64_t h = 0; h < c.H; ++h) {
            const auto head = [&](const Tensor& t) { return narrow(narrow(t, 0, b, 1), 1, h, 1); };
            INFO("head " << b << ", " << h);
            if (b == 0 && h == 0)
              CHECK(max_abs_diff(head(zeroed.dk), head(recomputed.dk)) > 1e-3);
            else
              CHECK(max_abs_diff(head(zeroed.dk), head(recomputed.dk)) == 0);
          }
        ko.probs_budget = bytes;
        const kernels::AttentionForwardResult f = kernels::attention_forward(q, k, v, {}, ko);
        // Tiles from another shape, or of more heads than there are, are refused, not read past.
        CHECK_THROWS_WITH(kernels::attention_backward(dout, q, k, v, {}, f.out, f.lse, narrow(f.probs, 0, 1, 64), ko),
                          Catch::Contains("is not the forward's saved tiles"));
        CHECK_THROWS_WITH(
            kernels::attention_backward(dout, q, k, v, {}, f.out, f.lse, kernels::cat({f.probs, f.probs}, 0), ko),
            Catch::Contains("is not the forward's saved tiles"));
      }
}

TEST_CASE("attention: MHA keeps the probabilities only when it records a graph, within its limit", "[attention]") {
  // x (1, 70, 128): 2 query blocks, so 3 causal tiles of 64 x 64 probabilities and 64 maxima per head.
  Generator gen(4);
  Tensor x = randn({1, 70, 128}, {}, gen);
  x.set_requires_grad(true);
  // Bytes held after the forward while its output (and graph) lives.
  auto held_by_forward = [&](std::int64_t heads, std::int64_t limit, bool grad) {
    Generator init(3);
    const MultiHeadAttention mha(
        {.d_model = 128, .num_heads = heads, .causal = true, .impl = AttentionImpl::fused, .saved_probs_limit = limit},
        init);
    std::optional<NoGradGuard> no_grad;
    if (!grad) no_grad.emplace();
    const std::size_t before = cpu_alloc_stats().bytes_in_use;
    const Tensor y = mha(x);
    return cpu_alloc_stats().bytes_in_use - before;
  };
  for (std::int64_t heads : {2, 4}) {
    INFO(heads << " heads of " << 128 / heads);
    const std::size_t probs_bytes = heads * 3 * (64 * 64 + 64) * sizeof(float);
    const auto predicted = [&](std::int64_t limit) {  // what the trainer's memory check counts
      return saved_probs_bytes({.causal = true, .saved_probs_limit = limit}, heads, 70, 70, 128 / heads, 4);
    };
    CHECK(predicted(probs_bytes) == std::int64_t(probs_bytes));
    CHECK(predicted(probs_bytes - 1) == std::int64_t(probs_bytes / heads * (heads - 1)));  // whole heads
    CHECK(predicted(kAutoSavedProbsLimit) == (heads == 2 ? std::int64_t(probs_bytes) : 0));
    const std::size_t recomputed = held_by_forward(heads, 0, true);
    CHECK(held_by_forward(heads, probs_bytes, true) == recomputed + probs_bytes);
    // Over the limit: the heads that fit.
    CHECK(held_by_forward(heads, probs_bytes - 1, true) == recomputed + probs_bytes / heads * (heads - 1));
    CHECK(held_by_forward(heads, probs_bytes / heads - 1, true) == recomputed);
    CHECK(held_by_forward(heads, probs_bytes, false) < recomputed);      // no graph: nothing saved
    // The automatic limit keeps them on heads of 64 values, not on narrower ones.
    CHECK(held_by_forward(heads, kAutoSavedProbsLimit, true) == recomputed + (heads == 2 ? probs_bytes : 0));
  }
  CHECK_THROWS_WITH(held_by_forward(2, -2, true), Catch::Contains("saved_probs_limit must be a byte count >= 0"));
}

// Random shapes, seeded so a failure reproduces: both fused backward paths
// against the composed reference, in float64, with the causal flag, a
// broadcast mask and dropout drawn at random. The fixed cases above pick the
// edges; this reaches the ones between them (odd D, one-row blocks, Tq far
// from Tk, tiles cut anywhere).
TEST_CASE("attention: on random shapes both backward paths equal the composed one", "[attention][property]") {
  std::mt19937 rng(20261124);
  auto pick = [&rng](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (int n = 0; n < 24; ++n) {
    const std::int64_t B = pick(1, 2), H = pick(1, 3), Tq = pick(1, 150), Tk = pick(1, 150), D = pick(1, 70);
    const bool causal = pick(0, 1) == 1, masked = pick(0, 2) == 0;
    const double dropout = pick(0, 3) == 0 ? 0.25 : 0.0;
    AttentionOptions o{.causal = causal, .dropout_p = dropout};
    if (masked) o.mask = random_mask({B, 1, Tq, Tk}, 0.2, 100 + n);
    const Tensor q = input({B, H, Tq, D}, 3 * n, DType::f64), k = input({B, H, Tk, D}, 3 * n + 1, DType::f64),
                 v = input({B, H, Tk, D}, 3 * n + 2, DType::f64);
    INFO("case " << n << ": B " << B << " H " << H << " Tq " << Tq << " Tk " << Tk << " D " << D << " causal "
                 << causal << " masked " << masked << " dropout " << dropout);
    const Run composed = run_attention(q, k, v, o, AttentionImpl::composed);
    for (const ProbsPath& path : kProbsPaths) {
      INFO("probabilities " << path.name);
      o.saved_probs_limit = path.limit(B * H, Tq, Tk, causal, DType::f64);
      require_same_runs(run_attention(q, k, v, o, AttentionImpl::fused), composed, DType::f64);
    }
  }
}

// ---- fused == composed ---------------------------------------------------------------------

TEST_CASE("attention: fused equals composed, forward and backward", "[attention]") {
  struct Case {
    const char* name;
    std::int64_t B, H, Tq, Tk, D;
    bool causal;
    int mask;  // 0 none, 1 key padding (B,1,1,Tk), 2 random (B,H,Tq,Tk) with a fully hidden row, 3 (Tq,Tk)
    double dropout;
    bool transposed;
  };
  const Case cases[] = {
      {"small", 2, 3, 5, 5, 4, false, 0, 0, false},
      {"small causal", 2, 3, 5, 5, 4, true, 0, 0, false},
      {"T not a multiple of the block, causal", 1, 2, 67, 67, 8, true, 0, 0, false},
      {"two query blocks, three key blocks", 1, 2, 130, 131, 8, true, 0, 0, false},
      {"cross, Tq > Tk, causal", 2, 2, 70, 9, 16, true, 0, 0, false},
      {"cross, Tq < Tk, causal", 1, 2, 9, 70, 8, true, 0, 0, false},
      {"key padding", 3, 2, 13, 13, 4, false, 1, 0, false},
      {"random mask with a hidden row, causal", 2, 2, 11, 11, 4, true, 2, 0, false},
      {"(Tq, Tk) mask, cross", 2, 2, 7, 75, 4, false, 3, 0, false},
      {"dropout", 2, 3, 13, 13, 4, false, 0, 0.3, false},
      {"dropout, causal, masked, long", 1, 2, 97, 97, 8, true, 2, 0.2, false},
      {"transposed inputs", 2, 2, 7, 7, 5, true, 1, 0, true},
      // D = 32 and 64: whole rows of 4 vectors, the AVX-512 path's 4 x 4 micro-tiles (float64 and float32),
      // and at D = 64 its 6 x 4 ones on the tiles no causal limit trims: 64 rows of a tile as 6 x 10 + 4, a
      // last key tile's 16 (Tk = 75) as 6 + 6 + 4, a last query block's 8 (Tq = 130) as 6 + 2.
      {"D = 32, two query blocks, causal", 1, 2, 130, 130, 32, true, 0, 0, false},
      {"D = 64, two query blocks, causal, masked, dropout", 1, 2, 130, 130, 64, true, 2, 0.1, false},
      {"D = 64, cross, not causal", 1, 2, 130, 75, 64, false, 0, 0, false},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::f64, DType::f32}) {
      for (const ProbsPath& path : kProbsPaths) {
        DYNAMIC_SECTION(c.name << " " << dtype_name(dtype) << ", probabilities " << path.name) {
          const Tensor q = input({c.B, c.H, c.Tq, c.D}, 1, dtype, c.transposed);
          const Tensor k = input({c.B, c.H, c.Tk, c.D}, 2, dtype, c.transposed);
          const Tensor v = input({c.B, c.H, c.Tk, c.D}, 3, dtype, c.transposed);
          AttentionOptions o{.causal = c.causal, .dropout_p = c.dropout, .return_weights = true};
          o.saved_probs_limit = path.limit(c.B * c.H, c.Tq, c.Tk, c.causal, dtype);
          if (c.mask == 1) {
            std::vector<std::int64_t> lengths;
            for (std::int64_t b = 0; b < c.B; ++b) lengths.push_back(std::max<std::int64_t>(1, c.Tk - 3 * b));
            o.mask = nn::key_padding_mask(lengths, c.Tk);
          }
          if (c.mask == 2) o.mask = hide_row(random_mask({c.B, c.H, c.Tq, c.Tk}, 0.3, 7), 3);
          if (c.mask == 3) o.mask = random_mask({c.Tq, c.Tk}, 0.5, 8);
          const Run fused = run_attention(q, k, v, o, AttentionImpl::fused);
          const Run composed = run_attention(q, k, v, o, AttentionImpl::composed);
          require_same_runs(fused, composed, dtype);
          CHECK(all_close(fused.weights, composed.weights, atol_for(dtype), rtol_for(dtype)));
          for (const Tensor& t : {fused.out, fused.dq, fused.dk, fused.dv}) {
            const auto values = t.to_vector<double>();
            CHECK(std::none_of(values.begin(), values.end(), [](double x) { return std::isnan(x); }));
          }
        }
      }
    }
  }
}

TEST_CASE("attention: the fused kernels give the same bits on any number of threads", "[attention][parallel]") {
  // Tasks go to whichever thread is free, so which thread runs which head
  // changes from call to call; each task's arithmetic must not.
  // Heads long enough (a millisecond or so each) that threads run them side by side.
  const Shape sizes{2, 4, 320, 64};
  const Tensor q = input(sizes, 1, DType::f32), k = input(sizes, 2, DType::f32), v = input(sizes, 3, DType::f32);
  for (const ProbsPath& path : kProbsPaths) {
    AttentionOptions o{.causal = true, .mask = random_mask({2, 4, 320, 320}, 0.2, 9), .dropout_p = 0.1};
    o.saved_probs_limit = path.limit(8, 320, 320, true, DType::f32);
    set_num_threads(1);
    const Run serial = run_attention(q, k, v, o, AttentionImpl::fused);
    for (int threads : {2, 3, 5}) {
      set_num_threads(threads);
      const Run threaded = run_attention(q, k, v, o, AttentionImpl::fused);
      INFO(threads << " threads, probabilities " << path.name);
      CHECK(max_abs_diff(threaded.out, serial.out) == 0);
      CHECK(max_abs_diff(threaded.dq, serial.dq) == 0);
      CHECK(max_abs_diff(threaded.dk, serial.dk) == 0);
      CHECK(max_abs_diff(threaded.dv, serial.dv) == 0);
    }
  }
  set_num_threads(2);
}

// ctest runs the [attention] cases again on the narrower paths (tests/CMakeLists.txt):
// this one makes sure they did not silently run on the widest.
TEST_CASE("attention: the kernels run on the path ATTOGRAD_ATTENTION_ISA names", "[attention]") {
  const char* env = std::getenv("ATTOGRAD_ATTENTION_ISA");
  const std::string isa = cpu::attention_isa();
  if (env != nullptr && *env != '\0')
    CHECK(isa == env);
  else
    CHECK((isa == "avx512" || isa == "avx2" || isa == "baseline"));
}

TEST_CASE("attention: dropout draws the same mask in both paths and a new one per call", "[attention]") {
  const Tensor q = input({1, 2, 9, 4}, 1, DType::f64), k = input({1, 2, 9, 4}, 2, DType::f64),
               v = input({1, 2, 9, 4}, 3, DType::f64);
  const Run a = run_attention(q, k, v, {.dropout_p = 0.5}, AttentionImpl::fused, 11);
  const Run b = run_attention(q, k, v, {.dropout_p = 0.5}, AttentionImpl::fused, 12);
  const Run none = run_attention(q, k, v, {}, AttentionImpl::fused, 11);
  CHECK(max_abs_diff(a.out, b.out) > 1e-3);     // another seed, another mask
  CHECK(max_abs_diff(a.out, none.out) > 1e-3);  // dropout did something
  const Run eval = run_attention(q, k, v, {.dropout_p = 0.5, .training = false}, AttentionImpl::fused, 11);
  CHECK(max_abs_diff(eval.out, none.out) == 0);
  // Two calls on one generator draw at different offsets.
  Generator gen(11);
  AttentionOptions o{.dropout_p = 0.5, .generator = &gen};
  const Tensor first = attention(q.detach(), k.detach(), v.detach(), o).out;
  const Tensor second = attention(q.detach(), k.detach(), v.detach(), o).out;
  CHECK(max_abs_diff(first, second) > 1e-3);
}

TEST_CASE("attention: rows with every key hidden give zeros and zero gradient", "[attention]") {
  const Tensor q = input({1, 1, 4, 3}, 1, DType::f64), k = input({1, 1, 5, 3}, 2, DType::f64),
               v = input({1, 1, 5, 3}, 3, DType::f64);
  Tensor mask = zeros({1, 1, 4, 5}, {DType::b8});
  mask = hide_row(mask, 2);
  for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
    const Run r = run_attention(q, k, v, {.mask = mask, .return_weights = true}, impl);
    for (std::int64_t d = 0; d < 3; ++d) {
      CHECK(r.out.at({0, 0, 2, d}) == 0.0);
      CHECK(r.dq.at({0, 0, 2, d}) == 0.0);
    }
    for (std::int64_t j = 0; j < 5; ++j) CHECK(r.weights.at({0, 0, 2, j}) == 0.0);
    CHECK(std::abs(r.out.at({0, 0, 1, 0})) > 0);  // other rows are attended normally
  }
}

// The float32 kernels' exponential skips the usual clamps (cpu/attention/vectors.h):
// a NaN must still reach every output that depends on it, and no other.
TEST_CASE("attention: a NaN key reaches exactly the queries that see it", "[attention]") {
  for (DType dtype : {DType::f32, DType::f64}) {
    // D = 64 and two tiles of queries and keys: the AVX-512 path's 4 x 4 micro-tiles, and a later key tile.
    const Tensor q = input({1, 2, 130, 64}, 1, dtype), v = input({1, 2, 130, 64}, 3, dtype);
    Tensor k = kernels::clone(input({1, 2, 130, 64}, 2, dtype));
    constexpr std::int64_t kNanKey = 70;
    if (dtype == DType::f32)
      k.data<float>()[kNanKey * 64 + 5] = std::nanf("");
    else
      k.data<double>()[kNanKey * 64 + 5] = std::nan("");
    for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
      DYNAMIC_SECTION(dtype_name(dtype) << (impl == AttentionImpl::fused ? " fused" : " composed")) {
        const Tensor out = attention(q, k, v, {.causal = true, .impl = impl}).out;
        for (std::int64_t h = 0; h < 2; ++h)
          for (std::int64_t i = 0; i < 130; ++i) {
            INFO("head " << h << " query " << i);
            const bool sees_nan = h == 0 && i >= kNanKey;
            CHECK(std::isnan(out.at({0, h, i, 0})) == sees_nan);
            CHECK(std::isnan(out.at({0, h, i, 63})) == sees_nan);
          }
      }
    }
  }
}

TEST_CASE("attention: returned weights sum to one over visible keys", "[attention]") {
  const Tensor q = input({2, 3, 70, 4}, 1, DType::f32), k = input({2, 3, 70, 4}, 2, DType::f32),
               v = input({2, 3, 70, 4}, 3, DType::f32);
  const Tensor mask = nn::key_padding_mask({70, 40}, 70);
  for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
    const AttentionOutput a = attention(q, k, v, {.causal = true, .mask = mask, .return_weights = true, .impl = impl});
    REQUIRE(a.weights.sizes() == Shape{2, 3, 70, 70});
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t i = 0; i < 70; i += 7) {
        double total = 0;
        for (std::int64_t j = 0; j < 70; ++j) {
          const double w = a.weights.at({b, 1, i, j});
          const bool hidden = j > i || (b == 1 && j >= 40);
          if (hidden) CHECK(w == 0.0);
          total += w;
        }
        CHECK(total == Approx(1.0).epsilon(1e-5));
      }
  }
}

TEST_CASE("attention: gradcheck of the op on odd and transposed shapes", "[attention][gradcheck]") {
  for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed})
    for (const ProbsPath& path : kProbsPaths) {
      INFO("impl " << int(impl) << ", probabilities " << path.name);
      Generator gen(3);
      Fn fn = [&](const std::vector<Tensor>& x) {
        gen.set_state(3, 0);
        AttentionOptions o{.causal = true,
                           .mask = random_mask({5, 7}, 0.3, 4),
                           .dropout_p = 0.2,
                           .generator = &gen,
                           .impl = impl};
        o.saved_probs_limit = path.limit(2, 5, 7, true, DType::f64);
        return attention(x[0], x[1], x[2], o).out;
      };
      REQUIRE_GRADCHECK("attention", fn,
                        {leaf({1, 2, 5, 3}, 1), transposed_leaf({1, 2, 7, 3}, 2), leaf({1, 2, 7, 3}, 3)});
    }
}

// ---- attention_packed: q, k, v side by side in one (B, T, 3 H D) projection ------------------

namespace {
// The three heads of a packed qkv as differentiable views, the way a user would split it.
std::vector<Tensor> split_views(const Tensor& qkv, std::int64_t heads) {
  const Tensor x =
      permute(view(qkv, {qkv.size(0), qkv.size(1), 3, heads, qkv.size(2) / (3 * heads)}), {2, 0, 3, 1, 4});
  return {select(x, 0, 0), select(x, 0, 1), select(x, 0, 2)};
}

// A packed qkv of (B, T, 3 H D) as a leaf; a non-contiguous view when asked.
Tensor packed_leaf(std::int64_t B, std::int64_t T, std::int64_t width, std::uint64_t seed, DType dtype,
                   bool transposed) {
  Generator gen(seed);
  Tensor x = transposed ? transpose(randn({B, width, T}, {dtype}, gen), 1, 2) : randn({B, T, width}, {dtype}, gen);
  x.set_requires_grad(true);
  return x;
}

// A case of the attention_packed tests: (B, T, 3 H D) as packed_leaf makes it, with its options.
struct PackedCase {
  const char* name;
  std::int64_t B, T, H, D;
  bool causal, mask;
  double dropout;
  bool transposed = false;  // qkv a non-contiguous view
};
}  // namespace

TEST_CASE("attention: attention_packed equals attention on the views of qkv, forward and backward", "[attention]") {
  using Case = PackedCase;
  // D = 16 or 32 with T a multiple of 16 write the gradient rows in place (every
  // instruction set's vector width divides them); the others go through scratch rows.
  // q, k, v rows are 3 H D apart: heads this short are also read in place, except
  // where D needs padding. The next test covers long heads, whose rows are
  // copied compact, and compares the paths bit for bit.
  const Case cases[] = {
      {"in place, causal", 2, 64, 2, 32, true, false, 0, false},
      {"in place, two blocks", 1, 144, 3, 16, true, false, 0, false},
      {"odd T and D", 2, 13, 3, 5, true, false, 0, false},
      {"key padding, dropout", 3, 20, 2, 8, false, true, 0.25, false},
      {"non-contiguous qkv", 2, 9, 2, 4, true, true, 0, true},
  };
  for (const Case& c : cases)
    for (DType dtype : {DType::f64, DType::f32})
      for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
        DYNAMIC_SECTION(c.name << " " << dtype_name(dtype) << " impl " << int(impl)) {
          AttentionOptions o{.causal = c.causal, .dropout_p = c.dropout, .impl = impl};
          if (c.mask) {
            std::vector<std::int64_t> lengths;
            for (std::int64_t b = 0; b < c.B; ++b) lengths.push_back(std::max<std::int64_t>(1, c.T - 4 * b));
            o.mask = nn::key_padding_mask(lengths, c.T);
          }
          const Tensor qkv = packed_leaf(c.B, c.T, 3 * c.H * c.D, 6, dtype, c.transposed);
          Tensor ref = qkv.detach();  // the same values and strides, its own gradient
          ref.set_requires_grad(true);
          Generator gen_a(17), gen_b(17);
          o.generator = &gen_a;
          const AttentionOutput packed = attention_packed(qkv, c.H, o);
          o.generator = &gen_b;
          const auto views = split_views(ref, c.H);
          const AttentionOutput reference = attention(views[0], views[1], views[2], o);
          Generator rg(8);
          const Tensor g = randn(packed.out.sizes(), packed.out.options(), rg);
          backward(packed.out, g);
          backward(reference.out, g);
          INFO("out diff " << max_abs_diff(packed.out, reference.out) << ", d(qkv) diff "
                           << max_abs_diff(qkv.grad(), ref.grad()));
          CHECK(all_close(packed.out, reference.out, atol_for(dtype), rtol_for(dtype)));
          REQUIRE(qkv.grad().sizes() == qkv.sizes());
          CHECK(all_close(qkv.grad(), ref.grad(), atol_for(dtype), rtol_for(dtype)));
          CHECK(max_abs_diff(qkv.grad(), zeros(qkv.sizes(), qkv.options())) > 1e-3);  // every part got a gradient
        }
      }
}

TEST_CASE("attention: the fused kernels give the same bits on packed and on contiguous q k v", "[attention]") {
  // Rows that are not back to back (a packed qkv's are 3 H D apart) are read
  // from compact copies on heads of 512 rows or more, and where D needs
  // padding: in the forward a thread's copy of a head's keys and values, kept
  // from task to task; in the backward copies of q, do and each key tile.
  // Contiguous (B, H, T, D) operands with D a multiple of every vector width
  // are read in place. Every path must do the same arithmetic.
  using Case = PackedCase;
  const Case cases[] = {
      {"a short head", 1, 256, 2, 64, true, false, 0},
      {"a long head, a partial last tile", 1, 520, 2, 32, true, false, 0},
      {"padded D", 1, 150, 3, 40, true, true, 0},
      {"a long head, no causal flag, mask and dropout", 1, 530, 2, 16, false, true, 0.2},
  };
  for (const Case& c : cases)
    for (DType dtype : {DType::f32, DType::f64})
      for (const ProbsPath& path : kProbsPaths)
        DYNAMIC_SECTION(c.name << " " << dtype_name(dtype) << ", probabilities " << path.name) {
          AttentionOptions o{.causal = c.causal, .dropout_p = c.dropout};
          o.saved_probs_limit = path.limit(c.B * c.H, c.T, c.T, c.causal, dtype);
          if (c.mask) o.mask = random_mask({c.B, 1, c.T, c.T}, 0.2, 4);
          const Tensor qkv = packed_leaf(c.B, c.T, 3 * c.H * c.D, 6, dtype, false);
          const auto views = split_views(qkv.detach(), c.H);
          const Run contiguous = run_attention(kernels::contiguous(views[0]), kernels::contiguous(views[1]),
                                               kernels::contiguous(views[2]), o, AttentionImpl::fused);
          const Run strided = run_attention(views[0], views[1], views[2], o, AttentionImpl::fused);
          // attention_packed writes d(qkv) itself, rows 3 H D apart; run_attention's seeds.
          Generator gen(99), rg(5);
          o.generator = &gen;
          const Tensor out = attention_packed(qkv, c.H, o).out;
          backward(out, randn(out.sizes(), out.options(), rg));
          const auto grads = split_views(qkv.grad(), c.H);
          for (const Run* run : {&strided, &contiguous}) {
            INFO((run == &strided ? "strided views" : "contiguous") << " against attention_packed");
            CHECK(max_abs_diff(run->out, out) == 0);
            CHECK(max_abs_diff(run->dq, grads[0]) == 0);
            CHECK(max_abs_diff(run->dk, grads[1]) == 0);
            CHECK(max_abs_diff(run->dv, grads[2]) == 0);
          }
          CHECK(max_abs_diff(out, zeros(out.sizes(), out.options())) > 1e-3);
        }
}

TEST_CASE("attention: gradcheck of attention_packed", "[attention][gradcheck]") {
  for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed})
    for (bool transposed : {false, true}) {
      // Half the heads' probabilities saved on plain qkv, all recomputed on the transposed.
      const ProbsPath& path = kProbsPaths[transposed ? 0 : 2];
      INFO("impl " << int(impl) << ", probabilities " << path.name);
      Generator gen(3);
      Fn fn = [&](const std::vector<Tensor>& x) {
        gen.set_state(3, 0);
        AttentionOptions o{.causal = true,
                           .mask = random_mask({6, 6}, 0.3, 4),
                           .dropout_p = 0.2,
                           .generator = &gen,
                           .impl = impl};
        o.saved_probs_limit = path.limit(4, 6, 6, true, DType::f64);
        return attention_packed(x[0], 2, o).out;
      };
      const Tensor qkv = transposed ? transposed_leaf({2, 6, 18}, 5) : leaf({2, 6, 18}, 5);
      REQUIRE_GRADCHECK("attention_packed", fn, {qkv});
    }
}

namespace {
// qkv (B, T, 3 H D) laid out as linear_heads writes it, (B, 3, H, T, D) contiguous, as a new leaf.
Tensor by_heads_leaf(const Tensor& qkv, std::int64_t heads) {
  const std::int64_t D = qkv.size(2) / (3 * heads);
  Tensor x = contiguous(permute(view(qkv.detach(), {qkv.size(0), qkv.size(1), 3, heads, D}), {0, 2, 3, 1, 4}));
  x.set_requires_grad(true);
  return x;
}
}  // namespace

// linear_heads' layout: each head's rows back to back, read in place by the
// fused kernels; its gradient laid out (B, T, 3, H, D), as linear_heads'
// backward reads it with no copy. The same arithmetic as the (B, T, 3 H D)
// packing, so the same bits.
TEST_CASE("attention: attention_packed on a (B, 3, H, T, D) qkv gives the bits of the (B, T, 3 H D) one", "[attention]") {
  using Case = PackedCase;
  const Case cases[] = {
      {"a short head", 2, 40, 2, 64, true, false, 0},
      {"a long head, a partial last tile", 1, 520, 2, 32, true, false, 0},
      {"padded D, mask and dropout", 1, 30, 3, 5, false, true, 0.2},
  };
  for (const Case& c : cases)
    for (DType dtype : {DType::f32, DType::f64})
      for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed})
        DYNAMIC_SECTION(c.name << " " << dtype_name(dtype) << " impl " << int(impl)) {
          AttentionOptions o{.causal = c.causal, .dropout_p = c.dropout, .impl = impl};
          if (c.mask) o.mask = random_mask({c.B, 1, c.T, c.T}, 0.2, 4);
          const Tensor qkv = packed_leaf(c.B, c.T, 3 * c.H * c.D, 6, dtype, false);
          const Tensor heads = by_heads_leaf(qkv, c.H);
          Generator gen_a(17), gen_b(17), rg(8);
          o.generator = &gen_a;
          const Tensor want = attention_packed(qkv, c.H, o).out;
          o.generator = &gen_b;
          const Tensor got = attention_packed(heads, c.H, o).out;
          const Tensor g = randn(want.sizes(), want.options(), rg);
          backward(want, g);
          backward(got, g);
          const Tensor d_rows = permute(heads.grad(), {0, 3, 1, 2, 4});  // (B, T, 3, H, D)
          const Tensor d_want = view(qkv.grad(), d_rows.sizes());
          if (impl == AttentionImpl::fused) {
            CHECK(max_abs_diff(got, want) == 0);
            CHECK(max_abs_diff(d_rows, d_want) == 0);
          } else {
            CHECK(all_close(got, want, atol_for(dtype), rtol_for(dtype)));
            CHECK(all_close(d_rows, d_want, atol_for(dtype), rtol_for(dtype)));
          }
          CHECK(max_abs_diff(heads.grad(), zeros(heads.sizes(), heads.options())) > 1e-3);
        }
}

TEST_CASE("attention: gradcheck of attention_packed on a (B, 3, H, T, D) qkv", "[attention][gradcheck]") {
  for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
    INFO("impl " << int(impl));
    Generator gen(3);
    Fn fn = [&](const std::vector<Tensor>& x) {
      gen.set_state(3, 0);
      AttentionOptions o{.causal = true, .mask = random_mask({6, 6}, 0.3, 4), .dropout_p = 0.2, .generator = &gen,
                         .impl = impl};
      return attention_packed(x[0], 2, o).out;
    };
    REQUIRE_GRADCHECK("attention_packed by heads", fn, {leaf({2, 3, 2, 6, 3}, 5)});
  }
}

// MultiHeadAttention projects q, k, v with linear_heads, written head by head
// where the kernel can (float32, D a multiple of the kernel's 64-column
// blocks on AVX-512), and its backward reads d(qkv) as the attention lays it out:
// the module must give the bits of the (B, T, 3C) projection's path, written
// out here, and match its composed reference.
TEST_CASE("attention: MHA with heads of 64 gives the bits of attention on its (B, T, 3C) projection", "[attention]") {
  const std::int64_t B = 2, T = 37, C = 128, H = 2;
  Generator data(5);
  const Tensor x0 = randn({B, T, C}, {DType::f32}, data), g = randn({B, T, C}, {DType::f32}, data);
  enum { kModule, kWrittenOut, kComposed };
  std::vector<Tensor> grads[3];
  Tensor outs[3];
  for (int path : {kModule, kWrittenOut, kComposed}) {
    Generator init(9);
    MultiHeadAttention mha({.d_model = C, .num_heads = H, .causal = true,
                            .impl = path == kComposed ? AttentionImpl::composed : AttentionImpl::fused},
                           init);
    Tensor x = x0.detach();
    x.set_requires_grad(true);
    if (path == kWrittenOut) {
      const AttentionOutput a = attention_packed(mha.qkv(x), H, {.causal = true, .impl = AttentionImpl::fused});
      outs[path] = mha.out_proj(reshape(transpose(a.out, 1, 2), {B, T, C}));
    } else {
      outs[path] = mha(x);
    }
    backward(outs[path], g);
    grads[path].push_back(x.grad());
    for (const Tensor& p : mha.parameters()) grads[path].push_back(p.grad());
  }
  INFO("q, k, v written head by head: " << cpu::linear_heads_direct(C / H));
  CHECK(max_abs_diff(outs[kModule], outs[kWrittenOut]) == 0);
  CHECK(all_close(outs[kModule], outs[kComposed], atol_for(DType::f32), rtol_for(DType::f32)));
  for (std::size_t k = 0; k < grads[kModule].size(); ++k) {
    INFO("gradient " << k);
    CHECK(max_abs_diff(grads[kModule][k], grads[kWrittenOut][k]) == 0);
    CHECK(all_close(grads[kModule][k], grads[kComposed][k], atol_for(DType::f32), rtol_for(DType::f32)));
  }
}

TEST_CASE("attention: attention_packed names a qkv that does not split into heads", "[attention][errors]") {
  CHECK_THROWS_WITH(attention_packed(zeros({2, 5, 10}), 2),
                    Catch::Contains("attention_packed") && Catch::Contains("[2,5,10]") &&
                        Catch::Contains("num_heads = 2"));
  CHECK_THROWS_WITH(attention_packed(zeros({10, 6}), 1), Catch::Contains("attention_packed"));
}

// ---- MultiHeadAttention ------------------------------------------------------------------------

TEST_CASE("attention: gradcheck of MHA over inputs and every parameter", "[attention][gradcheck]") {
  for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
    Generator dropout_gen(21);
    const auto mha_owner = make_mha({.d_model = 6, .num_heads = 2, .causal = true, .impl = impl});
    auto& mha = *mha_owner;
    const auto mha_drop_owner =
        make_mha({.d_model = 6, .num_heads = 2, .dropout = 0.3, .dropout_generator = &dropout_gen, .impl = impl});
    auto& mha_drop = *mha_drop_owner;
    const auto mha_cross_owner = make_mha({.d_model = 6, .num_heads = 3, .bias = false, .impl = impl});
    auto& mha_cross = *mha_cross_owner;
    const Tensor x = leaf({2, 5, 6}, 1), memory = leaf({2, 7, 6}, 2);
    const Tensor padding = nn::key_padding_mask({5, 3}, 5), memory_padding = nn::key_padding_mask({7, 4}, 7);
    DYNAMIC_SECTION("self, causal " << int(impl)) {
      REQUIRE_GRADCHECK("mha self", Fn([&](const std::vector<Tensor>& in) { return mha(in[0]); }),
                        with_params({x}, mha));
    }
    DYNAMIC_SECTION("self, causal, key padding " << int(impl)) {
      REQUIRE_GRADCHECK("mha self masked", Fn([&](const std::vector<Tensor>& in) { return mha(in[0], padding); }),
                        with_params({x}, mha));
    }
    DYNAMIC_SECTION("self, dropout " << int(impl)) {
      Fn fn = [&](const std::vector<Tensor>& in) {
        dropout_gen.set_state(21, 0);
        return mha_drop(in[0]);
      };
      REQUIRE_GRADCHECK("mha dropout", fn, with_params({x}, mha_drop));
    }
    DYNAMIC_SECTION("cross, key padding " << int(impl)) {
      Fn fn = [&](const std::vector<Tensor>& in) {
        return mha_cross.forward(in[0], in[1], in[1], {.mask = memory_padding}).out;
      };
      REQUIRE_GRADCHECK("mha cross", fn, with_params({x, memory}, mha_cross));
    }
    DYNAMIC_SECTION("cross, separate key and value " << int(impl)) {
      Fn fn = [&](const std::vector<Tensor>& in) { return mha_cross.forward(in[0], in[1], in[2]).out; };
      REQUIRE_GRADCHECK("mha cross kv", fn, with_params({x, memory, leaf({2, 7, 6}, 5)}, mha_cross));
    }
  }
}

TEST_CASE("attention: the packed MHA equals single heads computed separately and concatenated", "[attention]") {
  // Head h of a packed MHA must be exactly: rows [h*D, (h+1)*D) of W_q, W_k,
  // W_v (and biases) as a one-head attention of width D; heads concatenated in
  // order, then W_o. Built here from plain ops on 2-D weight slices.
  const std::int64_t B = 2, T = 6, C = 8, H = 4, D = C / H;
  const auto mha_owner = make_mha({.d_model = C, .num_heads = H, .causal = true});
  auto& mha = *mha_owner;
  const Tensor x = leaf({B, T, C}, 4).detach();
  Tensor causal = empty({T, T}, {DType::b8});
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t j = 0; j < T; ++j) causal.data<bool>()[i * T + j] = j > i;
  std::vector<Tensor> heads;
  for (std::int64_t h = 0; h < H; ++h) {
    auto rows = [&](const Tensor& w) { return narrow(w, 0, h * D, D); };
    const Tensor q = linear(x, rows(mha.w_q()), rows(mha.b_q()));  // (B, T, D)
    const Tensor k = linear(x, rows(mha.w_k()), rows(mha.b_k()));
    const Tensor v = linear(x, rows(mha.w_v()), rows(mha.b_v()));
    const Tensor scores = masked_fill(matmul(q, transpose(k, 1, 2)) / std::sqrt(double(D)), causal, -INFINITY);
    heads.push_back(matmul(softmax(scores, -1), v));  // (B, T, D)
  }
  const Tensor expected = mha.out_proj(cat(heads, -1));
  CHECK(max_abs_diff(mha(x), expected) < 1e-12);
  // And a one-head MHA with the same weights is the H = 1 case of the same formula.
  const auto one_owner = make_mha({.d_model = C, .num_heads = 1, .causal = true});
  auto& one = *one_owner;
  one.load_state_dict(mha.state_dict());
  const Tensor q = linear(x, mha.w_q(), mha.b_q()), k = linear(x, mha.w_k(), mha.b_k()),
               v = linear(x, mha.w_v(), mha.b_v());
  const Tensor att = softmax(masked_fill(matmul(q, transpose(k, 1, 2)) / std::sqrt(double(C)), causal, -INFINITY), -1);
  CHECK(max_abs_diff(one(x), mha.out_proj(matmul(att, v))) < 1e-12);
  CHECK(max_abs_diff(one(x), mha(x)) > 1e-6);  // splitting into heads does change the function
}

TEST_CASE("attention: causal outputs ignore later tokens", "[attention]") {
  for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
    Generator gen(2);
    MultiHeadAttention mha({.d_model = 16, .num_heads = 4, .causal = true, .impl = impl}, gen);
    const std::int64_t T = 70, t = 40;
    const Tensor x = randn({2, T, 16}, {}, gen);
    Tensor perturbed = kernels::clone(x);
    kernels::copy_(narrow(perturbed, 1, t, T - t), randn({2, T - t, 16}, {}, gen));
    const Tensor a = mha(x), b = mha(perturbed);
    CHECK(max_abs_diff(narrow(a, 1, 0, t), narrow(b, 1, 0, t)) == 0);
    CHECK(max_abs_diff(narrow(a, 1, t, T - t), narrow(b, 1, t, T - t)) > 1e-3);
  }
}

TEST_CASE("attention: hidden (padded) keys do not affect the outputs", "[attention]") {
  for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::composed}) {
    Generator gen(2);
    MultiHeadAttention mha({.d_model = 12, .num_heads = 3, .impl = impl}, gen);
    const Tensor query = randn({2, 5, 12}, {}, gen), memory = randn({2, 9, 12}, {}, gen);
    const Tensor mask = nn::key_padding_mask({9, 6}, 9);
    Tensor changed = kernels::clone(memory);
    kernels::copy_(narrow(select(changed, 0, 1), 0, 6, 3), randn({3, 12}, {}, gen));  // batch 1's padding
    const Tensor a = mha.forward(query, memory, memory, {.mask = mask}).out;
    const Tensor b = mha.forward(query, changed, changed, {.mask = mask}).out;
    CHECK(max_abs_diff(a, b) == 0);
    const Tensor c = mha.forward(query, changed, changed).out;  // unmasked, the change shows
    CHECK(max_abs_diff(a, c) > 1e-3);
  }
}

TEST_CASE("attention: eval mode makes dropout the identity", "[attention]") {
  Generator gen(2), dropout_gen(5);
  MultiHeadAttention mha({.d_model = 8, .num_heads = 2, .dropout = 0.5, .dropout_generator = &dropout_gen}, gen);
  MultiHeadAttention plain({.d_model = 8, .num_heads = 2}, gen);
  plain.load_state_dict(mha.state_dict());
  const Tensor x = randn({2, 7, 8}, {}, gen);
  CHECK(max_abs_diff(mha(x), plain(x)) > 1e-3);  // training: dropped weights
  mha.eval();
  CHECK_FALSE(mha.is_training());
  CHECK_FALSE(mha.qkv.is_training());
  CHECK(max_abs_diff(mha(x), plain(x)) == 0);
  CHECK(max_abs_diff(mha(x), mha(x)) == 0);
}

TEST_CASE("attention: key_padding_mask marks positions past each length", "[attention]") {
  const Tensor m = nn::key_padding_mask({3, 1}, 4);
  REQUIRE(m.sizes() == Shape{2, 1, 1, 4});
  CHECK(m.to_vector<bool>() == std::vector<bool>{false, false, false, true, false, true, true, true});
  REQUIRE_THROWS_WITH(nn::key_padding_mask({5}, 4), Catch::Contains("length 5"));
}

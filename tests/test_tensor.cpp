// Tensor basics: factories, views sharing storage, contiguity, casts, printing, errors.
#include <cmath>
#include <sstream>
#include <vector>

#include "helpers.h"
#include "cpu/philox_block.h"
#include "tensor/dense_span.h"

using namespace attograd;
using namespace attograd::test;

TEST_CASE("factories fill, shape and dtype", "[tensor]") {
  Tensor z = zeros({2, 3});
  CHECK(z.sizes() == Shape{2, 3});
  CHECK(z.strides() == Shape{3, 1});
  CHECK(z.dtype() == DType::f32);
  CHECK(z.to_vector<float>() == std::vector<float>(6, 0.f));
  CHECK(ones({4}, {DType::f64}).to_vector<double>() == std::vector<double>(4, 1.0));
  CHECK(full({2}, 2.5).to_vector<float>() == std::vector<float>{2.5f, 2.5f});
  CHECK(arange(5).to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4});
  CHECK(arange(1, 2, 0.25, {DType::f64}).to_vector<double>() == std::vector<double>{1, 1.25, 1.5, 1.75});
  CHECK(arange(4, {DType::i64}).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3});
  CHECK(scalar_tensor(3).item() == 3);
  CHECK(scalar_tensor(3).dim() == 0);
  Tensor f = from({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(f.at({1, 2}) == 6);
  REQUIRE_THROWS_WITH(from({1, 2, 3}, {2, 2}), Catch::Contains("[from]") && Catch::Contains("[2,2]"));
  REQUIRE_THROWS_WITH(zeros({2, -1}), Catch::Contains("negative size"));
  REQUIRE_THROWS_WITH(f.at({2, 0}), Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(f.item(), Catch::Contains("6 elements"));
  REQUIRE_THROWS_WITH(f.data<double>(), Catch::Contains("float32"));
}

TEST_CASE("rand and randn are reproducible from the seed and well distributed", "[tensor][rng]") {
  Generator g1(7), g2(7), g3(8);
  Tensor a = randn({10000}, {}, g1), b = randn({10000}, {}, g2), c = randn({10000}, {}, g3);
  CHECK(max_abs_diff(a, b) == 0);
  CHECK(max_abs_diff(a, c) > 0.1);
  const double m = mean(a).item();
  const double var = mean(pow(a - m, 2.0)).item();
  CHECK(std::abs(m) < 0.05);
  CHECK(std::abs(var - 1) < 0.05);
  Tensor u = rand({10000}, {DType::f64}, g1);
  CHECK(max(u).item() < 1.0);
  CHECK(max(-u).item() <= 0.0);
  CHECK(std::abs(mean(u).item() - 0.5) < 0.02);
  // The offset advances: two draws from one generator differ.
  Generator g4(1);
  CHECK(max_abs_diff(rand({8}, {}, g4), rand({8}, {}, g4)) > 0);
}

TEST_CASE("philox matches the Random123 known-answer vector", "[tensor][rng]") {
  // Random123's kat_vectors: philox4x32_10 with counter 0 and key 0 gives
  // 6627e8d5 e169c58d bc57ac4c 9b00dbd8.
  const Philox4 r = philox4x32(0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
}

TEST_CASE("Philox with its round keys worked out once draws what philox4x32 draws", "[tensor][rng]") {
  // The CUDA attention kernels take the round keys among their parameters (AttentionProblem::round_keys).
  for (const std::uint64_t key : {std::uint64_t{0}, std::uint64_t{0x123456789abcdefULL}, ~std::uint64_t{0}}) {
    const PhiloxRoundKeys keys = philox_round_keys(key);
    for (const std::uint64_t counter : {std::uint64_t{0}, std::uint64_t{7}, std::uint64_t{0xffffffffULL},
                                        std::uint64_t{0xfedcba9876543210ULL}}) {
      const Philox4 want = philox4x32(counter, key), got = philox4x32(counter, keys);
      INFO("key " << key << " counter " << counter);
      for (int w = 0; w < 4; ++w) CHECK(got.v[w] == want.v[w]);
    }
  }
}

TEST_CASE("a draw's bits are below drop_bits_below(p) exactly when its uniform is below p", "[tensor][rng]") {
  // The CUDA attention kernels test a weight with the integer compare; the CPU compares uniforms.
  std::vector<float> thresholds = {0.0f, 1e-30f, 0.1f, 0.25f, 0.3f, 0.5f, 1.0f / 3.0f, 0.9f, 0.999f,
                                   std::nextafter(1.0f, 0.0f), 0x1p-24f, 0x1.8p-24f, 0x1p-25f};
  for (std::uint32_t k : {1u, 2u, 1000u, (1u << 23) + 1, (1u << 24) - 1})  // on the 2^-24 grid and beside it
    for (const float x : {k * 0x1p-24f, std::nextafter(k * 0x1p-24f, 0.0f), std::nextafter(k * 0x1p-24f, 1.0f)})
      if (x < 1.0f) thresholds.push_back(x);  // a dropout probability is below 1
  for (const float threshold : thresholds) {
    const std::uint32_t below = drop_bits_below(threshold);
    // Every bits value whose uniform lies near the boundary, and a sweep of the rest.
    std::vector<std::uint32_t> bits = {0u, 1u, 255u, 256u, 0xffffffffu, 0xffffff00u, below, below - 1, below + 1};
    for (std::uint32_t b = 0; b < 0xffffffffu - 0x01000193u; b += 0x01000193u) bits.push_back(b);
    for (std::int64_t d = -1024; d <= 1024; ++d) bits.push_back(static_cast<std::uint32_t>(static_cast<std::int64_t>(below) + d));
    for (const std::uint32_t b : bits) {
      INFO("threshold " << threshold << " bits " << b << " below " << below);
      REQUIRE((b < below) == (uniform_from_bits(b) < threshold));
    }
  }
}

TEST_CASE("block Philox dropout factors equal philox_uniform's, whatever the start and length", "[tensor][rng]") {
  // The block version (cpu/philox_block.h) draws 16 counters at once;
  // ranges that start or end inside a counter or a block use part of one.
  // Keys and offsets with high words set, and a counter whose low word wraps.
  const float threshold = 0.3f;
  for (const std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{0x123456789abcdefULL}})
    for (const std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{5}, std::uint64_t{0xfffffff9ULL}})
      for (const std::uint64_t first : {0, 1, 3, 4, 61, 64, 130})
        for (const std::int64_t n : {0, 1, 3, 5, 63, 64, 65, 200}) {
          std::vector<double> got(static_cast<std::size_t>(n), -1.0);
          cpu::philox_dropout_factors(seed, offset, first, n, threshold, 2.0, got.data());
          for (std::int64_t j = 0; j < n; ++j) {
            const double want = philox_uniform(seed, offset, first + static_cast<std::uint64_t>(j)) < threshold ? 0 : 2.0;
            INFO("seed " << seed << " offset " << offset << " first " << first << " n " << n << " j " << j);
            REQUIRE(got[static_cast<std::size_t>(j)] == want);
          }
        }
}

TEST_CASE("views share storage, contiguity is computed", "[tensor][views]") {
  Tensor x = reshape(arange(12), {3, 4});
  Tensor t = transpose(x, 0, 1);
  CHECK(t.sizes() == Shape{4, 3});
  CHECK(t.strides() == Shape{1, 4});
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.storage() == x.storage());
  CHECK(t.at({3, 2}) == 11);
  Tensor n = narrow(x, 1, 1, 2);
  CHECK(n.sizes() == Shape{3, 2});
  CHECK(n.at({2, 1}) == 10);
  CHECK(n.storage() == x.storage());
  Tensor e = expand(reshape(arange(3), {3, 1}), {3, 5});
  CHECK(e.strides()[1] == 0);
  CHECK(e.at({2, 4}) == 2);
  Tensor c = contiguous(t);
  CHECK(c.is_contiguous());
  CHECK(c.storage() != x.storage());
  CHECK(c.to_vector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  CHECK(contiguous(x).storage() == x.storage());  // no copy when already contiguous
  CHECK(unsqueeze(x, 1).sizes() == Shape{3, 1, 4});
  CHECK(squeeze(unsqueeze(x, 0), 0).sizes() == Shape{3, 4});
  CHECK(permute(reshape(arange(24), {2, 3, 4}), {2, 0, 1}).sizes() == Shape{4, 2, 3});
  CHECK(slice(arange(10), 0, 1, 8, 3).to_vector<float>() == std::vector<float>{1, 4, 7});
  CHECK(slice(arange(10), 0, -3, 100).to_vector<float>() == std::vector<float>{7, 8, 9});
  CHECK(select(x, 0, -1).to_vector<float>() == std::vector<float>{8, 9, 10, 11});
  CHECK(flatten(reshape(arange(24), {2, 3, 4}), 1).sizes() == Shape{2, 12});
  // Writing through a view is seen by the base.
  kernels::fill_(narrow(x, 0, 0, 1), -1);
  CHECK(x.at({0, 3}) == -1);
  CHECK(x.at({1, 0}) == 4);
}

TEST_CASE("view refuses incompatible strides, reshape copies", "[tensor][views][errors]") {
  Tensor t = transpose(reshape(arange(12), {3, 4}), 0, 1);  // (4, 3), strides (1, 4)
  REQUIRE_THROWS_WITH(view(t, {12}), Catch::Contains("[view]") && Catch::Contains("incompatible"));
  Tensor r = reshape(t, {12});
  CHECK(r.to_vector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  CHECK(view(t, {2, 2, 3}).sizes() == Shape{2, 2, 3});  // splitting the outer dim is expressible
  CHECK(view(reshape(arange(12), {3, 4}), {-1, 6}).sizes() == Shape{2, 6});
  REQUIRE_THROWS_WITH(view(arange(12), {5, -1}), Catch::Contains("invalid for"));
  REQUIRE_THROWS_WITH(view(arange(12), {-1, -1}), Catch::Contains("only one dim"));
  REQUIRE_THROWS_WITH(transpose(arange(3), 0, 2), Catch::Contains("[transpose] dim 2 out of range"));
  REQUIRE_THROWS_WITH(permute(zeros({2, 3}), {0, 0}), Catch::Contains("repeated"));
  REQUIRE_THROWS_WITH(narrow(zeros({4}), 0, 3, 2), Catch::Contains("[narrow]"));
  REQUIRE_THROWS_WITH(expand(zeros({2, 3}), {4, 3}), Catch::Contains("[expand] cannot expand [2,3] to [4,3]"));
  REQUIRE_THROWS_WITH(squeeze(zeros({2, 3}), 1), Catch::Contains("not 1"));
  REQUIRE_THROWS_WITH(select(zeros({2, 3}), 1, 3), Catch::Contains("out of range"));
}

TEST_CASE("casts, clone and to_vector", "[tensor]") {
  Tensor x = from({1.5f, -2.25f}, {2});
  Tensor d = to(x, DType::f64);
  CHECK(d.dtype() == DType::f64);
  CHECK(d.to_vector<double>() == std::vector<double>{1.5, -2.25});
  CHECK(to(x, DType::i64).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, -2});
  Tensor c = clone(x);
  kernels::fill_(c, 0);
  CHECK(x.at({0}) == 1.5);
  Tensor b = from_vector(std::vector<bool>{true, false}, {2});
  CHECK(b.dtype() == DType::b8);
  CHECK(to(b, DType::f32).to_vector<float>() == std::vector<float>{1, 0});
}

TEST_CASE("printing shows values, shape and dtype like torch's repr", "[tensor]") {
  std::ostringstream os;
  os << from({1, 2, 3, 4}, {2, 2});
  CHECK(os.str() == "tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]], shape=[2,2], dtype=float32)");
  std::ostringstream big;
  big << zeros({2000});
  CHECK(big.str().find("...") != std::string::npos);
  std::ostringstream ints;
  ints << arange(3, {DType::i64});
  CHECK(ints.str() == "tensor([0, 1, 2], shape=[3], dtype=int64)");
  std::ostringstream undefined;
  undefined << Tensor();
  CHECK(undefined.str() == "tensor(undefined)");
}

TEST_CASE("devices: CUDA tensors are refused cleanly without a GPU", "[tensor][errors]") {
  if (cuda::device_count() > 0) {
    SUCCEED("a GPU is present; covered by the CUDA suite");
    return;
  }
  REQUIRE_THROWS_AS(to(zeros({2}), Device::cuda(0)), Error);
  REQUIRE_THROWS_WITH(zeros({2}, {DType::f32, Device::cuda(0)}), Catch::Contains("cuda"));
}

TEST_CASE("dense_span finds the stretch that views fill exactly once, and nothing else", "[tensor][views]") {
  using kernels::dense_span;
  // q, k, v of a packed (B, T, 3 H D) projection, as (B, H, T, D) views: the whole buffer.
  const std::int64_t B = 2, T = 3, H = 2, D = 4, C = H * D;
  const Tensor qkv = zeros({1 + B * T * 3 * C});  // one element before them: the span starts at 1
  std::vector<Tensor> parts;
  for (std::int64_t i = 0; i < 3; ++i) parts.push_back(make_view(qkv, {B, H, T, D}, {T * 3 * C, D, 3 * C, 1}, 1 + i * C));
  const auto span = dense_span(parts);
  REQUIRE(span.has_value());
  CHECK(span->offset == 1);
  CHECK(span->numel == B * T * 3 * C);
  // Laid over another buffer, each part keeps its sizes, strides and place.
  const Tensor flat = arange(span->numel);
  const std::vector<Tensor> over = kernels::views_over(flat, parts, *span);
  CHECK(over[1].strides() == parts[1].strides());
  CHECK(over[2].at({1, 1, 2, 3}) == 2 * C + 1 * (T * 3 * C) + 1 * D + 2 * (3 * C) + 3);  // v's place, b h t d
  // A permuted dense tensor alone (the attention output's (B, H, T, D) view of (B, T, H, D)).
  const Tensor heads = make_view(zeros({B, T, H, D}), {B, H, T, D}, {T * H * D, D, H * D, 1}, 0);
  REQUIRE(dense_span({heads}).has_value());
  CHECK(dense_span({heads})->numel == B * T * H * D);
  // Two of the three leave a gap; reordered, overlapping or apart they are not one stretch.
  CHECK_FALSE(dense_span({parts[0], parts[2]}).has_value());
  CHECK_FALSE(dense_span({parts[1], parts[0], parts[2]}).has_value());
  CHECK_FALSE(dense_span({parts[0], parts[0], parts[1]}).has_value());
  CHECK_FALSE(dense_span({parts[0], parts[1], contiguous(parts[2])}).has_value());
  CHECK_FALSE(dense_span({make_view(qkv, {4, 2}, {3, 1}, 0)}).has_value());  // rows with a gap
  CHECK_FALSE(dense_span({make_view(qkv, {4, 2}, {1, 1}, 0)}).has_value());  // rows overlapping
  CHECK_FALSE(dense_span({Tensor()}).has_value());
  CHECK_FALSE(dense_span({zeros({0, 3})}).has_value());
}

TEST_CASE("cast_keeping_layout casts views of one stretch in their layout, and others alone", "[tensor][views][bf16]") {
  Generator gen(4);
  const Tensor x = randn({2, 3, 4}, {}, gen);
  const Tensor xt = permute(x, {2, 0, 1});  // dense, not contiguous
  const Tensor cast = kernels::cast_keeping_layout({xt}, DType::bf16)[0];
  CHECK(cast.dtype() == DType::bf16);
  CHECK(cast.strides() == xt.strides());
  CHECK(cast.to_vector<double>() == kernels::cast(xt, DType::bf16).to_vector<double>());
  const Tensor gappy = make_view(x, {2, 2}, {12, 1}, 1);  // no dense span: cast alone, contiguous
  const Tensor alone = kernels::cast_keeping_layout({gappy}, DType::bf16)[0];
  CHECK(alone.is_contiguous());
  CHECK(alone.to_vector<double>() == kernels::cast(gappy, DType::bf16).to_vector<double>());
}

// Data-parallel training (train/distributed/communicator.h, data_parallel.h, step.h,
// sharded_optimizer.h, fixed_split.h): the pieces in this process, then real runs under
// mpirun as child processes (tag [mpi]; each reports itself skipped, by name,
// where this build has no MPI or mpirun is not installed).
//
// What the runs check: N processes follow the one-process run step for step;
// a checkpoint moves between process counts; --fixed-split gives the same bits
// on every process count; kill -9 of one rank or Ctrl-C to
// mpirun never hangs and never damages the checkpoint; processes started with
// different flags are refused, naming the flag.
#include <dirent.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "child_process.h"
#include "helpers.h"
#include "mpi_runs.h"
#include "program_helpers.h"
#include "train/distributed/communicator.h"
#include "train/distributed/data_parallel.h"
#include "train/distributed/fixed_split.h"
#include "train/distributed/sharded_optimizer.h"
#include "train/output/checkpoint.h"

using namespace attograd;
using namespace attograd::test;

namespace {

// ---- in this process: the one-process communicator, buckets, shards ----------------------

nn::NamedParameter param(const std::string& name, const Shape& sizes, std::uint64_t seed) {
  Generator gen(seed);
  Tensor t = randn(sizes, {}, gen);
  t.set_requires_grad(true);
  return {name, t, true};
}

}  // namespace

TEST_CASE("gradient buckets: reverse order, sized by bytes, sums written back, missing gradients as zeros", "[mpi]") {
  auto comm = train::distributed::single_process_communicator();
  const std::vector<nn::NamedParameter> params = {param("a", {10, 10}, 1), param("b", {7}, 2), param("c", {5, 3}, 3),
                                                  param("d", {300}, 4)};
  // 400-byte buckets from the last parameter back: {d}, {c, b, a}... d alone fills one (1200 bytes).
  train::distributed::GradientReducer reducer(params, *comm, 400);
  CHECK(reducer.bucket_count() == 2);
  train::distributed::GradientReducer one_bucket(params, *comm, 1 << 20);
  CHECK(one_bucket.bucket_count() == 1);

  // a, c and d get gradients through backward (the hook sees each once), b gets none.
  int hooked = 0;
  const Tensor loss = sum(params[0].tensor * 2.0) + sum(params[2].tensor * params[2].tensor) + sum(params[3].tensor);
  auto hook = reducer.hook();
  backward(loss, {}, {.on_leaf_grad_ready = [&](const Tensor& leaf) {
                        ++hooked;
                        hook(leaf);
                      }});
  CHECK(hooked == 3);
  const Tensor want_c = clone(params[2].tensor.grad());
  reducer.finish();  // one process: the sum is the gradient itself
  CHECK(max_abs_diff(params[0].tensor.grad(), full({10, 10}, 2.0)) == 0);
  REQUIRE(params[1].tensor.grad().defined());
  CHECK(max_abs_diff(params[1].tensor.grad(), zeros({7})) == 0);
  CHECK(max_abs_diff(params[2].tensor.grad(), want_c) == 0);
  CHECK(max_abs_diff(params[3].tensor.grad(), ones({300})) == 0);

  // prepare(): every .grad a zeroed view of its bucket, and backward adds into it there.
  reducer.prepare();
  for (const auto& p : params) CHECK(max_abs_diff(p.tensor.grad(), zeros(p.tensor.sizes())) == 0);
  CHECK(params[0].tensor.grad().storage() == params[2].tensor.grad().storage());  // one bucket: c, b, a
  CHECK(params[0].tensor.grad().storage() != params[3].tensor.grad().storage());  // d has its own
  const std::shared_ptr<Storage> bucket = params[0].tensor.grad().storage();
  backward(sum(params[0].tensor * 3.0) + sum(params[3].tensor * 2.0), {}, {.on_leaf_grad_ready = reducer.hook()});
  reducer.finish();
  CHECK(params[0].tensor.grad().storage() == bucket);  // accumulated in place, not replaced
  CHECK(max_abs_diff(params[0].tensor.grad(), full({10, 10}, 3.0)) == 0);
  CHECK(max_abs_diff(params[1].tensor.grad(), zeros({7})) == 0);
  CHECK(max_abs_diff(params[2].tensor.grad(), zeros({5, 3})) == 0);  // last step's gradient is gone
  CHECK(max_abs_diff(params[3].tensor.grad(), full({300}, 2.0)) == 0);
}

namespace {

// One process that records the size of each sum as it starts: MPI pairs the
// processes' non-blocking collectives by that order.
class StartOrder final : public train::distributed::SingleProcessCommunicator {
 public:
  std::vector<std::size_t> started;
  std::unique_ptr<train::distributed::PendingReduce> start_sum(float* data, std::size_t n) override {
    started.push_back(n);
    return train::distributed::SingleProcessCommunicator::start_sum(data, n);
  }
};

}  // namespace

TEST_CASE("gradient buckets start in index order whatever order backward finishes them in", "[mpi]") {
  // 64-byte buckets from the last parameter back: {c} (16 floats), {b} (20), {a} (24).
  const std::vector<nn::NamedParameter> params = {param("a", {4, 6}, 1), param("b", {20}, 2), param("c", {16}, 3)};
  StartOrder comm;
  train::distributed::GradientReducer reducer(params, comm, 64);
  REQUIRE(reducer.bucket_count() == 3);
  const std::vector<std::size_t> sizes = {16, 20, 24};

  // Backward finishes a, then b, then c: the reverse of the buckets' order. A
  // process whose last micro-batch had no targets runs no hooked backward and
  // starts every bucket in finish(), so the others must start them in index order too.
  reducer.prepare();
  auto hook = reducer.hook();
  hook(params[0].tensor);  // bucket 2 is complete, but buckets 0 and 1 have not started
  CHECK(comm.started.empty());
  hook(params[1].tensor);
  CHECK(comm.started.empty());
  hook(params[2].tensor);  // bucket 0, and then the two waiting behind it
  CHECK(comm.started == sizes);
  reducer.finish();
  CHECK(comm.started == sizes);  // nothing started twice

  // The next step starts over at bucket 0; finish() starts what backward never reached, in order.
  comm.started.clear();
  reducer.prepare();
  hook(params[1].tensor);
  CHECK(comm.started.empty());
  reducer.finish();
  CHECK(comm.started == sizes);
}

// ---- GPU gradients: NCCL in device memory, or staged through the host ---------------------
// These run where a GPU is (tags [mpi][cuda]) and report themselves skipped, by name, elsewhere.

namespace {

bool gpu_or_nccl_missing(bool need_nccl) {
  if (cuda_missing()) return true;
  if (need_nccl && !train::distributed::built_with_nccl()) {
    WARN("skipped: this build has no NCCL (ATTOGRAD_NCCL, NCCL_ROOT)");
    return true;
  }
  return false;
}

}  // namespace

TEST_CASE("NCCL at world size 1: GPU buckets summed in device memory hold backward's gradients, bit for bit",
          "[mpi][cuda]") {
  if (gpu_or_nccl_missing(true)) return;
  auto comm = train::distributed::single_process_communicator();
  const ScopedEnv unset("ATTOGRAD_NCCL", nullptr);
  train::distributed::DeviceReduction nccl = train::distributed::choose_device_reduction(*comm, Device::cuda(0));
  REQUIRE(nccl.comm);
  CHECK_THAT(nccl.how, Catch::StartsWith("in device memory by NCCL 2."));

  std::vector<nn::NamedParameter> params = {param("a", {64, 33}, 1), param("b", {33}, 2), param("c", {33, 70}, 3),
                                            param("d", {5000}, 4)};
  std::vector<nn::NamedParameter> plain;
  for (auto& p : params) {
    p.tensor = to(p.tensor.detach(), Device::cuda(0));
    p.tensor.set_requires_grad(true);
    Tensor twin = clone(p.tensor.detach());
    twin.set_requires_grad(true);
    plain.push_back({p.name, twin, true});
  }
  // 8 KB buckets: d alone, then c and b, then a, each summed as backward finishes it.
  train::distributed::GradientReducer reducer(params, *comm, 8 << 10, nccl.comm.get());
  REQUIRE(reducer.bucket_count() == 3);
  const auto loss_of = [](const std::vector<nn::NamedParameter>& p, const Tensor& x) {
    const Tensor h = tanh(matmul(matmul(x, p[0].tensor) + p[1].tensor, p[2].tensor));
    return sum(h * h) + sum(p[3].tensor * p[3].tensor) * 0.5;
  };
  Generator gen(7);
  for (int step = 0; step < 3; ++step) {  // the buckets are reused, and zeroed by prepare(), every step
    INFO("step " << step);
    const Tensor x = to(randn({16, 64}, {}, gen), Device::cuda(0));
    for (auto& p : plain) p.tensor.set_grad(Tensor());
    backward(loss_of(plain, x));
    reducer.prepare();
    backward(loss_of(params, x), {}, {.on_leaf_grad_ready = reducer.hook()});
    reducer.finish();
    for (std::size_t i = 0; i < params.size(); ++i) {
      INFO(params[i].name);
      REQUIRE(params[i].tensor.grad().device() == Device::cuda(0));
      CHECK(max_abs_diff(params[i].tensor.grad(), plain[i].tensor.grad()) == 0);
    }
  }
  // ZeRO-1's gather as one NCCL group of broadcasts, queued after a write on the
  // device's stream: at world size 1 every parameter keeps its (just written) values.
  std::vector<Tensor> want;
  for (auto& p : params) {
    NoGradGuard no_grad;
    kernels::add_(p.tensor, full(p.tensor.sizes(), 0.5, p.tensor.options()), 1.0);
    want.push_back(clone(p.tensor.detach()));
  }
  train::distributed::gather_sharded_parameters(params, std::vector<int>(params.size(), 0), *comm, nccl.comm.get());
  for (std::size_t i = 0; i < params.size(); ++i) CHECK(max_abs_diff(params[i].tensor, want[i]) == 0);
}

TEST_CASE("the GPU's gradient path is chosen alike everywhere: NCCL, ATTOGRAD_NCCL=0, or a bad value named",
          "[mpi][cuda]") {
  if (gpu_or_nccl_missing(false)) return;
  auto comm = train::distributed::single_process_communicator();
  {
    const ScopedEnv off("ATTOGRAD_NCCL", "0");
    const train::distributed::DeviceReduction staged = train::distributed::choose_device_reduction(*comm, Device::cuda(0));
    CHECK_FALSE(staged.comm);
    CHECK_THAT(staged.how, Catch::StartsWith("staged through host memory ("));
    CHECK_THAT(staged.how, Catch::Contains(train::distributed::built_with_nccl() ? "ATTOGRAD_NCCL=0" : "this build has no NCCL"));
  }
  {
    const ScopedEnv bad("ATTOGRAD_NCCL", "yes");
    CHECK_THROWS_WITH(train::distributed::choose_device_reduction(*comm, Device::cuda(0)),
                      Catch::Contains("[ATTOGRAD_NCCL] must be 0 or 1 (or unset), but rank 0 has 'yes'"));
  }
  const train::distributed::DeviceReduction cpu = train::distributed::choose_device_reduction(*comm, Device::cpu());
  CHECK_FALSE(cpu.comm);
  CHECK(cpu.how == "in host memory");
}

TEST_CASE("optimizer shards: every parameter has one owner, and each process holds about 1/N", "[mpi]") {
  std::vector<nn::NamedParameter> params;
  for (int i = 0; i < 23; ++i) params.push_back(param("p" + std::to_string(i), {1 + (i * 37) % 101, 3}, i));
  std::int64_t total = 0, largest = 0;
  for (const auto& p : params) total += p.tensor.numel(), largest = std::max(largest, p.tensor.numel());
  for (int n : {1, 2, 3, 4, 7}) {
    INFO(n << " processes");
    const std::vector<int> owners = train::distributed::shard_owners(params, n);
    REQUIRE(owners.size() == params.size());
    std::vector<std::int64_t> held(static_cast<std::size_t>(n), 0);
    for (std::size_t i = 0; i < params.size(); ++i) {
      REQUIRE(owners[i] >= 0);
      REQUIRE(owners[i] < n);
      held[static_cast<std::size_t>(owners[i])] += params[i].tensor.numel();
    }
    // Largest first onto the least loaded: no process exceeds the mean by more than one parameter.
    for (std::int64_t h : held) CHECK(h <= total / n + largest);
  }
}

TEST_CASE("data-parallel flags checked on one process: --grad-accum, --shard-optimizer, --batch", "[mpi]") {
  TempDir tmp;
  const std::vector<std::string> base = {"train", "--task-size", "3", "--layers", "1", "--width", "8", "--heads", "2",
                                         "--steps", "2", "--heldout", "10", "--threads", "1", "--quiet"};
  const auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return cli(args);
  };
  CliResult r = run({"--out", tmp / "a", "--batch", "8", "--grad-accum", "0"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("[--grad-accum] must be in [1, --batch 8], got 0"));
  r = run({"--out", tmp / "b", "--batch", "8", "--grad-accum", "3"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("[--batch] 8 sequences do not split evenly into 1 processes x --grad-accum 3"));
  r = run({"--out", tmp / "c", "--shard-optimizer"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("[--shard-optimizer] needs several processes"));
  r = run({"--out", tmp / "d", "--batch", "8", "--fixed-split", "3"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("[--fixed-split] must be a power of two in [1, 1024] (0: off), got 3"));
  r = run({"--out", tmp / "e", "--batch", "6", "--fixed-split", "4"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("[--fixed-split] 4 pieces do not divide --batch 6"));
  r = run({"--out", tmp / "f", "--batch", "8", "--fixed-split", "4", "--grad-accum", "2"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("[--grad-accum] 2 cannot go with --fixed-split"));
  for (const char* dir : {"a", "c", "d", "e", "f"}) CHECK_FALSE(fs::exists(tmp / dir));

  // One process in micro-batches follows the plain run (float rounding apart).
  r = run({"--out", tmp / "plain", "--batch", "8"});
  REQUIRE(r.code == 0);
  r = run({"--out", tmp / "accum", "--batch", "8", "--grad-accum", "4"});
  REQUIRE(r.code == 0);
  const train::output::LoadedCheckpoint plain = train::output::load_checkpoint(tmp / "plain/ckpt.safetensors");
  const train::output::LoadedCheckpoint accum = train::output::load_checkpoint(tmp / "accum/ckpt.safetensors");
  const auto a = plain.model->state_dict(), b = accum.model->state_dict();
  for (const auto& [name, t] : a) CHECK(max_abs_diff(t, b.at(name)) < 1e-5);
}

// 2^24 + 1 is not a float: it rounds to 2^24. So the order of additions shows in
// the bits: the tree's (2^24 + 1) + (1 - 2^24) is 1, left to right gives 0.
TEST_CASE("a fixed split (--fixed-split) sums its pieces in a perfect binary tree", "[mpi]") {
  const float big = 16777216.0f;  // 2^24
  const std::vector<float> pieces = {big, 1.0f, 1.0f, -big};
  float left_to_right = 0;
  for (float x : pieces) left_to_right += x;
  REQUIRE(left_to_right == 0.0f);  // the order matters for these values

  train::distributed::PairwiseSum tree;
  for (float x : pieces) tree.add({x, 2 * x});
  CHECK(tree.take() == std::vector<float>{1.0f, 2.0f});
  // Eight: ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) = 1 + 1. Left to right
  // gives 0, and adding the pairs' sums left to right 1.
  for (float x : {big, 1.0f, 1.0f, -big, 1.0f, big, 1.0f, -big}) tree.add({x});
  CHECK(tree.take() == std::vector<float>{2.0f});
  // The tree is reused from empty after take(), and refuses a count that is not a power of two.
  for (int i = 0; i < 3; ++i) tree.add({1.0f});
  CHECK_THROWS_WITH(tree.take(), Catch::Contains("3 pieces are not a power of two"));
  tree.add({1.0f});  // the fourth
  CHECK(tree.take() == std::vector<float>{4.0f});
  tree.add({1.0f});
  CHECK_THROWS_WITH(tree.add({1.0f, 2.0f}), Catch::Contains("pieces of 1 and 2 values"));

  // One process is the whole tree: the levels above it add nothing.
  train::distributed::SingleProcessCommunicator one;
  std::vector<float> values = {3.0f, -0.5f};
  train::distributed::sum_over_processes_in_tree(values, one);
  CHECK(values == std::vector<float>{3.0f, -0.5f});
}

// ---- real runs under mpirun (tests/mpi_runs.h) --------------------------------------------

// The two cases that compare losses across process counts assert a numerical
// property of the optimised build (check_follows). The asan-ubsan preset (clang
// -O1) rounds differently again and leaves them out (CMakePresets.json); the
// exact cases below run everywhere.
TEST_CASE("mpirun -np 2 and -np 4 follow the one-process run step for step, sharded optimizer too",
          "[mpi][numerics]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  run_ok(1, default_run(tmp / "one"), tmp);
  const Metrics one = read_metrics(tmp / "one/metrics.jsonl");
  REQUIRE(one.losses.size() == kRunSteps);
  REQUIRE(one.accuracy > 0);
  for (const auto& [n, extra] : std::vector<std::pair<int, std::vector<std::string>>>{
           {2, {}}, {4, {}}, {2, {"--shard-optimizer"}}, {4, {"--shard-optimizer", "--grad-accum", "2"}}}) {
    const std::string name = fmt::format("np{}{}", n, fmt::join(extra, ""));
    INFO(name);
    run_ok(n, default_run(tmp / name, extra), tmp);
    check_follows(one, read_metrics(tmp / (name + "/metrics.jsonl")));
  }
}

// Two processes on the GPU(s) at hand: each takes GPU local_rank % count. With
// one GPU both share it and the gradients are staged through host memory (NCCL
// needs a GPU per process); with two or more NCCL sums them in device memory.
// Either way the run follows the one-process GPU run.
TEST_CASE("mpirun -np 2 --device cuda follows the one-process GPU run, naming how gradients travel",
          "[mpi][cuda][numerics]") {
  SKIP_WITHOUT_MPI();
  if (gpu_or_nccl_missing(false)) return;
  TempDir tmp;
  run_ok(1, default_run(tmp / "one", {"--device", "cuda"}), tmp);
  const Metrics one = read_metrics(tmp / "one/metrics.jsonl");
  REQUIRE(one.losses.size() == kRunSteps);
  const auto two = start(2, default_run(tmp / "two", {"--device", "cuda"}), tmp);
  INFO("stdout: " << two->out() << "\nstderr: " << two->err());
  REQUIRE(two->exit_code(300s) == 0);
  check_follows(one, read_metrics(tmp / "two/metrics.jsonl"));
  // ZeRO-1 on GPUs: parameters gathered through NCCL (two GPUs) or the host (one).
  run_ok(2, default_run(tmp / "two_sharded", {"--device", "cuda", "--shard-optimizer"}), tmp);
  check_follows(one, read_metrics(tmp / "two_sharded/metrics.jsonl"));
  const std::string path = !train::distributed::built_with_nccl()     ? "buckets staged through host memory (this build has no NCCL)"
                           : cuda::device_count() < 2 ? "buckets staged through host memory (ranks 0 and 1 share the GPU at "
                                                      : "buckets in device memory by NCCL 2.";
  CHECK_THAT(two->out(), Catch::Contains(path));
}

TEST_CASE("a checkpoint moves between process counts: 2 -> 1 and 1 -> 4 continue the run", "[mpi][numerics]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  run_ok(1, default_run(tmp / "straight"), tmp);
  const Metrics straight = read_metrics(tmp / "straight/metrics.jsonl");
  for (const auto& [before, after] : std::vector<std::pair<int, int>>{{2, 1}, {1, 4}}) {
    const std::string dir = tmp / fmt::format("from{}to{}", before, after);
    INFO(dir);
    run_ok(before, default_run(dir, {"--stop-at", kHalfway}), tmp);
    REQUIRE(train::output::load_checkpoint(dir + "/ckpt.safetensors").info.step == kRunSteps / 2);
    run_ok(after, {"train", "--resume", dir + "/ckpt.safetensors", "--threads", "1", "--quiet"}, tmp);
    check_follows(straight, read_metrics(dir + "/metrics.jsonl"));
  }
}

TEST_CASE("exactly: a sharded optimizer gives the unsharded run's bits, and 2 -> 2 resumes bit for bit", "[mpi]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::vector<std::string> short_run = {"--steps", "20", "--eval-interval", "10"};
  const auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), short_run.begin(), short_run.end());
    return extra;
  };
  // ZeRO-1 changes where the optimizer state lives, not one bit of the result.
  run_ok(2, default_run(tmp / "whole", with({})), tmp);
  run_ok(2, default_run(tmp / "sharded", with({"--shard-optimizer"})), tmp);
  require_same_checkpoint(tmp / "whole/ckpt.safetensors", tmp / "sharded/ckpt.safetensors");
  // Stopped halfway and resumed at the same count (the sharded state gathered and re-split).
  run_ok(2, default_run(tmp / "halves", with({"--shard-optimizer", "--stop-at", "10"})), tmp);
  REQUIRE(train::output::load_checkpoint(tmp / "halves/ckpt.safetensors").info.step == 10);
  run_ok(2, {"train", "--resume", tmp / "halves/ckpt.safetensors", "--threads", "1", "--quiet", "--shard-optimizer"},
         tmp);
  require_same_checkpoint(tmp / "sharded/ckpt.safetensors", tmp / "halves/ckpt.safetensors");
}

// --fixed-split 4 (train/distributed/fixed_split.h), the default run (kRunSteps): 1, 2 and
// 4 processes make the same run, every loss, the exact match and every bit of
// the checkpoint (weights, optimizer state, dropout stream), with dropout on and
// with ZeRO-1; a checkpoint written at one count continues at another bit for
// bit. Exact, so it holds in every build.
TEST_CASE("a fixed split: 1, 2 and 4 processes give the same bits, dropout and ZeRO-1 too, resumed across counts",
          "[mpi]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const auto fixed = [&](const std::string& name, std::vector<std::string> extra = {}) {
    const std::vector<std::string> common = {"--fixed-split", "4", "--dropout", "0.1"};
    extra.insert(extra.begin(), common.begin(), common.end());
    return default_run(tmp / name, extra);
  };
  const auto two = start(2, fixed("two"), tmp);
  INFO("stdout: " << two->out() << "\nstderr: " << two->err());
  REQUIRE(two->exit_code(300s) == 0);
  CHECK_THAT(two->out(), Catch::Contains("2 of 4 pieces each per step, summed in one fixed order"));
  run_ok(1, fixed("one"), tmp);
  run_ok(4, fixed("four_sharded", {"--shard-optimizer"}), tmp);
  const Metrics one = read_metrics(tmp / "one/metrics.jsonl");
  REQUIRE(one.losses.size() == kRunSteps);
  REQUIRE(one.accuracy > 0);
  for (const std::string run : {"two", "four_sharded"}) {
    INFO(run);
    require_same_run(tmp / "one", tmp / run);
  }
  for (const auto& [before, after] : std::vector<std::pair<int, int>>{{2, 1}, {1, 4}}) {
    const std::string name = fmt::format("from{}to{}", before, after);
    INFO(name);
    run_ok(before, fixed(name, {"--stop-at", kHalfway}), tmp);
    run_ok(after,
           {"train", "--resume", tmp / (name + "/ckpt.safetensors"), "--threads", "1", "--quiet", "--fixed-split", "4"},
           tmp);
    require_same_checkpoint(tmp / "one/ckpt.safetensors", tmp / (name + "/ckpt.safetensors"));
  }
}

// bfloat16 (--dtype bfloat16: the forward under autocast, float32 gradients
// and master weights) under mpirun: a fixed split is exact there too, and the
// bucketed all-reduce with ZeRO-1 and --grad-accum trains as well.
TEST_CASE("bfloat16 under mpirun: a fixed split gives the one-process run's bits, and ZeRO-1 with --grad-accum trains",
          "[mpi][bf16]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::vector<std::string> bf16_split = {"--dtype", "bfloat16", "--fixed-split", "2"};
  run_ok(1, default_run(tmp / "one", bf16_split), tmp);
  run_ok(2, default_run(tmp / "two", bf16_split), tmp);
  require_same_run(tmp / "one", tmp / "two");
  const auto sharded = start(2, default_run(tmp / "sharded", {"--dtype", "bfloat16", "--shard-optimizer", "--grad-accum", "2"}), tmp);
  INFO("stdout: " << sharded->out() << "\nstderr: " << sharded->err());
  REQUIRE(sharded->exit_code(300s) == 0);
  CHECK_THAT(sharded->out(), Catch::Contains("bfloat16 (") && Catch::Contains("(sharded, ZeRO-1)"));
  const Metrics m = read_metrics(tmp / "sharded/metrics.jsonl");
  REQUIRE(m.losses.size() == kRunSteps);
  CHECK(m.losses.back() < 0.5 * m.losses.front());
}

// The same on the GPU: pieces' gradients go through host memory to be summed
// there, so two ranks sharing one GPU, or on two, make the one-process GPU run.
TEST_CASE("a fixed split on the GPU: -np 2 gives the one-process GPU run's bits, dropout on", "[mpi][cuda]") {
  SKIP_WITHOUT_MPI();
  if (gpu_or_nccl_missing(false)) return;
  TempDir tmp;
  // Small, for the emulator under the sanitizers: 3 steps of 16 sequences, 20 held-out problems.
  const std::vector<std::string> extra = {"--device",  "cuda", "--fixed-split", "2",  "--dropout",       "0.1",
                                          "--steps",   "3",    "--batch",       "16", "--eval-interval", "3",
                                          "--heldout", "20"};
  run_ok(1, default_run(tmp / "one", extra), tmp);
  run_ok(2, default_run(tmp / "two", extra), tmp);
  require_same_run(tmp / "one", tmp / "two");
}

// Several machines, stood in for by this one: a hostfile of two node names that
// are not this machine, and an "ssh" that runs the command here. Open MPI then
// treats the ranks as on two machines: one daemon per node, TCP between them
// (no shared memory), and each process alone on its node (local rank 0 of 1).
// What this cannot show: real network latency and bandwidth, and a data file
// or binary missing on a remote machine.
TEST_CASE("two machines stood in for by one (a hostfile, ssh replaced): the run is the one-node run, bit for bit",
          "[mpi]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  write_text(tmp / "hosts", "nodea slots=1\nnodeb slots=1\n");
  // Drops ssh's options and runs the remote command here, with a TMPDIR of the
  // node's own: two daemons sharing one Open MPI session directory (and its hwloc
  // topology file) crashed one of them in 4-8% of launches; 0 of 80 with this.
  write_text(tmp / "ssh", "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in -*) shift;; *) break;; esac; done\n"
                          "export TMPDIR=\"" + (tmp / "nodes") + "/$1\"; shift; mkdir -p \"$TMPDIR\"\n"
                          "exec sh -c \"$*\"\n");
  fs::permissions(tmp / "ssh", fs::perms::owner_all);
  const std::vector<std::string> nodes_env = {"OMPI_MCA_plm_rsh_agent=" + (tmp / "ssh"),
                                              "OMPI_MCA_routed=direct",  // each daemon talks to mpirun itself
                                              "OMPI_MCA_btl=self,tcp"};
  const auto on_nodes = [&](const std::vector<std::string>& args) {
    return start(2, args, tmp, nodes_env, {"--hostfile", tmp / "hosts"});
  };
  const std::vector<std::string> short_run = {"--steps", "20", "--eval-interval", "10"};
  run_ok(2, default_run(tmp / "one_node", short_run), tmp);
  const auto two = on_nodes(default_run(tmp / "two_nodes", short_run));
  INFO("stdout: " << two->out() << "\nstderr: " << two->err());
  REQUIRE(two->exit_code(300s) == 0);
  require_same_checkpoint(tmp / "one_node/ckpt.safetensors", tmp / "two_nodes/ckpt.safetensors");

  // Without --threads, each process takes all of its machine's cores: it is alone there.
  const auto alone = on_nodes({"train", "--steps", "1", "--out", tmp / "alone", "--quiet"});
  INFO("stdout: " << alone->out() << "\nstderr: " << alone->err());
  REQUIRE(alone->exit_code(300s) == 0);
  CHECK_THAT(alone->out(), Catch::Contains(fmt::format("; {} threads, cpu, float32 (", std::thread::hardware_concurrency())));
}

namespace {

void check_kill_stops_the_others(const std::vector<std::string>& extra) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  std::vector<std::string> flags = {"--steps", "1000000", "--eval-interval", "20"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  const auto run = start(2, default_run(dir, flags), tmp);
  REQUIRE(wait_until([&] { return read_metrics(dir + "/metrics.jsonl").accuracy >= 0; }));  // a checkpoint exists
  std::map<int, pid_t> ranks;
  REQUIRE(wait_until([&] { return (ranks = ranks_running(dir)).size() == 2; }));
  REQUIRE(::kill(ranks.at(1), SIGKILL) == 0);
  const auto killed = std::chrono::steady_clock::now();
  const int status = run->wait(60s);
  CHECK(std::chrono::steady_clock::now() - killed < 30s);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) != 0);
  const std::string err = run->err();
  INFO("stderr: " << err);
  CHECK(std::regex_search(err, std::regex("process rank 1 .*exited on signal 9")));
  // Rank 0 leaves a helper behind (stop_run_after_signal, a fork: the same command
  // line and environment, so it reads as rank 0 here) that stops mpirun if it is
  // still there 3 s later; it ends once it sees mpirun gone, which on a loaded host
  // can come a moment after mpirun's own end. A survivor would still be there.
  std::map<int, pid_t> left;
  const bool all_ended = wait_until([&] { return (left = ranks_running(dir)).empty(); }, 10s);
  for (const auto& [rank, pid] : left) UNSCOPED_INFO("rank " << rank << " is still running as pid " << pid);
  CHECK(all_ended);
  const train::output::LoadedCheckpoint last = train::output::load_checkpoint(dir + "/ckpt.safetensors");
  CHECK(last.info.step % 20 == 0);
  CHECK(last.info.step >= 20);
}

}  // namespace

TEST_CASE("kill -9 of one rank stops the others within 30 s, naming the rank, and the last checkpoint is whole",
          "[mpi]") {
  SKIP_WITHOUT_MPI();
  check_kill_stops_the_others({});
}

// On GPUs the survivor may be waiting inside NCCL's kernels (two GPUs or more)
// or in MPI over host memory (one GPU, shared).
TEST_CASE("kill -9 of one rank of a GPU run stops the others within 30 s", "[mpi][cuda]") {
  SKIP_WITHOUT_MPI();
  if (gpu_or_nccl_missing(false)) return;
  check_kill_stops_the_others({"--device", "cuda"});
}

TEST_CASE("Ctrl-C to mpirun: every rank finishes its step, one checkpoint is saved, and it resumes", "[mpi]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string dir = tmp / "run";
  const auto run = start(2, default_run(dir, {"--steps", "1000000", "--eval-interval", "1000000"}), tmp);
  REQUIRE(wait_until([&] { return count_lines(file_text(dir + "/metrics.jsonl")) >= 5; }));
  run->signal(SIGINT);
  const int status = run->wait(60s);
  // Open MPI's mpirun passes SIGTERM to every rank a second after its SIGINT, and
  // exits non-zero itself (1) however the ranks end.
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) != 0);
  const std::string out = run->out();
  INFO("stdout: " << out << "\nstderr: " << run->err());
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("SIGTERM: saving step ([0-9]+)")));
  const std::int64_t stopped = std::stoll(m[1]);
  CHECK(train::output::load_checkpoint(dir + "/ckpt.safetensors").info.step == stopped);
  run_ok(2, {"train", "--resume", dir + "/ckpt.safetensors", "--stop-at", std::to_string(stopped + 2), "--threads",
             "1", "--quiet"},
         tmp);
  CHECK(train::output::load_checkpoint(dir + "/ckpt.safetensors").info.step == stopped + 2);
}

TEST_CASE("under mpirun with its output read (not a terminal), progress is plain lines", "[mpi]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  // Rank 0 writes to the pseudo-terminal mpirun gives it whatever mpirun's own
  // output is; a log must still get lines, not carriage returns and ESC[K redraws.
  std::vector<std::string> args = {"train",     "--steps", "40", "--eval-interval", "20",
                                   "--threads", "1",       "--out", tmp / "run"};
  if (kSanitized)
    for (const auto& [flag, value] : kSanitizedRunFlags) args.insert(args.end(), {flag, value});
  const auto child = start(2, args, tmp);
  INFO("stdout: " << child->out());
  REQUIRE(child->exit_code(300s) == 0);
  CHECK(child->out().find("step 40/40") != std::string::npos);
  CHECK(child->out().find('\r') == std::string::npos);
  CHECK(child->out().find("\033[K") == std::string::npos);
}

TEST_CASE("under mpirun: differing flags and a batch that does not split are refused once, naming the flag",
          "[mpi]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  // MPMD: rank 0 and rank 1 started with different learning rates.
  const std::vector<std::string> a = default_run(tmp / "lr", {"--lr", "0.005"});
  std::vector<std::string> mpmd = {"-np", "1", kAttogradBinary};
  mpmd.insert(mpmd.end(), a.begin(), a.end());
  mpmd.insert(mpmd.end(), {":", "-np", "1", kAttogradBinary});
  const std::vector<std::string> b = default_run(tmp / "lr", {"--lr", "0.01"});
  mpmd.insert(mpmd.end(), b.begin(), b.end());
  Child lr(mpmd, tmp.path, mpi_env(), "mpirun");
  CHECK(lr.exit_code() != 0);
  const std::string err = lr.err();
  INFO("stderr: " << err);
  const std::string want = "attograd: error: [--lr] differs between the processes of this run: rank 1 has '0.01', "
                           "rank 0 '0.005'";
  CHECK_THAT(err, Catch::Contains(want));
  CHECK(err.find(want) == err.rfind(want));  // once, not once per rank
  CHECK_FALSE(fs::exists(tmp / "lr"));

  const auto odd = start(3, default_run(tmp / "odd", {"--batch", "8"}), tmp);
  CHECK(odd->exit_code() != 0);
  const std::string odd_err = odd->err();
  INFO("stderr: " << odd_err);
  const std::string odd_want = "[--batch] 8 sequences do not split evenly into 3 processes x --grad-accum 1";
  CHECK_THAT(odd_err, Catch::Contains(odd_want));
  CHECK(odd_err.find(odd_want) == odd_err.rfind(odd_want));
  CHECK_FALSE(fs::exists(tmp / "odd"));

  const auto three = start(3, default_run(tmp / "three", {"--batch", "12", "--fixed-split", "4"}), tmp);
  CHECK(three->exit_code() != 0);
  const std::string three_err = three->err();
  INFO("stderr: " << three_err);
  CHECK_THAT(three_err, Catch::Contains("[--fixed-split] 4 pieces do not split evenly over 3 processes"));
  CHECK_FALSE(fs::exists(tmp / "three"));
}

TEST_CASE("processes whose parameters drift apart are stopped at the next evaluation, naming the step", "[mpi]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  // A test hook: rank 1 nudges one weight after step 3, as a bit flip in one process would.
  const auto run = start(2, default_run(tmp / "drift", {"--eval-interval", "10"}), tmp, {"ATTOGRAD_TEST_DRIFT_RANK=1"});
  CHECK(run->exit_code() != 0);
  const std::string err = run->err();
  INFO("stderr: " << err);
  CHECK_THAT(err, Catch::Contains("[train] the processes' parameters differ at step 10: rank 1 has checksum"));
  CHECK_FALSE(fs::exists(tmp / "drift/ckpt.safetensors"));  // no checkpoint of nobody's model
}

TEST_CASE("a failure on one rank between set-up and the first step stops every process", "[mpi]") {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  // A test hook: rank 1 fails where a GPU out of memory for its gradient buckets would.
  // Rank 0 waits in the parameters' broadcast meanwhile; it must not wait for ever.
  const auto run = start(2, default_run(tmp / "fail"), tmp, {"ATTOGRAD_TEST_FAIL_RANK=1"});
  CHECK(run->exit_code(60s) != 0);
  const std::string err = run->err();
  INFO("stderr: " << err);
  CHECK_THAT(err, Catch::Contains("[train] test failure on rank 1 (rank 1 of 2; stopping every process)"));
}

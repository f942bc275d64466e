// The gradient all-reduce of data-parallel training, measured: attograd's
// bucketed path (train::distributed::GradientReducer: gradients live in 4 MB buckets, each
// zeroed before backward and summed by a non-blocking MPI_Iallreduce once its
// gradients are done) against one plain MPI_Allreduce of the same bytes in
// place, and one MPI_Iallreduce waited for at once, over message sizes.
//
//   mpirun -np 2 build/bench/attograd_allreduce_bench [--max-mb 64]
//
// Bandwidths as NCCL's tests define them: algorithm bandwidth = bytes / time,
// bus bandwidth = algbw x 2 (N - 1) / N (what each link carries in a ring
// all-reduce, comparable across process counts). Each figure is the median of
// five timings, each a fixed number of reductions (the same on every process:
// a collective's count must agree everywhere).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "tensor/tensor.h"
#include "train/distributed/communicator.h"
#include "train/distributed/data_parallel.h"

using namespace attograd;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per reduction of `run`, the median over five timings of `iterations` each.
template <typename F>
double time_per_call(F run, int iterations) {
  run();  // warm-up: buffers touched, connections made
  std::vector<double> timings;
  for (int rep = 0; rep < 5; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) run();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest process's
    timings.push_back(seconds);
  }
  return median(timings);
}

}  // namespace

int main(int argc, char** argv) {
  double max_mb = 64;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--max-mb") max_mb = std::stod(argv[i + 1]);

  train::distributed::Communicator& comm = train::distributed::world();
  const int n = comm.size();
  const bool report = comm.rank() == 0;
  if (report) {
    std::printf("# gradient all-reduce: %d processes (%s); bus bandwidth = bytes/time x 2(N-1)/N\n", n,
                comm.engine().c_str());
    std::printf("| bytes | plain MPI_Allreduce us | busbw GB/s | MPI_Iallreduce + wait us | busbw GB/s | "
                "bucketed (attograd) us | busbw GB/s | buckets | bucketed / plain |\n"
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  NoGradGuard no_grad;
  for (std::size_t bytes = 4096; bytes <= static_cast<std::size_t>(max_mb * (1 << 20)); bytes *= 4) {
    const std::size_t floats = bytes / sizeof(float);
    const int iterations = static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / bytes, 3, 2000));

    std::vector<float> plain(floats, 1.0f);
    const double plain_s = time_per_call(
        [&] { MPI_Allreduce(MPI_IN_PLACE, plain.data(), static_cast<int>(floats), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        iterations);

    // The same call, non-blocking, waited for at once: what a bucket costs without the copies.
    const double nonblocking_s = time_per_call(
        [&] {
          MPI_Request request;
          MPI_Iallreduce(MPI_IN_PLACE, plain.data(), static_cast<int>(floats), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                         &request);
          MPI_Wait(&request, MPI_STATUS_IGNORE);
        },
        iterations);

    // The same bytes as a model's gradients: 16 tensors (or fewer, of 1024 floats at least).
    const std::size_t pieces = std::clamp<std::size_t>(floats / 1024, 1, 16);
    std::vector<nn::NamedParameter> params;
    for (std::size_t p = 0; p < pieces; ++p) {
      const std::int64_t size = static_cast<std::int64_t>(floats / pieces + (p < floats % pieces ? 1 : 0));
      Tensor t = zeros({size});
      t.set_requires_grad(true);
      params.push_back({"p" + std::to_string(p), t, false});
    }
    train::distributed::GradientReducer reducer(params, comm);
    auto hook = reducer.hook();
    // A step's whole cost: zeroing the buckets (backward then adds into them), starting
    // each bucket as backward finishes its gradients, and waiting for them all.
    const double bucketed_s = time_per_call(
        [&] {
          reducer.prepare();
          for (std::size_t p = pieces; p-- > 0;) hook(params[p].tensor);  // as backward finishes them
          reducer.finish();
        },
        iterations);

    const double ring = 2.0 * (n - 1) / n;
    if (report)
      std::printf("| %zu | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f | %zu | %.2f |\n", bytes, plain_s * 1e6,
                  ring * bytes / plain_s / 1e9, nonblocking_s * 1e6, ring * bytes / nonblocking_s / 1e9,
                  bucketed_s * 1e6, ring * bytes / bucketed_s / 1e9, reducer.bucket_count(), bucketed_s / plain_s);
  }
  return 0;
}

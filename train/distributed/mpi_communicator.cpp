// The communicator on Open MPI (any MPI-3 library works): MPI_COMM_WORLD, with
// non-blocking all-reduces for gradient buckets. Built when CMake finds MPI.
//
// MPI is initialised only when a launcher started this process: a plain
// `attograd train` stays a one-process run with no MPI start-up at all.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "train/distributed/communicator.h"
#include "train/distributed/launcher.h"

namespace attograd::train::distributed {
namespace {

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail("mpi", "{} failed: {}", call, std::string(text, static_cast<std::size_t>(length)));
}

int checked_count(std::size_t n, const char* call) {
  AG_CHECK(n <= static_cast<std::size_t>(INT_MAX), "mpi", "{} of {} elements exceeds MPI's int count", call, n);
  return static_cast<int>(n);
}

class MpiReduce final : public PendingReduce {
 public:
  explicit MpiReduce(MPI_Request request) : request_(request) {}
  ~MpiReduce() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);  // never free a buffer MPI still uses
  }
  bool test() override {
    int done = 0;
    check(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }
  void wait() override { check(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait"); }

 private:
  MPI_Request request_;
};

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    // Open MPI's default schedule for a non-blocking all-reduce ran 2-3x slower than
    // its blocking one on 1-16 MB (bench/mpi_allreduce.cpp); the ring schedule matches
    // it. A value the user set in the environment wins.
    ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "ring", 0);
    int provided = 0;
    // Only the main thread calls MPI; the thread pool's workers never do.
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm local;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
          "MPI_Comm_split_type");
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    engine_ = std::string(version, static_cast<std::size_t>(length));
    engine_ = engine_.substr(0, engine_.find_first_of(",\n"));  // "Open MPI v4.1.4"
  }
  ~MpiWorld() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string engine() const override { return engine_; }

  std::unique_ptr<PendingReduce> start_sum(float* data, std::size_t n) override {
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(n, "MPI_Iallreduce"), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                         &request),
          "MPI_Iallreduce");
    return std::make_unique<MpiReduce>(request);
  }
  void sum(double* data, std::size_t n) override { reduce(data, n, MPI_SUM); }
  void max(double* data, std::size_t n) override { reduce(data, n, MPI_MAX); }
  void broadcast(void* data, std::size_t bytes, int root) override {
    check(MPI_Bcast(data, checked_count(bytes, "MPI_Bcast"), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  std::vector<std::string> all_gather(const std::string& value) override {
    int length = checked_count(value.size(), "MPI_Allgather");
    std::vector<int> lengths(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
    std::size_t total = 0;
    for (std::size_t r = 0; r < lengths.size(); ++r) {
      offsets[r] = static_cast<int>(total);
      total += static_cast<std::size_t>(lengths[r]);
    }
    std::string all(total, '\0');
    check(MPI_Allgatherv(value.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
    std::vector<std::string> values;
    for (std::size_t r = 0; r < lengths.size(); ++r)
      values.push_back(all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r])));
    return values;
  }
  void transfer(void* data, std::size_t bytes, int from, int to) override {
    if (from == to) return;
    const int count = checked_count(bytes, "MPI_Send");
    if (rank_ == from) check(MPI_Send(data, count, MPI_BYTE, to, 0, MPI_COMM_WORLD), "MPI_Send");
    if (rank_ == to) check(MPI_Recv(data, count, MPI_BYTE, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  void exchange(const float* data, float* received, std::size_t n, int partner) override {
    const int count = checked_count(n, "MPI_Sendrecv");
    check(MPI_Sendrecv(data, count, MPI_FLOAT, partner, 1, received, count, MPI_FLOAT, partner, 1, MPI_COMM_WORLD,
                       MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
  }
  [[noreturn]] void abort_all(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);  // MPI_Abort does not return; this keeps the [[noreturn]] promise regardless
  }

 private:
  void reduce(double* data, std::size_t n, MPI_Op op) {
    check(MPI_Allreduce(MPI_IN_PLACE, data, checked_count(n, "MPI_Allreduce"), MPI_DOUBLE, op, MPI_COMM_WORLD),
          "MPI_Allreduce");
  }
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string engine_;
};

}  // namespace

bool built_with_mpi() { return true; }

std::unique_ptr<Communicator> make_communicator() {
  if (launcher_world_size() == 0) return single_process_communicator();
  return std::make_unique<MpiWorld>();
}

}  // namespace attograd::train::distributed

// The communicator on Open MPI (any MPI-3 library works): MPI_COMM_WORLD, with
// non-blocking all-reduces for gradient buckets. Built when CMake finds MPI.
//
// Every operation is started non-blocking and waited for by MpiWorld::wait,
// which polls (as MPI_Wait itself does) against the --comm-timeout deadline and,
// in waits past kQuietSeconds, exchanges liveness messages (watchdog.h).
//
// MPI is initialised only when a launcher started this process: a plain
// `attograd train` stays a one-process run with no MPI start-up at all.
#include <fmt/format.h>
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "train/distributed/communicator.h"
#include "train/distributed/launcher.h"
#include "train/distributed/watchdog.h"

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

using Clock = std::chrono::steady_clock;

// Who is still there, in a long wait: every waiting process sends each other
// one a message a second on a communicator of their own (so no message of the
// run's can match one), carrying the number of collectives it has started.
// Every process starts the same collectives in the same order, so a message
// counts as a sign of life in this wait only if its sender has reached this
// collective: one sent in an earlier wait, read late, does not. When each was
// heard, and who fell silent, is SignsOfLife's (watchdog.h). A process that
// stops the run says so first (another tag), so that a process whose deadline
// comes later does not take its silence for a cut link.
class Liveness {
 public:
  Liveness(int size, int rank) : rank_(rank), size_(size), signs_(size, rank) {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");  // a duplicate: the same ranks
    post_receive();
  }
  ~Liveness() {
    MPI_Cancel(&incoming_);
    MPI_Wait(&incoming_, MPI_STATUS_IGNORE);
    MPI_Comm_free(&comm_);
  }

  // A wait in collective number `collective` has lasted kQuietSeconds: from now on, listen.
  void begin(std::int64_t collective, Clock::time_point now) {
    collective_ = collective;
    signs_.begin(now);
    next_send_ = now;
  }
  // Sends this second's messages (once a second) and reads what arrived.
  void poll(Clock::time_point now) {
    signs_.poll(now);
    if (now >= next_send_) {
      sent_ = collective_;  // one buffer for every send: it must outlive them, and never changes under them
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        MPI_Request request;
        // Never waited for: a message to a host that is gone may never leave.
        if (MPI_Isend(&sent_, 1, MPI_INT64_T, r, kTag, comm_, &request) == MPI_SUCCESS) MPI_Request_free(&request);
      }
      next_send_ = now + std::chrono::seconds(1);
    }
    for (;;) {
      int arrived = 0;
      MPI_Status status;
      check(MPI_Test(&incoming_, &arrived, &status), "MPI_Test");
      if (!arrived) return;
      if (status.MPI_TAG == kStoppingTag) signs_.stopped(status.MPI_SOURCE);
      else if (received_ >= collective_) signs_.heard(status.MPI_SOURCE);
      post_receive();
    }
  }
  // Tells every other process that this one stops the run, and gives the
  // messages up to kStoppingSendSeconds to leave (one to a host that is gone
  // never does). Then the process exits.
  void say_stopping() {
    std::vector<MPI_Request> requests;
    for (int r = 0; r < size_; ++r) {
      MPI_Request request;
      if (r != rank_ && MPI_Isend(&sent_, 1, MPI_INT64_T, r, kStoppingTag, comm_, &request) == MPI_SUCCESS)
        requests.push_back(request);
    }
    const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(kStoppingSendSeconds));
    int done = 0;
    while (!done && Clock::now() < until) {
      if (MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        return;
      ::usleep(1000);
    }
  }
  // The ranks nothing was heard from lately. Not "since begin()": what a host
  // sent just before its link went down can still be read after (sent while
  // this process was busy elsewhere, say evaluating).
  std::vector<int> silent() const { return signs_.silent(); }
  std::vector<int> stopped() const { return signs_.stopped(); }
  bool grace(Clock::time_point now, Clock::time_point deadline) { return signs_.grace(now, deadline); }

 private:
  static constexpr int kTag = 1;          // a sign of life
  static constexpr int kStoppingTag = 2;  // "I stop the run"
  static constexpr double kStoppingSendSeconds = 0.2;
  void post_receive() {
    check(MPI_Irecv(&received_, 1, MPI_INT64_T, MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &incoming_), "MPI_Irecv");
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Request incoming_ = MPI_REQUEST_NULL;
  int rank_ = 0, size_ = 0;
  std::int64_t received_ = 0, sent_ = 0, collective_ = 0;
  SignsOfLife signs_;
  Clock::time_point next_send_;
};

class MpiWorld;

class MpiReduce final : public PendingReduce {
 public:
  MpiReduce(MpiWorld& world, MPI_Request request) : world_(world), request_(request) {}
  ~MpiReduce() override;  // waits: never free a buffer MPI still uses
  bool test() override {
    int done = 0;
    check(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }
  void wait() override;

 private:
  MpiWorld& world_;
  MPI_Request request_;
};

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    // Open MPI's default schedule for a non-blocking all-reduce ran well behind
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
    liveness_.emplace(size_, rank_);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    hosts_ = all_gather(host);
  }
  ~MpiWorld() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // MPI_Finalize waits for every process with no deadline: meet them here first.
    MPI_Request barrier;
    ++collectives_;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &barrier) == MPI_SUCCESS) wait(&barrier, 1, "the barrier at the end of the run");
    liveness_.reset();
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string engine() const override { return engine_; }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  void set_step(std::int64_t step) override { step_ = step; }
  void set_stop_signal(int (*received)()) override { stop_signal_ = received; }

  std::unique_ptr<PendingReduce> start_sum(float* data, std::size_t n) override {
    MPI_Request request;
    ++collectives_;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(n, "MPI_Iallreduce"), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                         &request),
          "MPI_Iallreduce");
    return std::make_unique<MpiReduce>(*this, request);
  }
  void sum(double* data, std::size_t n) override { reduce(data, n, false); }
  void max(double* data, std::size_t n) override { reduce(data, n, true); }
  void broadcast(void* data, std::size_t bytes, int root) override {
    MPI_Request request;
    ++collectives_;
    check(MPI_Ibcast(data, checked_count(bytes, "MPI_Ibcast"), MPI_BYTE, root, MPI_COMM_WORLD, &request), "MPI_Ibcast");
    wait(&request, 1, fmt::format("the broadcast from rank {}", root));
  }
  std::vector<std::string> all_gather(const std::string& value) override {
    int length = checked_count(value.size(), "MPI_Allgather");
    std::vector<int> lengths(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_));
    MPI_Request request;
    collectives_ += 2;
    check(MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD, &request), "MPI_Iallgather");
    wait(&request, 1, "an all-gather");
    std::size_t total = 0;
    for (std::size_t r = 0; r < lengths.size(); ++r) {
      offsets[r] = static_cast<int>(total);
      total += static_cast<std::size_t>(lengths[r]);
    }
    std::string all(total, '\0');
    check(MPI_Iallgatherv(value.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
                          MPI_COMM_WORLD, &request),
          "MPI_Iallgatherv");
    wait(&request, 1, "an all-gather");
    std::vector<std::string> values;
    for (std::size_t r = 0; r < lengths.size(); ++r)
      values.push_back(all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r])));
    return values;
  }
  void transfer(void* data, std::size_t bytes, int from, int to) override {
    if (from == to) return;
    const int count = checked_count(bytes, "MPI_Isend");
    MPI_Request request;
    if (rank_ == from) {
      check(MPI_Isend(data, count, MPI_BYTE, to, 0, MPI_COMM_WORLD, &request), "MPI_Isend");
      wait(&request, 1, fmt::format("a send to rank {}", to));
    }
    if (rank_ == to) {
      check(MPI_Irecv(data, count, MPI_BYTE, from, 0, MPI_COMM_WORLD, &request), "MPI_Irecv");
      wait(&request, 1, fmt::format("a receive from rank {}", from));
    }
  }
  void exchange(const float* data, float* received, std::size_t n, int partner) override {
    const int count = checked_count(n, "MPI_Isend");
    MPI_Request requests[2];
    check(MPI_Irecv(received, count, MPI_FLOAT, partner, 1, MPI_COMM_WORLD, &requests[0]), "MPI_Irecv");
    check(MPI_Isend(data, count, MPI_FLOAT, partner, 1, MPI_COMM_WORLD, &requests[1]), "MPI_Isend");
    wait(requests, 2, fmt::format("the exchange with rank {}", partner));
  }
  [[noreturn]] void abort_all(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);  // MPI_Abort does not return; this keeps the [[noreturn]] promise regardless
  }

  // Returns once every one of `requests` completed; past the deadline, stops the run.
  void wait(MPI_Request* requests, int count, const std::string& operation) {
    int done = 0;
    check(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    const Clock::time_point start = Clock::now();
    const auto quiet = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kQuietSeconds));
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
    bool listening = false;
    for (;;) {
      check(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
      if (done) return;
      const Clock::time_point now = Clock::now();
      if (now < quiet) continue;
      if (liveness_) {
        if (!listening) liveness_->begin(collectives_, now);
        listening = true;
        liveness_->poll(now);
      }
      const int signal = stop_signal_ && child_of_mpirun_ ? stop_signal_() : 0;
      // At the deadline with every rank heard from lately, a little longer for one
      // to fall silent: a link cut just before the deadline (after an evaluation,
      // under a sanitizer's slowness) was still "heard" through the messages sent
      // before it, and the line blamed nobody.
      const bool past_deadline = now >= deadline;
      const bool grace = past_deadline && signal == 0 && liveness_ && liveness_->grace(now, deadline);
      if ((past_deadline && !grace) || signal != 0) {
        const Silence silence{.rank = rank_,
                              .host = hosts_.empty() ? "" : hosts_[static_cast<std::size_t>(rank_)],
                              .step = step_,
                              .operation = operation,
                              .waited = std::chrono::duration<double>(now - start).count(),
                              .timeout = timeout_,
                              .silent = liveness_ ? liveness_->silent() : std::vector<int>{},
                              .stopped = liveness_ ? liveness_->stopped() : std::vector<int>{},
                              .hosts = hosts_,
                              .signal = signal == 0 ? "" : fmt::format("SIG{}", ::sigabbrev_np(signal))};
        if (liveness_) liveness_->say_stopping();
        if (signal != 0) stop_run_after_signal(silence_message(silence));
        stop_run_after_silence(silence_message(silence));
      }
      // Past the quiet second this wait is no longer a fast one: poll gently.
      ::usleep(50);
    }
  }

 private:
  // A few scalars: every process's values gathered everywhere and combined in
  // rank order, so every process gets the same bits. One round of messages: the
  // ring schedule that suits the gradients' megabytes takes 2 (N - 1) rounds,
  // each a wake-up of a process on a busy machine (more processes than cores
  // across hosts trained markedly slower with it).
  void reduce(double* data, std::size_t n, bool maximum) {
    std::vector<double> all(n * static_cast<std::size_t>(size_));
    MPI_Request request;
    ++collectives_;
    check(MPI_Iallgather(data, checked_count(n, "MPI_Iallgather"), MPI_DOUBLE, all.data(), static_cast<int>(n),
                         MPI_DOUBLE, MPI_COMM_WORLD, &request),
          "MPI_Iallgather");
    wait(&request, 1, maximum ? "an all-reduce (maximum)" : "an all-reduce (sum)");
    for (std::size_t i = 0; i < n; ++i) {
      double value = all[i];
      for (int r = 1; r < size_; ++r) {
        const double other = all[static_cast<std::size_t>(r) * n + i];
        value = maximum ? std::max(value, other) : value + other;
      }
      data[i] = value;
    }
  }
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string engine_;
  double timeout_ = kDefaultCommTimeoutSeconds;
  std::int64_t step_ = 0;
  std::int64_t collectives_ = 0;  // collectives started: the same count on every process at each
  int (*stop_signal_)() = nullptr;
  const bool child_of_mpirun_ = child_of_mpirun();  // read once: /proc
  std::optional<Liveness> liveness_;
  std::vector<std::string> hosts_;  // every rank's host name, by rank
};

MpiReduce::~MpiReduce() {
  if (request_ != MPI_REQUEST_NULL) world_.wait(&request_, 1, "the all-reduce of gradients");
}
void MpiReduce::wait() { world_.wait(&request_, 1, "the all-reduce of gradients"); }

}  // namespace

bool built_with_mpi() { return true; }

std::unique_ptr<Communicator> make_communicator() {
  if (launcher_world_size() == 0) return single_process_communicator();
  return std::make_unique<MpiWorld>();
}

}  // namespace attograd::train::distributed

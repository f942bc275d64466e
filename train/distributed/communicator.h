#pragma once
// The processes of one data-parallel training run, as the trainer sees them:
// who am I, how many are we, and the few collectives data parallelism needs.
// Open MPI is the engine (train/distributed/mpi_communicator.cpp, built when CMake finds
// MPI); a run not started by mpirun, or a build without MPI, is one process
// (train/distributed/no_mpi.cpp) and every collective is the identity.
//
// Collectives must be called by every process in the same order, as MPI's.
// A process that fails calls abort_all(), which stops every process of the
// run (MPI_Abort): a rank that dies must never leave the others waiting.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"

namespace attograd::train::distributed {

// A failure every process of a run meets at the same point (flags that differ,
// a NaN loss after the all-reduce, parameters that drifted apart), so none is
// left waiting for the others: rank 0 reports it, the others exit with the
// same status without repeating it (report() is false there).
class SharedFailure : public Error {
 public:
  SharedFailure(const std::string& message, bool report) : Error(message), report_(report) {}
  bool report() const { return report_; }

 private:
  bool report_;
};

// A started non-blocking all-reduce; wait() returns once its buffer holds the result.
class PendingReduce {
 public:
  virtual ~PendingReduce() = default;
  virtual bool test() = 0;  // done yet? (also drives MPI's progress engine)
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the processes on this machine (picks a GPU)
  virtual int local_size() const = 0;  // processes on this machine (they share its cores)
  virtual std::string engine() const = 0;  // "Open MPI 4.1.4", or "one process"

  // Every wait for the other processes ends within `seconds` (--comm-timeout):
  // past it, this process names the step, the operation and the processes it
  // heard nothing from, and stops the run (train/distributed/watchdog.h). One
  // process never waits.
  virtual void set_timeout(double /*seconds*/) {}
  // The step the run is at, for that line (0: setting up).
  virtual void set_step(std::int64_t /*step*/) {}
  // Where to read a stop signal received (SIGTERM, SIGINT: its number, else 0),
  // which ends a long wait on mpirun's own host (watchdog.h).
  virtual void set_stop_signal(int (*/*received*/)()) {}

  // Sums `n` floats in place across every process, in the background. The
  // buffer must stay alive and untouched until the returned reduce is waited for.
  virtual std::unique_ptr<PendingReduce> start_sum(float* data, std::size_t n) = 0;
  virtual void sum(double* data, std::size_t n) = 0;  // blocking, for a few scalars
  virtual void max(double* data, std::size_t n) = 0;
  // Root's bytes to every process (`bytes` must be the same size everywhere).
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // Every process's string, in rank order, on every process.
  virtual std::vector<std::string> all_gather(const std::string& value) = 0;
  // Rank `from` sends `bytes` to `to` (point to point; both must call it).
  virtual void transfer(void* data, std::size_t bytes, int from, int to) = 0;
  // Sends `n` floats to `partner` and receives its `n` into `received`, at once
  // (both must call it, each naming the other).
  virtual void exchange(const float* data, float* received, std::size_t n, int partner) = 0;

  // Stops every process of the run with this exit status (after this process
  // printed why). Does not return.
  [[noreturn]] virtual void abort_all(int status) = 0;
};

// One process: every collective is the identity (sums and maxima of one
// value, broadcasts from oneself). Not final, so that a test can watch what a
// trainer asks of its communicator.
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string engine() const override { return "one process"; }
  std::unique_ptr<PendingReduce> start_sum(float* data, std::size_t n) override;
  void sum(double*, std::size_t) override {}
  void max(double*, std::size_t) override {}
  void broadcast(void*, std::size_t, int) override {}
  std::vector<std::string> all_gather(const std::string& value) override { return {value}; }
  void transfer(void*, std::size_t, int, int) override {}
  void exchange(const float* data, float* received, std::size_t n, int partner) override;
  [[noreturn]] void abort_all(int status) override;
};

// The GPUs of a run joined by NCCL: sums in device memory, with no copy through
// the host. Made by choose_device_reduction() (train/distributed/data_parallel.h), only
// when every process drives a GPU of its own.
class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;
  virtual std::string engine() const = 0;  // "NCCL 2.30.3"
  // Sums `n` floats of device memory in place across every process, on a stream
  // of the library's own: it starts after the work already queued on the
  // device's stream, and wait() makes later work there wait for it (and returns
  // once the sum is done). The buffer must stay alive until then.
  virtual std::unique_ptr<PendingReduce> start_sum(float* device_data, std::size_t n) = 0;

  // Each buffer of device memory takes its root's values on every process, in
  // place, all in one NCCL group: after the work queued on the device's stream,
  // and before whatever is queued there next (the host does not wait).
  struct Broadcast {
    float* device_data;
    std::size_t n;
    int root;
  };
  virtual void broadcast(const std::vector<Broadcast>& buffers) = 0;
};

// The communicator of this process: MPI's world when started by an MPI
// launcher (mpirun sets OMPI_COMM_WORLD_SIZE), else one process. Made on the
// first call and kept until the process exits, when MPI is finalised: every
// process then leaves together, after rank 0 has printed its last line (an
// early exit of another rank with a non-zero status makes mpirun kill the rest).
// A launcher's world of several processes in a build without MPI is an error.
Communicator& world();
std::unique_ptr<Communicator> make_communicator();  // what world() makes
// Throws SharedFailure(message) on every process (reported by rank 0).
[[noreturn]] void fail_on_every_process(const Communicator& comm, const std::string& message);
// For `e`, met by this process alone (a full disk on rank 0, a GPU out of memory
// on one rank): the others would wait for it for ever in their next collective,
// and MPI_Finalize waits for them, so this prints it, naming the rank, and stops
// every process. Returns (for the caller to rethrow) when `comm` is one process
// or `e` is a SharedFailure, which every process meets at the same point.
void stop_every_process(Communicator& comm, const std::exception& e);
std::unique_ptr<Communicator> single_process_communicator();

// True when this build can run on several processes (CMake found MPI).
bool built_with_mpi();
// True when this build sums GPU gradients with NCCL (CMake found it, CUDA on).
bool built_with_nccl();
// Every process of `comm` joins one NCCL group on its GPU `device` (a
// collective: every process calls it). Throws in a build without NCCL.
std::unique_ptr<DeviceCommunicator> make_nccl_communicator(Communicator& comm, int device);

}  // namespace attograd::train::distributed

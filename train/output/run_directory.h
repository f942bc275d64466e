#pragma once
// The run directory of `attograd train` (--out): checked before anything is
// made, created only once every input is valid, and removed again when the run
// fails before writing its first checkpoint, so a bad input never leaves a
// half-made run behind.
#include <filesystem>
#include <string>

namespace attograd::train::output {

// The files a run writes into its directory.
inline constexpr const char* kCheckpointName = "ckpt.safetensors";
inline constexpr const char* kBestCheckpointName = "best.safetensors";  // --keep-best
inline constexpr const char* kRunFiles[] = {kCheckpointName, kBestCheckpointName, "metrics.jsonl", "loss.svg"};

// Fails with "[--out] ..." unless `dir` is a writable directory or can be
// created as one, and holds no other run: a checkpoint there is replaced only
// by a run resumed from a checkpoint in `dir` (`resume`, empty for a new run).
// Creates nothing.
void check_output_dir(const std::filesystem::path& dir, const std::string& resume);

// The default run directory of a new run: `base` unless it holds a run's
// checkpoint or a running run, else the first of base-2, base-3, ... that does not.
std::filesystem::path first_free_run_dir(const std::filesystem::path& base);

class RunDirectory {
 public:
  // Creates `dir` and its missing parents ("[--out] cannot create ..." on failure),
  // and takes an exclusive lock on it for the run's lifetime: a second run into the
  // same directory fails at once, naming it, instead of interleaving their files.
  // Under the lock it checks again that no other run's checkpoint is there.
  RunDirectory(const std::filesystem::path& dir, const std::string& resume);
  // Removes what the constructor created, unless keep() was called.
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  void keep() { keep_ = true; }  // it holds a checkpoint now

 private:
  std::filesystem::path created_;  // the outermost directory created; empty if it existed
  int lock_fd_ = -1;               // holds flock(LOCK_EX) on <dir>/.attograd.lock
  bool keep_ = false;
};


}  // namespace attograd::train::output

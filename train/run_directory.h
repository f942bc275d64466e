#pragma once
// The run directory of `attograd train` (--out): checked before anything is
// made, created only once every input is valid, and removed again when the run
// fails before writing its first checkpoint, so a bad input never leaves a
// half-made run behind.
#include <filesystem>
#include <string>

namespace attograd {

// Fails with "[--out] ..." unless `dir` is a writable directory or can be
// created as one; creates nothing.
void check_output_dir(const std::filesystem::path& dir);

class RunDirectory {
 public:
  // Creates `dir` and its missing parents ("[--out] cannot create ..." on failure).
  explicit RunDirectory(const std::filesystem::path& dir);
  // Removes what the constructor created, unless keep() was called.
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  void keep() { keep_ = true; }  // it holds a checkpoint now

 private:
  std::filesystem::path created_;  // the outermost directory created; empty if it existed
  bool keep_ = false;
};

// Deletes the temporary files ".<name>.tmpXXXXXX" that a write of `name` cut
// short by a crash or kill -9 leaves next to it (the file itself is intact:
// writes go to a temporary and are renamed over it).
void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& name);

}  // namespace attograd

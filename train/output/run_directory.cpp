#include "train/output/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "train/files.h"
#include "train/output/safetensors.h"

namespace attograd::train::output {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockName = ".attograd.lock";

bool holds_checkpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / kCheckpointName, ec);
}

// True while another run holds `dir`'s lock (a run before its first checkpoint).
bool locked_by_a_run(const fs::path& dir) {
  const int fd = ::open((dir / kLockName).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

// A checkpoint in `dir` is replaced only by the run it belongs to: the run resumed
// from it, or from a copy of it kept beside it (ckpt-step300.safetensors, say).
void check_no_other_run(const fs::path& dir, const std::string& resume) {
  std::error_code ec;
  const bool same_run = !resume.empty() && fs::equivalent(fs::absolute(resume).parent_path(), dir, ec);
  AG_CHECK(!holds_checkpoint(dir) || same_run, "--out",
           "'{}' holds another run's checkpoint: continue it with --resume {}, or choose another --out "
           "(or remove it)",
           dir.string(), (dir / kCheckpointName).string());
}

}  // namespace

void check_output_dir(const fs::path& dir, const std::string& resume) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    AG_CHECK(fs::is_directory(dir, ec), "--out", "'{}' exists and is not a directory", dir.string());
    AG_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "--out", "'{}' is not writable", dir.string());
    for (const char* name : kRunFiles) check_replaceable("--out", (dir / name).string());
    check_no_other_run(dir, resume);
    return;
  }
  fs::path ancestor = fs::absolute(dir, ec).parent_path();
  while (!ancestor.empty() && !fs::exists(ancestor, ec) && ancestor != ancestor.root_path())
    ancestor = ancestor.parent_path();
  AG_CHECK(fs::is_directory(ancestor, ec), "--out", "cannot create '{}': '{}' is not a directory", dir.string(),
           ancestor.string());
  AG_CHECK(::access(ancestor.c_str(), W_OK | X_OK) == 0, "--out", "cannot create '{}': '{}' is not writable",
           dir.string(), ancestor.string());
}

fs::path first_free_run_dir(const fs::path& base) {
  fs::path dir = base;
  for (int n = 2; holds_checkpoint(dir) || locked_by_a_run(dir); ++n) dir = fs::path(base.string() + "-" + std::to_string(n));
  return dir;
}

RunDirectory::RunDirectory(const fs::path& dir, const std::string& resume) {
  std::error_code ec;
  fs::path first_missing;
  for (fs::path p = fs::absolute(dir, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    first_missing = p;
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  // access() passes for root even where creating fails (a read-only file system).
  AG_CHECK(!ec, "--out", "cannot create '{}': {}", dir.string(), ec.message());
  created_ = first_missing;
  bool ours = true;  // false once another run is known to hold the directory
  try {
    // flock, not a pid file: the kernel drops the lock when the process ends, however it ends.
    const fs::path lock = dir / kLockName;
    lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    AG_CHECK(lock_fd_ >= 0, "--out", "cannot create '{}': {}", lock.string(), std::strerror(errno));
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ours = err != EWOULDBLOCK;
      AG_CHECK(ours, "--out", "'{}' is in use by another attograd run", dir.string());
      // A file system without locks (NFS without lockd, Lustre without flock) runs unlocked, as before.
      AG_CHECK(err == ENOSYS || err == ENOLCK || err == EOPNOTSUPP || err == EINVAL, "--out", "cannot lock '{}': {}",
               lock.string(), std::strerror(err));
    }
    // Again under the lock: another run may have written its checkpoint and ended since the check.
    check_no_other_run(dir, resume);
  } catch (...) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    if (ours && !created_.empty()) fs::remove_all(created_, ec);
    throw;
  }
}

RunDirectory::~RunDirectory() {
  if (!keep_ && !created_.empty()) {
    std::error_code ec;
    fs::remove_all(created_, ec);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

}  // namespace attograd::train::output

// Whole files in and out, for every room of train/: read with a limit (and a
// deadline for a FIFO's writer), written atomically.
#include "train/files.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "base/error.h"

namespace attograd::train {
namespace {

// Tests only (tests/test_reliability.cpp): ATTOGRAD_TEST_WRITE_PAUSE_MS=N makes
// every atomic write stop halfway for N ms, so a test can kill -9 the process
// while a half-written temporary file exists.
int test_write_pause_ms() {
  static const int ms = [] {
    const char* value = std::getenv("ATTOGRAD_TEST_WRITE_PAUSE_MS");
    return value ? std::atoi(value) : 0;
  }();
  return ms;
}

}  // namespace

MappedFile::MappedFile(const std::string& path, std::string_view flag) {
  // Opened without blocking, so that a FIFO (or a device) reaches the check below rather than
  // waiting in open() for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  AG_CHECK(fd >= 0, flag, "cannot read '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(flag, "'{}' is not a regular file", path);
  }
  bytes_ = static_cast<std::size_t>(st.st_size);
  if (bytes_ > 0) {
    map_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd, 0);
    const int error = errno;
    ::close(fd);
    AG_CHECK(map_ != MAP_FAILED, flag, "cannot map '{}': {}", path, std::strerror(error));
  } else {
    ::close(fd);
  }
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

MappedFile::~MappedFile() {
  if (map_) ::munmap(map_, bytes_);
}

void MappedFile::advise_random() const {
  if (map_) ::madvise(map_, bytes_, MADV_RANDOM);
}

void MappedFile::release(std::size_t begin, std::size_t end) const {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t first = (begin + page - 1) / page * page, last = std::min(end, bytes_) / page * page;
  if (map_ && first < last) ::madvise(static_cast<char*>(map_) + first, last - first, MADV_DONTNEED);
}

std::string read_file(const std::string& path, const char* flag, std::uint64_t max_bytes, int fifo_wait_ms) {
  AG_CHECK(!std::filesystem::is_directory(path), flag, "'{}' is a directory, not a file", path);
  // Opened without blocking: open() on a FIFO would wait for a writer for ever.
  // A FIFO then waits for its writer in poll() (no POLLHUP before one has come),
  // at most fifo_wait_ms; reads block again, as a pipe's writer may be slow.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  AG_CHECK(fd >= 0, flag, "cannot read '{}': {}", path, std::strerror(errno));
  const std::unique_ptr<const int, void (*)(const int*)> closer(&fd, [](const int* f) { ::close(*f); });
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode)) {
    pollfd writer{fd, POLLIN, 0};
    int ready;
    while ((ready = ::poll(&writer, 1, fifo_wait_ms)) < 0 && errno == EINTR) {
    }
    AG_CHECK(ready > 0, flag, "'{}' is a FIFO, and nothing wrote to it within {} s", path, fifo_wait_ms / 1000.0);
  }
  // Read in chunks and stop one byte past the limit: never an endless or unbounded read.
  std::string text;
  char chunk[1 << 16];
  while (text.size() <= max_bytes) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    // Unreadable devices open but fail to read.
    AG_CHECK(n >= 0, flag, "cannot read '{}': {}", path, std::strerror(errno));
    if (n == 0) break;
    text.append(chunk, static_cast<std::size_t>(n));
  }
  AG_CHECK(text.size() <= max_bytes, flag, "'{}' holds more than {} bytes, the limit", path, max_bytes);
  AG_CHECK(!text.empty(), flag, "'{}' is empty (or not a regular file)", path);
  return text;
}

void check_replaceable(std::string_view what, const std::string& path) {
  struct stat existing {};
  AG_CHECK(::stat(path.c_str(), &existing) != 0 || S_ISREG(existing.st_mode), what,
           "cannot write '{}': it exists and is not a regular file", path);
}

void write_file_atomically(std::string_view what, const std::string& path, std::string_view bytes) {
  write_file_atomically(what, path, std::vector<std::string_view>{bytes});
}

void write_file_atomically(std::string_view what, const std::string& path, const std::vector<std::string_view>& parts) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  check_replaceable(what, path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string temp = (dir / ("." + target.filename().string() + ".tmpXXXXXX")).string();
  const int fd = ::mkstemp(temp.data());
  AG_CHECK(fd >= 0, what, "cannot write '{}': {}", path, std::strerror(errno));
  const auto fail_and_clean = [&](const char* step) {
    const int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    fail(what, "cannot write '{}' ({}): {}", path, step, std::strerror(err));
  };
  std::size_t total = 0;
  for (std::string_view part : parts) total += part.size();
  // The tests' pause (a kill mid-write) comes halfway through the file's bytes.
  const std::size_t pause_at = test_write_pause_ms() > 0 ? total / 2 : total;
  std::size_t written = 0;  // of the whole file
  for (std::string_view bytes : parts) {
    for (std::size_t done = 0; done < bytes.size();) {
      const std::size_t until = written < pause_at ? std::min(bytes.size(), done + (pause_at - written)) : bytes.size();
      const ssize_t n = ::write(fd, bytes.data() + done, until - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_and_clean("write");
      done += static_cast<std::size_t>(n);
      written += static_cast<std::size_t>(n);
      if (written == pause_at && pause_at < total) ::usleep(static_cast<useconds_t>(test_write_pause_ms()) * 1000);
    }
  }
  if (::fsync(fd) != 0) fail_and_clean("fsync");
  if (::fchmod(fd, 0644) != 0) fail_and_clean("chmod");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail(what, "cannot write '{}' (close): {}", path, std::strerror(err));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail(what, "cannot write '{}' (rename): {}", path, std::strerror(err));
  }
  // The rename itself is durable only once the directory is synced.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& name) {
  std::error_code ec;
  const std::string prefix = "." + name + ".tmp";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove(entry.path(), ec);
}

}  // namespace attograd::train

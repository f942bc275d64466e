#pragma once
// Whole files in and out, for every room of train/: the text and checkpoints
// a run reads, and every file it writes (checkpoints, metrics.jsonl, the SVG
// plots), each replaced atomically so a crash never leaves half of one.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace attograd::train {

// The file's bytes; "[--data] cannot read 'f': No such file or directory", "... is empty",
// or "... holds more than N bytes" (read no further: /dev/zero or a pipe is no endless read).
// A FIFO waits for its writer at most `fifo_wait_ms` ("... nothing wrote to it"). `flag`
// names where the path came from in errors.
std::string read_file(const std::string& path, const char* flag, std::uint64_t max_bytes, int fifo_wait_ms = 30000);

// A regular file mapped read-only for the life of the object: its bytes with
// no copy, of any size. "[flag] cannot read 'f': ...", "... is not a regular
// file". Pages read through the mapping count in the process's resident set
// until it goes, or until release() lets those of a range go (they stay in the
// page cache): a reader that copies a file out piece by piece holds it twice
// only a piece at a time.
class MappedFile {
 public:
  MappedFile(const std::string& path, std::string_view flag);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;
  ~MappedFile();

  std::string_view bytes() const { return {static_cast<const char*>(map_), bytes_}; }
  // Readers that jump about (token windows) ask for no read-ahead.
  void advise_random() const;
  // The whole pages within bytes [begin, end) leave the resident set.
  void release(std::size_t begin, std::size_t end) const;

 private:
  void* map_ = nullptr;
  std::size_t bytes_ = 0;
};

// Writes a temporary file in the same directory (".name.tmpXXXXXX"), fsyncs
// it, renames it over `path` and fsyncs the directory: a crash leaves the old
// file or the new one, never half of one. `what` names it in errors
// ("[loss.svg] cannot write ..."). An existing `path` that is not a regular
// file is refused (check_replaceable).
void write_file_atomically(std::string_view what, const std::string& path, std::string_view bytes);
// The same with the file's bytes in parts, written in order (a checkpoint's
// header, then each tensor's bytes, never joined in memory).
void write_file_atomically(std::string_view what, const std::string& path, const std::vector<std::string_view>& parts);

// Fails ("[what] cannot write 'p': it exists and is not a regular file") when
// `path` exists and is not a regular file (a directory, a device such as
// /dev/null, a FIFO), which a rename would replace. Callers check early too, so
// a bad path fails before the work whose result it would hold.
void check_replaceable(std::string_view what, const std::string& path);

// Deletes the temporary files ".<name>.tmpXXXXXX" that a write of `name` cut
// short by a crash or kill -9 leaves next to it (the file itself is intact:
// writes go to a temporary and are renamed over it).
void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& name);

}  // namespace attograd::train

#include "train/run_directory.h"

#include <unistd.h>

#include "tensor/error.h"

namespace attograd {

namespace fs = std::filesystem;

void check_output_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    AG_CHECK(fs::is_directory(dir, ec), "--out", "'{}' exists and is not a directory", dir.string());
    AG_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "--out", "'{}' is not writable", dir.string());
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

RunDirectory::RunDirectory(const fs::path& dir) {
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
}

RunDirectory::~RunDirectory() {
  if (keep_ || created_.empty()) return;
  std::error_code ec;
  fs::remove_all(created_, ec);
}

void remove_stale_temporaries(const fs::path& dir, const std::string& name) {
  std::error_code ec;
  const std::string prefix = "." + name + ".tmp";
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) fs::remove(entry.path(), ec);
}

}  // namespace attograd

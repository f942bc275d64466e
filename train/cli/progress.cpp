#include "train/cli/progress.h"

#include <unistd.h>

#include <cmath>
#include <fmt/format.h>
#include <string_view>
#include <utility>

#include "train/distributed/launcher.h"

namespace attograd::train::cli {

namespace {
std::string duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02}", s / 60, s % 60);
}

std::string rate(double tokens_per_s) {
  return tokens_per_s >= 1e6   ? fmt::format("{:.2f}M", tokens_per_s / 1e6)
         : tokens_per_s >= 1e3 ? fmt::format("{:.1f}k", tokens_per_s / 1e3)
                               : fmt::format("{:.0f}", tokens_per_s);
}
// Whether the parent process's descriptor fd is a terminal (Linux's /proc).
bool parent_descriptor_is_terminal(int fd) {
  const std::string path = fmt::format("/proc/{}/fd/{}", ::getppid(), fd);
  char target[256];
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
  if (n <= 0) return false;
  const std::string_view name(target, static_cast<std::size_t>(n));
  return name.starts_with("/dev/pts/") || name.starts_with("/dev/tty");
}
}  // namespace

bool is_interactive(std::FILE* out) {
  if (out == nullptr || ::isatty(::fileno(out)) != 1) return false;
  return distributed::launcher_world_size() == 0 || parent_descriptor_is_terminal(::fileno(out));
}

Progress::Progress(std::FILE* out, std::int64_t first_step, std::int64_t total_steps, ProgressOptions options)
    : out_(out), first_step_(first_step), total_steps_(total_steps), options_(options),
      start_(std::chrono::steady_clock::now()) {}

std::string Progress::line(std::int64_t step, double lr, double tokens_per_s) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = elapsed / (step - first_step_) * (total_steps_ - step);
  const int width = static_cast<int>(std::to_string(total_steps_).size());
  return fmt::format("step {:>{}}/{}  loss {:.4f}  lr {:.2e}  {} tok/s{}{}  ETA {}", step, width, total_steps_,
                     smoothed_, lr, rate(tokens_per_s), detail_.empty() ? "" : "  ", detail_, duration(eta));
}

void Progress::update(std::int64_t step, double loss, double lr, double tokens_per_s) {
  // An exponential moving average with bias correction, so early steps are not pulled toward zero.
  constexpr double kDecay = 0.9;
  ++seen_;
  raw_average_ = kDecay * raw_average_ + (1 - kDecay) * loss;
  smoothed_ = raw_average_ / (1 - std::pow(kDecay, static_cast<double>(seen_)));
  if (options_.quiet) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = step == total_steps_;
  if (options_.interactive) {
    if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    std::fprintf(out_, "\r\033[K%s", line(step, lr, tokens_per_s).c_str());
    live_line_shown_ = true;
  } else {
    const std::int64_t every = std::max<std::int64_t>(1, total_steps_ / 20);
    if (!last && step % every != 0) return;
    std::fprintf(out_, "%s\n", line(step, lr, tokens_per_s).c_str());
  }
  std::fflush(out_);
}

void Progress::clear_live_line() {
  if (live_line_shown_) std::fputs("\r\033[K", out_);
  live_line_shown_ = false;
}

void Progress::message(const std::string& text) {
  clear_live_line();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (live_line_shown_) std::fputc('\n', out_);
  live_line_shown_ = false;
  std::fflush(out_);
}

CountProgress::CountProgress(std::FILE* out, std::string what, std::string items, CountProgressOptions options)
    : out_(out), what_(std::move(what)), items_(std::move(items)), options_(options),
      start_(std::chrono::steady_clock::now()) {}

void CountProgress::update(std::int64_t done, std::int64_t total) {
  if (out_ == nullptr || done <= 0 || total <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::int64_t tenth = done * 10 / total;
  if (elapsed < options_.delay_s || done >= total) return;  // the caller's own line reports the end
  if (options_.interactive) {
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
  } else {
    if (tenth <= last_tenth_) return;
    last_tenth_ = tenth;
  }
  const double eta = elapsed / static_cast<double>(done) * static_cast<double>(total - done);
  const std::string line = fmt::format("{}: {}/{} {} ({}%)  ETA {}", what_, done, total, items_, done * 100 / total,
                                       duration(eta));
  if (options_.interactive) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    live_line_shown_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void CountProgress::finish() {
  if (out_ != nullptr && live_line_shown_) {
    std::fputs("\r\033[K", out_);
    std::fflush(out_);
  }
  live_line_shown_ = false;
}

}  // namespace attograd::train::cli

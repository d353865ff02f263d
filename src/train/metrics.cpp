// The run's reports: JSON-lines records with Hugging Face Trainer's keys, console lines, the
// progress bar and the summary table.
#include "metrics.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "shardlm/core.hpp"

namespace shardlm {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

std::string bytes_text(double bytes) { return format_bytes(static_cast<size_t>(std::max(0.0, bytes))); }

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string clock_text(double seconds) {
  const long s = static_cast<long>(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

// Rows of cells as a text table, columns padded to their widest cell, numbers right-aligned.
std::string text_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], row[c].size());
    }
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line = " ";
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const std::string& cell = rows[r][c];
      const std::string pad(width[c] - cell.size(), ' ');
      line += " " + (c == 0 ? cell + pad : pad + cell);
    }
    out += line + "\n";
    if (r == 0) {
      std::string rule = " ";
      for (size_t w : width) rule += " " + std::string(w, '-');
      out += rule + "\n";
    }
  }
  return out;
}

// Trainer's speed_metrics of a split ("eval", "train"): SPLIT_runtime, SPLIT_samples_per_second and
// SPLIT_steps_per_second.
void put_speed_metrics(nlohmann::json& j, const std::string& split, double runtime, double samples_per_second,
                       double steps_per_second) {
  j[split + "_runtime"] = runtime;
  j[split + "_samples_per_second"] = samples_per_second;
  j[split + "_steps_per_second"] = steps_per_second;
}

// An evaluation's SQuAD scores, where it generated (NaN otherwise).
void put_generation_scores(nlohmann::json& j, const EvalLog& e) {
  if (std::isfinite(e.exact_match)) j["eval_exact_match"] = e.exact_match;
  if (std::isfinite(e.f1)) j["eval_f1"] = e.f1;
}

}  // namespace

namespace {

// Cuts a partial last line (no newline at its end) off the file open at fd; says so on stdout.
void cut_partial_last_line(int fd, const std::string& path) {
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size <= 0) return;
  off_t end = size;  // the length to keep: up to and including the last newline
  char buf[4096];
  while (end > 0) {
    const off_t from = std::max<off_t>(0, end - static_cast<off_t>(sizeof buf));
    const ssize_t n = ::pread(fd, buf, static_cast<size_t>(end - from), from);
    SHARDLM_CHECK(n == end - from, "cannot read metrics file '", path, "': ", std::strerror(n < 0 ? errno : EIO));
    const char* nl = static_cast<const char*>(::memrchr(buf, '\n', static_cast<size_t>(n)));
    if (nl) {
      end = from + (nl - buf) + 1;
      break;
    }
    end = from;
  }
  if (end == size) return;
  SHARDLM_CHECK(::ftruncate(fd, end) == 0, "cannot cut the partial last line off metrics file '", path,
                "': ", std::strerror(errno));
  log_info(concat("warning: metrics file ", path, " ended in a partial record (", size - end,
                  " bytes, from a run stopped while writing it): cut off"));
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | (append ? 0 : O_TRUNC), 0644)),
      path_(path) {
  SHARDLM_CHECK(fd_ >= 0, "cannot write metrics file '", path, "': ", std::strerror(errno));
  // O_NONBLOCK above: a pipe of that name must not hold the open, and is refused, as its writes
  // would wait once its buffer is full; a file (or a device such as /dev/null) is written blocking.
  struct stat st {};
  const bool pipe = ::fstat(fd_, &st) == 0 && S_ISFIFO(st.st_mode);
  if (pipe || ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw Error(concat("cannot write metrics file '", path, "': ", pipe ? "it is a pipe (FIFO)" : std::strerror(err)));
  }
  if (append) cut_partial_last_line(fd_, path_);
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

MetricsWriter::MetricsWriter(MetricsWriter&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (fd_ < 0) return;
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  try {
    write_all(fd_, record.dump() + "\n", "metrics file", path_);
  } catch (const Error&) {
    if (before >= 0) (void)::ftruncate(fd_, before);  // no partial record stays behind
    throw;
  }
}

nlohmann::json train_record(const StepLog& log) {
  const double per_gpu = log.tokens_per_second / log.world;
  // "lr", "tokens_per_s" and "tokens_per_s_per_rank" are the earlier names, kept for bench/ scripts.
  return {{"type", "train"},
          {"loss", log.loss},
          {"grad_norm", log.grad_norm},
          {"learning_rate", log.learning_rate},
          {"epoch", log.epoch},
          {"step", log.step},
          {"tokens_per_second_per_gpu", per_gpu},
          {"mfu", log.mfu},
          {"peak_memory_bytes", max_of(log.peak_memory_bytes)},
          {"peak_memory_bytes_per_rank", log.peak_memory_bytes},
          {"loss_scale", log.loss_scale},
          {"lr", log.learning_rate},
          {"tokens_per_s", log.tokens_per_second},
          {"tokens_per_s_per_rank", per_gpu}};
}

nlohmann::json eval_record(const EvalLog& log) {
  nlohmann::json j = {{"type", "eval"}, {"eval_loss", log.loss}, {"epoch", log.epoch}, {"step", log.step}};
  put_speed_metrics(j, "eval", log.runtime, log.samples_per_second, log.steps_per_second);
  put_generation_scores(j, log);
  if (std::isfinite(log.generation_runtime)) j["eval_generation_runtime"] = log.generation_runtime;
  return j;
}

nlohmann::json summary_record(const RunSummary& s) {
  nlohmann::json j = {{"type", "summary"},
                      {"train_loss", s.train_loss},
                      {"epoch", s.epoch},
                      {"steps", s.steps},
                      {"tokens_per_second_per_gpu", s.tokens_per_second_per_gpu},
                      {"mfu", s.mfu},
                      {"peak_memory_bytes", max_of(s.peak_memory_bytes)},
                      {"peak_memory_bytes_per_rank", s.peak_memory_bytes},
                      {"peak_rss_bytes", s.peak_rss_bytes},
                      {"preempted", s.preempted}};
  put_speed_metrics(j, "train", s.train_runtime, s.train_samples_per_second, s.train_steps_per_second);
  if (!s.attention.empty()) j["attention"] = s.attention;
  if (std::isfinite(s.final_loss)) j["final_loss"] = s.final_loss;
  // The last generation's scores, as Trainer's final metrics carry its last evaluation's.
  for (const EvalLog& e : s.evals) put_generation_scores(j, e);
  return j;
}

std::string train_line(const StepLog& log) {
  return concat("step ", log.step, "/", log.total_steps, " | epoch ", fmt("%.2f", log.epoch), " | loss ",
                fmt("%.4f", log.loss), " | grad_norm ", fmt("%.3f", log.grad_norm), " | lr ",
                fmt("%.3e", log.learning_rate), " | ", fmt("%.0f", log.tokens_per_second), " tok/s (",
                fmt("%.0f", log.tokens_per_second / log.world), "/rank) | mem ", bytes_text(max_of(log.peak_memory_bytes)),
                log.mfu > 0 ? concat(" | MFU ", fmt("%.1f", 100 * log.mfu), "%") : "");
}

std::string eval_line(const EvalLog& log) {
  std::string line = concat("eval  epoch ", fmt("%.2f", log.epoch), " | eval_loss ", fmt("%.4f", log.loss), " | ",
                            fmt("%.1f", log.samples_per_second), " samples/s");
  if (std::isfinite(log.exact_match)) line += concat(" | EM ", fmt("%.2f", log.exact_match));
  if (std::isfinite(log.f1)) line += concat(" | F1 ", fmt("%.2f", log.f1));
  return line;
}

std::string done_line(const TrainResult& result, long steps_run, bool gpu_memory) {
  return concat(result.preempted ? "stopped: " : "done: ", steps_run, " steps in ", fmt("%.1f", result.train_runtime),
                " s | train_loss ", fmt("%.4f", result.train_loss), " | ", fmt("%.2f", result.train_samples_per_second),
                " samples/s | peak memory ", format_bytes(result.peak_memory_bytes), " per rank (",
                gpu_memory ? "GPU" : "planned buffers", "), ", format_bytes(result.peak_rss_bytes), " resident");
}

std::string summary_table(const RunSummary& s) {
  std::string peaks;
  for (size_t r = 0; r < s.peak_memory_bytes.size(); ++r)
    peaks += (r ? ", " : "") + bytes_text(s.peak_memory_bytes[r]);
  std::vector<std::vector<std::string>> run = {
      {"train metric", "value"},
      {"train_loss (mean over steps)", fmt("%.4f", s.train_loss)},
      {"final train loss (last log)", std::isfinite(s.final_loss) ? fmt("%.4f", s.final_loss) : "-"},
      {"train_runtime", fmt("%.2f s", s.train_runtime)},
      {"train_samples_per_second", fmt("%.3f", s.train_samples_per_second)},
      {"train_steps_per_second", fmt("%.3f", s.train_steps_per_second)},
      {"tokens/s per GPU (rank)", fmt("%.0f", s.tokens_per_second_per_gpu)},
      {"epoch", fmt("%.2f", s.epoch)},
      {s.gpu_memory ? "peak GPU memory per rank" : "peak planned memory per rank", peaks.empty() ? "-" : peaks},
      {"peak resident memory (max rank)", bytes_text(s.peak_rss_bytes)}};
  if (s.mfu > 0) run.push_back({"MFU", fmt("%.1f%%", 100 * s.mfu)});
  std::string out = concat("***** ", s.preempted ? "stopped" : "train", " summary *****\n", text_table(run));
  if (s.evals.empty()) return out;

  bool squad = false;
  for (const EvalLog& e : s.evals) squad = squad || std::isfinite(e.exact_match) || std::isfinite(e.f1);
  std::vector<std::vector<std::string>> evals = {{"epoch", "eval_loss", "eval samples/s", "eval_runtime"}};
  if (squad) {
    evals[0].push_back("EM");
    evals[0].push_back("F1");
  }
  for (const EvalLog& e : s.evals) {
    std::vector<std::string> row = {fmt("%.2f", e.epoch), fmt("%.4f", e.loss), fmt("%.2f", e.samples_per_second),
                                    fmt("%.2f s", e.runtime)};
    if (squad) {
      row.push_back(std::isfinite(e.exact_match) ? fmt("%.2f", e.exact_match) : "-");
      row.push_back(std::isfinite(e.f1) ? fmt("%.2f", e.f1) : "-");
    }
    evals.push_back(std::move(row));
  }
  return out + "***** eval per epoch *****\n" + text_table(evals);
}

bool output_is_terminal() {
  if (!isatty(STDOUT_FILENO)) return false;
  // Under Open MPI's mpirun (or MPICH's hydra) our terminal may be the launcher's pseudo-terminal:
  // follow the parent's standard output instead (a file or a pipe means no bar).
  const char* launched = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (launched == nullptr) launched = std::getenv("PMI_SIZE");
  if (launched == nullptr) return true;
  std::error_code ec;
  const std::string parent_out =
      std::filesystem::read_symlink(concat("/proc/", getppid(), "/fd/1"), ec).string();
  if (ec) return false;
  return parent_out.rfind("/dev/pts/", 0) == 0 || parent_out.rfind("/dev/tty", 0) == 0;
}

ProgressDisplay::ProgressDisplay(bool enabled, bool bar, long first_step, long total_steps)
    : enabled_(enabled), bar_(enabled && bar), first_step_(first_step), total_steps_(total_steps),
      step_(first_step), start_seconds_(now_seconds()) {}

void ProgressDisplay::hide() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stdout);
  drawn_ = false;
}

void ProgressDisplay::draw() {
  constexpr int kWidth = 30;
  const double done = total_steps_ > 0 ? static_cast<double>(step_) / static_cast<double>(total_steps_) : 1.0;
  const int filled = static_cast<int>(done * kWidth);
  const double elapsed = now_seconds() - start_seconds_;
  const long taken = step_ - first_step_;
  const double eta = taken > 0 ? elapsed / static_cast<double>(taken) * static_cast<double>(total_steps_ - step_) : 0;
  std::string line = concat("\r", fmt("%3.0f%%", 100 * done), " |", std::string(static_cast<size_t>(filled), '#'),
                            std::string(static_cast<size_t>(kWidth - filled), ' '), "| ", step_, "/", total_steps_,
                            " [", clock_text(elapsed), "<", clock_text(eta), "] loss ", fmt("%.4f", loss_));
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressDisplay::print(const std::string& line) {
  if (!enabled_) return;
  hide();
  log_info(line);
  if (bar_ && step_ > first_step_ && step_ < total_steps_) draw();
}

void ProgressDisplay::step(long step, double loss) {
  step_ = step;
  loss_ = loss;
  if (bar_) draw();
}

void ProgressDisplay::finish() {
  if (!bar_ || !drawn_) return;
  std::fputs("\n", stdout);
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace shardlm

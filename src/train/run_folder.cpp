// The run folder's lock and the checks that it is writable and holds no other run.
#include "run_folder.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "shardlm/core.hpp"

namespace shardlm {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLockName = "lock";

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string slurm_job_id() {
  const char* id = std::getenv("SLURM_JOB_ID");
  return id ? id : "";
}

// Which attempt of a requeued Slurm job this is (0 for the first).
long slurm_restart_count() {
  const char* n = std::getenv("SLURM_RESTART_COUNT");
  return n ? std::strtol(n, nullptr, 10) : 0;
}

// The lock's fields ("host", "pid", "slurm_job_id", "started"), one "key=value" a line.
std::string lock_text() {
  const std::time_t now = std::time(nullptr);
  char when[64] = {};
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return concat("host=", host_name(), "\npid=", ::getpid(), "\nslurm_job_id=", slurm_job_id(),
                "\nslurm_restart_count=", slurm_restart_count(), "\nstarted=", when, "\n");
}

struct LockOwner {
  std::string host, pid, slurm_job_id, started;
  long slurm_restart_count = 0;
  std::string describe() const {
    return concat("host ", host.empty() ? "?" : host, ", PID ", pid.empty() ? "?" : pid,
                  slurm_job_id.empty() ? std::string() : concat(", Slurm job ", slurm_job_id),
                  started.empty() ? std::string() : concat(", since ", started));
  }
};

LockOwner read_owner(const std::string& path) {
  LockOwner o;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = clip_for_message(line.substr(eq + 1), 100);
    if (key == "host") o.host = value;
    if (key == "pid") o.pid = value;
    if (key == "slurm_job_id") o.slurm_job_id = value;
    if (key == "started") o.started = value;
    if (key == "slurm_restart_count") o.slurm_restart_count = std::strtol(value.c_str(), nullptr, 10);
  }
  return o;
}

// Whether the job that wrote the lock is provably gone: an earlier attempt of this requeued Slurm
// job (same job id, lower SLURM_RESTART_COUNT: Slurm ended it before starting this one), or a PID
// that no longer runs on this host. A lock from another host is never proven stale otherwise.
bool provably_stale(const LockOwner& o) {
  if (!o.slurm_job_id.empty() && o.slurm_job_id == slurm_job_id() && o.slurm_restart_count < slurm_restart_count())
    return true;
  if (o.host != host_name() || o.pid.empty()) return false;
  char* end = nullptr;
  const long pid = std::strtol(o.pid.c_str(), &end, 10);
  if (*end != '\0' || pid <= 0) return false;
  if (pid == ::getpid()) return false;  // this very process: a second lock in one process is a mistake
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

RunFolderLock::RunFolderLock(const std::string& run_dir) {
  const std::string path = (fs::path(run_dir) / kLockName).string();
  const std::string text = lock_text();
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      try {
        write_all(fd, text, "run folder lock", path);
      } catch (const Error&) {
        ::close(fd);
        ::unlink(path.c_str());
        throw;
      }
      ::close(fd);
      path_ = path;
      return;
    }
    if (errno != EEXIST) throw Error(concat("cannot create the run folder lock '", path, "': ", std::strerror(errno)));
    const LockOwner owner = read_owner(path);
    if (attempt > 0 || !provably_stale(owner))
      throw Error(concat("run.dir = '", run_dir, "' is in use by another job (", owner.describe(),
                         "): two jobs must not share a run folder. Choose another run.dir, or, if that job is "
                         "gone, delete '", path, "'"));
    log_info(concat("warning: breaking the stale lock '", path, "' of a job that has ended (", owner.describe(), ")"));
    ::unlink(path.c_str());
  }
}

RunFolderLock::~RunFolderLock() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

RunFolderLock& RunFolderLock::operator=(RunFolderLock&& o) noexcept {
  if (this != &o) {
    if (!path_.empty()) ::unlink(path_.c_str());
    path_ = std::move(o.path_);
    o.path_.clear();
  }
  return *this;
}

void check_output_folders(const RunConfig& cfg) {
  check_writable_folder(cfg.run.dir, "run.dir");
  check_writable_folder(cfg.checkpoint_dir(), cfg.checkpoint.dir.empty() ? "checkpoint.dir (RUN_DIR/checkpoints)"
                                                                          : "checkpoint.dir");
}

std::string claim_run_folder(const RunConfig& cfg) {
  static const std::regex checkpoint_file(R"(ckpt-\d{8,}\.h5(\.tmp)?|latest(\.tmp)?)");
  std::vector<fs::path> found;
  for (const char* name : {"metrics.jsonl", "predictions.json"}) {
    // An empty metrics file is a run that failed before its first record (a bad size, say).
    const fs::path p = fs::path(cfg.run.dir) / name;
    std::error_code ec;
    if (fs::exists(p) && !(fs::is_regular_file(p) && fs::file_size(p, ec) == 0)) found.push_back(p);
  }
  size_t checkpoints = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(cfg.checkpoint_dir())) {
    if (!e.is_regular_file() || !std::regex_match(e.path().filename().string(), checkpoint_file)) continue;
    found.push_back(e.path());
    if (e.path().extension() == ".h5") ++checkpoints;
  }
  // Weights only start a new run: it must not mix with an earlier one either.
  if (found.empty() || (cfg.checkpoint.resume != ResumeFrom::None && !cfg.checkpoint.load_weights_only)) return "";
  std::ostringstream list;
  size_t listed = 0;
  for (const fs::path& p : found) {
    if (p.extension() == ".h5" || p.extension() == ".tmp" || p.filename() == "latest") continue;
    list << (listed++ ? ", " : "") << p.filename().string();
  }
  if (checkpoints > 0) list << (listed++ ? ", " : "") << checkpoints << " checkpoint(s) in " << cfg.checkpoint_dir();
  if (!cfg.run.overwrite)
    throw Error(concat("run.dir = '", cfg.run.dir, "' already holds a run (", list.str(),
                       "): set checkpoint.resume = auto to continue it, run.overwrite = true to replace it, or "
                       "choose another run.dir"));
  // The earlier run's step timelines (run.trace_step) go with it.
  static const std::regex trace_file(R"(trace_step\d+_rank\d+\.json)");
  for (const fs::directory_entry& e : fs::directory_iterator(cfg.run.dir))
    if (e.is_regular_file() && std::regex_match(e.path().filename().string(), trace_file)) found.push_back(e.path());
  for (const fs::path& p : found) {
    std::error_code ec;
    fs::remove(p, ec);
    if (ec) throw Error(concat("run.overwrite: cannot delete '", p.string(), "': ", ec.message()));
  }
  return concat("run.overwrite = true: replaced the earlier run in ", cfg.run.dir, " (", list.str(), ")");
}

}  // namespace shardlm

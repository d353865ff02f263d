// The run folder's lock and the checks that it is writable and holds no other run.
#include "run_folder.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
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
  std::unique_ptr<std::istream> file;
  try {
    file = open_input_file(path, "run folder lock", kMaxDeckBytes);
  } catch (const Error&) {
    return o;  // not a lock file shardlm wrote (a pipe, a folder): no owner to name
  }
  std::istream& in = *file;
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

namespace {

// Creates the lock file FOLDER/lock (Error naming `key` and the owner when another job holds it);
// returns its path.
std::string take_lock(const std::string& folder, const std::string& key, const std::string& what) {
  const std::string path = (fs::path(folder) / kLockName).string();
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
      return path;
    }
    if (errno != EEXIST) throw Error(concat("cannot create the run folder lock '", path, "': ", std::strerror(errno)));
    const LockOwner owner = read_owner(path);
    if (attempt > 0 || !provably_stale(owner))
      throw Error(concat(key, " = '", folder, "' is in use by another job (", owner.describe(), "; lock '", path,
                         "'): two jobs must not share a ", what, ". Choose another ", key, ", or, if that job is "
                         "gone, delete '", path, "'"));
    log_info(concat("warning: breaking the stale lock '", path, "' of a job that has ended (", owner.describe(), ")"));
    ::unlink(path.c_str());
  }
  throw Error(concat("cannot take the lock '", path, "'"));
}

// Whether A and B name one folder (both exist: check_output_folders made them).
bool same_folder(const std::string& a, const std::string& b) {
  std::error_code ec;
  const bool same = fs::equivalent(a, b, ec);
  return !ec && same;
}

}  // namespace

RunFolderLock::RunFolderLock(const std::string& run_dir, const std::string& checkpoint_dir) {
  paths_.push_back(take_lock(run_dir, "run.dir", "run folder"));
  if (checkpoint_dir.empty() || same_folder(run_dir, checkpoint_dir)) return;
  try {
    paths_.push_back(take_lock(checkpoint_dir, "checkpoint.dir", "checkpoint folder"));
  } catch (...) {
    release();
    throw;
  }
}

void RunFolderLock::release() noexcept {
  for (const std::string& p : paths_) ::unlink(p.c_str());
  paths_.clear();
}

RunFolderLock& RunFolderLock::operator=(RunFolderLock&& o) noexcept {
  if (this != &o) {
    release();
    paths_ = std::move(o.paths_);
    o.paths_.clear();
  }
  return *this;
}

bool holds_run_records(const std::string& run_dir) {
  std::error_code ec;
  for (const char* name : {"metrics.jsonl", "predictions.json"}) {
    const fs::path p = fs::path(run_dir) / name;
    if (fs::is_regular_file(p, ec) && fs::file_size(p, ec) > 0) return true;
  }
  return fs::is_regular_file(fs::path(run_dir) / "deck.resolved.ini", ec);
}

void check_output_folders(const RunConfig& cfg) {
  check_writable_folder(cfg.run.dir, "run.dir");
  check_writable_folder(cfg.checkpoint_dir(), cfg.checkpoint.dir.empty() ? "checkpoint.dir (RUN_DIR/checkpoints)"
                                                                          : "checkpoint.dir");
}

RunReplacement claim_run_folder(const RunConfig& cfg, const std::string& resume_path) {
  static const std::regex checkpoint_file(R"(ckpt-\d{8,}\.h5(\.tmp)?|(latest|best)(\.tmp)?)");
  // A new run unless it resumes a checkpoint: resume = none, auto with none to resume, and loading weights only
  // all start one, which must neither mix with an earlier run nor truncate its records.
  const bool fresh = cfg.checkpoint.load_weights_only || resume_path.empty();
  std::error_code ec;
  for (const std::string& folder : {cfg.run.dir, cfg.checkpoint_dir()}) {
    const fs::path aside = fs::path(folder) / kReplacedRunFolder;
    if (fresh && fs::exists(fs::symlink_status(aside, ec)))
      throw Error(concat(folder == cfg.run.dir ? "run.dir" : "checkpoint.dir", " = '", folder, "': ", aside.string(),
                         " holds an earlier run set aside by a run.overwrite that stopped before its first step: "
                         "move its files back into ", folder, ", or delete it, before starting a new run there"));
  }
  std::vector<fs::path> found;
  for (const char* name : {"metrics.jsonl", "predictions.json"}) {
    // A run's records are non-empty files: an empty one is a run that failed before its first record (a bad
    // size, say), and a pipe or a device holds none (writing to it then fails, naming the cause).
    const fs::path p = fs::path(cfg.run.dir) / name;
    if (fs::is_regular_file(p, ec) && fs::file_size(p, ec) > 0) found.push_back(p);
  }
  size_t checkpoints = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(cfg.checkpoint_dir())) {
    if (!e.is_regular_file() || !std::regex_match(e.path().filename().string(), checkpoint_file)) continue;
    found.push_back(e.path());
    if (e.path().extension() == ".h5") ++checkpoints;
  }
  // Weights only start a new run: it must not mix with an earlier one either.
  if (found.empty() || !fresh) return {};
  std::ostringstream list;
  size_t listed = 0;
  for (const fs::path& p : found) {
    if (p.extension() == ".h5" || p.extension() == ".tmp" || p.filename() == "latest" || p.filename() == "best") continue;
    list << (listed++ ? ", " : "") << p.filename().string();
  }
  if (checkpoints > 0) list << (listed++ ? ", " : "") << checkpoints << " checkpoint(s) in " << cfg.checkpoint_dir();
  if (!cfg.run.overwrite) {
    const char* remedy =
        cfg.checkpoint.load_weights_only
            ? "loading weights only (checkpoint.load_weights_only) starts a new run; set run.overwrite = true to "
              "replace it"
        : cfg.checkpoint.resume == ResumeFrom::Auto
            ? "it has no checkpoint to continue from (checkpoint.resume = auto); set run.overwrite = true to replace it"
            : "set checkpoint.resume = auto to continue it, run.overwrite = true to replace it";
    throw Error(concat("run.dir = '", cfg.run.dir, "' already holds a run (", list.str(), "): ", remedy,
                       ", or choose another run.dir"));
  }
  // The earlier run's resolved deck, identity and step timelines (run.trace_step) go with it.
  static const std::regex trace_file(R"(trace_step\d+_rank\d+\.json)");
  for (const fs::directory_entry& e : fs::directory_iterator(cfg.run.dir)) {
    const std::string name = e.path().filename().string();
    const bool is_new = std::find(found.begin(), found.end(), e.path()) == found.end();
    if (is_new && e.is_regular_file() && !e.is_symlink() &&
        (name == "deck.resolved.ini" || name == "run_id" || name == "metrics.jsonl" || std::regex_match(name, trace_file)))
      found.push_back(e.path());
  }
  // Its TensorBoard events files too, so TensorBoard does not show the two runs as one.
  static const std::regex events_file(R"(events\.out\.tfevents\..*)");
  const fs::path tensorboard = fs::path(cfg.run.dir) / "tensorboard";
  if (fs::is_directory(tensorboard, ec))
    for (const fs::directory_entry& e : fs::directory_iterator(tensorboard))
      if (e.is_regular_file() && !e.is_symlink() && std::regex_match(e.path().filename().string(), events_file))
        found.push_back(e.path());
  return RunReplacement(std::move(found), cfg.run.dir, list.str());
}

RunReplacement::RunReplacement(std::vector<fs::path> files, std::string run_dir, std::string description)
    : files_(std::move(files)), run_dir_(std::move(run_dir)), description_(std::move(description)) {}

RunReplacement::~RunReplacement() { put_back(); }

RunReplacement& RunReplacement::operator=(RunReplacement&& o) noexcept {
  if (this != &o) {
    put_back();
    files_ = std::move(o.files_);
    run_dir_ = std::move(o.run_dir_);
    description_ = std::move(o.description_);
    moved_ = std::move(o.moved_);
    aside_folders_ = std::move(o.aside_folders_);
    new_files_ = std::move(o.new_files_);
    o.files_.clear();
    o.moved_.clear();
    o.aside_folders_.clear();
  }
  return *this;
}

std::string RunReplacement::set_aside(const std::vector<fs::path>& new_files) {
  if (files_.empty() || !moved_.empty()) return "";
  std::error_code ec;
  for (const fs::path& file : files_) {
    const fs::path folder = file.parent_path() / kReplacedRunFolder;
    if (std::find(aside_folders_.begin(), aside_folders_.end(), folder) == aside_folders_.end()) {
      const bool made = fs::create_directory(folder, ec);
      if (!made || ec) {
        put_back();
        throw Error(concat("run.overwrite: cannot create ", folder.string(), " to set the earlier run aside: ",
                           ec ? ec.message() : std::string("it exists")));
      }
      aside_folders_.push_back(folder);
    }
    const fs::path to = folder / file.filename();
    fs::rename(file, to, ec);
    if (ec) {
      const std::string reason = ec.message();
      put_back();
      throw Error(concat("run.overwrite: cannot move '", file.string(), "' into ", folder.string(), ": ", reason,
                         " (the earlier run is left as it was)"));
    }
    moved_.push_back({file, to});
  }
  new_files_ = new_files;
  return concat("run.overwrite = true: the earlier run in ", run_dir_, " (", description_, ") is set aside in ",
                kReplacedRunFolder, " until this run's first logged step");
}

std::string RunReplacement::keep_new_run() {
  if (moved_.empty()) return "";
  std::error_code ec;
  for (const Moved& m : moved_) fs::remove(m.to, ec);
  for (const fs::path& folder : aside_folders_) fs::remove(folder, ec);  // only when empty: nothing else goes
  moved_.clear();
  aside_folders_.clear();
  files_.clear();
  return concat("run.overwrite = true: replaced the earlier run in ", run_dir_, " (", description_, ")");
}

void RunReplacement::put_back() noexcept {
  if (moved_.empty() && aside_folders_.empty()) return;
  std::error_code ec;
  for (const fs::path& p : new_files_) {
    const bool replaces = std::any_of(moved_.begin(), moved_.end(), [&](const Moved& m) { return m.from == p; });
    if (!replaces) fs::remove(p, ec);  // the failed start's own file; one of the same name is renamed over
  }
  bool all_back = true;
  for (const Moved& m : moved_) {
    fs::rename(m.to, m.from, ec);
    if (ec) {
      all_back = false;
      log_info(concat("warning: run.overwrite: cannot put '", m.to.string(), "' back as '", m.from.string(), "': ",
                      ec.message()));
    }
  }
  for (const fs::path& folder : aside_folders_) fs::remove(folder, ec);
  if (all_back && !moved_.empty())
    log_info(concat("run.overwrite = true: this run stopped before its first step; the earlier run in ", run_dir_,
                    " is back as it was"));
  moved_.clear();
  aside_folders_.clear();
  new_files_.clear();
}

}  // namespace shardlm

// Checkpoint files on disk: the rename that publishes a checkpoint, the DIR/latest pointer,
// keep-last pruning, and which checkpoint checkpoint.resume (resolve_resume) or a path (resolve_checkpoint_path) means.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "checkpoint_format.hpp"

namespace shardlm {
namespace {

using namespace ckpt;
namespace fs = std::filesystem;

// fsync a file or folder so a rename or a new name survives a crash of the node.
void sync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(concat("cannot open '", path, "' to sync it: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on a folder; the data itself was synced before.
  if (rc != 0 && err != EINVAL && err != EBADF) throw Error(concat("cannot sync '", path, "': ", std::strerror(err)));
}

void rename_path(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) throw Error(concat("cannot rename '", from, "' to '", to, "': ", ec.message()));
}

// Writes DIR/latest (the checkpoint's file name on one line) through latest.tmp and a rename; on a
// failure latest still names the previous checkpoint.
void write_latest(const std::string& dir, const std::string& name) {
  replace_file((fs::path(dir) / kLatestFile).string(), name + "\n", "checkpoint pointer");
}

struct Found {
  long step;
  fs::path path;
};

// Files named ckpt-<8+ digits>.h5 (or .h5.tmp when `temporaries`), oldest step first.
std::vector<Found> list_checkpoints(const std::string& dir, bool temporaries) {
  // 8 to 18 digits: a step past what a long holds is no checkpoint of ours (std::stol would throw).
  static const std::regex finished(R"(ckpt-(\d{8,18})\.h5)"), unfinished(R"(ckpt-(\d{8,18})\.h5\.tmp)");
  std::vector<Found> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(name, m, temporaries ? unfinished : finished))
      found.push_back({std::stol(m[1].str()), e.path()});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.step < b.step; });
  return found;
}

void remove_file(const fs::path& path) {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec) throw Error(concat("cannot delete old checkpoint '", path.string(), "': ", ec.message()));
}

// The file DIR/latest names (relative to DIR), or "" when DIR has no latest file.
std::string latest_target(const std::string& dir) {
  const fs::path latest = fs::path(dir) / kLatestFile;
  if (!fs::exists(latest)) return "";
  // A checkpoint file's name is one short line: a longer pointer is not one shardlm wrote.
  std::istringstream in(read_input_file(latest.string(), "checkpoint pointer", 4096));
  std::string name;
  std::getline(in, name);
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  SHARDLM_CHECK(!name.empty(), "checkpoint pointer '", latest.string(), "' is empty");
  const fs::path target = fs::path(dir) / name;
  SHARDLM_CHECK(fs::is_regular_file(target), "checkpoint pointer '", latest.string(), "' names '",
                clip_for_message(name, 100), "', which does not exist or is not a regular file");
  return target.string();
}

}  // namespace

namespace ckpt {

void prune_checkpoints(const std::string& dir, int keep_last, const std::string& keep_name, const std::string& newest) {
  const std::vector<Found> finished = list_checkpoints(dir, false);
  // The best checkpoint (keep_name) is kept beside the last keep_last, not counted among them.
  std::vector<Found> counted;
  for (const Found& f : finished)
    if (keep_name.empty() || f.path.filename() != keep_name || keep_name == newest) counted.push_back(f);
  if (keep_last > 0 && counted.size() > static_cast<size_t>(keep_last)) {
    const size_t extra = counted.size() - static_cast<size_t>(keep_last);
    for (size_t i = 0; i < extra; ++i) {
      // Never delete the checkpoint just written, even if an older run left higher steps here.
      if (counted[i].path.filename() != newest) remove_file(counted[i].path);
    }
  }
}

void publish_checkpoint(const std::string& dir, const std::string& tmp_path, const std::string& final_path,
                        int keep_last, const std::string& keep_name) {
  try {
    sync_path(tmp_path);
    rename_path(tmp_path, final_path);
  } catch (const Error&) {
    std::error_code ignored;
    fs::remove(tmp_path, ignored);  // not synced: nothing a resume may pick up
    throw;
  }
  sync_path(dir);
  const std::string name = fs::path(final_path).filename().string();
  write_latest(dir, name);
  sync_path(dir);

  prune_checkpoints(dir, keep_last, keep_name, name);
  // Any other temporary belongs to a job killed mid-write (this job holds the folder's lock).
  for (const Found& t : list_checkpoints(dir, true)) remove_file(t.path);
}

}  // namespace ckpt

std::string remove_unfinished_checkpoints(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return "";
  std::string names;
  size_t count = 0;
  for (const Found& t : list_checkpoints(dir, true)) {
    remove_file(t.path);
    names += (count++ ? ", " : "") + t.path.filename().string();
  }
  if (count == 0) return "";
  return concat("removed ", count, " unfinished checkpoint write(s) of a job stopped while writing (", names,
                ") from ", dir);
}

void write_best_pointer(const std::string& dir, const std::string& name, double eval_loss, int keep_last) {
  char loss[64];
  std::snprintf(loss, sizeof loss, "%.17g", eval_loss);
  replace_file((fs::path(dir) / kBestFile).string(), concat(name, "\neval_loss ", loss, "\n"), "best checkpoint pointer");
  sync_path(dir);
  // The best before this one goes now if keep_last would have pruned it.
  const std::string latest = latest_target(dir);
  prune_checkpoints(dir, keep_last, name, latest.empty() ? name : fs::path(latest).filename().string());
}

bool read_best_pointer(const std::string& dir, std::string* name, double* eval_loss) {
  std::error_code ec;
  // (A pipe or a folder in its place is no pointer: stat first, so that open() cannot wait on it.)
  if (!fs::is_regular_file(fs::path(dir) / kBestFile, ec)) return false;
  std::ifstream in(fs::path(dir) / kBestFile);
  if (!in) return false;
  std::string file, word;
  double loss = 0;
  if (!std::getline(in, file) || !(in >> word >> loss) || word != "eval_loss" || file.empty()) return false;
  if (!fs::is_regular_file(fs::path(dir) / file, ec)) return false;
  *name = file;
  *eval_loss = loss;
  return true;
}

std::vector<std::string> resume_candidates(const std::string& dir, std::string* note) {
  std::vector<std::string> out;
  if (dir.empty() || !fs::is_directory(dir)) return out;
  std::string latest;
  const std::vector<Found> finished = list_checkpoints(dir, false);
  try {
    latest = latest_target(dir);
  } catch (const Error& e) {
    if (finished.empty()) throw;  // a pointer to checkpoints that are all gone: not a fresh start
    if (note) *note = concat(e.what(), ": trying the checkpoints in the folder, newest first");
  }
  if (!latest.empty()) out.push_back(latest);
  if (latest.empty() && !finished.empty() && note && note->empty())
    *note = concat("checkpoint folder ", dir, " has no '", kLatestFile,
                   "' pointer: trying its checkpoints, newest first");
  // Older ones follow (a crash between a checkpoint's rename and latest's leaves a newer complete
  // file, which latest still outranks).
  long below = std::numeric_limits<long>::max();
  if (!latest.empty()) {
    for (const Found& f : finished)
      if (f.path.string() == latest || fs::equivalent(f.path, latest)) below = f.step;
  }
  for (auto it = finished.rbegin(); it != finished.rend(); ++it)
    if (it->step < below) out.push_back(it->path.string());
  return out;
}

std::string resolve_resume(ResumeFrom from, const std::string& path, const std::string& dir) {
  switch (from) {
    case ResumeFrom::None: return "";
    case ResumeFrom::Auto: {
      const std::vector<std::string> found = resume_candidates(dir, nullptr);
      return found.empty() ? "" : found.front();
    }
    case ResumeFrom::Path: break;
  }
  return resolve_checkpoint_path(path);
}

std::string run_checkpoint_folder(const std::string& run_dir) {
  const fs::path resolved = fs::path(run_dir) / "deck.resolved.ini";
  std::error_code ec;
  if (fs::is_regular_file(resolved, ec)) {
    const std::map<std::string, std::string> deck =
        ini_values(read_input_file(resolved.string(), "resolved deck", kMaxDeckBytes), resolved.string());
    if (const auto it = deck.find("checkpoint.dir"); it != deck.end() && !it->second.empty()) return it->second;
  }
  return (fs::path(run_dir) / "checkpoints").string();
}

std::string resolve_checkpoint_path(const std::string& spec, const std::string& what) {
  SHARDLM_CHECK(fs::exists(spec), what, ": '", spec, "' does not exist");
  if (fs::is_directory(spec)) {
    std::string target = latest_target(spec);
    const std::string in_run = run_checkpoint_folder(spec);
    if (target.empty() && fs::is_directory(in_run)) target = latest_target(in_run);
    // A resolved deck from before checkpoint.dir was kept absolute may name it relative to where that run started.
    const char* relative = fs::path(in_run).is_relative() && fs::path(in_run) != fs::path(spec) / "checkpoints"
                               ? ", relative to the folder the run started in: name the checkpoint folder instead"
                               : "";
    SHARDLM_CHECK(!target.empty(), what, ": folder '", spec, "' holds no checkpoint (no '", kLatestFile,
                  "' file in it, nor in ", in_run, " as a run folder", relative, ")");
    return target;
  }
  return spec;
}

}  // namespace shardlm

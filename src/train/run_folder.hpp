// A run folder belongs to one job: the lock rank 0 holds on RUN_DIR while it trains, and the check
// that a new run does not mix with an earlier one left there.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "shardlm/config.hpp"

namespace shardlm {

// RUN_DIR/lock, holding the host, PID, Slurm job id, Slurm restart count and start time of the job
// that owns the folder, and the same file in the checkpoint folder when it is another folder (two
// jobs with their own run.dir must not share a checkpoint.dir either). Taken by the constructor,
// removed by the destructor. A lock left by a job that is provably gone (same host and its PID no
// longer runs, or an earlier attempt of this requeued Slurm job) is broken with a warning; any other
// existing lock is an Error naming the key, the lock file and its owner.
class RunFolderLock {
 public:
  RunFolderLock() = default;
  explicit RunFolderLock(const std::string& run_dir, const std::string& checkpoint_dir = "");
  ~RunFolderLock() { release(); }
  RunFolderLock(RunFolderLock&& o) noexcept : paths_(std::move(o.paths_)) { o.paths_.clear(); }
  RunFolderLock& operator=(RunFolderLock&& o) noexcept;
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

 private:
  void release() noexcept;
  std::vector<std::string> paths_;  // the lock files held
};

// Rank 0, before anything is written: creates run.dir and the checkpoint folder and checks a file
// can be created in each (Error naming the key and the reason).
void check_output_folders(const RunConfig& cfg);

// The earlier run's files that a fresh run with run.overwrite = true replaces. Nothing moves until
// set_aside(), called once the new run has passed every check before its first step: its files go
// into a folder .replaced-run beside them (RUN_DIR's, checkpoint.dir's). keep_new_run(), after the
// new run's first logged step or checkpoint, removes them; until then the destructor (a failed
// start) removes the new run's `new_files` and puts every set-aside file back as it was.
class RunReplacement {
 public:
  RunReplacement() = default;
  RunReplacement(std::vector<std::filesystem::path> files, std::string run_dir, std::string description);
  ~RunReplacement();
  RunReplacement(RunReplacement&& o) noexcept { *this = std::move(o); }
  RunReplacement& operator=(RunReplacement&& o) noexcept;
  RunReplacement(const RunReplacement&) = delete;
  RunReplacement& operator=(const RunReplacement&) = delete;

  bool empty() const { return files_.empty(); }
  // Moves the files aside; returns the line saying so. `new_files`: what the new run writes in
  // their place (removed again when it fails before its first step).
  std::string set_aside(const std::vector<std::filesystem::path>& new_files);
  // Removes the set-aside files; returns the line saying what was replaced ("" when nothing was).
  std::string keep_new_run();

 private:
  struct Moved {
    std::filesystem::path from, to;
  };
  void put_back() noexcept;

  std::vector<std::filesystem::path> files_;
  std::string run_dir_, description_;
  std::vector<Moved> moved_;
  std::vector<std::filesystem::path> aside_folders_, new_files_;
};

// Whether run_dir holds an earlier run's records: a non-empty metrics.jsonl or predictions.json, or its
// deck.resolved.ini.
bool holds_run_records(const std::string& run_dir);

// The folder an overwrite sets the earlier run's files aside in, inside each folder they were in.
constexpr const char* kReplacedRunFolder = ".replaced-run";

// Rank 0, holding the lock: a folder that already holds a run (metrics, predictions, checkpoints)
// is an Error for a fresh run (no checkpoint to resume, or checkpoint.load_weights_only: a new run
// from a checkpoint's weights) unless run.overwrite = true; then the earlier run's files (with its
// deck.resolved.ini, run_id and step timelines) are returned, not yet touched. A .replaced-run
// folder left by an overwrite that did not reach its first step is an Error naming it.
// `resume_path`: the checkpoint the run resumes (resolve_resume's; empty: none), which decides whether it is new.
RunReplacement claim_run_folder(const RunConfig& cfg, const std::string& resume_path);

}  // namespace shardlm

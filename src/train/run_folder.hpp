// A run folder belongs to one job: the lock rank 0 holds on RUN_DIR while it trains, and the check
// that a new run does not mix with an earlier one left there.
#pragma once

#include <string>

#include "shardlm/config.hpp"

namespace shardlm {

// RUN_DIR/lock, holding the host, PID, Slurm job id, Slurm restart count and start time of the job
// that owns the folder. Taken by the constructor, removed by the destructor. A lock left by a job
// that is provably gone (same host and its PID no longer runs, or an earlier attempt of this
// requeued Slurm job) is broken with a warning; any other existing lock is an Error naming its owner.
class RunFolderLock {
 public:
  RunFolderLock() = default;
  explicit RunFolderLock(const std::string& run_dir);
  ~RunFolderLock();
  RunFolderLock(RunFolderLock&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  RunFolderLock& operator=(RunFolderLock&& o) noexcept;
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

 private:
  std::string path_;  // empty: holds no lock
};

// Rank 0, before anything is written: creates run.dir and the checkpoint folder and checks a file
// can be created in each (Error naming the key and the reason).
void check_output_folders(const RunConfig& cfg);

// Rank 0, holding the lock: a folder that already holds a run (metrics, predictions, checkpoints)
// is an Error for a fresh run (checkpoint.resume = none, or checkpoint.load_weights_only: a new run
// from a checkpoint's weights) unless run.overwrite = true; then the
// earlier run's files are deleted and the line returned says what was replaced ("" when nothing).
std::string claim_run_folder(const RunConfig& cfg);

}  // namespace shardlm

// train: the loop of a run (epochs, gradient accumulation, clipping, AdamW, evaluation, metrics).
#pragma once

#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "shardlm/config.hpp"

namespace shardlm {

struct TrainOptions {
  bool echo = true;  // print the resolved deck and progress lines on rank 0 of the run's communicator
};

// What a finished run measured; the same on every rank.
struct TrainResult {
  std::vector<double> step_losses;  // mean token loss of every optimizer step this run took
  std::vector<double> grad_norms;   // global gradient norm of every step, before clipping
  std::vector<double> eval_losses;  // one per evaluation (each epoch, every eval.every_steps) when there is an eval set
  double exact_match = NAN;         // SQuAD EM / F1 (percent) of the last generation, NaN when none ran
  double f1 = NAN;
  double train_loss = 0;            // mean of step_losses
  double train_runtime = 0;         // seconds
  double train_samples_per_second = 0;
  size_t peak_memory_bytes = 0;     // largest over ranks of the planned-buffer high-water mark
  size_t peak_rss_bytes = 0;        // largest over ranks of the process resident high-water mark
  size_t master_shard_bytes = 0;    // this rank's fp32 master slices
  size_t grad_shard_bytes = 0;      // this rank's fp32 grad slices
  size_t optimizer_bytes = 0;       // this rank's optimizer state on the device (AdamW's moments, or their 8-bit
                                    // codes; offloaded, the root's resident moments only)
  size_t model_params = 0;          // parameters of the whole model
  long first_step = 0;              // optimizer steps done before this run (resumed runs)
  double mfu = 0;                   // model FLOPs utilisation over the run (0 without a peak: CPU, fp32, GPU unknown)
  long skipped_steps = 0;           // steps skipped for an inf/NaN gradient (dynamic loss scaling)
  double loss_scale = 1;            // the loss scale at the end (1 when scaling is off)
  bool preempted = false;           // stopped by SIGTERM/SIGUSR1/SIGUSR2 after writing a checkpoint
  bool nothing_to_do = false;       // resumed from a checkpoint at the run's last step: nothing trained or recorded
  std::string last_checkpoint;      // path of the last checkpoint written, if any
  bool early_stopped = false;       // train.early_stopping_patience evaluations without improvement
  std::string best_checkpoint;      // checkpoint.keep_best: the checkpoint of the best eval loss, if any
};

// Trains the model the config describes on the ranks of `comm`, writing metrics.jsonl and the
// resolved deck into cfg.run.dir (rank 0 of comm). Throws Error consistently on all ranks for
// anything wrong with the setup.
TrainResult train(const RunConfig& cfg, MPI_Comm comm, const TrainOptions& options = {});

// SIGTERM, SIGUSR1 and SIGUSR2 ask a run to stop: the handler sets a flag, and at its next step
// boundary train() writes a checkpoint and returns with `preempted`. `shardlm train` installs them
// first thing, before MPI starts, so that a signal during start-up stops the run at its first step
// instead of killing it; train() installs them again for callers in code. A request waits for the
// run that acts on it.
void install_stop_signals();

}  // namespace shardlm

// The state of one training run and the parts train() is made of: setup (train_setup.cpp), one
// optimizer step (train_step.cpp), its log line (train_log.cpp), the epoch's evaluation
// (train_eval.cpp) and the closing summary (train_summary.cpp).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine.hpp"
#include "metrics.hpp"
#include "run_folder.hpp"
#include "tensorboard.hpp"
#include "shardlm/config.hpp"
#include "shardlm/data.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/optim.hpp"
#include "shardlm/train.hpp"

namespace shardlm {

// The peak one rank's device is measured against for the MFU, and where it came from.
struct MfuPeak {
  double tflops = 0;   // 0: no MFU
  std::string source;  // "run.peak_tflops", "built-in", "SHARDLM_GPU_PEAKS" or "none"
  std::string line;    // the start-up log line saying so
};

// What setup builds and the loop reads: the data, the engine and the run's fixed shape.
struct TrainRun {
  TrainRun(const RunConfig& cfg, MPI_Comm comm, const TrainOptions& options);
  void say(const std::string& line) { progress.print(line); }
  // Writes a metrics record (rank 0 only); after a resume it carries the run's "segment". Records
  // of the setup wait until open_run_outputs opens the file.
  void record(nlohmann::json j) {
    if (rank != 0) return;
    if (segment > 0) j["segment"] = segment;
    if (outputs_open) metrics.write(j);
    else pending_records.push_back(std::move(j));
  }
  // After the first logged step or checkpoint: an earlier run that run.overwrite set aside goes.
  void keep_new_run() {
    const std::string line = replacement.keep_new_run();
    if (!line.empty()) say(line);
  }

  const RunConfig& cfg;
  MPI_Comm comm;
  int rank = 0, world = 1;
  bool echo = false;  // this rank prints the deck, the log lines and the summary
  ProgressDisplay progress;
  RunFolderLock lock;     // held by rank 0 for the whole run
  MetricsWriter metrics;  // open on rank 0 only, from open_run_outputs
  bool outputs_open = false;
  std::vector<nlohmann::json> pending_records;  // the setup's, until the file is open
  // Rank 0, run.overwrite: the earlier run, put back if this one fails before its first logged step.
  RunReplacement replacement;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_hash;  // what each checkpoint keeps of it (tokenizer_hash), read once at start
  std::string base_checksum;   // LoRA: the frozen base weights' checksum (CheckpointMeta::base_checksum)
  std::vector<Example> train_set, eval_set;
  // examples_hash of train_set (CheckpointMeta::train_data_hash keeps its hex_digits), from load_inputs.
  uint64_t train_data_hash = 0;
  // SQuAD answers are generated and scored (exact match, F1) when the deck asks for it.
  bool generate_answers = false;
  std::vector<SquadQuestion> questions;
  // RUN_DIR/run_id, the same on every rank; empty until load_start when a resumed run's folder has
  // none yet (it then takes the checkpoint's).
  std::string run_id;
  std::string resume_path;  // empty: a fresh run
  long resume_step = -1;    // the step resume_path was written at (-1: a fresh run)
  // 0 for a run's first process; the k-th resume of the run (maybe on another world) is segment k.
  int segment = 0;
  bool finished = false;    // resumed from a checkpoint at or past total_steps: nothing to train
  Topology topo;
  int micro = 1, accum = 1;
  std::unique_ptr<FsdpEngine> engine;
  std::optional<DistributedSampler> sampler;
  long steps_per_epoch = 0, total_steps = 0;
  double flops_per_token = 0;  // training FLOPs (forward + backward) per token, for the MFU
  MfuPeak peak;                // of one rank's device, for the MFU
  std::unique_ptr<TensorBoardWriter> tensorboard;  // rank 0 with run.tensorboard, from open_run_outputs
};

// Where the run is: steps run, the position in the data after the last of them, and the dynamic loss
// scale.
struct TrainPosition {
  long step = 0;          // with those skipped on overflow (FsdpEngine::optimizer_steps counts the updates taken)
  int epoch = 0;          // `epoch_step` steps done in `epoch`
  long epoch_step = 0;
  // Epochs done, fractional (the logs' `epoch`): the position in the data, which after a resume with another
  // global batch (checkpoint.allow_new_batch) is not step / steps a epoch.
  double epochs_done(long steps_per_epoch) const {
    return epoch + static_cast<double>(epoch_step) / static_cast<double>(steps_per_epoch);
  }
  bool scaling = false;   // dynamic loss scaling (GradScaler's rules) is on
  DynamicLossScale loss_scale;  // value 1 when scaling is off
};

// ---- setup (train_setup.cpp) ----------------------------------------------------------------
// Echoes the deck, creates the run directory, loads tokenizer and data, builds the engine and
// logs the run's shape and memory. Throws AgreedError on every rank for a bad setup. A resume from
// a checkpoint at or past the run's last step sets `finished` and returns before the engine is
// built, writing no record.
std::unique_ptr<TrainRun> setup_run(const RunConfig& cfg, MPI_Comm comm, const TrainOptions& options);
// Warnings for deck keys that do nothing on this backend and topology: fsdp.cpu_offload,
// fsdp.activation_checkpointing and the CUDA backend's schedule and kernel keys away from their
// defaults on the CPU backend, the hybrid strategies on one node (num_nodes
// real or emulated nodes). Empty when every key set acts.
std::vector<std::string> inert_key_warnings(const RunConfig& cfg, int num_nodes);
// The loss scale to start from and, from a checkpoint (resume) or a Hugging Face directory
// (model.dir), the weights and position to start at. Collective.
TrainPosition load_start(TrainRun& run);
// After every check a run makes before its first step: sets an earlier run aside (run.overwrite),
// writes deck.resolved.ini, opens metrics.jsonl and writes the setup's records. Collective.
void open_run_outputs(TrainRun& run);

// ---- one optimizer step (train_step.cpp) ----------------------------------------------------
struct StepOutcome {
  double loss = 0;      // mean token loss of the global batch
  double grad_norm = 0; // before clipping, loss scale removed
  double lr = 0;        // the schedule's at the optimizer steps taken before this one (a skipped step's too)
  double seconds = 0;   // slowest rank
  int64_t tokens = 0;   // tokens of the global batch
};
// Token positions computed over the first epoch's steps (every rank's), with and without packing,
// against the examples' own tokens: the padding share the start-up log reports.
PaddingShare epoch_padding_share(const TrainRun& run);
// Step `s` of `epoch`: accumulation over the micro-batches, clip and AdamW (or a skipped step on
// overflow, with the loss scale halved). Advances pos.step. Collective.
StepOutcome take_step(TrainRun& run, TrainPosition& pos, int epoch, long s, TrainResult& result);

// ---- logging (train_log.cpp) ----------------------------------------------------------------
// Means since the last log line.
struct LogInterval {
  double loss = 0;
  int steps = 0;
  double seconds = 0;
  int64_t tokens = 0;
};
// Logs the interval ending at pos.step (console line and train record) and clears it; returns the
// logged loss. Collective (the per-rank memory is gathered).
double log_interval(TrainRun& run, const TrainPosition& pos, const StepOutcome& last, LogInterval& interval);
// This rank's peak memory: on a GPU the device's high-water mark; on the CPU the planned buffers.
size_t run_peak_bytes(const FsdpEngine& engine);
// The model FLOPs of training on one token (docs/deck.md, "MFU"): a frozen parameter (LoRA's base)
// costs 4 (forward 2, input gradient 2; no weight gradient), a trained one 6, and the attention's
// score and value products 12 x layers x hidden x seq_len (they have no weights, so LoRA runs them all).
// model_params counts every parameter, trainable_params those trained (all without LoRA).
double model_flops_per_token(size_t model_params, size_t trainable_params, int layers, int hidden, int seq_len);
// Model FLOPs utilisation at `tokens_per_second` over all ranks; 0 without a peak.
double run_mfu(const TrainRun& run, double tokens_per_second);
// The peak of one rank's device: run.peak_tflops when > 0; else, on the CUDA backend with bf16 or
// fp16 parameters, the GPU's dense peak for that dtype from `peaks_file` (SHARDLM_GPU_PEAKS; empty:
// none) or the built-in table; else 0. Error for a malformed peaks file.
MfuPeak resolve_mfu_peak(double peak_tflops, BackendKind backend, const std::string& device_name, DType param_dtype,
                         const std::string& peaks_file);

// ---- evaluation (train_eval.cpp) ------------------------------------------------------------
struct EarlyStopping;
// The eval loss after `pos.epoch` or at `pos.step` inside it (eval.every_steps: epoch_end false), and
// the SQuAD answers when due: at an epoch's end (eval.generate = epoch), at the run's last evaluation,
// which is also one that makes `early` stop the run (end); logged, recorded and written to TensorBoard.
// Collective.
EvalLog evaluate_epoch(TrainRun& run, const TrainPosition& pos, TrainResult& result, bool epoch_end,
                       const EarlyStopping& early);

// Trainer's EarlyStoppingCallback on the eval loss: an evaluation counts against the patience unless
// it is lower than the best before it by more than the threshold; the best is the lowest seen.
struct EarlyStopping {
  int patience = 0;  // 0: never stops
  double threshold = 0;
  bool have_best = false;
  double best = 0;
  int without_improvement = 0;
  // Takes one evaluation's loss; true when training should stop.
  bool should_stop(double eval_loss);
  // Whether should_stop(eval_loss) would say stop, without taking it.
  bool would_stop(double eval_loss) const { return EarlyStopping(*this).should_stop(eval_loss); }
};

// ---- the end (train_summary.cpp) ------------------------------------------------------------
struct RunTotals {
  double seconds = 0;        // this rank's time in the step loop
  int64_t tokens = 0;        // trained this run
  double final_loss = NAN;   // the last logged loss
  std::vector<EvalLog> evals;
};
// Fills the result's totals, prints the closing line and table, writes the summary record. Collective.
void summarize_run(TrainRun& run, const TrainPosition& pos, const RunTotals& totals, TrainResult& result);

}  // namespace shardlm

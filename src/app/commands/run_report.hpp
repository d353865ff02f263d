// `shardlm report`'s model of finished runs: what it reads from a run directory (metrics.jsonl and
// deck.resolved.ini) and the Markdown table, CSV and SVG plots it makes of several runs.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace shardlm {

// One process of a run: the first, or one resume (maybe on another world size). Its records
// follow its 'setup' record in metrics.jsonl.
struct RunSegment {
  int ranks = 0;
  int nodes = 0;
  std::string strategy;
  int grad_accum = 0;   // micro-steps per optimizer step (the setup record's; 0: not recorded)
  long first_step = 0;  // the segment trained steps (first_step, last_step]
  long last_step = 0;   // its summary's, else its last train record's
  bool summary = false;  // it ended with a summary record (finished or preempted by a signal)
  bool preempted = false;
  double train_runtime = NAN;  // seconds, from the summary
  double train_samples_per_second = NAN;
  double train_steps_per_second = NAN;
  double train_loss = NAN;  // mean over the segment's steps
  double steps_run() const;  // from the summary's rate and runtime; NaN without them
};

// One run as its directory records it. NaN marks what the run did not record (no summary line
// from an unfinished run, no EM/F1 without scoring). A resumed run's totals cover every segment
// that ended with a summary.
struct RunRecord {
  std::string name;  // the directory's name
  std::string dir;
  std::string backend;   // run.backend of the resolved deck
  // The last segment's: FULL_SHARD, ... (+ " +offload" with fsdp.cpu_offload on the CUDA backend: on
  // the CPU backend the key does nothing, and the run says so when it starts).
  std::string strategy;
  std::string param_dtype;
  int global_batch = 0;  // train.batch_size of the resolved deck (0: not there)
  int ranks = 0;  // the last segment's
  int nodes = 0;
  double train_samples_per_second = NAN;  // samples over the train runtime of all segments
  double train_loss = NAN;  // mean over the run's steps, all segments
  double final_loss = NAN;  // the last logged train loss
  double peak_memory_bytes = NAN;  // largest over ranks
  // The eval loss at the end of each epoch, by epoch (1, 2, ...): the eval records whose epoch is whole. A
  // resumed run that evaluates an epoch again keeps the later loss.
  std::map<int, double> eval_loss_by_epoch;
  // The evaluations inside an epoch, by step (eval.every_steps, or a last one where train.max_steps or early
  // stopping ended a segment inside an epoch): listed below the table, never as an epoch's.
  struct StepEval {
    double epoch = NAN;
    double loss = NAN;
  };
  std::map<long, StepEval> step_evals;
  double exact_match = NAN;  // the last evaluation's, when scored
  double f1 = NAN;
  std::map<long, double> train_loss_by_step;  // a resumed run's repeated steps keep the last value
  std::vector<RunSegment> segments;  // in order; one for a run never resumed
  std::vector<std::string> warnings;  // "FILE:LINE: ..." for each record skipped as malformed
  // Whether its segments ran on different rank counts: no speed-up or scaling point then.
  bool mixed_ranks() const;
  std::string ranks_text() const;  // "4", or "4 then 2" for a run resumed on another world size
  std::string grad_accum_text() const;  // "4", "4 then 8" likewise, "-" when no segment recorded it
};

// Reads RUN_DIR/metrics.jsonl and RUN_DIR/deck.resolved.ini; Error naming the file when the
// directory or a file is missing or there is no setup record. A malformed line (not JSON, a record
// missing a field) is skipped and named in `warnings`.
RunRecord read_run(const std::string& run_dir);

// Speed-up and parallel efficiency of `run` against `base` (the run with the fewest ranks):
// samples/s ratio, and that ratio over the ranks ratio. NaN when either throughput is unknown or
// either run ran on several rank counts.
double speedup(const RunRecord& run, const RunRecord& base);
double efficiency(const RunRecord& run, const RunRecord& base);
// The index of the run with the fewest ranks (the first of equals).
size_t base_run(const std::vector<RunRecord>& runs);

std::string report_markdown(const std::vector<RunRecord>& runs);
std::string report_csv(const std::vector<RunRecord>& runs);
// Train loss against optimizer step, one polyline per run.
std::string loss_curves_svg(const std::vector<RunRecord>& runs);
// Train samples/s against ranks, one polyline per strategy with one point per rank count (the
// median of the runs with that strategy and rank count), and the ideal linear scaling from the
// base run's point as a dashed line. Runs on several rank counts are left out.
std::string scaling_svg(const std::vector<RunRecord>& runs);

}  // namespace shardlm

// `shardlm report`'s model of finished runs: what it reads from a run directory (metrics.jsonl and
// deck.resolved.ini) and the Markdown table, CSV and SVG plots it makes of several runs.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace shardlm {

// One run as its directory records it. NaN marks what the run did not record (no summary line
// from an unfinished run, no EM/F1 without scoring).
struct RunRecord {
  std::string name;  // the directory's name
  std::string dir;
  std::string backend;   // run.backend of the resolved deck
  std::string strategy;  // FULL_SHARD, ... (+ " +offload" with fsdp.cpu_offload)
  std::string param_dtype;
  int ranks = 0;
  int nodes = 0;
  double train_samples_per_second = NAN;
  double train_loss = NAN;  // mean over the run's steps
  double final_loss = NAN;  // the last logged train loss
  double peak_memory_bytes = NAN;  // largest over ranks
  std::vector<double> eval_losses;  // one per evaluation, in order
  std::vector<double> eval_samples_per_second;
  double exact_match = NAN;  // the last evaluation's, when scored
  double f1 = NAN;
  std::map<long, double> train_loss_by_step;  // a resumed run's repeated steps keep the last value
};

// Reads RUN_DIR/metrics.jsonl and RUN_DIR/deck.resolved.ini; Error naming the file (and line) when
// the directory, a file or a record is missing or garbled.
RunRecord read_run(const std::string& run_dir);

// Speed-up and parallel efficiency of `run` against `base` (the run with the fewest ranks):
// samples/s ratio, and that ratio over the ranks ratio. NaN when either throughput is unknown.
double speedup(const RunRecord& run, const RunRecord& base);
double efficiency(const RunRecord& run, const RunRecord& base);
// The index of the run with the fewest ranks (the first of equals).
size_t base_run(const std::vector<RunRecord>& runs);

std::string report_markdown(const std::vector<RunRecord>& runs);
std::string report_csv(const std::vector<RunRecord>& runs);
// Train loss against optimizer step, one polyline per run.
std::string loss_curves_svg(const std::vector<RunRecord>& runs);
// Train samples/s against ranks, one polyline per strategy, and the ideal linear scaling from the
// base run as a dashed line.
std::string scaling_svg(const std::vector<RunRecord>& runs);

}  // namespace shardlm

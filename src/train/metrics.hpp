// What a run reports: the JSON-lines records (Hugging Face Trainer's keys plus ours), the console
// lines, the progress bar and the closing summary table; the sink rank 0 writes them to.
#pragma once

#include <mpi.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardlm/train.hpp"

namespace shardlm {

// metrics.jsonl, written in whole lines: each record is one write() of its line, and a write that
// fails part-way is cut back off, so the file never ends inside a record.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // append: continue the file of an earlier run (a resumed run) instead of starting it anew; a
  // partial last line (a run killed mid-write) is cut off first, with a warning on stdout.
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(MetricsWriter&& o) noexcept;
  MetricsWriter& operator=(MetricsWriter&& o) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // One line, in the file at once (`tail -f` follows the run); Error naming the file and the reason
  // (e.g. "No space left on device") when it cannot be written.
  void write(const nlohmann::json& record);

 private:
  int fd_ = -1;
  std::string path_;
};

// One logging step: means over the steps since the previous one, memory from every rank.
struct StepLog {
  long step = 0;
  long total_steps = 0;
  double epoch = 0;  // fractional, as Trainer logs it
  double loss = 0;
  double grad_norm = 0;
  double learning_rate = 0;
  double tokens_per_second = 0;  // all ranks together
  int world = 1;
  double mfu = 0;  // 0 without a peak to measure against
  double loss_scale = 1;
  std::vector<double> peak_memory_bytes;  // per rank
  bool gpu_memory = false;                // GPU high-water mark (else the planned CPU buffers)
};

// One evaluation (after each epoch).
struct EvalLog {
  long step = 0;
  double epoch = 0;
  double loss = 0;
  double runtime = 0;  // seconds
  double samples_per_second = 0;
  double steps_per_second = 0;  // eval micro-batches per rank per second
  double exact_match = NAN;     // SQuAD EM / F1 in percent when generation scored them; NaN otherwise
  double f1 = NAN;
  double generation_runtime = NAN;  // seconds the greedy answers took, when generated
};

// The end of a run.
struct RunSummary {
  double train_runtime = 0;
  double train_samples_per_second = 0;
  double train_steps_per_second = 0;
  double train_loss = 0;       // mean over the run's steps (Trainer's train_loss)
  double final_loss = NAN;     // the last logged (interval-mean) loss
  double epoch = 0;
  double tokens_per_second_per_gpu = 0;
  double mfu = 0;
  long steps = 0;
  bool preempted = false;
  std::vector<double> peak_memory_bytes;  // per rank
  double peak_rss_bytes = 0;              // largest over ranks
  bool gpu_memory = false;
  std::string attention;  // the model's attention path (UnitModel::attention_description)
  std::vector<EvalLog> evals;
};

// {"type":"train", "loss","grad_norm","learning_rate","epoch", "step", "tokens_per_second_per_gpu",
// "mfu", "peak_memory_bytes" (max over ranks), "peak_memory_bytes_per_rank", ...}.
nlohmann::json train_record(const StepLog& log);
// {"type":"eval", "eval_loss","eval_runtime","eval_samples_per_second","eval_steps_per_second",
// "epoch", "step"} plus "eval_exact_match" and "eval_f1" when present.
nlohmann::json eval_record(const EvalLog& log);
// {"type":"summary", "train_runtime","train_samples_per_second","train_steps_per_second",
// "train_loss","epoch", "peak_memory_bytes", "peak_memory_bytes_per_rank", ...}.
nlohmann::json summary_record(const RunSummary& summary);

std::string train_line(const StepLog& log);  // the console line of a logging step
std::string eval_line(const EvalLog& log);
// The closing line: "done: N steps in S s | train_loss L | X samples/s | peak memory ..." ("stopped:"
// when preempted); gpu_memory says whether the peak is the GPU's or the planned buffers'.
std::string done_line(const TrainResult& result, long steps_run, bool gpu_memory);
// The table rank 0 prints at the end: train loss, throughput and memory, then one row per
// evaluation (with EM and F1 columns when any evaluation has them).
std::string summary_table(const RunSummary& summary);

// Whether rank 0's output reaches a terminal. mpirun hands its ranks a pseudo-terminal even when
// its own output goes to a file, so under it the launcher's standard output is what counts.
bool output_is_terminal();

// Progress of the step loop on rank 0: on a terminal, a bar redrawn in place after every step with
// the log lines printed above it; elsewhere only the log lines (every train.log_every steps).
class ProgressDisplay {
 public:
  ProgressDisplay(bool enabled, bool bar, long first_step, long total_steps);
  void print(const std::string& line);  // a log line (above the bar)
  void step(long step, double loss);    // after each optimizer step
  void hide();                          // erases the bar before other output (checkpoint, eval)
  void finish();                        // ends the bar's line

 private:
  void draw();
  bool enabled_, bar_;
  long first_step_, total_steps_, step_ = 0;
  double loss_ = 0;
  bool drawn_ = false;
  double start_seconds_ = 0;
};

}  // namespace shardlm

// The end of a run: totals over its steps (runtime, loss, throughput, MFU, peak memory), the
// closing console line and table, and the summary record.
#include <cstdio>

#include "train_run.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

void summarize_run(TrainRun& run, const TrainPosition& pos, const RunTotals& totals, TrainResult& result) {
  const FsdpEngine& model = *run.engine;
  result.loss_scale = pos.loss_scale.value;
  result.train_runtime = mpi_max(run.comm, totals.seconds);
  result.mfu = run_mfu(run, result.train_runtime > 0 ? totals.tokens / result.train_runtime : 0.0);
  double sum = 0;
  for (double l : result.step_losses) sum += l;
  result.train_loss = result.step_losses.empty() ? 0.0 : sum / result.step_losses.size();
  const long steps_run = pos.step - result.first_step;
  result.train_samples_per_second = result.train_runtime > 0
                                        ? static_cast<double>(steps_run) * run.cfg.train.batch_size / result.train_runtime
                                        : 0.0;
  const std::vector<double> peaks = gather_on_root(run.comm, static_cast<double>(run_peak_bytes(model)));
  result.peak_memory_bytes = static_cast<size_t>(mpi_max(run.comm, static_cast<double>(run_peak_bytes(model))));
  result.peak_rss_bytes = static_cast<size_t>(mpi_max(run.comm, static_cast<double>(process_peak_rss_bytes())));
  run.progress.finish();
  run.say(done_line(result, steps_run, model.device_peak_bytes() > 0));
  RunSummary summary;
  summary.train_runtime = result.train_runtime;
  summary.train_samples_per_second = result.train_samples_per_second;
  summary.train_steps_per_second = result.train_runtime > 0 ? steps_run / result.train_runtime : 0.0;
  summary.train_loss = result.train_loss;
  summary.final_loss = totals.final_loss;
  summary.epoch = pos.epochs_done(run.steps_per_epoch);  // a resume with allow_new_batch: the epochs, not step / steps
  summary.tokens_per_second_per_gpu =
      result.train_runtime > 0 ? totals.tokens / result.train_runtime / run.world : 0.0;
  summary.mfu = result.mfu;
  summary.steps = pos.step;
  summary.preempted = result.preempted;
  summary.peak_memory_bytes = peaks;
  summary.peak_rss_bytes = static_cast<double>(result.peak_rss_bytes);
  summary.gpu_memory = model.device_peak_bytes() > 0;
  summary.attention = model.attention_description();
  summary.evals = totals.evals;
  if (run.echo) {
    std::fputs(summary_table(summary).c_str(), stdout);
    std::fflush(stdout);
  }
  nlohmann::json record = summary_record(summary);
  record["first_step"] = result.first_step;  // the segment's steps are (first_step, steps]
  run.record(record);
}

}  // namespace shardlm

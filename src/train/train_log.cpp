// The log of the step loop: a train line and record every train.log_every steps, with the means
// since the previous one, the MFU and every rank's peak memory.
#include "train_run.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

size_t run_peak_bytes(const FsdpEngine& engine) {
  return engine.device_peak_bytes() > 0 ? engine.device_peak_bytes() : memory_stats().total_peak;
}

double run_mfu(const TrainRun& run, double tokens_per_second) {
  const double peak = run.cfg.run.peak_tflops;
  return peak > 0 ? tokens_per_second * run.flops_per_token / (run.world * peak * 1e12) : 0.0;
}

double log_interval(TrainRun& run, const TrainPosition& pos, const StepOutcome& last, LogInterval& interval) {
  StepLog log;
  log.step = pos.step;
  log.total_steps = run.total_steps;
  log.epoch = static_cast<double>(pos.step) / static_cast<double>(run.steps_per_epoch);
  log.loss = interval.loss / interval.steps;
  log.grad_norm = last.grad_norm;
  log.learning_rate = last.lr;
  log.tokens_per_second = interval.seconds > 0 ? interval.tokens / interval.seconds : 0.0;
  log.world = run.world;
  log.mfu = run_mfu(run, log.tokens_per_second);
  log.loss_scale = pos.loss_scale;
  log.peak_memory_bytes = gather_on_root(run.comm, static_cast<double>(run_peak_bytes(*run.engine)));
  log.gpu_memory = run.engine->device_peak_bytes() > 0;
  run.say(train_line(log));
  if (run.rank == 0) run.metrics.write(train_record(log));
  interval = LogInterval{};
  return log.loss;
}

}  // namespace shardlm

// The log of the step loop: a train line and record every train.log_every steps, with the means
// since the previous one, the MFU and every rank's peak memory; the peak the MFU is measured against.
#include <algorithm>
#include <string>
#include <vector>

#include "train_run.hpp"
#include "shardlm/core.hpp"
#include "shardlm/device.hpp"

namespace shardlm {

size_t run_peak_bytes(const FsdpEngine& engine) {
  return engine.device_peak_bytes() > 0 ? engine.device_peak_bytes() : memory_stats().total_peak;
}

double model_flops_per_token(size_t model_params, size_t trainable_params, int layers, int hidden, int seq_len) {
  const double frozen = static_cast<double>(model_params - trainable_params);
  const double attention = 12.0 * layers * static_cast<double>(hidden) * seq_len;
  return 4.0 * frozen + 6.0 * static_cast<double>(trainable_params) + attention;
}

double run_mfu(const TrainRun& run, double tokens_per_second) {
  const double peak = run.peak.tflops;
  return peak > 0 ? tokens_per_second * run.flops_per_token / (run.world * peak * 1e12) : 0.0;
}

MfuPeak resolve_mfu_peak(double peak_tflops, BackendKind backend, const std::string& device_name, DType param_dtype,
                         const std::string& peaks_file) {
  if (peak_tflops > 0)
    return {peak_tflops, "run.peak_tflops", concat("MFU against ", peak_tflops, " TFLOP/s (run.peak_tflops)")};
  const std::string advice = "set run.peak_tflops or add it to SHARDLM_GPU_PEAKS";
  if (backend != BackendKind::Cuda) return {0, "none", "no MFU on the CPU backend (set run.peak_tflops)"};
  if (param_dtype == DType::F32)
    return {0, "none", concat("no MFU: fp32 parameters on ", device_name,
                              " (the GPU table holds dense bf16 and fp16 peaks; set run.peak_tflops)")};
  const std::vector<GpuPeak> mine = peaks_file.empty() ? std::vector<GpuPeak>{} : read_gpu_peaks(peaks_file);
  const GpuPeak* entry = find_gpu_peak(device_name, mine);
  if (!entry) return {0, "none", concat("no MFU: unknown GPU '", device_name, "' (", advice, ")")};
  const double tflops = param_dtype == DType::BF16 ? entry->bf16_tflops : entry->fp16_tflops;
  if (tflops <= 0)
    return {0, "none",
            concat("no MFU: no dense ", dtype_name(param_dtype), " peak for ", device_name, " (", advice, ")")};
  const bool from_file = entry != find_gpu_peak(device_name, {});
  return {tflops, from_file ? "SHARDLM_GPU_PEAKS" : "built-in",
          concat("MFU against ", tflops, " TFLOP/s (", device_name, ", dense ", dtype_name(param_dtype),
                 from_file ? concat(", from ", peaks_file) : std::string(), ")")};
}

double log_interval(TrainRun& run, const TrainPosition& pos, const StepOutcome& last, LogInterval& interval) {
  StepLog log;
  log.step = pos.step;
  log.total_steps = run.total_steps;
  log.epoch = pos.epochs_done(run.steps_per_epoch);
  log.loss = interval.loss / interval.steps;
  log.grad_norm = last.grad_norm;
  log.learning_rate = last.lr;
  log.tokens_per_second = interval.seconds > 0 ? interval.tokens / interval.seconds : 0.0;
  log.world = run.world;
  log.mfu = run_mfu(run, log.tokens_per_second);
  log.loss_scale = pos.loss_scale.value;
  log.peak_memory_bytes = gather_on_root(run.comm, static_cast<double>(run_peak_bytes(*run.engine)));
  log.gpu_memory = run.engine->device_peak_bytes() > 0;
  run.say(train_line(log));
  run.record(train_record(log));
  if (run.tensorboard) {
    // Named as Trainer's TensorBoard callback names them (train/...), plus throughput, MFU and memory.
    double peak = 0;
    for (double b : log.peak_memory_bytes) peak = std::max(peak, b);
    std::vector<std::pair<std::string, double>> scalars{
        {"train/loss", log.loss}, {"train/learning_rate", log.learning_rate}, {"train/grad_norm", log.grad_norm},
        {"train/epoch", log.epoch}, {"train/tokens_per_second", log.tokens_per_second},
        {"train/memory_gib", peak / static_cast<double>(1ull << 30)}};
    if (log.mfu > 0) scalars.emplace_back("train/mfu", log.mfu);
    run.tensorboard->scalars(log.step, scalars);
  }
  run.keep_new_run();
  interval = LogInterval{};
  return log.loss;
}

}  // namespace shardlm

// The trainer's side of checkpoints.
#include "train_checkpoint.hpp"

#include <algorithm>
#include <cstdio>

namespace shardlm {

CheckpointMeta make_meta(const RunConfig& cfg, const std::string& tokenizer_hash, long step, int epoch,
                         long epoch_step, long total_steps, long optimizer_steps, int world_size,
                         int shard_group_size, double loss_scale) {
  CheckpointMeta m;
  m.step = step;
  m.epoch = epoch;
  m.epoch_step = epoch_step;
  m.seed = cfg.train.seed;
  m.optimizer_steps = optimizer_steps;
  m.lr_schedule = lr_schedule_name(cfg.train.lr_schedule);
  m.base_lr = cfg.train.lr;
  m.warmup_steps = resolved_warmup_steps(cfg.train.warmup_steps, cfg.train.warmup_ratio, total_steps);
  m.total_steps = total_steps;
  m.world_size = world_size;
  m.shard_group_size = shard_group_size;
  m.loss_scale = loss_scale;
  m.strategy = strategy_name(cfg.fsdp.strategy);
  m.model = cfg.model;
  m.deck = resolved_deck_ini(cfg);
  m.version = SHARDLM_VERSION;
  m.tokenizer_hash = tokenizer_hash;
  m.global_batch = cfg.train.batch_size;
  return m;
}

CheckpointWriteStats write_checkpoint(const RunConfig& cfg, const CheckpointMeta& meta,
                                      const std::vector<UnitState>& units, MPI_Comm comm, bool echo,
                                      const std::string& keep_name) {
  CheckpointWriteOptions options;
  options.keep_name = keep_name;
  options.collective_buffering = cfg.checkpoint.collective_buffering;
  CheckpointWriteStats stats = save_checkpoint(cfg.checkpoint_dir(), cfg.checkpoint.keep_last, meta, units, comm, options);
  const double rate = stats.seconds > 0 ? stats.bytes / stats.seconds : 0.0;
  if (echo) {
    char line[512];
    std::snprintf(line, sizeof line, "checkpoint step %ld: %s, %s in %.2f s (%s/s)", meta.step, stats.path.c_str(),
                  format_bytes(stats.bytes).c_str(), stats.seconds, format_bytes(static_cast<size_t>(rate)).c_str());
    log_info(line);
  }
  return stats;
}

nlohmann::json checkpoint_record(long step, const CheckpointWriteStats& stats) {
  return {{"type", "checkpoint"}, {"step", step}, {"path", stats.path}, {"bytes", stats.bytes},
          {"seconds", stats.seconds}, {"bytes_per_s", stats.seconds > 0 ? stats.bytes / stats.seconds : 0.0}};
}

}  // namespace shardlm

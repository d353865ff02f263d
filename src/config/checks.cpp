// Checks that involve more than one key, or the world size the run is launched with.
#include <algorithm>
#include <climits>

#include "config_internal.hpp"

namespace shardlm::config_detail {

// SQuAD evaluation by generation: each rank's key/value cache holds eval.batch_size prompts of up to
// data.max_length tokens plus eval.max_new_tokens, K and V of every layer, in fp32 at most. Checked
// here, before training, against this node's available memory (the cache is allocated after training).
static void check_generation_sizes(const RunConfig& cfg) {
  if (cfg.data.format != DataFormat::Squad || cfg.eval.generate == EvalGenerate::None || cfg.data.eval_file.empty())
    return;
  const ModelConfig& m = cfg.model;
  model_layout(m);  // a shape no model has is refused as such first, not blamed on this key
  const int64_t positions = int64_t{cfg.data.max_length} + cfg.eval.max_new_tokens;
  if (positions > INT32_MAX)
    bad_value("eval.max_new_tokens", std::to_string(cfg.eval.max_new_tokens),
              concat("with data.max_length (", cfg.data.max_length, ") gives ", positions,
                     " positions, more than the 2147483647 a sequence may have"));
  const int64_t slots = cfg.eval.batch_size > 0 ? cfg.eval.batch_size : cfg.train.micro_batch_size;
  const double bytes = static_cast<double>(slots) * static_cast<double>(positions) * 2.0 * m.num_layers *
                       m.kv_heads() * m.head_dim() * sizeof(float);
  const double available = static_cast<double>(host_available_bytes());
  if (available > 0 && bytes > available)
    bad_value("eval.max_new_tokens", std::to_string(cfg.eval.max_new_tokens),
              concat("the generation's key/value cache would take ", format_bytes(static_cast<size_t>(std::min(bytes, 1e18))),
                     " per rank (", slots, " prompts x ", positions, " positions x ", m.num_layers,
                     " layers, K and V), more than the ", format_bytes(static_cast<size_t>(available)),
                     " this node has available; lower it or eval.batch_size"));
}

void check_run_config(const RunConfig& cfg, int world_size) {
  const ModelConfig& m = cfg.model;
  if (m.head_size == 0 && m.hidden_size % m.num_heads != 0)
    bad_value("model.num_heads", std::to_string(m.num_heads),
              concat("hidden_size (", m.hidden_size, ") is not divisible by it"));
  const ModelFamily& family = model_family(m.arch);
  if (m.head_size != 0 && !family.grouped_query)
    bad_value("model.head_dim", std::to_string(m.head_size), concat("applies to the Llama-style families, not ", m.arch));
  if (m.sliding_window != 0 && !family.sliding_window) {
    std::string windowed;
    for (const ModelFamily* f : model_families())
      if (f->sliding_window) windowed += (windowed.empty() ? "" : ", ") + f->name;
    bad_value("model.sliding_window", std::to_string(m.sliding_window),
              concat("applies to the families with sliding-window attention (", windowed, "), not ", m.arch));
  }
  if (family.grouped_query && m.num_heads % m.kv_heads() != 0)
    bad_value("model.num_kv_heads", std::to_string(m.num_kv_heads),
              concat("num_heads (", m.num_heads, ") is not divisible by it"));
  if (family.rotary && m.head_dim() % 2 != 0)
    bad_value("model.num_heads", std::to_string(m.num_heads),
              concat("gives an odd head dimension ", m.head_dim(), "; rotary embeddings need an even one"));
  if (cfg.data.tokenizer != TokenizerSource::File && cfg.model.dir.empty() && m.vocab_size < kByteVocab)
    bad_value("model.vocab_size", std::to_string(m.vocab_size),
              concat("must be >= ", kByteVocab, ", the byte tokenizer's vocabulary size"));

  check_generation_sizes(cfg);

  SHARDLM_CHECK(world_size >= 1, "world size must be >= 1 (got ", world_size, ")");
  const TrainSection& t = cfg.train;
  // Product in 64 bits: a huge micro_batch_size x world size must not wrap to a divisor.
  long long per_step = static_cast<long long>(world_size) * t.micro_batch_size;
  if (t.batch_size % per_step != 0) {
    // The fix: a batch the ranks split into whole micro-batches, or (when the ranks split the batch
    // evenly) the largest micro-batch that divides each rank's share.
    std::string fix = concat("set train.batch_size to a multiple of ", per_step);
    if (t.batch_size % world_size == 0) {
      int micro = t.micro_batch_size;
      const int share = t.batch_size / world_size;
      while (share % micro != 0) --micro;
      fix += concat(", or train.micro_batch_size to ", micro);
    }
    throw Error(concat("train.batch_size = ", t.batch_size, " is not divisible by micro_batch_size (",
                       t.micro_batch_size, ") x world size (", world_size, "): ", fix));
  }

  // The schedule's arguments act on their own schedules only (transformers' get_scheduler refuses or
  // ignores the others): a key that would do nothing is an error, not a silent no-op.
  const LrSchedule sched = t.lr_schedule;
  if (sched == LrSchedule::Constant && (t.warmup_steps > 0 || t.warmup_ratio > 0))
    bad_value("train.lr_schedule", "constant",
              "has no warm-up (as transformers' constant): use constant_with_warmup, or set train.warmup_steps and "
              "train.warmup_ratio to 0");
  const bool cosine = sched == LrSchedule::Cosine || sched == LrSchedule::CosineWithRestarts ||
                      sched == LrSchedule::CosineWithMinLr;
  if (t.lr_num_cycles > 0 && !cosine)
    bad_value("train.lr_num_cycles", format_double(t.lr_num_cycles),
              concat("applies to the cosine schedules, not ", lr_schedule_name(sched)));
  if (t.min_lr_ratio > 0 && sched != LrSchedule::CosineWithMinLr)
    bad_value("train.min_lr_ratio", format_double(t.min_lr_ratio),
              concat("is cosine_with_min_lr's floor: set train.lr_schedule = cosine_with_min_lr (now ",
                     lr_schedule_name(sched), ")"));
  if (sched != LrSchedule::Polynomial && (t.lr_power != 1.0 || t.lr_end != 1e-7))
    bad_value(t.lr_power != 1.0 ? "train.lr_power" : "train.lr_end",
              format_double(t.lr_power != 1.0 ? t.lr_power : t.lr_end),
              concat("applies to the polynomial schedule, not ", lr_schedule_name(sched)));
  if (sched == LrSchedule::Polynomial && !(t.lr_end < t.lr))
    bad_value("train.lr_end", format_double(t.lr_end),
              concat("must be below train.lr (", format_double(t.lr), "), as transformers' polynomial schedule requires"));

  // Evaluation-driven keys need an eval set.
  if (cfg.data.eval_file.empty()) {
    if (cfg.eval.every_steps > 0)
      bad_value("eval.every_steps", std::to_string(cfg.eval.every_steps), "needs data.eval_file");
    if (cfg.checkpoint.keep_best != KeepBest::None)
      bad_value("checkpoint.keep_best", keep_best_name(cfg.checkpoint.keep_best), "needs data.eval_file");
    if (t.early_stopping_patience > 0)
      bad_value("train.early_stopping_patience", std::to_string(t.early_stopping_patience), "needs data.eval_file");
  }

  int rpn = cfg.dist.ranks_per_node;
  if (rpn > 0 && world_size % rpn != 0)
    bad_value("dist.ranks_per_node", std::to_string(rpn),
              concat("world size ", world_size, " is not divisible by it"));

  if (!cfg.fsdp.offload_dir.empty() && !cfg.fsdp.cpu_offload)
    bad_value("fsdp.offload_dir", "'" + cfg.fsdp.offload_dir + "'",
              "keeps the host AdamW's moments of an offloaded run: set fsdp.cpu_offload = true, or leave it empty");
  if (cfg.fsdp.offload_accumulate == OffloadAccumulate::Device && !cfg.fsdp.cpu_offload)
    bad_value("fsdp.offload_accumulate", "device",
              "says where an offloaded run sums its micro-steps' gradients: set fsdp.cpu_offload = true, or use host");
  if (cfg.fsdp.offload_root_update == OffloadRootUpdate::Device && !cfg.fsdp.cpu_offload)
    bad_value("fsdp.offload_root_update", "device",
              "says where an offloaded run updates its root unit: set fsdp.cpu_offload = true, or use auto");
  if (cfg.fsdp.offload_resident_gib > 0 && (!cfg.fsdp.cpu_offload || cfg.fsdp.offload_root_update == OffloadRootUpdate::Host ||
                                            !cfg.fsdp.offload_dir.empty()))
    bad_value("fsdp.offload_resident_gib", format_double(cfg.fsdp.offload_resident_gib),
              "keeps part of the root unit's optimizer state on the GPU when an offloaded run updates the root "
              "there: set fsdp.cpu_offload = true, fsdp.offload_root_update = auto or device and no "
              "fsdp.offload_dir, or use 0");
  // The root's update on the device streams AdamW's fp32 moments; 8-bit moments update on the host with the rest.
  if (cfg.train.optim != Optim::AdamWTorch && cfg.fsdp.cpu_offload &&
      (cfg.fsdp.offload_root_update == OffloadRootUpdate::Device || cfg.fsdp.offload_resident_gib > 0))
    bad_value("train.optim", optim_name(cfg.train.optim),
              "updates an offloaded run's root unit on the host: use fsdp.offload_root_update = auto or host and "
              "fsdp.offload_resident_gib = 0, or train.optim = adamw_torch");
  if (cfg.fsdp.offload_root_update == OffloadRootUpdate::Device && !cfg.fsdp.offload_dir.empty())
    bad_value("fsdp.offload_root_update", "device",
              "streams the root's moments from host memory, and fsdp.offload_dir keeps them in files: leave "
              "fsdp.offload_dir empty, or use auto (which then updates the root on the host)");
}

}  // namespace shardlm::config_detail

// The [train] section's keys and their checks: the batch against the world size, the schedule's arguments.
// Adding a key: keys.cpp's first lines.
#include "key_builders.hpp"

namespace shardlm::config_detail {

// The global batch splits into whole micro-batches over the world.
static void check_batch(const TrainSection& t, int world_size) {
  SHARDLM_CHECK(world_size >= 1, "world size must be >= 1 (got ", world_size, ")");
  // Product in 64 bits: a huge micro_batch_size x world size must not wrap to a divisor.
  long long per_step = static_cast<long long>(world_size) * t.micro_batch_size;
  if (t.batch_size % per_step == 0) return;
  // The fix: a batch the ranks split into whole micro-batches, or (when the ranks split the batch
  // evenly) the largest micro-batch that divides each rank's share.
  std::string fix = concat("set train.batch_size to a multiple of ", per_step);
  if (t.batch_size % world_size == 0) {
    int micro = t.micro_batch_size;
    const int share = t.batch_size / world_size;
    while (share % micro != 0) --micro;
    fix += concat(", or train.micro_batch_size to ", micro);
  }
  throw Error(concat("train.batch_size = ", t.batch_size, " is not divisible by micro_batch_size (", t.micro_batch_size,
                     ") x world size (", world_size, "): ", fix));
}

// The schedule's arguments act on their own schedules only (transformers' get_scheduler refuses or
// ignores the others): a key that would do nothing is an error, not a silent no-op.
static void check_schedule(const TrainSection& t) {
  const LrSchedule sched = t.lr_schedule;
  if (sched == LrSchedule::Constant && (t.warmup_steps > 0 || t.warmup_ratio > 0))
    bad_value("train.lr_schedule", "constant",
              "has no warm-up (as transformers' constant): use constant_with_warmup, or set train.warmup_steps and "
              "train.warmup_ratio to 0");
  const bool cosine =
      sched == LrSchedule::Cosine || sched == LrSchedule::CosineWithRestarts || sched == LrSchedule::CosineWithMinLr;
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
}

static void check_train(const RunConfig& cfg, int world_size) {
  check_batch(cfg.train, world_size);
  check_schedule(cfg.train);
  if (cfg.data.eval_file.empty() && cfg.train.early_stopping_patience > 0)
    bad_value("train.early_stopping_patience", std::to_string(cfg.train.early_stopping_patience),
              "needs data.eval_file");
}

DeckSection train_section() {
  return {"train", check_train, {
      int_key("train.epochs", SHARDLM_FIELD(train.epochs), 1, "must be >= 1").doc("passes over the training set"),
      int_key("train.batch_size", SHARDLM_FIELD(train.batch_size), 1, "must be >= 1", "N")
          .doc("global batch: samples per optimizer step over all ranks (the batch rule above)"),
      int_key("train.micro_batch_size", SHARDLM_FIELD(train.micro_batch_size), 1, "must be >= 1")
          .doc("samples per rank per forward pass"),
      double_key("train.lr", SHARDLM_FIELD(train.lr), kPositive).doc("peak learning rate"),
      double_key("train.weight_decay", SHARDLM_FIELD(train.weight_decay), kNonNegative)
          .doc("AdamW decoupled weight decay (not on biases and norms)"),
      int_key("train.warmup_steps", SHARDLM_FIELD(train.warmup_steps), 0, "must be >= 0")
          .doc("linear warm-up from 0 to `lr` over this many steps; when > 0 it wins over `warmup_ratio` (Trainer's "
               "rule)"),
      double_key("train.warmup_ratio", SHARDLM_FIELD(train.warmup_ratio), kUnitClosed)
          .doc("with `warmup_steps = 0`: warm up over `ceil(warmup_ratio x total steps)` steps, as TrainingArguments'"
               " `get_warmup_steps` (the run's total: all epochs, or `max_steps`)"),
      enum_key("train.optim", SHARDLM_FIELD(train.optim), optim_name)
          .doc(
               "the optimizer, by TrainingArguments' `optim` names: `adamw_torch` is `torch.optim.AdamW` (two fp32 "
               "moments, 8 bytes a parameter); `adamw_8bit` is AdamW with block-wise 8-bit moments (one byte each "
               "per parameter and an fp32 scale per 256: 2.03 bytes a parameter), the same update, hyper-parameters "
               "and learning rate (docs/design.md, \"The optimizers\"). `shardlm plan` counts each one's state. "
               "Checkpoints keep either's moments as fp32 `exp_avg`/`exp_avg_sq`, so a run may resume with the "
               "other. With `fsdp.cpu_offload`, `adamw_8bit` updates the root unit on the host (refused with "
               "`fsdp.offload_root_update = device` or `fsdp.offload_resident_gib > 0`)"),
      enum_key("train.lr_schedule", SHARDLM_FIELD(train.lr_schedule), lr_schedule_name)
          .doc("the learning rate of each step exactly as transformers' `get_scheduler(name)` gives it (below), at "
               "the optimizer updates taken before the step: a step skipped on an fp16 overflow does not advance it, "
               "as Trainer steps its scheduler only after an update; `tests/test_schedules.cpp` checks every name, "
               "both warm-up forms, to 1e-7 against values computed with transformers"),
      double_key("train.lr_num_cycles", SHARDLM_FIELD(train.lr_num_cycles), kNonNegative)
          .doc("the cosine schedules' `num_cycles` (transformers' `lr_scheduler_kwargs`): 0 = the schedule's default,"
               " 0.5 for `cosine` and `cosine_with_min_lr` (half a cosine, `lr` to 0), 1 for `cosine_with_restarts` "
               "(hard restarts); refused with other schedules"),
      double_key("train.lr_power", SHARDLM_FIELD(train.lr_power), kPositive)
          .doc("`polynomial`'s `power`; refused with other schedules"),
      double_key("train.lr_end", SHARDLM_FIELD(train.lr_end), kNonNegative)
          .doc("`polynomial`'s `lr_end`, the rate the decay reaches at step N, one past the run's last (which runs a "
               "little above it, as in transformers); must be below `lr`; refused with other schedules"),
      double_key("train.min_lr_ratio", SHARDLM_FIELD(train.min_lr_ratio), kUnitClosed)
          .doc("`cosine_with_min_lr`'s floor as a fraction of `lr` (transformers' `min_lr_rate`): the cosine runs "
               "from `lr` down to `min_lr_ratio x lr`; refused with other schedules"),
      double_key("train.adam_beta1", SHARDLM_FIELD(train.adam_beta1), kUnitInterval)
          .doc("AdamW's first-moment decay rate (Trainer's `adam_beta1`)"),
      double_key("train.adam_beta2", SHARDLM_FIELD(train.adam_beta2), kUnitInterval)
          .doc("AdamW's second-moment decay rate (Trainer's `adam_beta2`)"),
      double_key("train.adam_eps", SHARDLM_FIELD(train.adam_eps), kPositive).doc("AdamW epsilon"),
      double_key("train.max_grad_norm", SHARDLM_FIELD(train.max_grad_norm), kNonNegative)
          .doc("clip the global gradient norm to this; 0 = no clipping"),
      double_key("train.loss_scale", SHARDLM_FIELD(train.loss_scale), kNonNegative)
          .doc("dynamic loss scaling (as torch's GradScaler): the loss is multiplied by the scale before backward and"
               " the gradients divided by it before clipping; a step whose gradient has an inf/NaN anywhere (agreed "
               "over all ranks through the global norm) is skipped and the scale halved; after 2000 good steps in a "
               "row it doubles. A skipped step takes no update, so the learning-rate schedule does not advance; the "
               "scale has no floor, as GradScaler's (one that overflows at 1 goes on to 0.5). `0`: on, from 65536, "
               "when `fsdp.param_dtype` or `fsdp.reduce_dtype` is `fp16`, off otherwise; `> 0`: on, starting at this "
               "value"),
      unsigned_key("train.seed", SHARDLM_FIELD(train.seed)).doc("initialisation, data order and subset selection"),
      flag_key("train.shuffle", SHARDLM_FIELD(train.shuffle)).doc("shuffle the training set each epoch"),
      int_key("train.log_every", SHARDLM_FIELD(train.log_every), 1, "must be >= 1")
          .doc("optimizer steps between log lines and `train` records of `metrics.jsonl` (on a terminal a progress "
               "bar also moves every step)"),
      int_key("train.max_steps", SHARDLM_FIELD(train.max_steps), 0, "must be >= 0")
          .doc("stop after this many optimizer steps (0 = all epochs)"),
      int_key("train.early_stopping_patience", SHARDLM_FIELD(train.early_stopping_patience), 0,
              "must be >= 0 (0 = no early stopping)")
          .doc("stop training after this many evaluations in a row whose eval loss does not beat the best earlier one"
               " by more than `early_stopping_threshold`, as transformers' `EarlyStoppingCallback` (the best follows "
               "every lower loss; the first evaluation sets it). 0 = never. Counts every evaluation (each epoch's and"
               " `eval.every_steps`'); needs `data.eval_file`. The count starts again at a resume. The stop writes "
               "the `at_end` checkpoint and an `early_stopping` record"),
      double_key("train.early_stopping_threshold", SHARDLM_FIELD(train.early_stopping_threshold), kNonNegative)
          .doc("how much lower than the best an eval loss must be to count as an improvement"),
  }};
}

}  // namespace shardlm::config_detail

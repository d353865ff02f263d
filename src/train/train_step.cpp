// One optimizer step: grad_accum micro-batches per rank over one global batch, the loss normalised
// by the global batch's target count so every world size computes the same step; then clipping,
// AdamW and the dynamic loss scale.
#include <algorithm>
#include <cmath>

#include "train_run.hpp"
#include "shardlm/optim.hpp"

namespace shardlm {

namespace {

// Steps without overflow after which the loss scale doubles (GradScaler's growth_interval).
constexpr long kScaleGrowthInterval = 2000;

int64_t count_tokens(const std::vector<Example>& data, const std::vector<size_t>& indices) {
  int64_t n = 0;
  for (size_t i : indices) n += static_cast<int64_t>(data[i].tokens.size());
  return n;
}

}  // namespace

PaddingShare epoch_padding_share(const TrainRun& run) {
  PaddingShare share;
  const int multiple = run.engine->length_multiple(), max_seq = run.cfg.data.max_length;
  const int32_t pad = run.tokenizer->pad_id();
  for (long s = 0; s < run.steps_per_epoch; ++s) {
    const std::vector<size_t> global = run.sampler->global_batch(0, s);
    share.real += count_tokens(run.train_set, global);
    for (int r = 0; r < run.world; ++r)
      for (int m = 0; m < run.accum; ++m) {
        const MicroBatch mb =
            make_micro_batch(run.train_set, run.sampler->micro_batch(0, s, r, run.world, m, run.micro), pad, multiple, max_seq);
        share.unpacked += static_cast<int64_t>(mb.batch) * mb.seq;
        share.unpacked_micro_batches += 1;
      }
    const PackedStep packed = pack_step(run.train_set, global, max_seq, run.world, run.micro);
    for (int r = 0; r < run.world; ++r)
      for (int m = 0; m < packed.micro_steps; ++m) {
        const MicroBatch mb = make_packed_micro_batch(run.train_set, packed.micro_batch(m, r, run.world, run.micro), pad,
                                                      multiple, max_seq);
        share.packed += static_cast<int64_t>(mb.batch) * mb.seq;
        share.packed_micro_batches += 1;
      }
  }
  return share;
}

StepOutcome take_step(TrainRun& run, TrainPosition& pos, int epoch, long s, TrainResult& result) {
  const RunConfig& cfg = run.cfg;
  FsdpEngine& model = *run.engine;
  Timer step_timer;
  const std::vector<size_t> global = run.sampler->global_batch(epoch, s);
  const int64_t targets = count_targets(run.train_set, global);
  // Dynamic loss scaling: scale the loss, unscale the gradients, skip a step whose gradient
  // overflowed (every rank sees the same global norm) and halve; double after a run of good steps.
  const float grad_scale = targets > 0 ? static_cast<float>(pos.loss_scale / static_cast<double>(targets)) : 0.0f;
  model.zero_grad();
  double loss_sum = 0;
  if (cfg.data.packing) {
    // The whole global batch packed into rows, dealt out to the ranks' micro-steps.
    const PackedStep packed = pack_step(run.train_set, global, cfg.data.max_length, run.world, run.micro);
    for (int m = 0; m < packed.micro_steps; ++m) {
      MicroBatch mb = make_packed_micro_batch(run.train_set, packed.micro_batch(m, run.rank, run.world, run.micro),
                                              run.tokenizer->pad_id(), model.length_multiple(), cfg.data.max_length);
      loss_sum += model.forward_backward(mb, grad_scale);
    }
  } else {
    for (int m = 0; m < run.accum; ++m) {
      MicroBatch mb = make_micro_batch(run.train_set, run.sampler->micro_batch(epoch, s, run.rank, run.world, m, run.micro),
                                       run.tokenizer->pad_id(), model.length_multiple(), cfg.data.max_length);
      loss_sum += model.forward_backward(mb, grad_scale);
    }
  }
  StepOutcome out;
  out.loss = targets > 0 ? mpi_sum(run.comm, loss_sum) / static_cast<double>(targets) : 0.0;
  // The loss is reduced over all ranks, so they all stop here together.
  if (!std::isfinite(out.loss))
    throw AgreedError(concat("the loss is not finite at step ", pos.step + 1, " (lower train.lr or check the data)"));
  out.grad_norm = model.grad_norm() / pos.loss_scale;
  out.lr = scheduled_lr(cfg.train.lr_schedule, cfg.train.lr, pos.step, cfg.train.warmup_steps, run.total_steps);
  if (pos.scaling && !std::isfinite(out.grad_norm)) {
    result.skipped_steps += 1;
    pos.good_steps = 0;
    pos.loss_scale = std::max(pos.loss_scale / 2, 1.0);
    run.say(concat("step ", pos.step + 1, ": gradient overflow, step skipped; loss scale now ", pos.loss_scale));
    run.record({{"type", "overflow"}, {"step", pos.step + 1}, {"loss_scale", pos.loss_scale}});
  } else {
    model.optimizer_step(out.lr, static_cast<float>(clip_factor(out.grad_norm, cfg.train.max_grad_norm) / pos.loss_scale));
    if (pos.scaling && ++pos.good_steps == kScaleGrowthInterval) {
      pos.loss_scale *= 2;
      pos.good_steps = 0;
    }
  }
  ++pos.step;
  out.seconds = mpi_max(run.comm, step_timer.seconds());
  out.tokens = count_tokens(run.train_set, global);
  result.step_losses.push_back(out.loss);
  result.grad_norms.push_back(out.grad_norm);
  return out;
}

}  // namespace shardlm

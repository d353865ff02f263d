// One optimizer step: grad_accum micro-batches per rank over one global batch (with data.packing, the
// packed rows dealt to the rank), the loss normalised
// by the global batch's target count so every world size computes the same step; then clipping,
// AdamW and the dynamic loss scale.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <vector>

#include "../device/dropout_mask.hpp"
#include "train_run.hpp"
#include "shardlm/optim.hpp"

namespace shardlm {

namespace {

int64_t count_tokens(const std::vector<Example>& data, const std::vector<size_t>& indices) {
  int64_t n = 0;
  for (size_t i : indices) n += static_cast<int64_t>(data[i].tokens.size());
  return n;
}

// The micro-batches of one step of `epoch`: the sampler's pieces of the global batch, or (packing)
// its rows dealt out to the ranks; built one at a time as the step runs them.
class StepMicroBatches {
 public:
  StepMicroBatches(const TrainRun& run, int epoch, long s, const std::vector<size_t>& global, bool packing)
      : run_(run), epoch_(epoch), s_(s), packing_(packing) {
    if (packing_) packed_ = pack_step(run.train_set, global, run.cfg.data.max_length, run.world, run.micro);
  }
  int count() const { return packing_ ? packed_.micro_steps : run_.accum; }  // per rank
  MicroBatch at(int rank, int m) const {
    const int32_t pad = run_.tokenizer->pad_id();
    const int multiple = run_.engine->length_multiple(), max_seq = run_.cfg.data.max_length;
    if (packing_)
      return make_packed_micro_batch(run_.train_set, packed_.micro_batch(m, rank, run_.world, run_.micro), pad,
                                     multiple, max_seq);
    return make_micro_batch(run_.train_set, run_.sampler->micro_batch(epoch_, s_, rank, run_.world, m, run_.micro), pad,
                            multiple, max_seq);
  }

 private:
  const TrainRun& run_;
  int epoch_;
  long s_;
  bool packing_;
  PackedStep packed_;
};

// run.trace_step: every rank's timeline to rank 0, which writes dir/trace_stepN_rankR.json for each
// (only rank 0 is sure to see run.dir: it may be node-local), a "trace" record per rank, and its own
// summary on the log.
void write_step_trace(TrainRun& run, long step, const StepTrace& trace) {
  const std::vector<std::string> jsons = gather_on_root(run.comm, trace_json(trace, run.rank));
  auto file_of = [&](int r) {
    return std::filesystem::path(run.cfg.run.dir) / concat("trace_step", step, "_rank", r, ".json");
  };
  for (size_t r = 0; r < jsons.size(); ++r) replace_file(file_of(static_cast<int>(r)).string(), jsons[r], "the step timeline");
  const std::filesystem::path file = file_of(0);
  const TraceSummary s = summarize_trace(trace);
  NamedValues mine = {{"step_ms", s.step_ms},       {"compute_ms", s.compute_ms},
                      {"comm_ms", s.comm_ms},       {"overlap_ms", s.overlap_ms},
                      {"exposed_comm_ms", s.exposed_comm_ms}, {"compute_idle_ms", s.compute_idle_ms},
                      {"gather_ms", s.gather_ms},   {"reduce_ms", s.reduce_ms}};
  if (run.cfg.fsdp.cpu_offload) mine.insert(mine.end(), {{"host_ms", s.host_ms}, {"copy_ms", s.copy_ms}});
  const std::vector<NamedValues> all = gather_on_root(run.comm, mine);
  for (size_t r = 0; r < all.size(); ++r) {
    nlohmann::json rec = {{"type", "trace"}, {"step", step}, {"rank", r}};
    for (const auto& [name, ms] : all[r]) rec[name] = ms;
    run.record(rec);
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "step %ld timeline (rank 0): %.2f ms; compute busy %.2f, communication busy %.2f (gathers %.2f, "
                "reductions %.2f), overlapped %.2f, exposed %.2f; compute idle %.2f; %s",
                step, s.step_ms, s.compute_ms, s.comm_ms, s.gather_ms, s.reduce_ms, s.overlap_ms, s.exposed_comm_ms,
                s.compute_idle_ms, file.filename().c_str());
  std::string said = line;
  if (run.cfg.fsdp.cpu_offload) {
    std::snprintf(line, sizeof line, "; offload: copies busy %.2f, host busy %.2f", s.copy_ms, s.host_ms);
    said += line;
  }
  if (run.echo) run.say(said);
}

}  // namespace

PaddingShare epoch_padding_share(const TrainRun& run) {
  PaddingShare share;
  for (long s = 0; s < run.steps_per_epoch; ++s) {
    const std::vector<size_t> global = run.sampler->global_batch(0, s);
    share.real += count_tokens(run.train_set, global);
    for (const bool packing : {false, true}) {
      const StepMicroBatches step(run, 0, s, global, packing);
      int64_t& positions = packing ? share.packed : share.unpacked;
      int64_t& passes = packing ? share.packed_micro_batches : share.unpacked_micro_batches;
      for (int r = 0; r < run.world; ++r)
        for (int m = 0; m < step.count(); ++m) {
          const MicroBatch mb = step.at(r, m);
          positions += static_cast<int64_t>(mb.batch) * mb.seq;
          passes += 1;
        }
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
  const float grad_scale = targets > 0 ? static_cast<float>(pos.loss_scale.value / static_cast<double>(targets)) : 0.0f;
  // run.trace_step names a step as the log does (the run's step count, continued by a resume).
  const bool trace = cfg.run.trace_step > 0 && pos.step + 1 == cfg.run.trace_step;
  if (trace) model.trace_begin();
  model.zero_grad();
  double loss_sum = 0;
  StepOutcome out;
  // The schedule counts the updates taken (the optimizer's steps, which a checkpoint keeps), not the loop's
  // steps: one skipped on overflow leaves it where it was, as Trainer steps its scheduler only when the
  // optimizer step was not skipped.
  out.lr = scheduled_lr(cfg.train.lr_schedule, cfg.train.lr, model.optimizer_steps(),
                        resolved_warmup_steps(cfg.train.warmup_steps, cfg.train.warmup_ratio, run.total_steps),
                        run.total_steps, lr_schedule_args(cfg.train));
  // Without clipping or loss scaling the step's gradient factor is known before its backward: an
  // offloaded engine then updates each unit as its gradient reaches the host (FsdpEngine::last_micro_step).
  const bool known = cfg.train.max_grad_norm <= 0 && !pos.scaling;
  const float known_factor = static_cast<float>(clip_factor(0.0, cfg.train.max_grad_norm) / pos.loss_scale.value);
  const StepMicroBatches micro_batches(run, epoch, s, global, cfg.data.packing);
  for (int m = 0; m < micro_batches.count(); ++m) {
    if (m + 1 == micro_batches.count())
      model.last_micro_step(known ? std::optional<FsdpEngine::StepUpdate>({out.lr, known_factor}) : std::nullopt);
    // LoRA dropout's masks: a function of (seed, step, micro-step, rank), which a resume restores. The
    // loss is read once, after the last micro-step (the host queues each next micro-step meanwhile).
    const bool last = m + 1 == micro_batches.count();
    loss_sum += model.forward_backward(micro_batches.at(run.rank, m), grad_scale,
                                       dropout_micro_step_seed(cfg.train.seed, pos.step, m, run.rank),
                                       last ? FsdpEngine::LossRead::now : FsdpEngine::LossRead::later);
  }
  out.loss = targets > 0 ? mpi_sum(run.comm, loss_sum) / static_cast<double>(targets) : 0.0;
  // The loss is reduced over all ranks, so they all stop here together.
  if (!std::isfinite(out.loss))
    throw AgreedError(concat("the loss is not finite at step ", pos.step + 1, " (lower train.lr or check the data)"));
  out.grad_norm = model.grad_norm() / pos.loss_scale.value;
  const bool overflow = pos.scaling && !std::isfinite(out.grad_norm);
  if (!overflow)
    model.optimizer_step(out.lr, known ? known_factor
                                       : static_cast<float>(clip_factor(out.grad_norm, cfg.train.max_grad_norm) /
                                                            pos.loss_scale.value));
  if (pos.scaling) pos.loss_scale.after_step(overflow);
  if (overflow) {
    result.skipped_steps += 1;
    run.say(concat("step ", pos.step + 1, ": gradient overflow, step skipped; loss scale now ", pos.loss_scale.value));
    run.record({{"type", "overflow"}, {"step", pos.step + 1}, {"loss_scale", pos.loss_scale.value}});
    // Its gradients are dropped now, not at the next step's start: an evaluation or decoding before that may
    // gather the root where they lie (FsdpBufferPlan::root_in_slices).
    model.zero_grad();
  }
  if (trace) write_step_trace(run, pos.step + 1, model.trace_end());
  ++pos.step;
  out.seconds = mpi_max(run.comm, step_timer.seconds());
  out.tokens = count_tokens(run.train_set, global);
  result.step_losses.push_back(out.loss);
  result.grad_norms.push_back(out.grad_norm);
  return out;
}

}  // namespace shardlm

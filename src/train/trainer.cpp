// train(): the step loop over epochs, with the log, checkpoint and stop-signal cadence; setup,
// the step itself, logging, evaluation and the summary live in the train_*.cpp files beside it.
#include <cstdio>
#include <filesystem>

#include "stop_signal.hpp"
#include "train_checkpoint.hpp"
#include "train_run.hpp"
#include "shardlm/train.hpp"

namespace shardlm {

namespace {

// Writes a checkpoint of the run at `pos`; returns its path. keep_name: DIR/best's file, which
// keep_last pruning leaves.
std::string checkpoint(TrainRun& run, const TrainPosition& pos, const std::string& keep_name) {
  run.progress.hide();
  CheckpointMeta meta = make_meta(run.cfg, run.tokenizer_hash, pos.step, pos.epoch, pos.epoch_step, run.total_steps,
                                  run.engine->optimizer_steps(), run.world, run.engine->groups().shard->size(),
                                  pos.loss_scale);
  meta.run_id = run.run_id;
  meta.steps_per_epoch = run.steps_per_epoch;
  if (run.cfg.model.lora.enabled()) {
    meta.lora = peft_adapter_config_json(run.cfg.model, run.cfg.model.dir);
    meta.base_checksum = run.base_checksum;
  }
  const CheckpointWriteStats stats =
      write_checkpoint(run.cfg, meta, run.engine->checkpoint_state(), run.comm, run.echo, keep_name);
  run.record(checkpoint_record(pos.step, stats));
  run.keep_new_run();
  return stats.path;
}

// checkpoint.keep_best: the checkpoint of the lowest eval loss, named by DIR/best (kept by a resume).
struct BestCheckpoint {
  bool have = false;
  double loss = 0;
  std::string name;  // its file name in the checkpoint folder
};

// DIR/best as a resumed run finds it (rank 0 reads, every rank learns it). Collective.
BestCheckpoint read_best(TrainRun& run) {
  BestCheckpoint best;
  char name[256] = {};
  if (run.rank == 0 && read_best_pointer(run.cfg.checkpoint_dir(), &best.name, &best.loss) && best.name.size() < sizeof name) {
    best.have = true;
    std::snprintf(name, sizeof name, "%s", best.name.c_str());
  }
  int have = best.have ? 1 : 0;
  MPI_Bcast(&have, 1, MPI_INT, 0, run.comm);
  MPI_Bcast(&best.loss, 1, MPI_DOUBLE, 0, run.comm);
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, run.comm);
  best.have = have != 0;
  best.name = name;
  return best;
}

}  // namespace

TrainResult train(const RunConfig& cfg, MPI_Comm comm, const TrainOptions& options) {
  std::unique_ptr<TrainRun> owner = setup_run(cfg, comm, options);
  TrainRun& run = *owner;
  if (run.finished) {
    // Resumed at its end (resume = auto on a finished run): no step, no record, exit 0.
    run.say(concat("nothing to do: finished at step ", run.resume_step, " (", run.resume_path, "; the deck gives ",
                   run.total_steps, " steps: raise train.epochs or train.max_steps to train further)"));
    TrainResult result;
    result.first_step = run.resume_step;
    result.nothing_to_do = true;
    return result;
  }
  install_stop_signals();
  TrainPosition pos = load_start(run);
  open_run_outputs(run);
  const int start_epoch = pos.epoch;
  const long start_epoch_step = pos.epoch_step;

  run.progress = ProgressDisplay(run.echo, run.echo && output_is_terminal(), pos.step, run.total_steps);
  if (cfg.run.trace_step > 0 && (cfg.run.trace_step <= pos.step || cfg.run.trace_step > run.total_steps))
    run.say(concat("warning: run.trace_step = ", cfg.run.trace_step, " is not among this run's steps (", pos.step + 1, " to ",
                   run.total_steps, "): no timeline will be written"));
  if (cfg.fsdp.cpu_offload && cfg.run.backend == BackendKind::Cuda && cfg.fsdp.offload_accumulate == OffloadAccumulate::Device &&
      run.accum == 1)
    run.say("warning: fsdp.offload_accumulate = device without gradient accumulation (one micro-step a step) only holds "
            "an fp32 gradient slice on the GPU that nothing uses: use host");
  TrainResult result;
  result.first_step = pos.step;
  const FsdpMemory mem = run.engine->memory();
  result.master_shard_bytes = mem.master_shard;
  result.grad_shard_bytes = mem.grad_shard;
  result.optimizer_bytes = run.engine->optimizer_bytes();
  result.model_params = mem.model_params;

  Timer run_timer;
  RunTotals totals;
  LogInterval interval;
  long saved_step = -1;
  // The checkpoint at the end of training is written before the last evaluation and generation, so
  // a failure there loses no training.
  const bool keep_best = cfg.checkpoint.keep_best == KeepBest::EvalLoss;
  BestCheckpoint best = keep_best && !run.resume_path.empty() && !cfg.checkpoint.load_weights_only ? read_best(run)
                                                                                                     : BestCheckpoint{};
  if (best.have) run.say(concat("best checkpoint so far: ", best.name, " (eval_loss ", best.loss, ")"));
  EarlyStopping early{cfg.train.early_stopping_patience, cfg.train.early_stopping_threshold};
  auto checkpoint_at_end = [&] {
    if (cfg.checkpoint.at_end && !result.preempted && saved_step != pos.step && pos.step > result.first_step) {
      result.last_checkpoint = checkpoint(run, pos, best.name);
      saved_step = pos.step;
    }
  };
  // After each evaluation: the best checkpoint (written now unless this step has one) and early
  // stopping. True when training should stop.
  auto after_eval = [&](const EvalLog& ev) {
    if (keep_best && (!best.have || ev.loss < best.loss)) {
      char name[64];
      std::snprintf(name, sizeof name, "ckpt-%08ld.h5", pos.step);
      if (saved_step != pos.step) {
        result.last_checkpoint = checkpoint(run, pos, name);
        saved_step = pos.step;
      }
      best = {true, ev.loss, std::filesystem::path(result.last_checkpoint).filename().string()};
      run_collectively(comm, [&] {
        if (run.rank == 0) write_best_pointer(cfg.checkpoint_dir(), best.name, best.loss, cfg.checkpoint.keep_last);
      });
      run.say(concat("best checkpoint: ", best.name, " (eval_loss ", ev.loss, ")"));
      run.record({{"type", "best_checkpoint"}, {"step", pos.step}, {"path", result.last_checkpoint}, {"eval_loss", ev.loss}});
    }
    if (best.have) result.best_checkpoint = (std::filesystem::path(cfg.checkpoint_dir()) / best.name).string();
    if (!early.should_stop(ev.loss)) return false;
    run.say(concat("early stopping at step ", pos.step, ": ", early.without_improvement,
                   " evaluation(s) without an improvement of more than ", cfg.train.early_stopping_threshold,
                   " on the best eval_loss ", early.best, " (train.early_stopping_patience = ", early.patience, ")"));
    run.record({{"type", "early_stopping"}, {"step", pos.step}, {"best_eval_loss", early.best},
                {"evaluations_without_improvement", early.without_improvement}});
    result.early_stopped = true;
    return true;
  };
  for (int epoch = start_epoch; epoch < cfg.train.epochs && pos.step < run.total_steps; ++epoch) {
    for (long s = epoch == start_epoch ? start_epoch_step : 0; s < run.steps_per_epoch && pos.step < run.total_steps;
         ++s) {
      const StepOutcome out = take_step(run, pos, epoch, s, result);
      interval.loss += out.loss;
      interval.steps += 1;
      interval.seconds += out.seconds;
      interval.tokens += out.tokens;
      totals.tokens += out.tokens;
      run.progress.step(pos.step, out.loss);
      // Every rank reaches the logging steps: the per-rank memory gather lines up.
      if (pos.step % cfg.train.log_every == 0 || pos.step == run.total_steps)
        totals.final_loss = log_interval(run, pos, out, interval);
      pos.epoch = epoch;
      pos.epoch_step = s + 1;
      bool stop = stop_requested(comm);
      if (stop || (cfg.checkpoint.every > 0 && pos.step % cfg.checkpoint.every == 0)) {
        result.last_checkpoint = checkpoint(run, pos, best.name);
        saved_step = pos.step;
        // A signal that came while this checkpoint was written stops here, at the position it holds:
        // another step and checkpoint could outlast the launcher's grace time (mpirun's few seconds).
        stop = stop || stop_requested(comm);
      }
      if (stop) {
        run.say(concat("stop signal received: checkpoint written at step ", pos.step,
                       "; exiting so the job can be requeued"));
        result.preempted = true;
        clear_stop_request();
        break;
      }
      // eval.every_steps; the epoch's last step is evaluated below, once.
      const bool epoch_ends = s + 1 == run.steps_per_epoch || pos.step >= run.total_steps;
      if (cfg.eval.every_steps > 0 && pos.step % cfg.eval.every_steps == 0 && !epoch_ends && !run.eval_set.empty()) {
        totals.evals.push_back(evaluate_epoch(run, pos.step, epoch, result, /*epoch_end=*/false));
        if (after_eval(totals.evals.back())) break;
      }
    }
    if (result.preempted || result.early_stopped) break;
    if (pos.step >= run.total_steps || epoch == cfg.train.epochs - 1) checkpoint_at_end();
    if (cfg.checkpoint.every_epoch && saved_step != pos.step && pos.step > result.first_step) {  // save_strategy = epoch
      result.last_checkpoint = checkpoint(run, pos, best.name);
      saved_step = pos.step;
    }
    if (!run.eval_set.empty()) {
      totals.evals.push_back(evaluate_epoch(run, pos.step, epoch, result));
      if (after_eval(totals.evals.back())) break;
    }
  }
  checkpoint_at_end();
  // LoRA: the adapters as PEFT loads them (RUN_DIR/adapter), from the checkpoint of the last step.
  if (cfg.model.lora.enabled() && !result.last_checkpoint.empty() && saved_step == pos.step) {
    const std::string dir = cfg.run.dir + "/adapter";
    run_collectively(comm, [&] {
      if (run.rank == 0) export_checkpoint_adapter(result.last_checkpoint, dir, /*overwrite=*/true);
    });
    run.say(concat("adapter written to ", dir, " (PeftModel.from_pretrained(base, '", dir, "') loads it)"));
  } else if (cfg.model.lora.enabled()) {
    run.say("note: no checkpoint of the last step, so no adapter folder; shardlm export --adapter writes one "
            "from any checkpoint");
  }
  totals.seconds = run_timer.seconds();
  summarize_run(run, pos, totals, result);
  clear_stop_request();  // one that came during the last steps: the run has ended anyway
  return result;
}

}  // namespace shardlm

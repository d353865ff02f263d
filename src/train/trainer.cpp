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
                                  pos.loss_scale.value);
  meta.run_id = run.run_id;
  meta.steps_per_epoch = run.steps_per_epoch;
  meta.train_data_hash = hex_digits(run.train_data_hash);
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
  if (run.rank == 0) best.have = read_best_pointer(run.cfg.checkpoint_dir(), &best.name, &best.loss);
  broadcast_value(best.have, run.comm);
  broadcast_value(best.loss, run.comm);
  broadcast_string(best.name, run.comm);
  return best;
}

// The loop's state over a run: where it is, what it has saved and the best so far, and the result.
class TrainLoop {
 public:
  TrainLoop(TrainRun& run, TrainPosition pos) : run_(run), cfg_(run.cfg), pos_(pos) {
    result_.first_step = pos_.step;
    const FsdpMemory mem = run.engine->memory();
    result_.master_shard_bytes = mem.master_shard;
    result_.grad_shard_bytes = mem.grad_shard;
    result_.optimizer_bytes = run.engine->optimizer_bytes();
    result_.model_params = mem.model_params;
    if (keep_best_ && !run.resume_path.empty() && !cfg_.checkpoint.load_weights_only) best_ = read_best(run);
    if (best_.have) run.say(concat("best checkpoint so far: ", best_.name, " (eval_loss ", best_.loss, ")"));
  }

  TrainResult run() {
    const int start_epoch = pos_.epoch;
    const long start_epoch_step = pos_.epoch_step;
    Timer run_timer;
    for (int epoch = start_epoch; epoch < cfg_.train.epochs && pos_.step < run_.total_steps; ++epoch) {
      if (run_epoch(epoch, epoch == start_epoch ? start_epoch_step : 0)) break;
      if (pos_.step >= run_.total_steps || epoch == cfg_.train.epochs - 1) checkpoint_at_end();
      if (cfg_.checkpoint.every_epoch && saved_step_ != pos_.step && pos_.step > result_.first_step)  // save_strategy = epoch
        save(best_.name);
      if (!run_.eval_set.empty()) {
        totals_.evals.push_back(evaluate_epoch(run_, pos_, result_, /*epoch_end=*/true, early_));
        if (after_eval(totals_.evals.back())) break;
      }
    }
    checkpoint_at_end();
    write_adapter();
    totals_.seconds = run_timer.seconds();
    summarize_run(run_, pos_, totals_, result_);
    clear_stop_request();  // one that came during the last steps: the run has ended anyway
    return result_;
  }

 private:
  TrainRun& run_;
  const RunConfig& cfg_;
  TrainPosition pos_;
  TrainResult result_;
  RunTotals totals_;
  LogInterval interval_;
  long saved_step_ = -1;
  const bool keep_best_ = cfg_.checkpoint.keep_best == KeepBest::EvalLoss;
  BestCheckpoint best_;
  EarlyStopping early_{cfg_.train.early_stopping_patience, cfg_.train.early_stopping_threshold};

  void save(const std::string& keep_name) {
    result_.last_checkpoint = checkpoint(run_, pos_, keep_name);
    saved_step_ = pos_.step;
  }

  // The checkpoint at the end of training is written before the last evaluation and generation, so a
  // failure there loses no training.
  void checkpoint_at_end() {
    if (cfg_.checkpoint.at_end && !result_.preempted && saved_step_ != pos_.step && pos_.step > result_.first_step)
      save(best_.name);
  }

  // Steps `first` on of `epoch`; true when the run stops inside it (a signal, early stopping).
  bool run_epoch(int epoch, long first) {
    for (long s = first; s < run_.steps_per_epoch && pos_.step < run_.total_steps; ++s) {
      const StepOutcome out = take_step(run_, pos_, epoch, s, result_);
      interval_.loss += out.loss;
      interval_.steps += 1;
      interval_.seconds += out.seconds;
      interval_.tokens += out.tokens;
      totals_.tokens += out.tokens;
      run_.progress.step(pos_.step, out.loss);
      pos_.epoch = epoch;
      pos_.epoch_step = s + 1;
      // Every rank reaches the logging steps: the per-rank memory gather lines up.
      if (pos_.step % cfg_.train.log_every == 0 || pos_.step == run_.total_steps)
        totals_.final_loss = log_interval(run_, pos_, out, interval_);
      if (checkpoint_or_stop()) return true;
      // eval.every_steps; the epoch's last step is evaluated after the epoch, once.
      const bool epoch_ends = s + 1 == run_.steps_per_epoch || pos_.step >= run_.total_steps;
      if (cfg_.eval.every_steps > 0 && pos_.step % cfg_.eval.every_steps == 0 && !epoch_ends && !run_.eval_set.empty()) {
        totals_.evals.push_back(evaluate_epoch(run_, pos_, result_, /*epoch_end=*/false, early_));
        if (after_eval(totals_.evals.back())) return true;
      }
    }
    return false;
  }

  // The checkpoint.every cadence and the stop signal (which checkpoints at once); true on a stop.
  bool checkpoint_or_stop() {
    bool stop = stop_requested(run_.comm);
    if (stop || (cfg_.checkpoint.every > 0 && pos_.step % cfg_.checkpoint.every == 0)) {
      save(best_.name);
      // A signal that came while this checkpoint was written stops here, at the position it holds:
      // another step and checkpoint could outlast the launcher's grace time (mpirun's few seconds).
      stop = stop || stop_requested(run_.comm);
    }
    if (!stop) return false;
    if (pos_.step >= run_.total_steps) {
      // The last step: nothing is left to requeue for. The run finishes as it would have (final
      // evaluation, adapter, summary) and a job script does not requeue it.
      run_.say(concat("stop signal received at the last step (", pos_.step, "): checkpoint written; finishing"));
      clear_stop_request();
      return false;
    }
    run_.say(concat("stop signal received: checkpoint written at step ", pos_.step, "; exiting so the job can be requeued"));
    result_.preempted = true;
    clear_stop_request();
    return true;
  }

  // After each evaluation: the best checkpoint (written now unless this step has one) and early
  // stopping. True when training should stop.
  bool after_eval(const EvalLog& ev) {
    if (keep_best_ && (!best_.have || ev.loss < best_.loss)) {
      char name[64];
      std::snprintf(name, sizeof name, "ckpt-%08ld.h5", pos_.step);
      if (saved_step_ != pos_.step) save(name);
      best_ = {true, ev.loss, std::filesystem::path(result_.last_checkpoint).filename().string()};
      run_collectively(run_.comm, [&] {
        if (run_.rank == 0) write_best_pointer(cfg_.checkpoint_dir(), best_.name, best_.loss, cfg_.checkpoint.keep_last);
      });
      run_.say(concat("best checkpoint: ", best_.name, " (eval_loss ", ev.loss, ")"));
      run_.record({{"type", "best_checkpoint"}, {"step", pos_.step}, {"path", result_.last_checkpoint}, {"eval_loss", ev.loss}});
    }
    if (best_.have) result_.best_checkpoint = (std::filesystem::path(cfg_.checkpoint_dir()) / best_.name).string();
    if (!early_.should_stop(ev.loss)) return false;
    run_.say(concat("early stopping at step ", pos_.step, ": ", early_.without_improvement,
                    " evaluation(s) without an improvement of more than ", cfg_.train.early_stopping_threshold,
                    " on the best eval_loss ", early_.best, " (train.early_stopping_patience = ", early_.patience, ")"));
    run_.record({{"type", "early_stopping"}, {"step", pos_.step}, {"best_eval_loss", early_.best},
                 {"evaluations_without_improvement", early_.without_improvement}});
    result_.early_stopped = true;
    return true;
  }

  // LoRA: the adapters as PEFT loads them (RUN_DIR/adapter), from the checkpoint of the last step.
  void write_adapter() {
    if (!cfg_.model.lora.enabled()) return;
    if (result_.last_checkpoint.empty() || saved_step_ != pos_.step) {
      run_.say("note: no checkpoint of the last step, so no adapter folder; shardlm export --adapter writes one "
               "from any checkpoint");
      return;
    }
    const std::string dir = cfg_.run.dir + "/adapter";
    run_collectively(run_.comm, [&] {
      if (run_.rank != 0) return;
      // An adapter.partial here holding only an adapter write's files (or nothing) was left by an earlier
      // attempt of this run stopped while writing it (the run folder is this run's, locked): removed, as it
      // would block the write. One holding anything else stays, and the write refuses it, naming it.
      const std::filesystem::path partial = dir + ".partial";
      std::error_code ec;
      const auto adapter_write_only = [&] {
        for (const auto& entry : std::filesystem::directory_iterator(partial, ec)) {
          const std::string name = entry.path().filename().string();
          if (!entry.is_regular_file() || entry.is_symlink() ||
              (name.rfind("adapter_config.json", 0) != 0 && name.rfind("adapter_model.safetensors", 0) != 0))
            return false;
        }
        return !ec;
      };
      if (std::filesystem::is_directory(std::filesystem::symlink_status(partial, ec)) && adapter_write_only()) {
        std::filesystem::remove_all(partial, ec);
        SHARDLM_CHECK(!ec, "adapter: cannot remove ", partial.string(), ", left by an earlier attempt: ", ec.message());
      }
      export_checkpoint_adapter(result_.last_checkpoint, dir, /*overwrite=*/true);
    });
    // A multimodal base's adapter names the modules of the model transformers builds from that folder.
    const std::string base = cfg_.model.hf_multimodal
                                 ? ", base being the multimodal model AutoModelForCausalLM.from_pretrained builds from "
                                   "model.dir, whose module paths the adapter names"
                                 : "";
    run_.say(concat("adapter written to ", dir, " (PeftModel.from_pretrained(base, '", dir, "') loads it", base, ")"));
  }
};

// Warnings about settings that do nothing in this run.
void warn_idle_settings(TrainRun& run, const TrainPosition& pos) {
  const RunConfig& cfg = run.cfg;
  if (cfg.run.trace_step > 0 && (cfg.run.trace_step <= pos.step || cfg.run.trace_step > run.total_steps))
    run.say(concat("warning: run.trace_step = ", cfg.run.trace_step, " is not among this run's steps (", pos.step + 1, " to ",
                   run.total_steps, "): no timeline will be written"));
  if (cfg.fsdp.cpu_offload && cfg.run.backend == BackendKind::Cuda && cfg.fsdp.offload_accumulate == OffloadAccumulate::Device &&
      run.accum == 1)
    run.say("warning: fsdp.offload_accumulate = device without gradient accumulation (one micro-step a step) only holds "
            "an fp32 gradient slice on the GPU that nothing uses: use host");
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
  const TrainPosition pos = load_start(run);
  open_run_outputs(run);
  run.progress = ProgressDisplay(run.echo, run.echo && output_is_terminal(), pos.step, run.total_steps);
  warn_idle_settings(run, pos);
  return TrainLoop(run, pos).run();
}

}  // namespace shardlm

// The training loop: one optimizer step = grad_accum micro-batches per rank over one global batch,
// loss normalised by the global batch's target count so every world size computes the same step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "metrics.hpp"
#include "stop_signal.hpp"
#include "engine.hpp"
#include "generate.hpp"
#include "train_checkpoint.hpp"
#include "shardlm/data.hpp"
#include "shardlm/device.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/fsdp.hpp"
#include "shardlm/optim.hpp"
#include "shardlm/train.hpp"

namespace shardlm {

namespace {

DatasetOptions dataset_options(const DataSection& data, size_t limit, uint64_t seed) {
  DatasetOptions opt;
  opt.max_length = data.max_length;
  opt.limit = limit;
  opt.seed = seed;
  opt.shuffle_subset = limit > 0;
  return opt;
}

std::vector<Example> load_dataset(const DataSection& data, const std::string& path, size_t limit,
                                  uint64_t seed, const Tokenizer& tok) {
  return load_examples(data.format, path, tok, dataset_options(data, limit, seed));
}

// Writes the predictions as the official SQuAD v1.1 evaluation script reads them: {"id": "text"}.
void write_predictions(const std::string& path, const std::vector<std::pair<std::string, std::string>>& predictions) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [id, text] : predictions) j[id] = text;
  std::ofstream out(path);
  out << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  SHARDLM_CHECK(out.good(), "cannot write ", path);
}

int64_t count_tokens(const std::vector<Example>& data, const std::vector<size_t>& indices) {
  int64_t n = 0;
  for (size_t i : indices) n += static_cast<int64_t>(data[i].tokens.size());
  return n;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

struct EvalResult {
  double loss = 0;
  double runtime = 0;
  double samples_per_second = 0;
  double steps_per_second = 0;  // micro-batches per rank per second
};

EvalResult evaluate(TrainEngine& model, const std::vector<Example>& eval_set, MPI_Comm comm, int micro,
                    int32_t pad_id) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  Timer timer;
  double loss_sum = 0, count = 0;
  const std::vector<std::vector<size_t>> batches = eval_micro_batches(eval_set.size(), rank, world, micro);
  for (const auto& indices : batches) {
    MicroBatch mb = make_micro_batch(eval_set, indices, pad_id);
    loss_sum += model.forward_loss(mb);
    count += static_cast<double>(mb.target_count);
  }
  EvalResult r;
  loss_sum = mpi_sum(comm, loss_sum);
  count = mpi_sum(comm, count);
  r.loss = count > 0 ? loss_sum / count : 0.0;
  r.runtime = mpi_max(comm, timer.seconds());
  r.samples_per_second = r.runtime > 0 ? eval_set.size() / r.runtime : 0.0;
  r.steps_per_second = r.runtime > 0 ? batches.size() / r.runtime : 0.0;
  return r;
}

void report_memory(const TrainEngine& engine, MPI_Comm comm, bool echo, MetricsWriter& metrics) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  FsdpMemory m = engine.memory();
  double mine[7] = {double(m.master_shard), double(m.grad_shard), double(engine.optimizer_bytes()),
                    double(m.full_params),  double(m.full_grads), double(m.activations), double(m.comm_staging)};
  std::vector<double> all(7 * static_cast<size_t>(world));
  MPI_Gather(mine, 7, MPI_DOUBLE, all.data(), 7, MPI_DOUBLE, 0, comm);
  if (rank != 0) return;
  const double model_bytes = static_cast<double>(m.model_params) * sizeof(float);
  if (echo) {
    log_info(concat("model: ", m.model_params, " parameters (", format_bytes(size_t(model_bytes)),
                    " fp32); per-rank state:"));
    log_info("  rank   master-shard     grad-shard      optimizer    full-params     full-grads    activations");
  }
  for (int r = 0; r < world; ++r) {
    const double* v = &all[7 * static_cast<size_t>(r)];
    if (echo) {
      char line[256];
      std::snprintf(line, sizeof line, "  %4d %14s %14s %14s %14s %14s %14s", r, format_bytes(size_t(v[0])).c_str(),
                    format_bytes(size_t(v[1])).c_str(), format_bytes(size_t(v[2])).c_str(),
                    format_bytes(size_t(v[3])).c_str(), format_bytes(size_t(v[4])).c_str(),
                    format_bytes(size_t(v[5])).c_str());
      log_info(line);
    }
    metrics.write({{"type", "memory"}, {"rank", r}, {"master_shard_bytes", v[0]}, {"grad_shard_bytes", v[1]},
                   {"optimizer_bytes", v[2]}, {"full_param_bytes", v[3]}, {"full_grad_bytes", v[4]},
                   {"activation_bytes", v[5]}, {"comm_staging_bytes", v[6]}, {"model_bytes", model_bytes},
                   {"sharded_state_fraction", (v[0] + v[2]) / (3.0 * model_bytes)}});
  }
}

}  // namespace

TrainResult train(const RunConfig& cfg, MPI_Comm comm, const TrainOptions& options) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const bool echo = options.echo && rank == 0;
  ProgressDisplay progress(echo, echo && output_is_terminal(), 0, 0);
  auto say = [&](const std::string& line) { progress.print(line); };

  memory_reset_peak();
  if (echo) {
    log_info("# shardlm " SHARDLM_VERSION ": resolved input deck");
    log_info(resolved_deck_ini(cfg));
  }

  // Setup that can fail (run directory, data files): agreed on by every rank before any collective.
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<Example> train_set, eval_set;
  // SQuAD answers are generated and scored (exact match, F1) when the deck asks for it.
  const bool generate_answers = cfg.data.format == DataFormat::Squad && cfg.eval.generate != EvalGenerate::None;
  std::vector<SquadQuestion> questions;
  MetricsWriter metrics;
  std::string resume_path;
  run_collectively(comm, [&] {
    resume_path = resolve_resume(cfg.checkpoint.resume, cfg.checkpoint.resume_path, cfg.checkpoint_dir());
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::create_directories(cfg.run.dir, ec);
      SHARDLM_CHECK(!ec, "run.dir = '", cfg.run.dir, "': cannot create it: ", ec.message());
      std::ofstream deck(std::filesystem::path(cfg.run.dir) / "deck.resolved.ini");
      deck << resolved_deck_ini(cfg);
      SHARDLM_CHECK(deck.good(), "run.dir = '", cfg.run.dir, "': cannot write deck.resolved.ini");
      metrics = MetricsWriter((std::filesystem::path(cfg.run.dir) / "metrics.jsonl").string(), !resume_path.empty());
    }
    // A deck has resolved "auto" already; a RunConfig built in code may still hold it.
    tokenizer = make_tokenizer(cfg.tokenizer_json());
    SHARDLM_CHECK(tokenizer->vocab_size() <= cfg.model.vocab_size, "data.tokenizer ", tokenizer_text(cfg.data), " has ",
                  tokenizer->vocab_size(), " tokens, more than the model's vocab_size ", cfg.model.vocab_size);
    train_set = load_dataset(cfg.data, cfg.data.train_file, cfg.data.train_size, cfg.train.seed, *tokenizer);
    if (!cfg.data.eval_file.empty()) {
      eval_set = load_dataset(cfg.data, cfg.data.eval_file, cfg.data.eval_size, cfg.train.seed, *tokenizer);
      if (generate_answers)
        questions = load_squad_questions(cfg.data.eval_file, dataset_options(cfg.data, cfg.data.eval_size, cfg.train.seed));
    }
    SHARDLM_CHECK(train_set.size() >= static_cast<size_t>(cfg.train.batch_size), "train.batch_size = ",
                  cfg.train.batch_size, " is larger than the training set (", train_set.size(), " examples in ",
                  cfg.data.train_file, ")");
  });
  Topology topo;
  run_collectively(comm, [&] { topo = make_topology(comm, cfg.dist.ranks_per_node); });
  // Ranks sharing a host split its cores between their BLAS threads.
  cpu_set_threads(cpu_default_threads(topo.host_ranks));

  const int micro = cfg.train.micro_batch_size;
  const int accum = cfg.grad_accum(world);
  std::unique_ptr<TrainEngine> engine_owner;
  if (cfg.run.backend == BackendKind::Cuda) {
#ifdef SHARDLM_HAVE_CUDA
    run_collectively(comm, [&] { engine_owner = make_cuda_engine(cfg, comm, topo, micro); });
#else
    throw AgreedError("run.backend = cuda: this shardlm was built without CUDA (configure with -DSHARDLM_CUDA=ON)");
#endif
  } else {
    engine_owner = make_cpu_engine(cfg, make_mpi_process_groups(comm, topo, cfg.fsdp.strategy), micro);
  }
  TrainEngine& model = *engine_owner;
  ProcessGroups& groups = model.groups();

  DistributedSampler sampler(train_set.size(), static_cast<size_t>(cfg.train.batch_size), cfg.train.seed,
                             cfg.train.shuffle);
  const long steps_per_epoch = static_cast<long>(sampler.steps_per_epoch());
  long total_steps = steps_per_epoch * cfg.train.epochs;
  if (cfg.train.max_steps > 0) total_steps = std::min<long>(total_steps, cfg.train.max_steps);

  say(concat("world ", world, " rank(s) on ", topo.num_nodes, topo.emulated ? " emulated" : "", " node(s); ",
             strategy_name(cfg.fsdp.strategy), ": shard group ", groups.shard->size(), ", replicate group ",
             groups.replicate->size(), "; param ", dtype_name(cfg.fsdp.param_dtype), ", reduce ",
             dtype_name(cfg.fsdp.reduce_dtype)));
  say(concat("data: ", train_set.size(), " train / ", eval_set.size(), " eval examples; global batch ",
             cfg.train.batch_size, " = micro-batch ", micro, " x ", accum, " accumulation x ", world, " ranks; ",
             steps_per_epoch, " steps/epoch, ", total_steps, " steps"));
  if (rank == 0)
    metrics.write({{"type", "setup"}, {"world_size", world}, {"num_nodes", topo.num_nodes},
                   {"strategy", strategy_name(cfg.fsdp.strategy)}, {"shard_group_size", groups.shard->size()},
                   {"replicate_group_size", groups.replicate->size()}, {"grad_accum", accum},
                   {"steps_per_epoch", steps_per_epoch}, {"total_steps", total_steps}});
  report_memory(model, comm, echo, metrics);

  install_stop_signals();
  long step = 0;
  // Dynamic loss scaling (GradScaler's rules): scale the loss, unscale the gradients, skip a step
  // whose gradient overflowed (every rank sees the same global norm) and halve; double after a
  // run of good steps.
  const bool fp16 = cfg.fsdp.param_dtype == DType::F16 || cfg.fsdp.reduce_dtype == DType::F16;
  const bool scaling = cfg.train.loss_scale > 0 || fp16;
  double loss_scale = scaling ? (cfg.train.loss_scale > 0 ? cfg.train.loss_scale : 65536.0) : 1.0;
  constexpr long kScaleGrowthInterval = 2000;
  long good_steps = 0;
  // Training FLOPs per token (forward + backward) and the utilisation they give at run.peak_tflops.
  const ModelConfig& mc = cfg.model;
  const double params = static_cast<double>(model.memory().model_params);
  const double flops_per_token =
      6.0 * params + 12.0 * mc.num_layers * static_cast<double>(mc.hidden_size) * cfg.data.max_length;
  auto mfu_of = [&](double tokens_per_s) {
    return cfg.run.peak_tflops > 0 ? tokens_per_s * flops_per_token / (world * cfg.run.peak_tflops * 1e12) : 0.0;
  };
  int64_t run_tokens = 0;
  int start_epoch = 0;
  long start_epoch_step = 0;
  if (!resume_path.empty()) {
    CheckpointMeta meta = load_checkpoint(resume_path, model.checkpoint_state(), comm);
    model.set_optimizer_steps(meta.optimizer_steps);
    model.checkpoint_loaded();
    step = meta.step;
    if (scaling && meta.loss_scale > 0) loss_scale = meta.loss_scale;
    start_epoch = meta.epoch;
    start_epoch_step = meta.epoch_step;
    say(concat("resumed from ", resume_path, ": step ", meta.step, ", epoch ", meta.epoch, " after ",
               meta.epoch_step, " of its steps (written by ", meta.world_size, " rank(s), ", meta.strategy, ")"));
  } else if (!cfg.model.dir.empty()) {
    const PretrainedLoad load = load_pretrained(cfg.model.dir, model.checkpoint_state(), comm);
    model.checkpoint_loaded();
    say(concat("loaded weights from ", cfg.model.dir, ": ", format_bytes(load.bytes_total), " read by ", world,
               " rank(s) (at most ", format_bytes(load.bytes_max_rank), " by one) in ", load.seconds, " s"));
    if (rank == 0)
      metrics.write({{"type", "pretrained"}, {"dir", cfg.model.dir}, {"bytes", load.bytes_total},
                   {"max_rank_bytes", load.bytes_max_rank}, {"seconds", load.seconds}});
  }
  auto checkpoint = [&](int epoch, long epoch_step) {
    progress.hide();
    CheckpointMeta meta = make_meta(cfg, step, epoch, epoch_step, total_steps, model.optimizer_steps(), world,
                                    groups.shard->size(), loss_scale);
    return write_checkpoint(cfg, meta, model.checkpoint_state(), comm, echo, metrics).path;
  };

  progress = ProgressDisplay(echo, echo && output_is_terminal(), step, total_steps);
  TrainResult result;
  result.first_step = step;
  FsdpMemory mem = model.memory();
  result.master_shard_bytes = mem.master_shard;
  result.grad_shard_bytes = mem.grad_shard;
  result.optimizer_bytes = model.optimizer_bytes();
  result.model_params = mem.model_params;

  Timer run_timer;
  // On a GPU the device's high-water mark; on the CPU the planned buffers.
  auto peak_bytes = [&] {
    return model.device_peak_bytes() > 0 ? model.device_peak_bytes() : memory_stats().total_peak;
  };
  double final_loss = NAN;
  std::vector<EvalLog> evals;
  long saved_step = -1;
  double interval_loss = 0;
  int interval_steps = 0;
  double interval_time = 0;
  int64_t interval_tokens = 0;
  // Position in the data after the last step taken: `position_step` steps done in `position_epoch`.
  int position_epoch = start_epoch;
  long position_step = start_epoch_step;
  for (int epoch = start_epoch; epoch < cfg.train.epochs && step < total_steps; ++epoch) {
    for (long s = epoch == start_epoch ? start_epoch_step : 0; s < steps_per_epoch && step < total_steps; ++s) {
      Timer step_timer;
      const std::vector<size_t> global = sampler.global_batch(epoch, s);
      const int64_t targets = count_targets(train_set, global);
      const float grad_scale =
          targets > 0 ? static_cast<float>(loss_scale / static_cast<double>(targets)) : 0.0f;
      model.zero_grad();
      double loss_sum = 0;
      for (int m = 0; m < accum; ++m) {
        MicroBatch mb = make_micro_batch(train_set, sampler.micro_batch(epoch, s, rank, world, m, micro),
                                         tokenizer->pad_id());
        loss_sum += model.forward_backward(mb, grad_scale);
      }
      const double loss = targets > 0 ? mpi_sum(comm, loss_sum) / static_cast<double>(targets) : 0.0;
      // The loss is reduced over all ranks, so they all stop here together.
      if (!std::isfinite(loss))
        throw AgreedError(concat("the loss is not finite at step ", step + 1, " (lower train.lr or check the data)"));
      const double norm = model.grad_norm() / loss_scale;
      const double lr = scheduled_lr(cfg.train.lr_schedule, cfg.train.lr, step, cfg.train.warmup_steps, total_steps);
      if (scaling && !std::isfinite(norm)) {
        result.skipped_steps += 1;
        good_steps = 0;
        loss_scale = std::max(loss_scale / 2, 1.0);
        say(concat("step ", step + 1, ": gradient overflow, step skipped; loss scale now ", loss_scale));
        if (rank == 0)
          metrics.write({{"type", "overflow"}, {"step", step + 1}, {"loss_scale", loss_scale}});
      } else {
        model.optimizer_step(lr, static_cast<float>(clip_factor(norm, cfg.train.max_grad_norm) / loss_scale));
        if (scaling && ++good_steps == kScaleGrowthInterval) {
          loss_scale *= 2;
          good_steps = 0;
        }
      }
      ++step;
      const double step_time = mpi_max(comm, step_timer.seconds());
      result.step_losses.push_back(loss);
      result.grad_norms.push_back(norm);

      interval_loss += loss;
      interval_steps += 1;
      interval_time += step_time;
      const int64_t step_tokens = count_tokens(train_set, global);
      interval_tokens += step_tokens;
      run_tokens += step_tokens;
      progress.step(step, loss);
      // Every rank reaches the logging steps: the per-rank memory gather lines up.
      if (step % cfg.train.log_every == 0 || step == total_steps) {
        StepLog log;
        log.step = step;
        log.total_steps = total_steps;
        log.epoch = static_cast<double>(step) / static_cast<double>(steps_per_epoch);
        log.loss = interval_loss / interval_steps;
        log.grad_norm = norm;
        log.learning_rate = lr;
        log.tokens_per_second = interval_time > 0 ? interval_tokens / interval_time : 0.0;
        log.world = world;
        log.mfu = mfu_of(log.tokens_per_second);
        log.loss_scale = loss_scale;
        log.peak_memory_bytes = gather_on_root(comm, static_cast<double>(peak_bytes()));
        log.gpu_memory = model.device_peak_bytes() > 0;
        final_loss = log.loss;
        say(train_line(log));
        if (rank == 0) metrics.write(train_record(log));
        interval_loss = 0;
        interval_steps = 0;
        interval_time = 0;
        interval_tokens = 0;
      }
      position_epoch = epoch;
      position_step = s + 1;
      const bool stop = stop_requested(comm);
      if (stop || (cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0)) {
        result.last_checkpoint = checkpoint(position_epoch, position_step);
        saved_step = step;
      }
      if (stop) {
        say(concat("stop signal received: checkpoint written at step ", step, "; exiting so the job can be requeued"));
        result.preempted = true;
        break;
      }
    }
    if (result.preempted) break;
    if (!eval_set.empty()) {
      progress.hide();
      EvalResult ev = evaluate(model, eval_set, comm, micro, tokenizer->pad_id());
      result.eval_losses.push_back(ev.loss);
      EvalLog log;
      log.step = step;
      log.epoch = static_cast<double>(step) / static_cast<double>(steps_per_epoch);
      log.loss = ev.loss;
      log.runtime = ev.runtime;
      log.samples_per_second = ev.samples_per_second;
      log.steps_per_second = ev.steps_per_second;
      const bool last_eval = step >= total_steps || epoch == cfg.train.epochs - 1;
      if (generate_answers && (cfg.eval.generate == EvalGenerate::Epoch || last_eval)) {
        const int batch = cfg.eval.batch_size > 0 ? cfg.eval.batch_size : micro;
        const SquadGeneration g =
            squad_generate(model, eval_set, questions, *tokenizer, batch, cfg.eval.max_new_tokens, comm);
        run_collectively(comm, [&] {
          if (rank == 0) write_predictions((std::filesystem::path(cfg.run.dir) / "predictions.json").string(), g.predictions);
        });
        log.exact_match = result.exact_match = g.exact_match;
        log.f1 = result.f1 = g.f1;
        log.generation_runtime = g.runtime;
      }
      evals.push_back(log);
      say(eval_line(log));
      if (rank == 0) metrics.write(eval_record(log));
    }
  }

  if (cfg.checkpoint.at_end && !result.preempted && saved_step != step && step > result.first_step) {
    result.last_checkpoint = checkpoint(position_epoch, position_step);
  }
  result.loss_scale = loss_scale;
  result.train_runtime = mpi_max(comm, run_timer.seconds());
  result.mfu = mfu_of(result.train_runtime > 0 ? run_tokens / result.train_runtime : 0.0);
  double sum = 0;
  for (double l : result.step_losses) sum += l;
  result.train_loss = result.step_losses.empty() ? 0.0 : sum / result.step_losses.size();
  const long steps_run = step - result.first_step;
  result.train_samples_per_second =
      result.train_runtime > 0 ? static_cast<double>(steps_run) * cfg.train.batch_size / result.train_runtime : 0.0;
  const std::vector<double> peaks = gather_on_root(comm, static_cast<double>(peak_bytes()));
  result.peak_memory_bytes = static_cast<size_t>(mpi_max(comm, static_cast<double>(peak_bytes())));
  result.peak_rss_bytes = static_cast<size_t>(mpi_max(comm, static_cast<double>(process_peak_rss_bytes())));
  progress.finish();
  say(concat(result.preempted ? "stopped: " : "done: ", steps_run, " steps in ", fmt("%.1f", result.train_runtime), " s | train_loss ",
             fmt("%.4f", result.train_loss), " | ", fmt("%.2f", result.train_samples_per_second),
             " samples/s | peak memory ", format_bytes(result.peak_memory_bytes), " per rank (",
             model.device_peak_bytes() > 0 ? "GPU" : "planned buffers", "), ",
             format_bytes(result.peak_rss_bytes), " resident"));
  RunSummary summary;
  summary.train_runtime = result.train_runtime;
  summary.train_samples_per_second = result.train_samples_per_second;
  summary.train_steps_per_second = result.train_runtime > 0 ? steps_run / result.train_runtime : 0.0;
  summary.train_loss = result.train_loss;
  summary.final_loss = final_loss;
  summary.epoch = static_cast<double>(step) / static_cast<double>(steps_per_epoch);
  summary.tokens_per_second_per_gpu = result.train_runtime > 0 ? run_tokens / result.train_runtime / world : 0.0;
  summary.mfu = result.mfu;
  summary.steps = step;
  summary.preempted = result.preempted;
  summary.peak_memory_bytes = peaks;
  summary.peak_rss_bytes = static_cast<double>(result.peak_rss_bytes);
  summary.gpu_memory = model.device_peak_bytes() > 0;
  summary.evals = evals;
  if (echo) {
    std::fputs(summary_table(summary).c_str(), stdout);
    std::fflush(stdout);
  }
  if (rank == 0) metrics.write(summary_record(summary));
  return result;
}

}  // namespace shardlm

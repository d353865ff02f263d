// The evaluation after each epoch: the eval loss on every rank's share of the eval set and, for
// SQuAD when eval.generate asks, greedy answers scored by exact match and F1 (predictions.json).
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "generate.hpp"
#include "train_run.hpp"

namespace shardlm {

namespace {

// Writes the predictions as the official SQuAD v1.1 evaluation script reads them: {"id": "text"}.
void write_predictions(const std::string& path, const std::vector<std::pair<std::string, std::string>>& predictions) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [id, text] : predictions) j[id] = text;
  replace_file(path, j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "predictions file");
}

struct EvalResult {
  double loss = 0;
  double runtime = 0;
  double samples_per_second = 0;
  double steps_per_second = 0;  // micro-batches per rank per second
};

EvalResult evaluate(FsdpEngine& model, const std::vector<Example>& eval_set, MPI_Comm comm, int micro,
                    int32_t pad_id, int max_seq) {
  const int rank = rank_of(comm), world = size_of(comm);
  Timer timer;
  double loss_sum = 0, count = 0;
  const std::vector<std::vector<size_t>> batches = eval_micro_batches(eval_set.size(), rank, world, micro);
  for (const auto& indices : batches) {
    MicroBatch mb = make_micro_batch(eval_set, indices, pad_id, model.length_multiple(), max_seq);
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

}  // namespace

bool EarlyStopping::should_stop(double eval_loss) {
  if (patience <= 0) return false;
  if (!have_best || (eval_loss < best && std::abs(eval_loss - best) > threshold)) without_improvement = 0;
  else without_improvement += 1;
  // Trainer keeps the best metric of every evaluation, improved by any amount.
  if (!have_best || eval_loss < best) best = eval_loss;
  have_best = true;
  return without_improvement >= patience;
}

EvalLog evaluate_epoch(TrainRun& run, const TrainPosition& pos, TrainResult& result, bool epoch_end,
                       const EarlyStopping& early) {
  const long step = pos.step;
  const int epoch = pos.epoch;
  const RunConfig& cfg = run.cfg;
  run.progress.hide();
  EvalResult ev =
      evaluate(*run.engine, run.eval_set, run.comm, run.micro, run.tokenizer->pad_id(), run.cfg.data.max_length);
  result.eval_losses.push_back(ev.loss);
  EvalLog log;
  log.step = step;
  log.epoch = pos.epochs_done(run.steps_per_epoch);
  log.loss = ev.loss;
  log.runtime = ev.runtime;
  log.samples_per_second = ev.samples_per_second;
  log.steps_per_second = ev.steps_per_second;
  // Early stopping ends the run at this evaluation: its answers are the run's last.
  const bool stops = early.would_stop(ev.loss);
  const bool last_eval = step >= run.total_steps || epoch == cfg.train.epochs - 1 || stops;
  if (run.generate_answers && ((epoch_end && (cfg.eval.generate == EvalGenerate::Epoch || last_eval)) || stops)) {
    const int batch = cfg.eval.batch_size > 0 ? cfg.eval.batch_size : run.micro;
    const SquadGeneration g = squad_generate(*run.engine, run.eval_set, run.questions, *run.tokenizer, batch,
                                             cfg.eval.max_new_tokens, run.comm);
    run_collectively(run.comm, [&] {
      if (run.rank == 0)
        write_predictions((std::filesystem::path(cfg.run.dir) / "predictions.json").string(), g.predictions);
    });
    log.exact_match = result.exact_match = g.exact_match;
    log.f1 = result.f1 = g.f1;
    log.generation_runtime = g.runtime;
  }
  run.say(eval_line(log));
  run.record(eval_record(log));
  if (run.tensorboard) {
    std::vector<std::pair<std::string, double>> scalars{{"eval/loss", log.loss}, {"eval/runtime", log.runtime}};
    if (!std::isnan(log.exact_match)) scalars.emplace_back("eval/exact_match", log.exact_match);
    if (!std::isnan(log.f1)) scalars.emplace_back("eval/f1", log.f1);
    run.tensorboard->scalars(step, scalars);
  }
  return log;
}

}  // namespace shardlm

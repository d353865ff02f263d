// Reading a run directory (metrics.jsonl, deck.resolved.ini) and the side-by-side Markdown table and
// CSV of several runs.
#include "run_report.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <stdexcept>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "../../core/input_file.hpp"
#include "shardlm/config.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

namespace fs = std::filesystem;

namespace {

// "section.key" -> value of the resolved deck.
std::map<std::string, std::string> read_ini(const std::string& path) {
  std::error_code ec;
  SHARDLM_CHECK(fs::exists(path, ec), path, ": cannot open the resolved deck (is this a shardlm run directory?)");
  return ini_values(read_input_file(path, "resolved deck", kMaxDeckBytes), path);
}

double number_or_nan(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

std::string fixed(double v, const char* f) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string memory_text(double bytes) {
  return std::isfinite(bytes) ? format_bytes(static_cast<size_t>(bytes)) : "-";
}

bool any_finite(const std::vector<RunRecord>& runs, double RunRecord::*field) {
  return std::any_of(runs.begin(), runs.end(), [&](const RunRecord& r) { return std::isfinite(r.*field); });
}

// The last epoch any run evaluated at its end: the number of eval-loss-per-epoch columns.
int max_eval_epoch(const std::vector<RunRecord>& runs) {
  int n = 0;
  for (const RunRecord& r : runs)
    if (!r.eval_loss_by_epoch.empty()) n = std::max(n, r.eval_loss_by_epoch.rbegin()->first);
  return n;
}

double epoch_eval_loss(const RunRecord& r, int epoch) {
  auto it = r.eval_loss_by_epoch.find(epoch);
  return it == r.eval_loss_by_epoch.end() ? NAN : it->second;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// Full precision for machines; empty for unknown.
std::string csv_number(double v) {
  if (!std::isfinite(v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// The segments of the runs that were resumed: each process's ranks, steps, runtime and loss.
std::string segments_markdown(const std::vector<RunRecord>& runs) {
  std::string out;
  for (const RunRecord& r : runs) {
    if (r.segments.size() < 2) continue;
    if (out.empty())
      out = "\nResumed runs: train samples/s and mean train loss above cover every segment that ended with a "
            "summary (samples over their summed runtime, loss weighted by steps).\n\n"
            "| run | segment | ranks | nodes | strategy | steps | train runtime (s) | train samples/s | "
            "mean train loss | ended |\n| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | --- |\n";
    for (size_t i = 0; i < r.segments.size(); ++i) {
      const RunSegment& seg = r.segments[i];
      const char* ended = !seg.summary ? "no summary (killed?)" : seg.preempted ? "preempted" : "finished";
      out += concat("| ", r.name, " | ", i, " | ", seg.ranks, " | ", seg.nodes, " | ", seg.strategy, " | ",
                    seg.first_step, "-", seg.last_step, " | ", fixed(seg.train_runtime, "%.2f"), " | ",
                    fixed(seg.train_samples_per_second, "%.2f"), " | ", fixed(seg.train_loss, "%.4f"), " | ", ended,
                    " |\n");
    }
  }
  return out;
}

// The evaluations inside an epoch, one row per run that has any: the epoch column above holds epoch ends only.
std::string step_evals_markdown(const std::vector<RunRecord>& runs) {
  std::string out;
  for (const RunRecord& r : runs) {
    if (r.step_evals.empty()) continue;
    if (out.empty())
      out = "\nEvaluations inside an epoch (eval.every_steps, or a run that stopped inside one), not in the eval loss "
            "per epoch above:\n\n| run | step (epoch): eval loss |\n| --- | --- |\n";
    std::string evals;
    for (const auto& [step, e] : r.step_evals)
      evals += concat(evals.empty() ? "" : ", ", step, " (", fixed(e.epoch, "%.2f"), "): ", fixed(e.loss, "%.4f"));
    out += concat("| ", r.name, " | ", evals, " |\n");
  }
  return out;
}

std::string segment_ranks(const RunRecord& r) {
  std::string out;
  for (const RunSegment& seg : r.segments) out += (out.empty() ? "" : ";") + std::to_string(seg.ranks);
  return out;
}

// One record of metrics.jsonl into the run. Throws on a malformed record.
void read_record(const nlohmann::json& j, const std::string& type, RunRecord& run) {
  if (type == "setup") {
    // Each process of the run (the first, then each resume) starts with one.
    RunSegment seg;
    seg.ranks = j.at("world_size").get<int>();
    seg.nodes = j.at("num_nodes").get<int>();
    seg.strategy = j.at("strategy").get<std::string>();
    seg.grad_accum = j.value("grad_accum", 0);
    seg.first_step = j.value("resumed_from_step", run.segments.empty() ? 0L : run.segments.back().last_step);
    seg.last_step = seg.first_step;
    run.segments.push_back(seg);
  } else if (run.segments.empty()) {
    throw std::runtime_error("'" + type + "' record before any 'setup' record");
  } else if (type == "train") {
    const long step = j.at("step").get<long>();
    const double loss = j.at("loss").get<double>();
    run.train_loss_by_step[step] = loss;
    run.final_loss = loss;
    run.segments.back().last_step = step;
  } else if (type == "eval") {
    const double loss = j.at("eval_loss").get<double>();
    // The trainer records epochs done (epoch + steps into it / steps per epoch): whole, exactly, at an
    // epoch's end only. A repeat (a resume at an epoch's end evaluates it again) keeps the later loss.
    const double epoch = number_or_nan(j, "epoch");
    if (std::isfinite(epoch) && epoch >= 1 && epoch == std::floor(epoch))
      run.eval_loss_by_epoch[static_cast<int>(epoch)] = loss;
    else
      run.step_evals[j.at("step").get<long>()] = {epoch, loss};
    run.exact_match = number_or_nan(j, "eval_exact_match");
    run.f1 = number_or_nan(j, "eval_f1");
  } else if (type == "summary") {
    RunSegment& seg = run.segments.back();
    seg.train_samples_per_second = j.at("train_samples_per_second").get<double>();
    seg.train_loss = j.at("train_loss").get<double>();
    seg.train_runtime = number_or_nan(j, "train_runtime");
    seg.train_steps_per_second = number_or_nan(j, "train_steps_per_second");
    if (j.contains("first_step")) seg.first_step = j["first_step"].get<long>();
    if (j.contains("steps")) seg.last_step = j["steps"].get<long>();
    seg.preempted = j.value("preempted", false);
    seg.summary = true;
    const double peak = j.at("peak_memory_bytes").get<double>();
    run.peak_memory_bytes = std::isfinite(run.peak_memory_bytes) ? std::max(run.peak_memory_bytes, peak) : peak;
  }
}

// Every record of RUN_DIR/metrics.jsonl; a bad line is a warning, not the end of the report.
void read_metrics(const std::string& run_dir, RunRecord& run) {
  std::error_code ec;
  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  SHARDLM_CHECK(fs::exists(metrics_path, ec), metrics_path,
                ": cannot open the metrics log (is this a shardlm run directory?)");
  const std::unique_ptr<std::istream> metrics = open_input_file(metrics_path, "metrics log", kMaxDataFileBytes);
  std::string line;
  for (size_t number = 1; std::getline(*metrics, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string type;
    try {
      const nlohmann::json j = parse_json_bounded(line, metrics_path);
      if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
        throw std::runtime_error("expected a JSON object with a string 'type'");
      type = j["type"];
      read_record(j, type, run);
    } catch (const std::exception& e) {
      // One bad line (a crash mid-write, a hand edit) does not hide the rest of the run.
      run.warnings.push_back(concat(metrics_path, ":", number, ": skipped",
                                    type.empty() ? std::string() : " '" + type + "' record", ": ", e.what()));
    }
  }
  SHARDLM_CHECK(!run.segments.empty(), metrics_path, ": no 'setup' record (the run did not start?)");
}

// Totals over the segments that ended with a summary: samples over their summed runtime, and the loss
// of each segment weighted by its steps.
void total_segments(RunRecord& run) {
  std::vector<const RunSegment*> done;
  for (const RunSegment& seg : run.segments)
    if (seg.summary) done.push_back(&seg);
  if (done.size() == 1) {
    run.train_samples_per_second = done[0]->train_samples_per_second;
    run.train_loss = done[0]->train_loss;
  } else if (done.size() > 1) {
    double samples = 0, seconds = 0, loss_sum = 0, steps = 0;
    for (const RunSegment* seg : done) {
      samples += seg->train_samples_per_second * seg->train_runtime;
      seconds += seg->train_runtime;
      const double n = seg->steps_run();
      if (n > 0) loss_sum += seg->train_loss * n, steps += n;
    }
    run.train_samples_per_second = seconds > 0 ? samples / seconds : NAN;
    run.train_loss = steps > 0 ? loss_sum / steps : NAN;
  }
}

}  // namespace

RunRecord read_run(const std::string& run_dir) {
  std::error_code ec;
  SHARDLM_CHECK(fs::is_directory(run_dir, ec), "report: '", run_dir, "' is not a directory");
  RunRecord run;
  run.dir = run_dir;
  fs::path dir = fs::path(run_dir);
  if (!dir.has_filename()) dir = dir.parent_path();  // "runs/demo/" names "demo"
  run.name = dir.filename().string();
  if (run.name.empty() || run.name == ".") run.name = fs::absolute(dir, ec).lexically_normal().filename().string();

  const std::map<std::string, std::string> deck = read_ini((fs::path(run_dir) / "deck.resolved.ini").string());
  auto deck_value = [&](const std::string& key) {
    auto it = deck.find(key);
    return it == deck.end() ? std::string() : it->second;
  };
  run.backend = deck_value("run.backend");
  run.param_dtype = deck_value("fsdp.param_dtype");
  run.global_batch = std::atoi(deck_value("train.batch_size").c_str());
  read_metrics(run_dir, run);
  const RunSegment& last = run.segments.back();
  run.ranks = last.ranks;
  run.nodes = last.nodes;
  run.strategy = last.strategy;
  if (deck_value("fsdp.cpu_offload") == "true" && run.backend == "cuda") run.strategy += " +offload";
  total_segments(run);
  return run;
}

double RunSegment::steps_run() const {
  // The summary's steps/s times its runtime, rounded: exact where both are recorded.
  if (!std::isfinite(train_steps_per_second) || !std::isfinite(train_runtime)) return NAN;
  return std::round(train_steps_per_second * train_runtime);
}

bool RunRecord::mixed_ranks() const {
  for (const RunSegment& seg : segments)
    if (seg.ranks != ranks) return true;
  return false;
}

// A segment field's values in order, repeats merged: "4", "4 then 2"; "-" for none recorded (0).
static std::string segments_text(const std::vector<RunSegment>& segments, int RunSegment::*field) {
  std::string text;
  int previous = -1;
  for (const RunSegment& seg : segments)
    if (seg.*field != previous && seg.*field > 0) {
      text += (text.empty() ? "" : " then ") + std::to_string(seg.*field);
      previous = seg.*field;
    }
  return text.empty() ? "-" : text;
}

std::string RunRecord::ranks_text() const { return segments_text(segments, &RunSegment::ranks); }
std::string RunRecord::grad_accum_text() const { return segments_text(segments, &RunSegment::grad_accum); }

size_t base_run(const std::vector<RunRecord>& runs) {
  // A run on one rank count only, when there is one: a mixed run has no single ranks to scale from.
  size_t best = runs.size();
  for (size_t i = 0; i < runs.size(); ++i)
    if (!runs[i].mixed_ranks() && (best == runs.size() || runs[i].ranks < runs[best].ranks)) best = i;
  return best == runs.size() ? 0 : best;
}

double speedup(const RunRecord& run, const RunRecord& base) {
  if (!(base.train_samples_per_second > 0) || run.mixed_ranks() || base.mixed_ranks()) return NAN;
  return run.train_samples_per_second / base.train_samples_per_second;
}

double efficiency(const RunRecord& run, const RunRecord& base) {
  if (base.ranks <= 0 || run.ranks <= 0) return NAN;
  return speedup(run, base) / (static_cast<double>(run.ranks) / base.ranks);
}

std::string report_markdown(const std::vector<RunRecord>& runs) {
  SHARDLM_CHECK(!runs.empty(), "report: no runs");
  const RunRecord& base = runs[base_run(runs)];
  const bool em = any_finite(runs, &RunRecord::exact_match);
  const bool f1 = any_finite(runs, &RunRecord::f1);
  std::string out = "| run | backend | strategy | dtype | ranks | nodes | global batch | accumulation | train samples/s | "
                    "speed-up | efficiency | peak memory/rank | final train loss | mean train loss | eval loss per epoch |";
  std::string rule = "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |";
  if (em) out += " EM |", rule += " ---: |";
  if (f1) out += " F1 |", rule += " ---: |";
  out += "\n" + rule + "\n";
  for (const RunRecord& r : runs) {
    // Epochs 1 to the last the run evaluated, "-" for one it did not.
    std::string evals;
    const int epochs = r.eval_loss_by_epoch.empty() ? 0 : r.eval_loss_by_epoch.rbegin()->first;
    for (int e = 1; e <= epochs; ++e) evals += (e > 1 ? ", " : "") + fixed(epoch_eval_loss(r, e), "%.4f");
    out += concat("| ", r.name, " | ", r.backend, " | ", r.strategy, " | ", r.param_dtype, " | ", r.ranks_text(), " | ",
                  r.nodes, " | ", r.global_batch > 0 ? std::to_string(r.global_batch) : "-", " | ", r.grad_accum_text(),
                  " | ", fixed(r.train_samples_per_second, "%.2f"), " | ",
                  fixed(speedup(r, base), "%.2fx"), " | ", fixed(100 * efficiency(r, base), "%.0f%%"), " | ",
                  memory_text(r.peak_memory_bytes), " | ", fixed(r.final_loss, "%.4f"), " | ",
                  fixed(r.train_loss, "%.4f"), " | ", evals.empty() ? "-" : evals, " |");
    if (em) out += " " + fixed(r.exact_match, "%.2f") + " |";
    if (f1) out += " " + fixed(r.f1, "%.2f") + " |";
    out += "\n";
  }
  out += base.mixed_ranks()
             ? std::string("\nno speed-up or efficiency: no run ran on one rank count throughout; peak memory is the "
                           "largest over ranks.\n")
             : concat("\nspeed-up and efficiency against ", base.name, " (", base.ranks,
                      " rank(s)); peak memory is the largest over ranks.\n");
  out += step_evals_markdown(runs);
  out += segments_markdown(runs);
  return out;
}

std::string report_csv(const std::vector<RunRecord>& runs) {
  SHARDLM_CHECK(!runs.empty(), "report: no runs");
  const RunRecord& base = runs[base_run(runs)];
  const int epochs = max_eval_epoch(runs);
  std::string out =
      "run,dir,backend,strategy,param_dtype,ranks,nodes,global_batch,grad_accum,train_samples_per_second,speedup,efficiency,"
      "peak_memory_bytes,final_train_loss,train_loss";
  for (int e = 1; e <= epochs; ++e) out += concat(",eval_loss_", e);
  out += ",eval_exact_match,eval_f1,segments,segment_ranks\n";
  for (const RunRecord& r : runs) {
    out += concat(csv_field(r.name), ",", csv_field(r.dir), ",", csv_field(r.backend), ",", csv_field(r.strategy),
                  ",", csv_field(r.param_dtype), ",", r.ranks, ",", r.nodes, ",",
                  r.global_batch > 0 ? std::to_string(r.global_batch) : "", ",",
                  r.segments.empty() || r.segments.back().grad_accum <= 0 ? "" : std::to_string(r.segments.back().grad_accum),
                  ",", csv_number(r.train_samples_per_second),
                  ",", csv_number(speedup(r, base)), ",", csv_number(efficiency(r, base)), ",",
                  csv_number(r.peak_memory_bytes), ",", csv_number(r.final_loss), ",", csv_number(r.train_loss));
    for (int e = 1; e <= epochs; ++e) out += "," + csv_number(epoch_eval_loss(r, e));
    out += concat(",", csv_number(r.exact_match), ",", csv_number(r.f1), ",", r.segments.size(), ",",
                  segment_ranks(r), "\n");
  }
  return out;
}

}  // namespace shardlm

// Reading a run directory (metrics.jsonl, deck.resolved.ini) and the side-by-side Markdown table and
// CSV of several runs.
#include "run_report.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardlm/core.hpp"

namespace shardlm {

namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") + 1 - b);
}

// "section.key" -> value of an INI file as resolved_deck_ini writes it.
std::map<std::string, std::string> read_ini(const std::string& path) {
  std::ifstream in(path);
  SHARDLM_CHECK(in, path, ": cannot open the resolved deck (is this a shardlm run directory?)");
  std::map<std::string, std::string> values;
  std::string section, line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    line = trim(line.substr(0, line.find_first_of("#;")));
    if (line.empty()) continue;
    if (line.front() == '[') {
      SHARDLM_CHECK(line.back() == ']', path, ":", number, ": a section header needs a closing ']'");
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const size_t eq = line.find('=');
    SHARDLM_CHECK(eq != std::string::npos, path, ":", number, ": expected 'key = value', got '", line, "'");
    values[section + "." + trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return values;
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

size_t max_evals(const std::vector<RunRecord>& runs) {
  size_t n = 0;
  for (const RunRecord& r : runs) n = std::max(n, r.eval_losses.size());
  return n;
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

  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  std::ifstream in(metrics_path);
  SHARDLM_CHECK(in, metrics_path, ": cannot open the metrics log (is this a shardlm run directory?)");
  bool setup = false;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (trim(line).empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(concat(metrics_path, ":", number, ": not valid JSON: ", e.what()));
    }
    SHARDLM_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), metrics_path, ":", number,
                  ": expected a JSON object with a string 'type'");
    const std::string type = j["type"];
    try {
      if (type == "setup") {
        setup = true;  // a resumed run appends another; the last one describes the latest layout
        run.ranks = j.at("world_size").get<int>();
        run.nodes = j.at("num_nodes").get<int>();
        run.strategy = j.at("strategy").get<std::string>();
      } else if (type == "train") {
        run.train_loss_by_step[j.at("step").get<long>()] = j.at("loss").get<double>();
        run.final_loss = j.at("loss").get<double>();
      } else if (type == "eval") {
        run.eval_losses.push_back(j.at("eval_loss").get<double>());
        run.eval_samples_per_second.push_back(number_or_nan(j, "eval_samples_per_second"));
        run.exact_match = number_or_nan(j, "eval_exact_match");
        run.f1 = number_or_nan(j, "eval_f1");
      } else if (type == "summary") {
        run.train_samples_per_second = j.at("train_samples_per_second").get<double>();
        run.train_loss = j.at("train_loss").get<double>();
        run.peak_memory_bytes = j.at("peak_memory_bytes").get<double>();
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(concat(metrics_path, ":", number, ": '", type, "' record: ", e.what()));
    }
  }
  SHARDLM_CHECK(setup, metrics_path, ": no 'setup' record (the run did not start?)");
  if (deck_value("fsdp.cpu_offload") == "true") run.strategy += " +offload";
  return run;
}

size_t base_run(const std::vector<RunRecord>& runs) {
  size_t best = 0;
  for (size_t i = 1; i < runs.size(); ++i)
    if (runs[i].ranks < runs[best].ranks) best = i;
  return best;
}

double speedup(const RunRecord& run, const RunRecord& base) {
  if (!(base.train_samples_per_second > 0)) return NAN;
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
  std::string out = "| run | backend | strategy | dtype | ranks | nodes | train samples/s | speed-up | efficiency | "
                    "peak memory/rank | final train loss | mean train loss | eval loss per epoch |";
  std::string rule = "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |";
  if (em) out += " EM |", rule += " ---: |";
  if (f1) out += " F1 |", rule += " ---: |";
  out += "\n" + rule + "\n";
  for (const RunRecord& r : runs) {
    std::string evals;
    for (size_t i = 0; i < r.eval_losses.size(); ++i) evals += (i ? ", " : "") + fixed(r.eval_losses[i], "%.4f");
    out += concat("| ", r.name, " | ", r.backend, " | ", r.strategy, " | ", r.param_dtype, " | ", r.ranks, " | ",
                  r.nodes, " | ", fixed(r.train_samples_per_second, "%.2f"), " | ",
                  fixed(speedup(r, base), "%.2fx"), " | ", fixed(100 * efficiency(r, base), "%.0f%%"), " | ",
                  memory_text(r.peak_memory_bytes), " | ", fixed(r.final_loss, "%.4f"), " | ",
                  fixed(r.train_loss, "%.4f"), " | ", evals.empty() ? "-" : evals, " |");
    if (em) out += " " + fixed(r.exact_match, "%.2f") + " |";
    if (f1) out += " " + fixed(r.f1, "%.2f") + " |";
    out += "\n";
  }
  out += concat("\nspeed-up and efficiency against ", base.name, " (", base.ranks,
                " rank(s)); peak memory is the largest over ranks.\n");
  return out;
}

std::string report_csv(const std::vector<RunRecord>& runs) {
  SHARDLM_CHECK(!runs.empty(), "report: no runs");
  const RunRecord& base = runs[base_run(runs)];
  const size_t epochs = max_evals(runs);
  std::string out =
      "run,dir,backend,strategy,param_dtype,ranks,nodes,train_samples_per_second,speedup,efficiency,"
      "peak_memory_bytes,final_train_loss,train_loss";
  for (size_t e = 1; e <= epochs; ++e) out += concat(",eval_loss_", e);
  out += ",eval_exact_match,eval_f1\n";
  for (const RunRecord& r : runs) {
    out += concat(csv_field(r.name), ",", csv_field(r.dir), ",", csv_field(r.backend), ",", csv_field(r.strategy),
                  ",", csv_field(r.param_dtype), ",", r.ranks, ",", r.nodes, ",", csv_number(r.train_samples_per_second),
                  ",", csv_number(speedup(r, base)), ",", csv_number(efficiency(r, base)), ",",
                  csv_number(r.peak_memory_bytes), ",", csv_number(r.final_loss), ",", csv_number(r.train_loss));
    for (size_t e = 0; e < epochs; ++e) out += "," + (e < r.eval_losses.size() ? csv_number(r.eval_losses[e]) : "");
    out += "," + csv_number(r.exact_match) + "," + csv_number(r.f1) + "\n";
  }
  return out;
}

}  // namespace shardlm

#define BOOST_TEST_MODULE test_run_logs
#include <boost/test/unit_test.hpp>

// Tests of what a run reports and what `shardlm report` makes of it, on made-up numbers: the
// records' Hugging Face keys, the summary table's EM/F1 columns, speed-up and efficiency, the
// resumed run's repeated steps and CSV quoting.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "metrics.hpp"
#include "run_report.hpp"
#include "test_support.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

// A run directory holding the given metrics lines and a resolved deck.
fs::path make_run(const std::string& name, const std::string& metrics, const std::string& deck_extra = "") {
  const fs::path dir = fs::temp_directory_path() / ("shardlm_test_run_logs_" + std::to_string(getpid())) / name;
  fs::create_directories(dir);
  std::ofstream(dir / "deck.resolved.ini") << "# shardlm resolved input deck\n\n[fsdp]\nparam_dtype = bf16\n"
                                           << deck_extra << "\n[run]\nbackend = cuda\n";
  std::ofstream(dir / "metrics.jsonl") << metrics;
  return dir;
}

std::string setup(int world, int nodes, const char* strategy) {
  return concat("{\"type\":\"setup\",\"world_size\":", world, ",\"num_nodes\":", nodes, ",\"strategy\":\"", strategy,
                "\"}\n");
}

std::string summary(double sps, double loss, double peak) {
  return concat("{\"type\":\"summary\",\"train_samples_per_second\":", sps, ",\"train_loss\":", loss,
                ",\"peak_memory_bytes\":", peak, "}\n");
}

size_t count_of_polylines(const std::string& svg) {
  size_t n = 0;
  for (size_t pos = svg.find("<polyline"); pos != std::string::npos; pos = svg.find("<polyline", pos + 1)) ++n;
  return n;
}

struct Cleanup {
  ~Cleanup() {
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("shardlm_test_run_logs_" + std::to_string(getpid())), ec);
  }
} cleanup;

}  // namespace

BOOST_AUTO_TEST_CASE(records_carry_trainer_keys) {
  StepLog step;
  step.step = 10;
  step.loss = 2.5;
  step.learning_rate = 1e-4;
  step.tokens_per_second = 4000;
  step.world = 4;
  step.peak_memory_bytes = {100, 300, 200, 50};
  const nlohmann::json t = train_record(step);
  for (const char* key : {"loss", "grad_norm", "learning_rate", "epoch", "step", "tokens_per_second_per_gpu", "mfu"})
    BOOST_TEST(t.contains(key), key);
  BOOST_TEST(t.at("tokens_per_second_per_gpu").get<double>() == 1000.0);
  BOOST_TEST(t.at("peak_memory_bytes").get<double>() == 300.0);  // the largest rank's
  BOOST_TEST(t.at("peak_memory_bytes_per_rank").size() == 4u);

  EvalLog eval;
  eval.loss = 1.5;
  nlohmann::json e = eval_record(eval);
  for (const char* key : {"eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch"})
    BOOST_TEST(e.contains(key), key);
  BOOST_TEST(!e.contains("eval_exact_match"));
  eval.exact_match = 61.5;
  eval.f1 = 70.25;
  e = eval_record(eval);
  BOOST_TEST(e.at("eval_exact_match").get<double>() == 61.5);
  BOOST_TEST(e.at("eval_f1").get<double>() == 70.25);
  BOOST_TEST(contains(eval_line(eval), "EM 61.50 | F1 70.25"));

  RunSummary s;
  const nlohmann::json j = summary_record(s);
  for (const char* key : {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "epoch"})
    BOOST_TEST(j.contains(key), key);
}

BOOST_AUTO_TEST_CASE(summary_table_shows_em_and_f1_only_when_scored) {
  RunSummary s;
  s.train_loss = 1.25;
  s.final_loss = 0.75;
  s.peak_memory_bytes = {1024, 2048};
  EvalLog a, b;
  a.epoch = 1;
  a.loss = 2.0;
  b.epoch = 2;
  b.loss = 1.5;
  s.evals = {a, b};
  std::string table = summary_table(s);
  BOOST_TEST(contains(table, "1.2500"), table);
  BOOST_TEST(contains(table, "0.7500"), table);
  BOOST_TEST(contains(table, "1.00 KiB, 2.00 KiB"), table);  // per rank
  BOOST_TEST(contains(table, "2.0000"), table);
  BOOST_TEST(!contains(table, " EM "), table);
  s.evals[1].exact_match = 40;
  s.evals[1].f1 = 55.5;
  table = summary_table(s);
  BOOST_TEST(contains(table, "EM"), table);
  BOOST_TEST(contains(table, "55.50"), table);
}

BOOST_AUTO_TEST_CASE(report_speedup_efficiency_and_scores) {
  const fs::path one = make_run("gpu1", setup(1, 1, "FULL_SHARD") +
                                            "{\"type\":\"train\",\"step\":5,\"loss\":3.0}\n"
                                            "{\"type\":\"eval\",\"eval_loss\":2.5,\"epoch\":1}\n" +
                                            summary(10, 3.0, 1073741824));
  const fs::path four = make_run("gpu4", setup(4, 2, "HYBRID_SHARD") +
                                             "{\"type\":\"train\",\"step\":5,\"loss\":2.9}\n"
                                             "{\"type\":\"eval\",\"eval_loss\":2.4,\"epoch\":1,"
                                             "\"eval_exact_match\":12.5,\"eval_f1\":20.0}\n" +
                                             summary(36, 2.9, 536870912),
                                 "cpu_offload = true\n");
  const std::vector<RunRecord> runs = {read_run(four.string()), read_run(one.string())};
  BOOST_TEST(base_run(runs) == 1u);
  BOOST_TEST(speedup(runs[0], runs[1]) == 3.6, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(efficiency(runs[0], runs[1]) == 0.9, boost::test_tools::tolerance(1e-12));
  const std::string md = report_markdown(runs);
  BOOST_TEST(contains(md, "| gpu4 | cuda | HYBRID_SHARD +offload | bf16 | 4 | 2 | 36.00 | 3.60x | 90% | 512.00 MiB"), md);
  BOOST_TEST(contains(md, "| gpu1 | cuda | FULL_SHARD | bf16 | 1 | 1 | 10.00 | 1.00x | 100% |"), md);
  BOOST_TEST(contains(md, " EM | F1 |"), md);
  BOOST_TEST(contains(md, "| 12.50 | 20.00 |"), md);
  BOOST_TEST(contains(md, "| - | - |"), md);  // gpu1 was not scored
}

BOOST_AUTO_TEST_CASE(report_of_a_resumed_and_an_unfinished_run) {
  // Resumed: steps 3-4 were logged before the preemption and again after the resume.
  const fs::path resumed = make_run("resumed", setup(2, 1, "FULL_SHARD") +
                                                   "{\"type\":\"train\",\"step\":2,\"loss\":4.0}\n"
                                                   "{\"type\":\"train\",\"step\":4,\"loss\":3.5}\n" +
                                                   setup(2, 1, "FULL_SHARD") +
                                                   "{\"type\":\"train\",\"step\":4,\"loss\":3.4}\n"
                                                   "{\"type\":\"train\",\"step\":6,\"loss\":3.0}\n" +
                                                   summary(8, 3.2, 1e6));
  const RunRecord r = read_run(resumed.string());
  BOOST_TEST(r.train_loss_by_step.size() == 3u);
  BOOST_TEST(r.train_loss_by_step.at(4) == 3.4);
  BOOST_TEST(r.final_loss == 3.0);
  // Unfinished: no summary, so no throughput, speed-up or scaling point, but a loss curve.
  const fs::path unfinished = make_run("un,finished", setup(1, 1, "NO_SHARD") + "{\"type\":\"train\",\"step\":2,\"loss\":4.5}\n");
  const std::vector<RunRecord> runs = {read_run(unfinished.string()), r};
  BOOST_TEST(std::isnan(speedup(runs[1], runs[0])));
  const std::string md = report_markdown(runs);
  BOOST_TEST(contains(md, "| un,finished | cuda | NO_SHARD | bf16 | 1 | 1 | - | - | - | - | 4.5000 |"), md);
  const std::string csv = report_csv(runs);
  BOOST_TEST(contains(csv, "\n\"un,finished\","), csv);  // a comma in a name is quoted
  BOOST_TEST(count_of_polylines(loss_curves_svg(runs)) == 2u);
  BOOST_TEST(count_of_polylines(scaling_svg(runs)) == 1u);  // the finished run's strategy; no base throughput, no ideal
}

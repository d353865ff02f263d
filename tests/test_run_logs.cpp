#define BOOST_TEST_MODULE test_run_logs
#include <boost/test/unit_test.hpp>

// Tests of what a run reports and what `shardlm report` makes of it, on made-up numbers: the
// records' Hugging Face keys, the summary table's EM/F1 columns, speed-up and efficiency, the
// resumed run's repeated steps and CSV quoting, the eval loss per epoch (epoch ends only, step evaluations
// apart); the GPU peak the MFU is measured against.
#include <unistd.h>

#include <filesystem>
#include <set>
#include <fstream>
#include <map>
#include <string>

#include "metrics.hpp"
#include "run_report.hpp"
#include "shardlm/device.hpp"
#include "shardlm/io.hpp"
#include "temp_dir.hpp"
#include "test_support.hpp"
#include "train_run.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

// A run directory holding the given metrics lines and a resolved deck.
fs::path make_run(const std::string& name, const std::string& metrics, const std::string& deck_extra = "",
                  const std::string& backend = "cuda") {
  const fs::path dir = fs::temp_directory_path() / ("shardlm_test_run_logs_" + std::to_string(getpid())) / name;
  fs::create_directories(dir);
  std::ofstream(dir / "deck.resolved.ini") << "# shardlm resolved input deck\n\n[fsdp]\nparam_dtype = bf16\n"
                                           << deck_extra << "\n[run]\nbackend = " << backend << "\n";
  std::ofstream(dir / "metrics.jsonl") << metrics;
  return dir;
}

std::string setup(int world, int nodes, const char* strategy, int grad_accum = 0) {
  return concat("{\"type\":\"setup\",\"world_size\":", world, ",\"num_nodes\":", nodes, ",\"strategy\":\"", strategy,
                "\"", grad_accum > 0 ? concat(",\"grad_accum\":", grad_accum) : std::string(), "}\n");
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
  const fs::path one = make_run("gpu1", setup(1, 1, "FULL_SHARD", 4) +
                                            "{\"type\":\"train\",\"step\":5,\"loss\":3.0}\n"
                                            "{\"type\":\"eval\",\"eval_loss\":2.5,\"epoch\":1}\n" +
                                            summary(10, 3.0, 1073741824));
  const fs::path four = make_run("gpu4", setup(4, 2, "HYBRID_SHARD", 1) +
                                             "{\"type\":\"train\",\"step\":5,\"loss\":2.9}\n"
                                             "{\"type\":\"eval\",\"eval_loss\":2.4,\"epoch\":1,"
                                             "\"eval_exact_match\":12.5,\"eval_f1\":20.0}\n" +
                                             summary(36, 2.9, 536870912),
                                 "cpu_offload = true\n[train]\nbatch_size = 4\n");
  const std::vector<RunRecord> runs = {read_run(four.string()), read_run(one.string())};
  BOOST_TEST(base_run(runs) == 1u);
  BOOST_TEST(speedup(runs[0], runs[1]) == 3.6, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(efficiency(runs[0], runs[1]) == 0.9, boost::test_tools::tolerance(1e-12));
  const std::string md = report_markdown(runs);
  BOOST_TEST(contains(md, "| global batch | accumulation |"), md);
  BOOST_TEST(contains(md, "| gpu4 | cuda | HYBRID_SHARD +offload | bf16 | 4 | 2 | 4 | 1 | 36.00 | 3.60x | 90% | 512.00 MiB"), md);
  BOOST_TEST(contains(md, "| gpu1 | cuda | FULL_SHARD | bf16 | 1 | 1 | - | 4 | 10.00 | 1.00x | 100% |"), md);
  const std::string csv = report_csv(runs);
  BOOST_TEST(contains(csv, "ranks,nodes,global_batch,grad_accum,"), csv);
  BOOST_TEST(contains(csv, "\ngpu4,"), csv);
  BOOST_TEST(contains(csv, ",4,2,4,1,36,"), csv);
  BOOST_TEST(contains(csv, ",1,1,,4,10,"), csv);
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
  BOOST_TEST(contains(md, "| un,finished | cuda | NO_SHARD | bf16 | 1 | 1 | - | - | - | - | - | - | 4.5000 |"), md);
  const std::string csv = report_csv(runs);
  BOOST_TEST(contains(csv, "\n\"un,finished\","), csv);  // a comma in a name is quoted
  BOOST_TEST(count_of_polylines(loss_curves_svg(runs)) == 2u);
  BOOST_TEST(count_of_polylines(scaling_svg(runs)) == 1u);  // the finished run's strategy; no base throughput, no ideal
}

namespace {

std::string full_summary(double runtime, double sps, double steps_per_s, double loss, long first, long steps,
                         bool preempted) {
  return concat("{\"type\":\"summary\",\"train_runtime\":", runtime, ",\"train_samples_per_second\":", sps,
                ",\"train_steps_per_second\":", steps_per_s, ",\"train_loss\":", loss,
                ",\"peak_memory_bytes\":1e6,\"first_step\":", first, ",\"steps\":", steps,
                ",\"preempted\":", preempted ? "true" : "false", "}\n");
}

}  // namespace

BOOST_AUTO_TEST_CASE(report_of_a_run_resumed_on_another_world_covers_every_segment) {
  // 50 steps on 4 ranks in 10 s (preempted), then 50 on 2 ranks in 20 s; batch 8.
  const fs::path dir = make_run(
      "four_then_two", setup(4, 1, "FULL_SHARD") + "{\"type\":\"train\",\"step\":50,\"loss\":3.0}\n"
                           "{\"type\":\"eval\",\"epoch\":2.0,\"eval_loss\":2.9}\n" +
                           full_summary(10, 40, 5, 3.0, 0, 50, true) +
                           "{\"type\":\"setup\",\"world_size\":2,\"num_nodes\":1,\"strategy\":\"FULL_SHARD\","
                           "\"resumed_from_step\":50,\"segment\":1}\n"
                           "{\"type\":\"eval\",\"epoch\":2.0,\"eval_loss\":2.8,\"segment\":1}\n"
                           "{\"type\":\"train\",\"step\":100,\"loss\":2.0,\"segment\":1}\n"
                           "{\"type\":\"eval\",\"epoch\":4.0,\"eval_loss\":2.1,\"segment\":1}\n" +
                           full_summary(20, 20, 2.5, 2.0, 50, 100, false));
  const RunRecord r = read_run(dir.string());
  BOOST_TEST_REQUIRE(r.segments.size() == 2u);
  BOOST_TEST(r.segments[1].first_step == 50);
  BOOST_TEST(r.segments[1].last_step == 100);
  BOOST_TEST(r.train_samples_per_second == 800.0 / 30, boost::test_tools::tolerance(1e-12));  // over all 30 s
  BOOST_TEST(r.train_loss == 2.5, boost::test_tools::tolerance(1e-12));  // every step weighted alike
  BOOST_TEST(r.mixed_ranks());
  BOOST_TEST(r.ranks_text() == "4 then 2");
  // Resumed at the end of epoch 2, the run evaluated it again: one loss per epoch, the later one.
  BOOST_TEST((r.eval_loss_by_epoch == std::map<int, double>{{2, 2.8}, {4, 2.1}}));
  const fs::path one = make_run("one", setup(1, 1, "FULL_SHARD") + summary(10, 3.0, 1e6));
  const std::vector<RunRecord> runs = {read_run(one.string()), r};
  BOOST_TEST(base_run(runs) == 0u);
  BOOST_TEST(std::isnan(speedup(runs[1], runs[0])));  // no single rank count to scale by
  const std::string md = report_markdown(runs);
  BOOST_TEST(contains(md, "| four_then_two | cuda | FULL_SHARD | bf16 | 4 then 2 | 1 | - | - | 26.67 | - | - |"), md);
  BOOST_TEST(contains(md, "| four_then_two | 0 | 4 | 1 | FULL_SHARD | 0-50 | 10.00 | 40.00 | 3.0000 | preempted |"), md);
  BOOST_TEST(contains(md, "| four_then_two | 1 | 2 | 1 | FULL_SHARD | 50-100 | 20.00 | 20.00 | 2.0000 | finished |"), md);
  BOOST_TEST(contains(report_csv(runs), ",2,4;2\n"), report_csv(runs));
  const std::string svg = scaling_svg(runs);
  BOOST_TEST(contains(svg, "1 run(s) resumed on other ranks left out"), svg);
}

// Only the evaluations at an epoch's end are the epoch's: a run with eval.every_steps and a run resumed
// after train.max_steps stopped its first segment inside epoch 1 list epoch 1's loss as epoch 1's, and
// their other evaluations apart, below the table.
BOOST_AUTO_TEST_CASE(report_keys_eval_loss_by_epoch_and_lists_step_evaluations_apart) {
  // 25 steps an epoch, evaluated every 10 steps and after each epoch (the trainer skips step 50, an epoch's end).
  const fs::path steps = make_run(
      "steps", setup(1, 1, "FULL_SHARD") + "{\"type\":\"eval\",\"epoch\":0.4,\"eval_loss\":3.7,\"step\":10}\n"
                   "{\"type\":\"eval\",\"epoch\":0.8,\"eval_loss\":3.4,\"step\":20}\n"
                   "{\"type\":\"eval\",\"epoch\":1.0,\"eval_loss\":3.2,\"step\":25}\n"
                   "{\"type\":\"eval\",\"epoch\":1.2,\"eval_loss\":3.1,\"step\":30}\n"
                   "{\"type\":\"eval\",\"epoch\":1.6,\"eval_loss\":2.9,\"step\":40}\n"
                   "{\"type\":\"eval\",\"epoch\":2.0,\"eval_loss\":2.8,\"step\":50}\n" +
                   summary(10, 3.0, 1e6));
  // 2 ranks to step 20 (max_steps: the segment's last evaluation at epoch 0.8), then resumed on 1 rank.
  const fs::path resumed = make_run(
      "resumed", setup(2, 1, "FULL_SHARD") + "{\"type\":\"eval\",\"epoch\":0.8,\"eval_loss\":3.45,\"step\":20}\n" +
                     full_summary(4, 40, 5, 3.5, 0, 20, false) +
                     "{\"type\":\"setup\",\"world_size\":1,\"num_nodes\":1,\"strategy\":\"FULL_SHARD\","
                     "\"resumed_from_step\":20,\"segment\":1}\n"
                     "{\"type\":\"eval\",\"epoch\":1.0,\"eval_loss\":3.2,\"step\":25,\"segment\":1}\n"
                     "{\"type\":\"eval\",\"epoch\":2.0,\"eval_loss\":2.8,\"step\":50,\"segment\":1}\n" +
                     full_summary(6, 30, 5, 3.0, 20, 50, false));
  const fs::path plain = make_run("plain", setup(1, 1, "FULL_SHARD") +
                                               "{\"type\":\"eval\",\"epoch\":1.0,\"eval_loss\":3.2,\"step\":25}\n"
                                               "{\"type\":\"eval\",\"epoch\":2.0,\"eval_loss\":2.8,\"step\":50}\n" +
                                               summary(10, 3.0, 1e6));
  const std::vector<RunRecord> runs = {read_run(steps.string()), read_run(resumed.string()), read_run(plain.string())};
  for (const RunRecord& r : runs) BOOST_TEST((r.eval_loss_by_epoch == std::map<int, double>{{1, 3.2}, {2, 2.8}}), r.name);
  BOOST_TEST(runs[0].step_evals.size() == 4u);
  BOOST_TEST(runs[0].step_evals.at(30).loss == 3.1);
  BOOST_TEST(runs[1].step_evals.size() == 1u);
  BOOST_TEST(runs[2].step_evals.empty());
  const std::string md = report_markdown(runs);
  // Each run's row of the table (its first line starting with its name) ends with the two epochs' losses.
  const auto row = [&md](const std::string& name) {
    const size_t at = md.find("\n| " + name + " | cuda");
    return at == std::string::npos ? std::string() : md.substr(at + 1, md.find('\n', at + 1) - at - 1);
  };
  for (const char* name : {"steps", "resumed", "plain"})
    BOOST_TEST((row(name).size() > 30 && row(name).substr(row(name).size() - 19) == " | 3.2000, 2.8000 |"), md);
  BOOST_TEST(!contains(row("steps"), "3.7000"), md);
  BOOST_TEST(contains(md, "| steps | 10 (0.40): 3.7000, 20 (0.80): 3.4000, 30 (1.20): 3.1000, 40 (1.60): 2.9000 |"), md);
  BOOST_TEST(contains(md, "| resumed | 20 (0.80): 3.4500 |"), md);
  const std::string csv = report_csv(runs);
  BOOST_TEST(contains(csv, ",eval_loss_1,eval_loss_2,eval_exact_match,"), csv);
  for (const char* name : {"steps", "resumed", "plain"}) {
    const size_t at = csv.find(concat("\n", name, ","));
    BOOST_TEST((at != std::string::npos && contains(csv.substr(at, csv.find('\n', at + 1) - at), ",3.2,2.8,,,")), csv);
  }
  // A run that evaluated epoch 2 only (resumed at its end) leaves epoch 1's column empty.
  const fs::path late = make_run("late", setup(1, 1, "FULL_SHARD") +
                                             "{\"type\":\"eval\",\"epoch\":2.0,\"eval_loss\":2.8,\"step\":50}\n");
  const std::vector<RunRecord> two = {read_run(late.string()), runs[2]};
  BOOST_TEST(contains(report_markdown(two), "| -, 2.8000 |"), report_markdown(two));
  BOOST_TEST(contains(report_csv(two), ",,2.8,"), report_csv(two));
}

BOOST_AUTO_TEST_CASE(report_skips_a_malformed_line_and_names_it) {
  const fs::path dir = make_run("torn", setup(2, 1, "FULL_SHARD") +
                                            "{\"type\":\"train\",\"step\":2,\"loss\":4.0}\n"
                                            "{\"type\":\"train\",\"st\n"  // torn by a crash
                                            "{\"type\":\"train\",\"step\":4}\n"  // no loss
                                            "{\"type\":\"train\",\"step\":6,\"loss\":3.0}\n" +
                                            summary(8, 3.5, 1e6));
  const RunRecord r = read_run(dir.string());
  BOOST_TEST_REQUIRE(r.warnings.size() == 2u);
  BOOST_TEST(contains(r.warnings[0], "metrics.jsonl:3: skipped: "), r.warnings[0]);
  BOOST_TEST(contains(r.warnings[1], "metrics.jsonl:4: skipped 'train' record: "), r.warnings[1]);
  BOOST_TEST(r.train_loss_by_step.size() == 2u);
  BOOST_TEST(r.final_loss == 3.0);
  BOOST_TEST(r.train_samples_per_second == 8.0);
}

BOOST_AUTO_TEST_CASE(scaling_plot_has_one_point_per_rank_count) {
  std::vector<RunRecord> runs;
  int i = 0;
  for (const auto& [ranks, sps] : std::vector<std::pair<int, double>>{{1, 12}, {2, 10}, {2, 30}, {2, 20}})
    runs.push_back(read_run(make_run(concat("r", i++), setup(ranks, 1, "FULL_SHARD") + summary(sps, 3, 1e6)).string()));
  const std::string svg = scaling_svg(runs);
  BOOST_TEST(count_of_polylines(svg) == 2u);  // the strategy's and the ideal
  size_t circles = 0;
  for (size_t pos = svg.find("<circle"); pos != std::string::npos; pos = svg.find("<circle", pos + 1)) ++circles;
  BOOST_TEST(circles == 2u);
  BOOST_TEST(contains(svg, "2 rank(s): 20.00 samples/s (median of 3 runs)"), svg);
  BOOST_TEST(contains(svg, "points: median of the"), svg);
}

BOOST_AUTO_TEST_CASE(report_labels_offload_only_where_it_ran) {
  // fsdp.cpu_offload on the CPU backend does nothing (the run warns): no "+offload" in the report.
  const RunRecord cpu = read_run(make_run("off_cpu", setup(1, 1, "FULL_SHARD") + summary(5, 3, 1e6), "cpu_offload = true\n",
                                          "cpu").string());
  BOOST_TEST(cpu.strategy == "FULL_SHARD");
  const RunRecord gpu = read_run(make_run("off_gpu", setup(1, 1, "FULL_SHARD") + summary(5, 3, 1e6), "cpu_offload = true\n",
                                          "cuda").string());
  BOOST_TEST(gpu.strategy == "FULL_SHARD +offload");
  // A resumed run whose accumulation changed (another world size) says both.
  const RunRecord mixed = read_run(make_run("accum", setup(4, 1, "FULL_SHARD", 1) + setup(2, 1, "FULL_SHARD", 2)).string());
  BOOST_TEST(mixed.grad_accum_text() == "1 then 2");
}

namespace {

// The number in attribute `name`="..." of the first element `tag` of an SVG text.
double svg_attribute(const std::string& svg, const std::string& tag, const std::string& name, size_t from = 0) {
  const size_t at = svg.find("<" + tag, from);
  BOOST_REQUIRE(at != std::string::npos);
  const size_t value = svg.find(name + "=\"", at) + name.size() + 2;
  return std::stod(svg.substr(value));
}

}  // namespace

BOOST_AUTO_TEST_CASE(report_legends_fit_and_twenty_runs_look_different) {
  std::vector<RunRecord> runs;
  for (int i = 0; i < 20; ++i) {
    const std::string name = i == 3 ? "shard-grad-op-offload-4-ranks-bf16-activation-checkpointing" : concat("run", i);
    runs.push_back(read_run(make_run(name, setup(1 + i % 4, 1, i % 2 ? "SHARD_GRAD_OP" : "FULL_SHARD") +
                                               concat("{\"type\":\"train\",\"step\":1,\"loss\":", 3 + i * 0.1, "}\n"
                                                      "{\"type\":\"train\",\"step\":2,\"loss\":", 2 + i * 0.1, "}\n") +
                                               summary(10 + i, 2, 1e6)).string()));
  }
  const std::string svg = loss_curves_svg(runs);
  // Every legend text ends inside the picture, at 7.5 px a character (wider than 12 px sans-serif's).
  const double width = svg_attribute(svg, "svg", "width");
  for (size_t at = svg.find("font-size=\"12\">"); at != std::string::npos; at = svg.find("font-size=\"12\">", at + 1)) {
    const size_t text_start = svg.rfind("<text", at);
    const double x = svg_attribute(svg, "text", "x", text_start);
    const size_t begin = at + 16, end = svg.find("</text>", begin);
    BOOST_TEST(x + 7.5 * static_cast<double>(end - begin) <= width, svg.substr(begin, end - begin) << " ends past " << width);
  }
  BOOST_TEST(contains(svg, "shard-grad-op-offload-4-ranks-bf16-activation-checkpointing (4)"));
  // The 20 polylines: 20 different colour and dash pairs.
  std::set<std::string> styles;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) {
    const size_t stroke = svg.find("stroke=\"", at) + 8;
    const size_t points = svg.find(" points=", at);
    styles.insert(svg.substr(stroke, points - stroke));
  }
  BOOST_TEST(styles.size() == 20u);
  std::set<std::string> colours;
  for (const std::string& s : styles) colours.insert(s.substr(0, s.find('"')));
  BOOST_TEST(colours.size() == 20u);  // colours alone, no dashes needed yet
}

// ---- the peak the MFU is measured against ---------------------------------------------------

namespace {

// The built-in table's (bf16, fp16) peak for a CUDA device name; (-1, -1) when no entry matches.
std::pair<double, double> builtin_peak(const std::string& device) {
  const GpuPeak* e = find_gpu_peak(device, {});
  return e ? std::make_pair(e->bf16_tflops, e->fp16_tflops) : std::make_pair(-1.0, -1.0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(gpu_peaks_of_the_builtin_table_by_device_name) {
  using P = std::pair<double, double>;
  BOOST_TEST((builtin_peak("NVIDIA H100 80GB HBM3") == P{989, 989}));  // SXM
  BOOST_TEST((builtin_peak("NVIDIA H100 PCIe") == P{756, 756}));       // before the shorter "H100"
  BOOST_TEST((builtin_peak("NVIDIA H100 NVL") == P{835, 835}));
  BOOST_TEST((builtin_peak("NVIDIA H200") == P{989, 989}));
  BOOST_TEST((builtin_peak("NVIDIA H200 NVL") == P{835, 835}));
  for (const char* a100 :
       {"NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"})
    BOOST_TEST((builtin_peak(a100) == P{312, 312}), a100);
  for (const char* v100 : {"Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB", "Tesla V100-SXM3-32GB"})
    BOOST_TEST((builtin_peak(v100) == P{0, 125}), v100);
  for (const char* v100 : {"Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"})
    BOOST_TEST((builtin_peak(v100) == P{0, 112}), v100);
  BOOST_TEST((builtin_peak("Tesla V100S-PCIE-32GB") == P{0, 130}));
  BOOST_TEST((builtin_peak("nvidia h100 pcie") == P{756, 756}));  // case does not matter
  BOOST_TEST((builtin_peak("NVIDIA GeForce RTX 4090") == P{-1, -1}));
  BOOST_TEST((builtin_peak("cpu") == P{-1, -1}));
}

BOOST_AUTO_TEST_CASE(gpu_peaks_file_adds_and_overrides) {
  TempDir dir("gpu_peaks");
  const std::string path = dir.write("peaks.txt",
                                     "# site figures\n"
                                     "\n"
                                     "RTX 4090   165.2 165.2   # dense, fp32 accumulate\n"
                                     "H100 900 901\n"
                                     "H100 PCIe 700 701\n");
  const std::vector<GpuPeak> mine = read_gpu_peaks(path);
  BOOST_TEST_REQUIRE(mine.size() == 3u);
  BOOST_TEST(mine[0].name == "RTX 4090");
  BOOST_TEST(mine[0].bf16_tflops == 165.2);
  BOOST_TEST(mine[2].name == "H100 PCIe");
  const GpuPeak* added = find_gpu_peak("NVIDIA GeForce RTX 4090", mine);
  BOOST_TEST_REQUIRE(added);
  BOOST_TEST(added->fp16_tflops == 165.2);
  BOOST_TEST(find_gpu_peak("NVIDIA H100 80GB HBM3", mine)->bf16_tflops == 900);
  BOOST_TEST(find_gpu_peak("NVIDIA H100 PCIe", mine)->fp16_tflops == 701);
  // A file entry that matches wins even over a longer built-in one; others still come from the table.
  const std::vector<GpuPeak> broad = {{"NVIDIA", 100, 100}};
  BOOST_TEST(find_gpu_peak("NVIDIA H100 NVL", broad)->bf16_tflops == 100);
  BOOST_TEST(find_gpu_peak("Tesla V100-SXM2-16GB", broad)->fp16_tflops == 125);
}

BOOST_AUTO_TEST_CASE(gpu_peaks_file_errors_name_file_and_line) {
  TempDir dir("gpu_peaks_bad");
  const std::string two_fields = dir.write("two.txt", "# ok\nH100 989\n");
  std::string message = error_of([&] { read_gpu_peaks(two_fields); });
  BOOST_TEST(contains(message, two_fields + ":2 "), message);
  BOOST_TEST(contains(message, "'H100 989'"), message);
  const std::string word = dir.write("word.txt", "H100 989 989\nA100 fast 312\n");
  message = error_of([&] { read_gpu_peaks(word); });
  BOOST_TEST(contains(message, word + ":2 "), message);
  const std::string negative = dir.write("negative.txt", "A100 -1 312\n");
  BOOST_TEST(contains(error_of([&] { read_gpu_peaks(negative); }), negative + ":1 "));
  message = error_of([&] { read_gpu_peaks((dir.root / "missing.txt").string()); });
  BOOST_TEST(contains(message, "missing.txt"), message);
  BOOST_TEST(contains(message, "SHARDLM_GPU_PEAKS"), message);
}

BOOST_AUTO_TEST_CASE(model_flops_per_token_counts_what_runs) {
  // Full training: 6N + 12 L H T; here N = 1000, L = 2, H = 8, T = 16.
  BOOST_TEST(model_flops_per_token(1000, 1000, 2, 8, 16) == 6.0 * 1000 + 12.0 * 2 * 8 * 16);
  // LoRA: 960 frozen base parameters run forward (2) and the input gradient (2), the 40 adapter ones
  // forward and both gradients (6); the attention term is unchanged.
  BOOST_TEST(model_flops_per_token(1000, 40, 2, 8, 16) == 4.0 * 960 + 6.0 * 40 + 12.0 * 2 * 8 * 16);
  // A hand count for a LoRA shape: Llama-3.1-8B's 8030261248 parameters, rank-16 adapters on q and v
  // of 32 layers (q: 4096 -> 4096, v: 4096 -> 1024), T = 512.
  const size_t adapters = 32 * (16 * (4096 + 4096) + 16 * (4096 + 1024));
  const size_t all = 8030261248ull + adapters;
  BOOST_TEST(model_flops_per_token(all, adapters, 32, 4096, 512) ==
             4.0 * 8030261248.0 + 6.0 * adapters + 12.0 * 32 * 4096 * 512);
}

BOOST_AUTO_TEST_CASE(keys_that_do_nothing_here_are_warned_about) {
  RunConfig cfg;
  cfg.run.backend = BackendKind::Cpu;
  cfg.fsdp.strategy = ShardingStrategy::FullShard;
  BOOST_TEST(inert_key_warnings(cfg, 1).empty());
  cfg.fsdp.cpu_offload = true;
  cfg.fsdp.activation_checkpointing = true;
  std::vector<std::string> w = inert_key_warnings(cfg, 1);
  BOOST_TEST_REQUIRE(w.size() == 2u);
  BOOST_TEST(contains(w[0], "fsdp.cpu_offload = true does nothing on the CPU backend"), w[0]);
  BOOST_TEST(contains(w[1], "fsdp.activation_checkpointing = true does nothing on the CPU backend"), w[1]);
  // The CUDA backend's schedule and kernels, away from their defaults: one line naming each.
  cfg.fsdp.forward_prefetch = false;
  cfg.fsdp.limit_all_gathers = 4;
  cfg.model.attention = AttentionImpl::Native;
  w = inert_key_warnings(cfg, 1);
  BOOST_TEST_REQUIRE(w.size() == 3u);
  BOOST_TEST(w[2] == "warning: model.attention = native, fsdp.forward_prefetch = false, fsdp.limit_all_gathers = 4 do "
                     "nothing on the CPU backend (they choose how the CUDA backend schedules and computes)");
  // The [dist] section's CUDA keys too (NCCL's timeout and streams).
  cfg.fsdp.forward_prefetch = true;
  cfg.fsdp.limit_all_gathers = RunConfig().fsdp.limit_all_gathers;
  cfg.model.attention = AttentionImpl::Auto;
  cfg.dist.timeout = 30;
  cfg.dist.gather_stream = !RunConfig().dist.gather_stream;
  w = inert_key_warnings(cfg, 1);
  BOOST_TEST_REQUIRE(w.size() == 3u);
  BOOST_TEST(contains(w[2], "warning: dist.timeout = 30, dist.gather_stream = "), w[2]);
  cfg.dist = RunConfig().dist;
  cfg.run.backend = BackendKind::Cuda;  // all act on the GPU
  BOOST_TEST(inert_key_warnings(cfg, 1).empty());
  cfg.model.fp8_linear = cfg.model.fp8_keep_weights = true;  // BLOOM (the default arch) keeps no weights
  w = inert_key_warnings(cfg, 1);
  BOOST_TEST_REQUIRE(w.size() == 1u);
  BOOST_TEST(contains(w[0], "model.fp8_keep_weights = true does nothing for model.arch = bloom"), w[0]);
  for (const std::string arch : {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"}) {  // the family says so
    cfg.model.arch = arch;
    BOOST_TEST(inert_key_warnings(cfg, 1).empty(), arch);
  }
  cfg.fsdp.strategy = ShardingStrategy::HybridShard;
  w = inert_key_warnings(cfg, 1);
  BOOST_TEST_REQUIRE(w.size() == 1u);
  BOOST_TEST(contains(w[0], "fsdp.strategy = HYBRID_SHARD on one node is FULL_SHARD"), w[0]);
  cfg.fsdp.strategy = ShardingStrategy::HybridShardZero2;
  BOOST_TEST(contains(inert_key_warnings(cfg, 1).at(0), "HYBRID_SHARD_ZERO2 on one node is SHARD_GRAD_OP"));
  BOOST_TEST(inert_key_warnings(cfg, 2).empty());  // two nodes, real or emulated: it acts
}

BOOST_AUTO_TEST_CASE(mfu_peak_choice_at_setup) {
  const std::string h100 = "NVIDIA H100 80GB HBM3";
  // run.peak_tflops wins over everything, on either backend.
  MfuPeak p = resolve_mfu_peak(500, BackendKind::Cuda, h100, DType::BF16, "");
  BOOST_TEST(p.tflops == 500);
  BOOST_TEST(p.source == "run.peak_tflops");
  BOOST_TEST(p.line == "MFU against 500 TFLOP/s (run.peak_tflops)");
  BOOST_TEST(resolve_mfu_peak(2, BackendKind::Cpu, "cpu", DType::F32, "").tflops == 2);
  BOOST_TEST(resolve_mfu_peak(500, BackendKind::Cuda, h100, DType::BF16, "/no/such/peaks.txt").tflops == 500);

  p = resolve_mfu_peak(0, BackendKind::Cuda, h100, DType::BF16, "");
  BOOST_TEST(p.tflops == 989);
  BOOST_TEST(p.source == "built-in");
  BOOST_TEST(p.line == "MFU against 989 TFLOP/s (NVIDIA H100 80GB HBM3, dense bf16)");
  BOOST_TEST(resolve_mfu_peak(0, BackendKind::Cuda, "Tesla V100-SXM2-32GB", DType::F16, "").tflops == 125);

  p = resolve_mfu_peak(0, BackendKind::Cuda, "Tesla V100-SXM2-32GB", DType::BF16, "");  // no bf16 tensor cores
  BOOST_TEST(p.tflops == 0);
  BOOST_TEST(p.source == "none");
  BOOST_TEST(contains(p.line, "no MFU: no dense bf16 peak for Tesla V100-SXM2-32GB"), p.line);
  p = resolve_mfu_peak(0, BackendKind::Cuda, h100, DType::F32, "");
  BOOST_TEST(p.tflops == 0);
  BOOST_TEST(contains(p.line, "no MFU: fp32 parameters"), p.line);
  p = resolve_mfu_peak(0, BackendKind::Cuda, "NVIDIA GeForce RTX 4090", DType::BF16, "");
  BOOST_TEST(p.tflops == 0);
  BOOST_TEST(p.line ==
             "no MFU: unknown GPU 'NVIDIA GeForce RTX 4090' (set run.peak_tflops or add it to SHARDLM_GPU_PEAKS)");
  p = resolve_mfu_peak(0, BackendKind::Cpu, "cpu", DType::BF16, "");
  BOOST_TEST(p.tflops == 0);
  BOOST_TEST(p.line == "no MFU on the CPU backend (set run.peak_tflops)");

  TempDir dir("mfu_peak");
  const std::string path = dir.write("peaks.txt", "RTX 4090 165 165\n");
  p = resolve_mfu_peak(0, BackendKind::Cuda, "NVIDIA GeForce RTX 4090", DType::F16, path);
  BOOST_TEST(p.tflops == 165);
  BOOST_TEST(p.source == "SHARDLM_GPU_PEAKS");
  BOOST_TEST(p.line == "MFU against 165 TFLOP/s (NVIDIA GeForce RTX 4090, dense fp16, from " + path + ")");
  BOOST_TEST(resolve_mfu_peak(0, BackendKind::Cuda, h100, DType::BF16, path).source == "built-in");
  const std::string bad = dir.write("bad.txt", "RTX 4090\n");
  BOOST_TEST(contains(error_of([&] { resolve_mfu_peak(0, BackendKind::Cuda, h100, DType::BF16, bad); }), bad + ":1 "));
}

namespace {

// Every file under ROOT (relative path -> bytes; "<dir>" for a folder).
std::map<std::string, std::string> files_of(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_directory()) {
      out[fs::relative(it->path(), root).string()] = "<dir>";
      continue;
    }
    std::ifstream in(it->path(), std::ios::binary);
    out[fs::relative(it->path(), root).string()] =
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return out;
}

// An earlier run in RUN (its checkpoints in CKPT), with a user's file beside it.
// claim_run_folder with the checkpoint the trainer would resume (load_inputs resolves it the same way).
RunReplacement claim(const RunConfig& cfg) {
  return claim_run_folder(cfg, resolve_resume(cfg.checkpoint.resume, cfg.checkpoint.resume_path, cfg.checkpoint_dir()));
}

RunConfig earlier_run(const TempDir& tmp) {
  RunConfig cfg;
  cfg.run.dir = (tmp.root / "run").string();
  cfg.checkpoint.dir = (tmp.root / "ckpt").string();
  cfg.run.overwrite = true;
  tmp.write("run/metrics.jsonl", "{\"type\":\"setup\"}\n{\"type\":\"train\",\"step\":1}\n");
  tmp.write("run/deck.resolved.ini", "[run]\n");
  tmp.write("run/run_id", "run-1\n");
  tmp.write("run/trace_step1_rank0.json", "[]");
  tmp.write("run/notes.txt", "the user's\n");
  tmp.write("ckpt/ckpt-00000001.h5", "weights");
  tmp.write("ckpt/latest", "ckpt-00000001.h5\n");
  tmp.write("ckpt/README", "the user's too\n");
  return cfg;
}

}  // namespace

// run.overwrite: claiming the folder touches nothing; a start that fails after the earlier run was
// set aside puts it back byte-identical (the new run's own files gone); a run that reached its
// first step removes the set-aside files and nothing else.
BOOST_AUTO_TEST_CASE(an_overwritten_run_is_set_aside_then_put_back_or_removed) {
  TempDir tmp{"replace"};
  const RunConfig cfg = earlier_run(tmp);
  const auto before = files_of(tmp.root);
  const fs::path run = tmp.root / "run", ckpt = tmp.root / "ckpt";
  {
    RunReplacement replacement = claim(cfg);
    BOOST_TEST(!replacement.empty());
    BOOST_TEST((files_of(tmp.root) == before));
    const std::string line = replacement.set_aside({run / "deck.resolved.ini", run / "metrics.jsonl", run / "new.txt"});
    BOOST_TEST(contains(line, "is set aside in .replaced-run"), line);
    BOOST_TEST(fs::exists(run / ".replaced-run" / "run_id"));
    BOOST_TEST(fs::exists(ckpt / ".replaced-run" / "ckpt-00000001.h5"));
    BOOST_TEST(!fs::exists(run / "metrics.jsonl"));
    tmp.write("run/metrics.jsonl", "{\"type\":\"setup\",\"new\":true}\n");
    tmp.write("run/new.txt", "the new run's");
  }  // a failed start
  BOOST_TEST((files_of(tmp.root) == before));

  // A .replaced-run left by a job that died in between is an error naming it.
  fs::create_directories(run / ".replaced-run");
  BOOST_TEST(contains(error_of([&] { claim(cfg); }), (run / ".replaced-run").string()));
  fs::remove(run / ".replaced-run");

  RunReplacement replacement = claim(cfg);
  replacement.set_aside({run / "metrics.jsonl"});
  tmp.write("run/metrics.jsonl", "new\n");
  BOOST_TEST(contains(replacement.keep_new_run(), "replaced the earlier run in " + cfg.run.dir));
  const auto after = files_of(tmp.root);
  BOOST_TEST((after == std::map<std::string, std::string>{{"ckpt", "<dir>"}, {"ckpt/README", "the user's too\n"},
                                                           {"run", "<dir>"}, {"run/metrics.jsonl", "new\n"},
                                                           {"run/notes.txt", "the user's\n"}}));
}

// Without run.overwrite the earlier run is an error naming what it holds, and nothing is touched.
BOOST_AUTO_TEST_CASE(a_fresh_run_into_an_earlier_one_is_refused_without_overwrite) {
  TempDir tmp{"refuse"};
  RunConfig cfg = earlier_run(tmp);
  cfg.run.overwrite = false;
  const auto before = files_of(tmp.root);
  BOOST_TEST(contains(error_of([&] { claim(cfg); }), "already holds a run (metrics.jsonl, 1 checkpoint(s)"));
  BOOST_TEST((files_of(tmp.root) == before));
  // Loading weights only starts a new run too.
  cfg.checkpoint.resume = ResumeFrom::Auto;
  cfg.checkpoint.load_weights_only = true;
  BOOST_TEST(contains(error_of([&] { claim(cfg); }), "loading weights only (checkpoint.load_weights_only)"));
  // resume = auto continues the run where it has a checkpoint...
  cfg.checkpoint.load_weights_only = false;
  BOOST_TEST(claim(cfg).empty());
  // ... and where it has none (a run that kept no checkpoint), starting afresh would replace it: refused.
  fs::remove(tmp.root / "ckpt" / "ckpt-00000001.h5");
  fs::remove(tmp.root / "ckpt" / "latest");
  const auto no_checkpoint = files_of(tmp.root);
  BOOST_TEST(contains(error_of([&] { claim(cfg); }), "already holds a run (metrics.jsonl): it has no checkpoint "
                                                                  "to continue from (checkpoint.resume = auto)"));
  BOOST_TEST((files_of(tmp.root) == no_checkpoint));
  cfg.run.overwrite = true;
  BOOST_TEST(!claim(cfg).empty());
}

// A checkpoint.dir outside run.dir is locked too: a second job with its own run.dir is refused,
// naming the key and the lock file; both locks go with the first job.
BOOST_AUTO_TEST_CASE(a_shared_checkpoint_dir_is_locked) {
  TempDir tmp{"lock"};
  for (const char* d : {"a", "b", "ckpt"}) fs::create_directories(tmp.root / d);
  const std::string ckpt = (tmp.root / "ckpt").string();
  {
    RunFolderLock first((tmp.root / "a").string(), ckpt);
    BOOST_TEST(fs::exists(tmp.root / "ckpt" / "lock"));
    const std::string e = error_of([&] { RunFolderLock second((tmp.root / "b").string(), ckpt); });
    BOOST_TEST(contains(e, "checkpoint.dir = '" + ckpt + "' is in use by another job (host "), e);
    BOOST_TEST(contains(e, (tmp.root / "ckpt" / "lock").string()), e);
    BOOST_TEST(!fs::exists(tmp.root / "b" / "lock"));  // the run.dir lock taken first is given back
  }
  BOOST_TEST(!fs::exists(tmp.root / "a" / "lock"));
  BOOST_TEST(!fs::exists(tmp.root / "ckpt" / "lock"));
  RunFolderLock same((tmp.root / "a").string(), (tmp.root / "a").string());  // one folder, one lock
  BOOST_TEST(fs::exists(tmp.root / "a" / "lock"));
}

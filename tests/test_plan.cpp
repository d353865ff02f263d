// Tests of `shardlm plan`: its CPU numbers against what demo runs on 1, 2 and 4 ranks report for
// every strategy; its CUDA numbers against the peaks measured on an H100 (docs/PERFORMANCE.md);
// the sizing functions against the allocations of the code they mirror; bad decks and options.
#define BOOST_TEST_MODULE test_plan
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/fsdp.hpp"
#include "shardlm/model.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Outcome {
  int exit_code = -1;
  std::string output;
};

Outcome run_command(const std::string& cmd) {
  Outcome o;
  FILE* pipe = popen(cmd.c_str(), "r");
  BOOST_TEST_REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) o.output.append(buf, n);
  const int status = pclose(pipe);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

const std::string kBin = SHARDLM_BINARY_DIR "/bin/shardlm";
const std::string kDemo = SHARDLM_SOURCE_DIR "/input/demo.ini";
const std::string kBloom560m = SHARDLM_SOURCE_DIR "/input/bench/bloom560m.ini";

// `shardlm plan ARGS` run directly (it needs no MPI); stdout only unless with_stderr.
Outcome plan(const std::string& args, bool with_stderr = false) {
  return run_command("timeout 60 " + kBin + " plan " + args + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

Outcome train(int np, const std::string& args) {
  return run_command(std::string("timeout 120 " SHARDLM_MPIEXEC " -np ") + std::to_string(np) +
                     " " SHARDLM_MPIEXEC_FLAGS " " + kBin + " train " + args + " 2>&1");
}

fs::path scratch(const std::string& name) {
  fs::path dir = fs::path(SHARDLM_BINARY_DIR) / "test_runs" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

const json& row_of(const json& plan, const std::string& strategy, bool offload = false, bool ac = false) {
  for (const json& r : plan.at("rows"))
    if (r.at("strategy") == strategy && r.at("cpu_offload") == offload && r.at("activation_checkpointing") == ac)
      return r;
  throw std::runtime_error("plan has no row " + strategy);
}

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

shardlm::RunConfig bloom560m(const std::vector<std::string>& overrides) {
  return shardlm::load_run_config(kBloom560m, overrides, 1, false);
}

shardlm::MemoryPlanSpec spec_of(const shardlm::RunConfig& c) {
  shardlm::MemoryPlanSpec s;
  s.model = c.model;
  s.backend = c.run.backend;
  s.strategy = c.fsdp.strategy;
  s.param_dtype = c.fsdp.param_dtype;
  s.reduce_dtype = c.fsdp.reduce_dtype;
  s.cpu_offload = c.fsdp.cpu_offload;
  s.activation_checkpointing = c.fsdp.activation_checkpointing;
  s.micro_batch = c.train.micro_batch_size;
  s.max_seq = c.data.max_length;
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(cpu_activation_sizing_matches_the_model_it_mirrors) {
  shardlm::ModelConfig cfg;
  cfg.vocab_size = 300, cfg.hidden_size = 32, cfg.num_heads = 4;
  for (int layers : {0, 1, 3})
    for (auto [b, t] : std::vector<std::pair<int, int>>{{1, 8}, {4, 40}, {3, 100}, {0, 16}}) {
      cfg.num_layers = layers;
      shardlm::BloomCpu model(cfg, b, t);
      BOOST_TEST(shardlm::cpu_activation_bytes(cfg, b, t) == model.activation_bytes(),
                 "layers " << layers << ", batch " << b << " x " << t);
    }
  cfg.arch = "gpt2";
  BOOST_TEST(contains(error_of([&] { shardlm::cpu_activation_bytes(cfg, 1, 8); }), "gpt2"));
}

// The measured peaks of docs/PERFORMANCE.md (one H100, BLOOM-560M shape, seq 512, micro-batch 8,
// bf16): the plan must give the bytes the engine allocated, to the doc's two decimals.
BOOST_AUTO_TEST_CASE(cuda_plan_reproduces_the_measured_h100_peaks) {
  struct Point {
    std::vector<std::string> overrides;
    double gib;
  };
  const std::vector<Point> points = {
      {{"--train.batch_size=8"}, 17.94},
      {{"--train.batch_size=8", "--fsdp.activation_checkpointing=true"}, 13.80},
      {{"--train.batch_size=8", "--fsdp.cpu_offload=true"}, 11.69},
  };
  for (const Point& p : points) {
    shardlm::MemoryPlanSpec s = spec_of(bloom560m(p.overrides));
    BOOST_TEST_REQUIRE(s.backend == "cuda");
    for (auto strategy : {shardlm::ShardingStrategy::FullShard, shardlm::ShardingStrategy::NoShard}) {
      s.strategy = strategy;
      const double planned = gib(static_cast<double>(shardlm::plan_rank_memory(s).device_total()));
      BOOST_TEST(std::fabs(planned - p.gib) <= 0.006, p.overrides.back() << ": planned " << planned << " GiB");
    }
  }
  // Sharding over 4 GPUs divides the state (18 bytes a parameter here) and adds gathered blocks.
  shardlm::MemoryPlanSpec s = spec_of(bloom560m({"--train.batch_size=8"}));
  const shardlm::RankMemoryPlan one = shardlm::plan_rank_memory(s);
  s.world_size = 4;
  const shardlm::RankMemoryPlan four = shardlm::plan_rank_memory(s);
  BOOST_TEST(four.record.grad_shard * 4 >= one.record.grad_shard);
  BOOST_TEST(four.record.grad_shard * 4 < one.record.grad_shard + 16);
  BOOST_TEST(four.optimizer * 4 < one.optimizer + 32);
  BOOST_TEST(four.record.full_params > 0u);
  BOOST_TEST(one.record.full_params == 0u);
}

BOOST_AUTO_TEST_CASE(llama_on_cuda_is_refused_with_the_reason) {
  shardlm::MemoryPlanSpec s;
  s.model.arch = "llama";
  s.model.vocab_size = 300, s.model.hidden_size = 32, s.model.num_layers = 2, s.model.num_heads = 4;
  s.backend = "cuda";
  BOOST_TEST(contains(error_of([&] { shardlm::plan_rank_memory(s); }), "CPU backend only"));

  fs::path dir = scratch("plan_llama");
  std::ofstream(dir / "llama.ini") << "[model]\narch = llama\nvocab_size = 300\nhidden_size = 32\nnum_layers = 2\n"
                                   << "num_heads = 4\nnum_kv_heads = 2\n"
                                   << "[data]\ntrain_file = train.jsonl\nformat = jsonl\n"
                                   << "[train]\nbatch_size = 1\n[run]\nbackend = cuda\n";
  Outcome o = plan((dir / "llama.ini").string(), true);
  BOOST_TEST_INFO(o.output);
  BOOST_TEST(o.exit_code == 1);
  BOOST_TEST(contains(o.output, "shardlm: error: model.arch = llama runs on the CPU backend only"));
}

// The plan of the demo deck against the memory the demo reports, for every strategy on 1, 2 and
// 4 ranks: the "memory" records field by field and the peak of the planned buffers.
BOOST_AUTO_TEST_CASE(cpu_plan_matches_what_demo_runs_report) {
  struct Case {
    int np;
    std::string strategy;
    std::string extra;  // more overrides for both plan and run
  };
  std::vector<Case> cases;
  for (int np : {1, 2, 4})
    for (const char* s : {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"})
      cases.push_back({np, s, np > 1 && std::string(s) == "HYBRID_SHARD"
                                  ? "--dist.ranks_per_node=" + std::to_string(np / 2)  // two emulated nodes
                                  : ""});
  cases.push_back({2, "FULL_SHARD", "--fsdp.param_dtype=bf16 --fsdp.reduce_dtype=bf16"});
  const std::string common = "--train.batch_size=16 --checkpoint.at_end=false";
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.strategy << " on " << c.np << " rank(s) " << c.extra) {
      const std::string deck_args = kDemo + " " + common + " --fsdp.strategy=" + c.strategy + " " + c.extra;
      Outcome p = plan(deck_args + " --json --ranks=" + std::to_string(c.np));
      BOOST_TEST_INFO(p.output);
      BOOST_TEST_REQUIRE(p.exit_code == 0);
      const json planned = json::parse(p.output);
      const json& row = row_of(planned, c.strategy);
      BOOST_TEST(row.at("deck").get<bool>());

      fs::path dir = scratch("plan_demo_" + c.strategy + "_" + std::to_string(c.np));
      Outcome t = train(c.np, deck_args + " --train.max_steps=2 --train.log_every=1 --run.dir=" + dir.string());
      BOOST_TEST_INFO(t.output);
      BOOST_TEST_REQUIRE(t.exit_code == 0);
      std::ifstream metrics(dir / "metrics.jsonl");
      std::string line;
      int records = 0;
      std::vector<double> peaks;
      while (std::getline(metrics, line)) {
        const json j = json::parse(line);
        if (j.at("type") == "memory") {
          ++records;
          double sum = 0;
          for (const auto& [key, value] : row.at("memory_record").items()) {
            BOOST_TEST(j.at(key).get<double>() == value.get<double>(), key << " of rank " << j.at("rank"));
            sum += j.at(key).get<double>();
          }
          const double total = row.at("total_bytes").get<double>();
          BOOST_TEST(std::fabs(total - sum) <= 0.15 * sum, "plan " << total << " against the record's " << sum);
        } else if (j.at("type") == "summary") {
          peaks = j.at("peak_memory_bytes_per_rank").get<std::vector<double>>();
        }
      }
      BOOST_TEST(records == c.np);
      BOOST_TEST_REQUIRE(peaks.size() == static_cast<size_t>(c.np));
      for (double peak : peaks) {
        const double total = row.at("total_bytes").get<double>();
        BOOST_TEST(std::fabs(total - peak) <= 0.15 * peak, "plan " << total << " against the peak " << peak);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(table_lists_every_configuration_and_recommends_one) {
  Outcome o = plan(kDemo + " --ranks=2 --gpu-memory=1GiB");
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  for (const char* s : {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD", "max micro", "cpu backend"})
    BOOST_TEST(contains(o.output, s), s);
  BOOST_TEST(contains(o.output, "recommendation: NO_SHARD"));

  // BLOOM-560M on 8 GPUs of 80 GiB: 16 CUDA rows, and micro-batch 8 fits unsharded.
  Outcome b = plan(kBloom560m + " --ranks=8 --train.batch_size=64 --json");
  BOOST_TEST_INFO(b.output);
  BOOST_TEST_REQUIRE(b.exit_code == 0);
  const json j = json::parse(b.output);
  BOOST_TEST(j.at("rows").size() == 16u);
  BOOST_TEST(j.at("recommendation").at("strategy") == "NO_SHARD");
  BOOST_TEST(j.at("runtime_overhead_bytes").get<double>() > 1e9);
  // On a 16 GiB GPU micro-batch 8 does not fit unsharded; something sharded or recomputed must.
  Outcome small = plan(kBloom560m + " --ranks=8 --train.batch_size=64 --gpu-memory=16GiB --json");
  BOOST_TEST_REQUIRE(small.exit_code == 0);
  const json s = json::parse(small.output);
  BOOST_TEST(!row_of(s, "NO_SHARD").at("fits").get<bool>());
  BOOST_TEST(row_of(s, "NO_SHARD").at("max_micro_batch").get<int>() >= 1);
  BOOST_TEST(s.at("recommendation").at("strategy") != "NO_SHARD");
  BOOST_TEST(row_of(s, "FULL_SHARD", false, true).at("max_micro_batch").get<int>() >
             row_of(s, "FULL_SHARD").at("max_micro_batch").get<int>());
}

BOOST_AUTO_TEST_CASE(bad_input_fails_with_one_clear_message) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/nonexistent/deck.ini", "/nonexistent/deck.ini"},
      {kDemo + " --gpu-memory=80", "give a unit"},
      {kDemo + " --gpu-memory=80GiBs", "unknown unit 'gibs'"},
      {kDemo + " --gpu-memory=-4GiB", "must be positive"},
      {kDemo + " --gpu-memory=lots", "not a size"},
      {kDemo + " --ranks=0", "--ranks"},
      {kDemo + " --ranks=4 --train.batch_size=16 --ranks-per-node=3", "--ranks-per-node = 3"},
      {kDemo + " --gpus=4", "unknown option '--gpus=4'"},
      {kDemo + " --trian.lr=1", "did you mean 'train.lr'"},
      {kDemo + " --ranks=3", "train.batch_size"},
  };
  for (const auto& [args, message] : cases) {
    Outcome o = plan(args, true);
    BOOST_TEST_CONTEXT("plan " << args << "\n" << o.output) {
      BOOST_TEST(o.exit_code == 1);
      BOOST_TEST(contains(o.output, "shardlm: error:"));
      BOOST_TEST(contains(o.output, message));
    }
  }
  Outcome none = plan("", true);
  BOOST_TEST(none.exit_code == 2);
  BOOST_TEST(contains(none.output, "usage: shardlm plan"));
}

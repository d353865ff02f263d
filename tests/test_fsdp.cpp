// Tests of the FSDP engine end to end under mpirun: every strategy on the world gives the per-step
// losses of one rank with NO_SHARD and the same global batch; state is sharded 1/N; mixed precision;
// Llama (GQA, llama3 rotary scaling, untied head) through the same engine.
#define BOOST_TEST_MODULE test_fsdp
#include "mpi_fixture.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cpu_model_test_support.hpp"
#include "head_scratch_check.hpp"
#include "train_test_support.hpp"
#include "shardlm/fsdp.hpp"

using namespace shardlm;

namespace {

RunConfig tiny_config(ShardingStrategy strategy, const std::string& name) {
  RunConfig cfg = tiny_squad_config(32);
  cfg.data.format = DataFormat::Squad;
  cfg.data.eval_file = SHARDLM_SOURCE_DIR "/input/data/demo_squad_eval.json";
  cfg.data.eval_size = 16;
  cfg.data.max_length = 160;
  cfg.train.epochs = 1;
  cfg.train.warmup_steps = 3;
  cfg.train.max_steps = 20;
  cfg.train.seed = 7;
  cfg.train.log_every = 5;
  cfg.fsdp.strategy = strategy;
  cfg.run.dir = concat(SHARDLM_BINARY_DIR, "/test_runs/fsdp_np", world_size(), "_", name);
  cfg.run.overwrite = true;  // the suite's earlier run left its files there
  return cfg;
}

// The reference: one rank, NO_SHARD, gradient accumulation over the whole global batch.
const TrainResult& reference() {
  static TrainResult ref = [] {
    TrainResult r;
    if (world_rank() == 0) r = train(tiny_config(ShardingStrategy::NoShard, "reference"), MPI_COMM_SELF, quiet());
    size_t steps = r.step_losses.size();
    MPI_Bcast(&steps, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
    r.step_losses.resize(steps);
    r.eval_losses.resize(1);
    MPI_Bcast(r.step_losses.data(), static_cast<int>(steps), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(r.eval_losses.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return r;
  }();
  return ref;
}

void expect_same_losses(const TrainResult& got, const TrainResult& ref, double rel) {
  BOOST_TEST_REQUIRE(got.step_losses.size() == ref.step_losses.size());
  for (size_t i = 0; i < ref.step_losses.size(); ++i)
    BOOST_TEST(got.step_losses[i] == ref.step_losses[i], boost::test_tools::tolerance(rel));
  BOOST_TEST(got.eval_losses.at(0) == ref.eval_losses.at(0), boost::test_tools::tolerance(rel));
}

}  // namespace

BOOST_AUTO_TEST_CASE(reference_learns) {
  const TrainResult& ref = reference();
  BOOST_TEST_REQUIRE(ref.step_losses.size() == 20u);
  // Loss starts near ln(259) for a fresh model and falls.
  BOOST_TEST(ref.step_losses.front() > 4.5);
  BOOST_TEST(ref.step_losses.back() < ref.step_losses.front() - 1.0);
}

BOOST_AUTO_TEST_CASE(full_shard_matches_one_rank) {
  TrainResult r = train(tiny_config(ShardingStrategy::FullShard, "full"), MPI_COMM_WORLD, quiet());
  expect_same_losses(r, reference(), 1e-4);
}

// run.trace_step: the traced step changes no loss; every rank writes its timeline (Chrome trace
// events: each unit's forward and backward on the compute lane, its reduction and, sharded, its
// all-gathers on the comm lane, all inside the step), and metrics.jsonl has a "trace" record per rank.
BOOST_AUTO_TEST_CASE(a_traced_step_writes_its_timeline) {
  RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "trace");
  cfg.run.trace_step = 3;
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  expect_same_losses(r, reference(), 1e-4);
  const int L = cfg.model.num_layers;
  std::ifstream in(concat(cfg.run.dir, "/trace_step3_rank", world_rank(), ".json"));
  BOOST_TEST_REQUIRE(in.good());
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> count;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const std::string name = e.at("name");
    count[name.substr(0, name.find(" unit"))] += 1;
    BOOST_TEST(e.at("ts").get<double>() >= 0.0);
    BOOST_TEST(e.at("dur").get<double>() >= 0.0);
    BOOST_TEST(e.at("tid").get<int>() == (name.rfind("all-gather", 0) == 0 || name.rfind("reduce", 0) == 0 ? 1 : 0));
  }
  const int micro = cfg.train.batch_size / (cfg.train.micro_batch_size * world_size());
  BOOST_TEST(count["forward"] == micro * (L + 1));
  BOOST_TEST(count["backward"] == micro * L + micro);  // the blocks and the embedding
  BOOST_TEST(count["forward and backward"] == micro);  // the head
  // fsdp.no_sync = auto is full for this tiny model with accumulation: one reduction a unit a step.
  BOOST_TEST(count["reduce"] == (world_size() > 1 && micro > 1 ? 1 : micro) * (L + 1));
  BOOST_TEST((count["all-gather"] > 0) == (world_size() > 1));  // one rank reads its slices in place
  BOOST_TEST(count["optimizer (AdamW)"] == 1);
  if (world_rank() != 0) return;
  std::ifstream metrics(cfg.run.dir + "/metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("type", "") != "trace") continue;
    ++records;
    BOOST_TEST(j.at("step").get<int>() == 3);
    BOOST_TEST(j.at("step_ms").get<double>() > 0.0);
    BOOST_TEST(j.at("compute_ms").get<double>() <= j.at("step_ms").get<double>() + 1e-6);
    BOOST_TEST(j.at("exposed_comm_ms").get<double>() >= 0.0);
  }
  BOOST_TEST(records == world_size());
}

// summarize_trace: busy time is the union of a lane's spans, overlap their intersection.
BOOST_AUTO_TEST_CASE(trace_summary_of_known_spans) {
  StepTrace t;
  t.step_ms = 25;
  t.spans = {{"forward unit 1", "compute", 0, 10}, {"backward unit 1", "compute", 12, 20},
             {"forward unit 2", "compute", 8, 9},  {"all-gather unit 2", "comm", 5, 7},
             {"reduce unit 1", "comm", 6, 15}};
  const TraceSummary s = summarize_trace(t);
  BOOST_TEST(s.compute_ms == 18.0);
  BOOST_TEST(s.comm_ms == 10.0);           // [5, 15]
  BOOST_TEST(s.overlap_ms == 8.0);         // [5, 10] and [12, 15]
  BOOST_TEST(s.exposed_comm_ms == 2.0);    // [10, 12]
  BOOST_TEST(s.compute_idle_ms == 7.0);
  BOOST_TEST(s.gather_ms == 2.0);
  BOOST_TEST(s.reduce_ms == 9.0);
  const nlohmann::json j = nlohmann::json::parse(trace_json(t, 3));
  BOOST_TEST(j.at("traceEvents").size() == 5u + 3u);  // the spans, two lane names, the rank's name
  BOOST_TEST(s.host_ms == 0.0);
  BOOST_TEST(s.copy_ms == 0.0);
  // Offloaded lanes: host busy is its union; copies busy the union of down and up.
  t.spans.push_back({"copy down unit 1", "down", 15, 18});
  t.spans.push_back({"copy up unit 1", "up", 17, 21});
  t.spans.push_back({"update unit 1", "host", 18, 22});
  t.spans.push_back({"update unit 2", "host", 21, 23});
  const TraceSummary o = summarize_trace(t);
  BOOST_TEST(o.copy_ms == 6.0);  // [15, 21]
  BOOST_TEST(o.host_ms == 5.0);  // [18, 23]
  BOOST_TEST(o.compute_ms == 18.0);
  const nlohmann::json k = nlohmann::json::parse(trace_json(t, 3));
  BOOST_TEST(k.at("traceEvents").size() == 9u + 6u);  // five lane names now
  BOOST_TEST(k.at("traceEvents").back().at("tid") == 4);  // the host lane
}

BOOST_AUTO_TEST_CASE(shard_grad_op_matches_one_rank) {
  TrainResult r = train(tiny_config(ShardingStrategy::ShardGradOp, "grad_op"), MPI_COMM_WORLD, quiet());
  expect_same_losses(r, reference(), 1e-4);
}

// Both hybrids on two emulated nodes (on 4 ranks: 2 nodes x 2). HYBRID_SHARD frees each block after
// its use, as FULL_SHARD does inside the node; HYBRID_SHARD_ZERO2 keeps every block gathered, so
// with more than one rank a node it holds more at its peak.
BOOST_AUTO_TEST_CASE(hybrid_shards_match_one_rank) {
  const int per_node = world_size() >= 2 ? world_size() / 2 : 1;
  size_t peak[2] = {0, 0};
  int i = 0;
  for (ShardingStrategy s : {ShardingStrategy::HybridShard, ShardingStrategy::HybridShardZero2}) {
    RunConfig cfg = tiny_config(s, s == ShardingStrategy::HybridShard ? "hybrid" : "hybrid_zero2");
    cfg.dist.ranks_per_node = per_node;
    BOOST_TEST_CONTEXT(strategy_name(s)) {
      TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
      expect_same_losses(r, reference(), 1e-4);
      peak[i++] = r.peak_memory_bytes;
    }
  }
  if (per_node > 1) BOOST_TEST(peak[0] < peak[1]);
}

BOOST_AUTO_TEST_CASE(no_shard_on_the_world_matches_one_rank) {
  TrainResult r = train(tiny_config(ShardingStrategy::NoShard, "no_shard"), MPI_COMM_WORLD, quiet());
  expect_same_losses(r, reference(), 1e-4);
}

// fsdp.root_reduction = split (the head's part of the root reduced after the head's backward, the
// embedding's token rows packed and all-reduced at the end) trains BLOOM (tied head, an embedding
// LayerNorm beside the table) to the losses of one rank on every strategy, with accumulation and with a
// bf16 reduction; the tiny model's 259 rows are fewer than the ids, so auto would not split.
BOOST_AUTO_TEST_CASE(split_root_reduction_matches_one_rank) {
  struct Case {
    ShardingStrategy strategy;
    const char* name;
    int micro;
  };
  for (const Case& c : {Case{ShardingStrategy::FullShard, "split_full", 0}, Case{ShardingStrategy::ShardGradOp, "split_op", 0},
                        Case{ShardingStrategy::HybridShard, "split_hybrid", 0}, Case{ShardingStrategy::NoShard, "split_no", 0},
                        Case{ShardingStrategy::FullShard, "split_accum", 1}}) {
    RunConfig cfg = tiny_config(c.strategy, c.name);
    cfg.fsdp.root_reduction = RootReduction::Split;
    if (c.strategy == ShardingStrategy::HybridShard) cfg.dist.ranks_per_node = world_size() >= 2 ? world_size() / 2 : 1;
    if (c.micro > 0) cfg.train.micro_batch_size = c.micro;
    BOOST_TEST_CONTEXT(c.name) { expect_same_losses(train(cfg, MPI_COMM_WORLD, quiet()), reference(), 1e-4); }
  }
}

BOOST_AUTO_TEST_CASE(accumulation_does_not_change_the_step) {
  RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "accum");
  cfg.train.micro_batch_size = 1;  // twice the micro-steps for the same global batch
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  expect_same_losses(r, reference(), 1e-4);
}

BOOST_AUTO_TEST_CASE(state_is_sharded_one_over_n) {
  const int n = world_size();
  RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "memory");
  cfg.train.max_steps = 1;
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  const double model_bytes = double(r.model_params) * sizeof(float);
  // Each unit pads to a multiple of n, so a slice exceeds 1/n by under one element per unit.
  BOOST_TEST(double(r.master_shard_bytes) >= model_bytes / n);
  BOOST_TEST(double(r.master_shard_bytes) <= model_bytes / n + 3 * sizeof(float) * 4);
  BOOST_TEST(r.grad_shard_bytes == r.master_shard_bytes);
  BOOST_TEST(r.optimizer_bytes == 2 * r.master_shard_bytes);
  // HYBRID_SHARD shards over a node only.
  if (n >= 2) {
    RunConfig h = tiny_config(ShardingStrategy::HybridShard, "memory_hybrid");
    h.train.max_steps = 1;
    h.dist.ranks_per_node = n / 2;
    TrainResult hr = train(h, MPI_COMM_WORLD, quiet());
    BOOST_TEST(double(hr.master_shard_bytes) >= model_bytes / (n / 2));
    BOOST_TEST(double(hr.master_shard_bytes) <= model_bytes / (n / 2) + 3 * sizeof(float) * 4);
  }
}

BOOST_AUTO_TEST_CASE(bf16_parameters_and_reduction_track_fp32) {
  RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "bf16");
  cfg.fsdp.param_dtype = DType::BF16;
  cfg.fsdp.reduce_dtype = DType::BF16;
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  const TrainResult& ref = reference();
  bool any_different = false;
  for (size_t i = 0; i < ref.step_losses.size(); ++i) {
    BOOST_TEST(r.step_losses[i] == ref.step_losses[i], boost::test_tools::tolerance(0.02));
    any_different |= r.step_losses[i] != ref.step_losses[i];
  }
  BOOST_TEST(any_different);  // the rounding really happened
}

BOOST_AUTO_TEST_CASE(fp16_parameters_track_fp32) {
  RunConfig cfg = tiny_config(ShardingStrategy::ShardGradOp, "fp16");
  cfg.fsdp.param_dtype = DType::F16;  // fp32 reduction: no loss scaling needed
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  const TrainResult& ref = reference();
  for (size_t i = 0; i < ref.step_losses.size(); ++i)
    BOOST_TEST(r.step_losses[i] == ref.step_losses[i], boost::test_tools::tolerance(0.02));
}

// fp16 reductions with a loss scale far too large: the first steps overflow on some rank, every
// rank skips them together and halves the scale, then training proceeds and tracks fp32.
BOOST_AUTO_TEST_CASE(fp16_loss_scaling_skips_overflowing_steps_on_every_rank) {
  RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "fp16_scaling");
  cfg.fsdp.param_dtype = DType::F16;
  cfg.fsdp.reduce_dtype = DType::F16;
  cfg.train.loss_scale = 1099511627776.0;  // 2^40: fp16 reductions overflow until it is 2^15 or so
  cfg.train.max_steps = 60;
  cfg.train.epochs = 3;
  cfg.run.peak_tflops = 1.0;  // MFU against a 1 TFLOP/s "device": a few tenths of a percent here
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.mfu > 0.0);
  BOOST_TEST(r.mfu < 1.0);
  BOOST_TEST(r.skipped_steps > 5);
  BOOST_TEST(r.loss_scale < 1099511627776.0);
  BOOST_TEST(r.loss_scale >= 1.0);
  long fewest = 0, most = 0;
  MPI_Allreduce(&r.skipped_steps, &fewest, 1, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&r.skipped_steps, &most, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  BOOST_TEST(fewest == most);
  BOOST_TEST_REQUIRE(r.step_losses.size() == 60u);
  for (double l : r.step_losses) BOOST_TEST(std::isfinite(l));
  BOOST_TEST(r.step_losses.back() < r.step_losses.front() * 0.8);  // it trains after the skips

  // The default for fp16: dynamic scaling from 2^16, which this model never overflows.
  RunConfig dflt = tiny_config(ShardingStrategy::FullShard, "fp16_default");
  dflt.fsdp.param_dtype = DType::F16;
  dflt.fsdp.reduce_dtype = DType::F16;
  TrainResult d = train(dflt, MPI_COMM_WORLD, quiet());
  BOOST_TEST(d.loss_scale == 65536.0);
  const TrainResult& ref = reference();
  for (size_t i = 0; i < ref.step_losses.size(); ++i)
    BOOST_TEST(d.step_losses[i] == ref.step_losses[i], boost::test_tools::tolerance(0.03));
}

// eval_loss is the mean over all the eval set's loss tokens (deck.md, [eval]), so the eval micro-batches
// (train.micro_batch_size) do not change it; Trainer's mean of per-batch means would (its SQuAD answers differ
// in length).
BOOST_AUTO_TEST_CASE(eval_loss_is_the_mean_over_all_loss_tokens_whatever_the_micro_batch) {
  std::vector<double> evals;
  for (int micro : {1, 2}) {
    RunConfig cfg = tiny_config(ShardingStrategy::FullShard, concat("eval_micro", micro));
    cfg.train.micro_batch_size = micro;
    cfg.train.max_steps = 2;
    const TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
    BOOST_TEST_REQUIRE(r.eval_losses.size() == 1u);
    evals.push_back(r.eval_losses[0]);
  }
  BOOST_TEST(evals[0] == evals[1], boost::test_tools::tolerance(1e-5));
}

BOOST_AUTO_TEST_CASE(jsonl_text_trains_the_same_on_every_world) {
  auto config = [](const std::string& name) {
    RunConfig cfg = tiny_config(ShardingStrategy::FullShard, name);
    cfg.data.format = DataFormat::Jsonl;
    cfg.data.train_file = SHARDLM_SOURCE_DIR "/input/data/demo_text.jsonl";
    cfg.data.eval_file.clear();
    cfg.train.max_steps = 3;
    return cfg;
  };
  TrainResult world = train(config("jsonl_world"), MPI_COMM_WORLD, quiet());
  std::vector<double> single(3, 0.0);
  if (world_rank() == 0) single = train(config("jsonl_single"), MPI_COMM_SELF, quiet()).step_losses;
  MPI_Bcast(single.data(), 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  BOOST_TEST_REQUIRE(world.step_losses.size() == 3u);
  BOOST_TEST(world.eval_losses.empty());
  for (int i = 0; i < 3; ++i) BOOST_TEST(world.step_losses[i] == single[i], boost::test_tools::tolerance(1e-4));
}

// A tiny Llama (GQA, llama3 rotary scaling, untied head): FULL_SHARD on the world gives the losses of
// NO_SHARD on one rank.
BOOST_AUTO_TEST_CASE(llama_full_shard_matches_one_rank) {
  auto config = [](ShardingStrategy strategy, const std::string& name) {
    RunConfig cfg = tiny_config(strategy, name);
    ModelConfig& m = cfg.model;
    make_tiny_llama(m);
    m.rope_scaling.factor = 8.0f;
    m.rope_scaling.original_max_position_embeddings = 64;
    m.tie_word_embeddings = false;
    cfg.train.max_steps = 6;
    return cfg;
  };
  TrainResult world = train(config(ShardingStrategy::FullShard, "llama_full"), MPI_COMM_WORLD, quiet());
  // The root's reduction split in two (untied: the final norm and lm_head first, then the table's rows).
  RunConfig split_cfg = config(ShardingStrategy::FullShard, "llama_split");
  split_cfg.fsdp.root_reduction = RootReduction::Split;
  TrainResult split = train(split_cfg, MPI_COMM_WORLD, quiet());
  // Reducing every micro-step (no_sync off), the table's rows are written over the head's part of the
  // full gradient once it is reduced (RootSplit::grad_from).
  RunConfig reuse_cfg = config(ShardingStrategy::FullShard, "llama_split_reuse");
  reuse_cfg.fsdp.root_reduction = RootReduction::Split;
  reuse_cfg.fsdp.no_sync = NoSync::Off;
  TrainResult reuse = train(reuse_cfg, MPI_COMM_WORLD, quiet());
  std::vector<double> single(7, 0.0);
  if (world_rank() == 0) {
    TrainResult r = train(config(ShardingStrategy::NoShard, "llama_reference"), MPI_COMM_SELF, quiet());
    // No REQUIRE here: the other ranks wait in the broadcast below.
    BOOST_TEST(r.step_losses.size() == 6u);
    std::copy_n(r.step_losses.begin(), std::min<size_t>(6, r.step_losses.size()), single.begin());
    single[6] = r.eval_losses.empty() ? 0.0 : r.eval_losses[0];
  }
  MPI_Bcast(single.data(), 7, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  BOOST_TEST_REQUIRE(world.step_losses.size() == 6u);
  for (int i = 0; i < 6; ++i) BOOST_TEST(world.step_losses[i] == single[i], boost::test_tools::tolerance(1e-4));
  BOOST_TEST(world.eval_losses.at(0) == single[6], boost::test_tools::tolerance(1e-4));
  BOOST_TEST_REQUIRE(split.step_losses.size() == 6u);
  for (int i = 0; i < 6; ++i) BOOST_TEST(split.step_losses[i] == single[i], boost::test_tools::tolerance(1e-4));
  BOOST_TEST_REQUIRE(reuse.step_losses.size() == 6u);
  for (int i = 0; i < 6; ++i) BOOST_TEST(reuse.step_losses[i] == single[i], boost::test_tools::tolerance(1e-4));
  // A fresh model starts near ln(259) and learns.
  BOOST_TEST(single[0] > 4.5);
  BOOST_TEST(single[5] < single[0]);
}

// Sequence packing (data.packing): the same global batches packed into rows of 480 tokens (the demo's
// samples are 147-220 tokens, so 2-3 to a row, some ranks given an empty micro-batch), FULL_SHARD on
// the world, train to the losses of the unpacked run on one rank (fp32, 1e-5), and pad less; BLOOM
// (ALiBi), Llama (rotary positions restarting at each sample) and Mistral (a sliding window of 16 keys
// inside each sample).
BOOST_AUTO_TEST_CASE(packing_does_not_change_the_step) {
  for (const std::string arch : {"bloom", "llama", "mistral"}) {
    auto config = [arch](bool packed, const std::string& name) {
      RunConfig cfg = tiny_config(ShardingStrategy::FullShard, name);
      if (arch != "bloom") {
        cfg.model.arch = arch;
        cfg.model.num_kv_heads = 2;
        cfg.model.intermediate_size = 48;
      }
      if (arch == "mistral") cfg.model.sliding_window = 16;
      cfg.data.max_length = 480;
      cfg.data.eval_file.clear();
      cfg.train.max_steps = 6;
      cfg.data.packing = cfg.model.packed = packed;
      return cfg;
    };
    TrainResult packed = train(config(true, arch + "_packed"), MPI_COMM_WORLD, quiet());
    std::vector<double> single(6, 0.0);
    if (world_rank() == 0) {
      const TrainResult r = train(config(false, arch + "_unpacked"), MPI_COMM_SELF, quiet());
      std::copy_n(r.step_losses.begin(), std::min<size_t>(6, r.step_losses.size()), single.begin());
    }
    MPI_Bcast(single.data(), 6, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    BOOST_TEST_CONTEXT(arch) {
      BOOST_TEST_REQUIRE(packed.step_losses.size() == 6u);
      for (int i = 0; i < 6; ++i) BOOST_TEST(packed.step_losses[i] == single[i], boost::test_tools::tolerance(1e-5));
      BOOST_TEST(single[0] > 4.5);
    }
  }
}

namespace {

// The full block-gradient buffer in the LM head's scratch (the CPU backend's one buffer and 128-token logits
// chunk) changes no bit (head_scratch_check.hpp): BLOOM, Llama, and Llama with LoRA, every strategy. (One
// rank has the buffer too: the CPU engine never accumulates into its slices directly.)
BOOST_AUTO_TEST_CASE(block_gradients_in_the_head_scratch_change_nothing) {
  for (int kind = 0; kind < 3; ++kind) {
    RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "head_scratch");
    if (kind > 0) make_tiny_llama(cfg.model);
    if (kind == 2) {
      cfg.model.lora.r = 4;
      cfg.model.lora.alpha = 8;
      for (const LinearModule& m : linear_modules(cfg.model)) cfg.model.lora.target_modules.push_back(m.name);
    }
    expect_head_scratch_changes_nothing(cfg, true);
  }
}

// The gathered table in the head's gradient buffer changes no bit (head_scratch_check.hpp): the tiny untied
// Llama, FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD (one rank, or one rank a shard group, has no gathered root).
BOOST_AUTO_TEST_CASE(table_in_the_head_gradient_changes_nothing) {
  RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "table_in_head_grad");
  make_tiny_llama(cfg.model);
  cfg.model.tie_word_embeddings = false;
  expect_table_in_head_grad_changes_nothing(cfg, true);
}

// RootSplit::rows_packed changes nothing (head_scratch_check.hpp), on the CPU.
BOOST_AUTO_TEST_CASE(embedding_rows_packed_change_nothing) {
  RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "rows_packed");
  make_tiny_llama(cfg.model);
  expect_rows_packed_changes_nothing(cfg);
}

// The head's gradient buffer and the gathered root in the first blocks' gradient slices (head_scratch_check.hpp):
// bit for bit on the CPU, 1, 2 and 4 ranks.
BOOST_AUTO_TEST_CASE(root_in_the_gradient_slices_changes_nothing) {
  RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "root_in_slices");
  make_tiny_llama(cfg.model);
  expect_root_in_slices_changes_nothing(cfg, true);
}

// A step's loss read once, after its last micro-step (FsdpEngine::LossRead::later), changes nothing
// (head_scratch_check.hpp): BLOOM and Llama, every strategy, with and without CPU offload, bit for bit.
BOOST_AUTO_TEST_CASE(loss_read_once_a_step_changes_nothing) {
  for (int kind = 0; kind < 2; ++kind)
    for (bool offload : {false, true}) {
      RunConfig cfg = tiny_config(ShardingStrategy::FullShard, "loss_read_once");
      if (kind > 0) make_tiny_llama(cfg.model);
      cfg.fsdp.cpu_offload = offload;
      expect_loss_read_once_changes_nothing(cfg, true);
    }
}

// fsdp.fresh_block_grads: the CPU model zeroes a block's gradient itself before adding to it when the engine says
// its memory holds nothing to keep, and the engine zeroes none (the schedule the GPU families run, writing
// their weight gradients instead): against fsdp.fresh_block_grads = false, BLOOM and Llama, FULL_SHARD,
// NO_SHARD with no sync in full and HYBRID_SHARD, two steps of two micro-steps (head_scratch_check.hpp).
BOOST_AUTO_TEST_CASE(fresh_block_gradients_change_nothing) {
  for (int kind = 0; kind < 2; ++kind)
    for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::NoShard, ShardingStrategy::HybridShard}) {
      RunConfig cfg = tiny_config(s, "fresh_grads");
      if (kind > 0) make_tiny_llama(cfg.model);
      cfg.fsdp.no_sync = s == ShardingStrategy::NoShard ? NoSync::Full : NoSync::Off;
      const int per_node = s == ShardingStrategy::HybridShard && world_size() % 2 == 0 ? world_size() / 2 : 0;
      const Topology topo = make_topology(MPI_COMM_WORLD, per_node);
      const int micro = 2;
      RunConfig zeroing_cfg = cfg;
      zeroing_cfg.fsdp.fresh_block_grads = false;
      auto zeroing = make_engine(zeroing_cfg, MPI_COMM_WORLD, topo, micro);
      auto fresh = make_engine(cfg, MPI_COMM_WORLD, topo, micro);
      BOOST_TEST_CONTEXT(cfg.model.arch << " " << strategy_name(s)) { expect_two_steps_alike(cfg, micro, *zeroing, *fresh, 53); }
    }
}

// The first block's reduction in two parts (FsdpEngine::Impl::split_first_block: the MLP's part reduced as
// soon as the block's backward has written it, the attention's after) gives the gradients of the whole
// reduction: Llama, and Gemma 3 (whose sandwich norm on the attention's output lies before the MLP's part),
// FULL_SHARD and SHARD_GRAD_OP, two engines of one deck, one with the split off, three steps each. On two
// ranks bit for bit (each element a sum of two), on more to 1e-5 (of each slice's largest element; the losses
// after the first step, whose parameters took those differences). One rank's micro-batch is empty in one step.
BOOST_AUTO_TEST_CASE(first_block_reduced_in_two_parts_changes_nothing) {
  for (const ModelConfig& model : {model_test::tiny_llama(), model_test::tiny_gemma3()}) {
    // Where the MLP's part begins: its input norm (Gemma 3's pre-feedforward one).
    const std::vector<UnitLayout> layout = model_layout(model);
    const std::string first = model.arch == "gemma3" ? "layers.0.pre_feedforward_layernorm.weight"
                                                     : "layers.0.post_attention_layernorm.weight";
    size_t want = 0;
    for (const TensorSpec& t : layout[1].tensors)
      if (t.name == first) want = t.offset;
    BOOST_TEST_REQUIRE(want > 0u);
    BOOST_TEST(make_cpu_model(model, 1, 8)->backward_tail_begin() == want);
    for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp}) {
      RunConfig cfg = tiny_config(s, "tail_split");
      static_cast<ModelConfig&>(cfg.model) = model;
      cfg.fsdp.no_sync = NoSync::Off;
      const Topology topo = make_topology(MPI_COMM_WORLD, 0);
      const int micro = 2, V = cfg.model.vocab_size, T = 16;
      cfg.data.max_length = T;
      auto whole = make_engine(cfg, MPI_COMM_WORLD, topo, micro, [](FsdpOptions& o) { o.split_first_block = false; });
      auto split = make_engine(cfg, MPI_COMM_WORLD, topo, micro);
      std::mt19937 rng(5 + world_rank());
      BOOST_TEST_CONTEXT(model.arch << " " << strategy_name(s)) {
        for (int step = 0; step < 3; ++step) {
          // In the second step the last rank has no tokens (its backward calls no hook; it reduces both parts after).
          const bool empty = step == 1 && world_size() > 1 && world_rank() == world_size() - 1;
          MicroBatch mb;
          mb.batch = empty ? 0 : micro, mb.seq = T;
          for (int i = 0; i < mb.batch * T; ++i) mb.tokens.push_back(static_cast<int32_t>(rng() % V));
          for (int i = 0; i < mb.batch * T; ++i) mb.targets.push_back(static_cast<int32_t>(rng() % V));
          mb.target_count = mb.batch * T;
          std::vector<double> losses;
          std::vector<std::vector<float>> grads;
          for (FsdpEngine* e : {whole.get(), split.get()}) {
            e->zero_grad();
            e->last_micro_step();
            losses.push_back(e->forward_backward(mb, 1.0f / (micro * T), 0));
            e->grad_norm();
            for (size_t u = 0; u < e->num_units(); ++u) grads.push_back(e->grad_slice(u));
            e->optimizer_step(1e-3, 1.0f);
          }
          BOOST_TEST_CONTEXT("step " << step) {
            if (world_size() <= 2) BOOST_TEST(losses[1] == losses[0]);
            else BOOST_TEST(losses[1] == losses[0], boost::test_tools::tolerance(1e-5));
            expect_same_grad_slices(grads, world_size() <= 2);
            for (size_t u = 0; u < grads.size() / 2; ++u)  // (the blocks' and the root's gradients are not zero)
              BOOST_TEST((!grads[u].empty() && *std::max_element(grads[u].begin(), grads[u].end()) > 0.0f), "unit " << u);
          }
        }
      }
    }
  }
}

// LoRA (adapters on every linear layer, the base frozen but for the root modules of `saved`, trained
// whole): every strategy on the world gives the losses of NO_SHARD on one rank, the adapters and the
// saved modules alone carry master, gradient and AdamW state, and the adapted model learns.
void check_lora_strategies(const std::vector<std::string>& bloom_saved, const std::vector<std::string>& llama_saved,
                           const std::string& tag) {
  for (const bool llama : {false, true}) {
    auto config = [&](ShardingStrategy strategy, const std::string& name) {
      RunConfig cfg = tiny_config(strategy, name);
      if (llama) make_tiny_llama(cfg.model);
      cfg.model.lora.r = 4;
      cfg.model.lora.alpha = 8;
      for (const LinearModule& m : linear_modules(cfg.model)) cfg.model.lora.target_modules.push_back(m.name);
      cfg.model.lora.modules_to_save = llama ? llama_saved : bloom_saved;
      cfg.train.max_steps = 6;
      cfg.train.lr = 3e-2;  // the first Adam steps on B = 0 move every element by ~lr: enough to learn in 6 steps
      return cfg;
    };
    const std::string arch = (llama ? "llama" : "bloom") + tag;
    std::vector<double> single(7, 0.0), untrained(7, 0.0);
    if (world_rank() == 0) {
      const TrainResult r = train(config(ShardingStrategy::NoShard, arch + "_lora_reference"), MPI_COMM_SELF, quiet());
      std::copy_n(r.step_losses.begin(), std::min<size_t>(6, r.step_losses.size()), single.begin());
      single[6] = r.eval_losses.empty() ? 0.0 : r.eval_losses[0];
      // The same batches with lr 0: the base model's own losses.
      RunConfig still = config(ShardingStrategy::NoShard, arch + "_lora_untrained");
      still.train.lr = 0;
      const TrainResult u = train(still, MPI_COMM_SELF, quiet());
      std::copy_n(u.step_losses.begin(), std::min<size_t>(6, u.step_losses.size()), untrained.begin());
      untrained[6] = u.eval_losses.empty() ? 0.0 : u.eval_losses[0];
    }
    MPI_Bcast(single.data(), 7, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(untrained.data(), 7, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    BOOST_TEST(single[0] == untrained[0], boost::test_tools::tolerance(1e-6));  // B = 0: the base model at first
    BOOST_TEST(single[5] < untrained[5] - 0.05);  // then the adapters learn
    BOOST_TEST(single[6] < untrained[6] - 0.05);
    for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard,
                               ShardingStrategy::HybridShard}) {
      BOOST_TEST_CONTEXT(arch << " " << strategy_name(s)) {
        RunConfig cfg = config(s, arch + "_lora_" + strategy_name(s));
        cfg.dist.ranks_per_node = world_size() >= 2 ? world_size() / 2 : 1;  // HYBRID_SHARD: two emulated nodes
        const TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
        BOOST_TEST_REQUIRE(r.step_losses.size() == 6u);
        for (int i = 0; i < 6; ++i) BOOST_TEST(r.step_losses[i] == single[i], boost::test_tools::tolerance(1e-4));
        BOOST_TEST(r.eval_losses.at(0) == single[6], boost::test_tools::tolerance(1e-4));
        // Master and moments only for the adapters and the saved modules (lora_layout, root included):
        // a few thousand values, not the model's.
        const std::vector<UnitLayout> trained = lora_layout(config(s, "").model);
        size_t n = 0;
        for (const UnitLayout& u : trained) n += u.numel;
        BOOST_TEST(r.optimizer_bytes <= 2 * n * sizeof(float));
        BOOST_TEST(r.optimizer_bytes >= 2 * n * sizeof(float) / static_cast<size_t>(world_size()));
        BOOST_TEST(trained.front().tensors.size() == (llama ? llama_saved.size() : 2 * bloom_saved.size()));
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(lora_matches_one_rank_on_every_strategy) { check_lora_strategies({}, {}, ""); }

namespace {

// A tiny Llama-style model of family `arch` (GQA, head_dim 12 where hidden 32 / 4 heads is 8, untied
// head, sliding window `window`), fully trained and with LoRA on every linear layer: every strategy on
// the world gives the losses of NO_SHARD on one rank.
void check_family_strategies(const std::string& arch, int window) {
  for (const bool lora : {false, true}) {
    auto config = [lora, arch, window](ShardingStrategy strategy, const std::string& name) {
      RunConfig cfg = tiny_config(strategy, name);
      ModelConfig& m = cfg.model;
      m.arch = arch;
      m.num_kv_heads = 2;
      m.intermediate_size = 48;
      m.head_size = 12;
      m.sliding_window = window;
      m.rope_theta = 1000.0f;
      m.tie_word_embeddings = false;
      // Gemma 3: local, global, local...: the window on every other layer, its own rope base.
      if (arch == "gemma3") m = model_test::as_gemma3(m, 12, window, 100.0f, 10.0f);
      if (arch == "phi3") {  // half of each head rotates; LongRoPE's long factors past 64 positions
        m.partial_rotary_factor = 0.5;
        m.longrope.short_factor = {1.0f, 1.5f, 2.5f};
        m.longrope.long_factor = {1.25f, 3.0f, 7.0f};
        m.longrope.original_max_position_embeddings = 64;
      }
      if (lora) {
        m.lora.r = 4;
        m.lora.alpha = 8;
        for (const LinearModule& l : linear_modules(m)) m.lora.target_modules.push_back(l.name);
        cfg.train.lr = 3e-2;
      }
      cfg.train.max_steps = 5;
      return cfg;
    };
    const std::string tag = arch + (lora ? "_lora_" : "_");
    std::vector<double> single(6, 0.0);
    if (world_rank() == 0) {
      const TrainResult r = train(config(ShardingStrategy::NoShard, tag + "reference"), MPI_COMM_SELF, quiet());
      BOOST_TEST(r.step_losses.size() == 5u);
      std::copy_n(r.step_losses.begin(), std::min<size_t>(5, r.step_losses.size()), single.begin());
      single[5] = r.eval_losses.empty() ? 0.0 : r.eval_losses[0];
    }
    MPI_Bcast(single.data(), 6, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    BOOST_TEST(single[4] < single[0]);  // it learns
    for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard,
                               ShardingStrategy::HybridShard, ShardingStrategy::HybridShardZero2}) {
      BOOST_TEST_CONTEXT(tag << strategy_name(s)) {
        RunConfig cfg = config(s, tag + strategy_name(s));
        cfg.dist.ranks_per_node = world_size() >= 2 ? world_size() / 2 : 1;  // the hybrids: two emulated nodes
        const TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
        BOOST_TEST_REQUIRE(r.step_losses.size() == 5u);
        for (int i = 0; i < 5; ++i) BOOST_TEST(r.step_losses[i] == single[i], boost::test_tools::tolerance(1e-4));
        BOOST_TEST(r.eval_losses.at(0) == single[5], boost::test_tools::tolerance(1e-4));
      }
    }
  }
}

}  // namespace

// Qwen3: per-head q/k RMSNorms.
BOOST_AUTO_TEST_CASE(qwen3_matches_one_rank_on_every_strategy) { check_family_strategies("qwen3", 0); }

// Mistral: a sliding window of 16 keys over samples of 147-220 tokens.
BOOST_AUTO_TEST_CASE(mistral_matches_one_rank_on_every_strategy) { check_family_strategies("mistral", 16); }

// Gemma 3: local layers (a window of 16 keys, rope base 100) interleaved with global ones, its block's norms,
// GeGLU and scaled embeddings.
BOOST_AUTO_TEST_CASE(gemma3_matches_one_rank_on_every_strategy) { check_family_strategies("gemma3", 16); }
// Phi-3: fused q|k|v and gate|up (LoRA on qkv_proj and gate_up_proj), partial rotary, LongRoPE, a window of 16.
BOOST_AUTO_TEST_CASE(phi3_matches_one_rank_on_every_strategy) { check_family_strategies("phi3", 16); }

// lora.modules_to_save: Llama's embedding, final norm and head (untied here), BLOOM's two LayerNorms
// (its head is tied), trained whole in the root beside the adapters.
BOOST_AUTO_TEST_CASE(lora_with_saved_modules_matches_one_rank_on_every_strategy) {
  check_lora_strategies({"word_embeddings_layernorm", "ln_f"}, {"embed_tokens", "model.norm", "lm_head"}, "_saved");
}

// Tests of checkpoint and resume through the trainer under mpirun: resuming on the same world
// repeats the uninterrupted run bit for bit; resuming on other worlds and strategies (resharding)
// repeats it to rounding; "auto" finds the latest checkpoint.
#define BOOST_TEST_MODULE test_resume
#include "mpi_fixture.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint_edit.hpp"
#include "shardlm/io.hpp"
#include "shardlm/optim.hpp"
#include "test_support.hpp"
#include "train_test_support.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

std::string scratch(const std::string& name) {
  return concat(SHARDLM_BINARY_DIR, "/test_runs/resume_np", world_size(), "/", name);
}

RunConfig config(ShardingStrategy strategy, const std::string& name) {
  RunConfig cfg = tiny_squad_config(32);
  cfg.data.max_length = 160;
  cfg.train.warmup_steps = 3;
  cfg.train.max_steps = 20;
  cfg.train.seed = 11;
  cfg.fsdp.strategy = strategy;
  cfg.run.dir = scratch(name);
  cfg.checkpoint.keep_last = 0;
  return cfg;
}

// The uninterrupted run, checkpointing every 10 steps; every rank gets its losses.
const TrainResult& uninterrupted() {
  static TrainResult r = [] {
    if (world_rank() == 0) fs::remove_all(scratch(""));
    MPI_Barrier(MPI_COMM_WORLD);
    RunConfig cfg = config(ShardingStrategy::FullShard, "full");
    cfg.checkpoint.every = 10;
    return train(cfg, MPI_COMM_WORLD, quiet());
  }();
  return r;
}

std::string step10() { return scratch("full") + "/checkpoints/ckpt-00000010.h5"; }

std::vector<double> tail_of_uninterrupted() {
  const std::vector<double>& all = uninterrupted().step_losses;
  return std::vector<double>(all.begin() + 10, all.end());
}

// Runs `cfg` resumed from step 10 on the first `ranks` ranks (the others wait) and shares the losses.
std::vector<double> resumed_on(int ranks, RunConfig cfg) {
  cfg.checkpoint.resume = ResumeFrom::Path;
  cfg.checkpoint.resume_path = step10();
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < ranks ? 0 : MPI_UNDEFINED, world_rank(), &sub);
  std::vector<double> losses(10, 0.0);
  if (sub != MPI_COMM_NULL) {
    TrainResult r = train(cfg, sub, quiet());
    BOOST_TEST(r.first_step == 10);
    if (r.step_losses.size() == 10u) losses = r.step_losses;
    MPI_Comm_free(&sub);
  }
  MPI_Bcast(losses.data(), 10, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return losses;
}

// The message of the Error a resume of `cfg` from step 10 ends with on this rank ("" if it trains).
std::string refusal_of_resume_from_step10(RunConfig cfg) {
  cfg.checkpoint.resume = ResumeFrom::Path;
  cfg.checkpoint.resume_path = step10();
  try {
    train(cfg, MPI_COMM_WORLD, quiet());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The records of RUN_DIR/metrics.jsonl (rank 0 wrote them; read on rank 0).
std::vector<nlohmann::json> records_of(const std::string& name) {
  std::ifstream in(scratch(name) + "/metrics.jsonl");
  std::vector<nlohmann::json> records;
  std::string line;
  while (std::getline(in, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

// Removes what an earlier run of the tests left in scratch(name).
void start_afresh(const std::string& name) {
  if (world_rank() == 0) fs::remove_all(scratch(name));
  MPI_Barrier(MPI_COMM_WORLD);
}

// A fresh FULL_SHARD run of 10 steps in scratch(name), checkpoints at steps 5 and 10; its config.
RunConfig train_ten_steps(const std::string& name) {
  start_afresh(name);
  RunConfig cfg = config(ShardingStrategy::FullShard, name);
  cfg.train.max_steps = 10;
  cfg.checkpoint.every = 5;
  train(cfg, MPI_COMM_WORLD, quiet());
  return cfg;
}

std::string checkpoint_of(const std::string& name, long step) {
  char file[64];
  std::snprintf(file, sizeof file, "/checkpoints/ckpt-%08ld.h5", step);
  return scratch(name) + file;
}

// Rank 0 runs `edit` (true when it worked); every rank learns whether it did.
bool edited_on_rank0(const std::function<bool()>& edit) {
  int ok = world_rank() == 0 ? edit() : 0;
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok == 1;
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The run id of RUN_DIR/run_id on rank 0, shared with every rank.
std::string run_id_of(const std::string& name) {
  std::string id = world_rank() == 0 ? first_line(scratch(name) + "/run_id") : "";
  int size = static_cast<int>(id.size());
  MPI_Bcast(&size, 1, MPI_INT, 0, MPI_COMM_WORLD);
  id.resize(static_cast<size_t>(size));
  MPI_Bcast(id.data(), size, MPI_CHAR, 0, MPI_COMM_WORLD);
  return id;
}

// The Error message train(cfg) ends with on this rank ("" if it trains).
std::string refusal_of(const RunConfig& cfg) {
  try {
    train(cfg, MPI_COMM_WORLD, quiet());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_CASE(uninterrupted_run_writes_checkpoints) {
  const TrainResult& r = uninterrupted();
  BOOST_TEST_REQUIRE(r.step_losses.size() == 20u);
  BOOST_TEST(fs::exists(step10()));
  BOOST_TEST(r.last_checkpoint == scratch("full") + "/checkpoints/ckpt-00000020.h5");
}

BOOST_AUTO_TEST_CASE(resume_on_the_same_world_is_bit_exact) {
  RunConfig cfg = config(ShardingStrategy::FullShard, "same_world");
  std::vector<double> got = resumed_on(world_size(), cfg);
  std::vector<double> want = tail_of_uninterrupted();
  for (size_t i = 0; i < want.size(); ++i) BOOST_TEST(got[i] == want[i]);  // exactly
}

// train.optim = adamw_8bit: trains as AdamW does (its losses within a few percent of AdamW's), its
// checkpoints hold the dequantised moments, and a resume on the same world repeats the run bit for bit
// (quantising the checkpoint's moments again gives back the codes); another world resumes to rounding.
BOOST_AUTO_TEST_CASE(adamw_8bit_trains_and_resumes_exactly) {
  const std::vector<double>& adamw = uninterrupted().step_losses;  // first: its first call clears scratch
  start_afresh("adamw_8bit");
  start_afresh("adamw_8bit_resumed");
  RunConfig cfg = config(ShardingStrategy::FullShard, "adamw_8bit");
  cfg.train.optim = Optim::AdamW8bit;
  cfg.checkpoint.every = 10;
  const TrainResult whole = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(whole.step_losses.size() == 20u);
  for (size_t i = 0; i < 20; ++i) BOOST_TEST(whole.step_losses[i] == adamw[i], boost::test_tools::tolerance(0.05));
  BOOST_TEST(whole.optimizer_bytes < uninterrupted().optimizer_bytes / 3);
  RunConfig again = cfg;
  again.run.dir = scratch("adamw_8bit_resumed");
  again.checkpoint.resume = ResumeFrom::Path;
  again.checkpoint.resume_path = scratch("adamw_8bit") + "/checkpoints/ckpt-00000010.h5";
  const TrainResult resumed = train(again, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(resumed.step_losses.size() == 10u);
  for (size_t i = 0; i < 10; ++i) BOOST_TEST(resumed.step_losses[i] == whole.step_losses[10 + i]);  // exactly
}

BOOST_AUTO_TEST_CASE(resume_on_one_rank_no_shard) {
  std::vector<double> got = resumed_on(1, config(ShardingStrategy::NoShard, "one_rank"));
  std::vector<double> want = tail_of_uninterrupted();
  for (size_t i = 0; i < want.size(); ++i) BOOST_TEST(got[i] == want[i], boost::test_tools::tolerance(1e-5));
}

BOOST_AUTO_TEST_CASE(resume_on_two_ranks_full_shard) {
  if (world_size() < 2) return;
  std::vector<double> got = resumed_on(2, config(ShardingStrategy::FullShard, "two_ranks"));
  std::vector<double> want = tail_of_uninterrupted();
  for (size_t i = 0; i < want.size(); ++i) BOOST_TEST(got[i] == want[i], boost::test_tools::tolerance(1e-5));
}

BOOST_AUTO_TEST_CASE(resume_as_hybrid_shard) {
  if (world_size() < 2) return;
  RunConfig cfg = config(ShardingStrategy::HybridShard, "hybrid");
  cfg.dist.ranks_per_node = world_size() / 2;
  std::vector<double> got = resumed_on(world_size(), cfg);
  std::vector<double> want = tail_of_uninterrupted();
  for (size_t i = 0; i < want.size(); ++i) BOOST_TEST(got[i] == want[i], boost::test_tools::tolerance(1e-5));
}

// fp16 from a loss scale far too large: the first steps overflow and are skipped. The schedule counts the
// updates taken, as Trainer's (stepped only when the optimizer step was not skipped), so each step's rate is
// the schedule's at the updates before it; a resume from step 10 goes on with the same rates and losses.
BOOST_AUTO_TEST_CASE(skipped_steps_hold_the_schedule_and_a_resume_continues_it) {
  auto fp16 = [](const std::string& name) {
    start_afresh(name);
    RunConfig cfg = config(ShardingStrategy::FullShard, name);
    cfg.fsdp.param_dtype = DType::F16;
    cfg.fsdp.reduce_dtype = DType::F16;
    cfg.train.loss_scale = 4194304.0;  // 2^22: fp16 reductions overflow for the first few steps
    cfg.checkpoint.every = 10;
    return cfg;
  };
  const RunConfig cfg = fp16("fp16_skips");
  const TrainResult whole = train(cfg, MPI_COMM_WORLD, quiet());
  RunConfig resumed = fp16("fp16_skips_resumed");
  resumed.checkpoint.resume = ResumeFrom::Path;
  resumed.checkpoint.resume_path = checkpoint_of("fp16_skips", 10);
  train(resumed, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(whole.skipped_steps > 0);
  BOOST_TEST_REQUIRE(whole.skipped_steps < 10);  // updates before the checkpoint and after
  if (world_rank() != 0) return;
  std::map<long, double> lr, resumed_lr, loss, resumed_loss;
  std::vector<long> skipped;
  for (const nlohmann::json& r : records_of("fp16_skips")) {
    if (r["type"] == "overflow") skipped.push_back(r["step"].get<long>());
    if (r["type"] != "train") continue;
    lr[r["step"].get<long>()] = r["learning_rate"].get<double>();
    loss[r["step"].get<long>()] = r["loss"].get<double>();
  }
  for (const nlohmann::json& r : records_of("fp16_skips_resumed"))
    if (r["type"] == "train") {
      resumed_lr[r["step"].get<long>()] = r["learning_rate"].get<double>();
      resumed_loss[r["step"].get<long>()] = r["loss"].get<double>();
    }
  BOOST_TEST(static_cast<long>(skipped.size()) == whole.skipped_steps);
  BOOST_TEST_REQUIRE(lr.size() == 20u);
  long taken = 0;
  for (long step = 1; step <= 20; ++step) {
    const double want = scheduled_lr(cfg.train.lr_schedule, cfg.train.lr, taken, cfg.train.warmup_steps,
                                     cfg.train.max_steps, lr_schedule_args(cfg.train));
    BOOST_TEST(lr[step] == want, "step " << step << " after " << taken << " updates: " << lr[step] << " vs " << want);
    if (std::find(skipped.begin(), skipped.end(), step) == skipped.end()) ++taken;
  }
  BOOST_TEST_REQUIRE(resumed_lr.size() == 10u);
  for (long step = 11; step <= 20; ++step) {
    BOOST_TEST(resumed_lr[step] == lr[step], "step " << step);
    BOOST_TEST(resumed_loss[step] == loss[step], "step " << step);
  }
}

BOOST_AUTO_TEST_CASE(auto_resume_takes_the_latest) {
  uninterrupted();
  RunConfig cfg = config(ShardingStrategy::FullShard, "full");
  cfg.checkpoint.resume = ResumeFrom::Auto;
  cfg.train.max_steps = 22;  // two more steps after the latest (step 20)
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.first_step == 20);
  BOOST_TEST(r.step_losses.size() == 2u);
  if (world_rank() != 0) return;
  // The resume is the run's segment 1: its setup says where it started, each of its records says
  // which segment wrote it; the first segment's records carry no segment.
  size_t setups = 0, tagged = 0;
  for (const nlohmann::json& j : records_of("full")) {
    if (j["type"] == "setup" && ++setups == 2) BOOST_TEST(j.value("resumed_from_step", -1L) == 20);
    if (setups == 1) BOOST_TEST(!j.contains("segment"), j.dump());
    if (setups == 2) {
      BOOST_TEST(j.value("segment", 0) == 1, j.dump());
      ++tagged;
    }
    if (j["type"] == "summary" && setups == 2) {
      BOOST_TEST(j["first_step"] == 20);
      BOOST_TEST(j["steps"] == 22);
    }
  }
  BOOST_TEST(setups == 2u);
  BOOST_TEST(tagged > 3u);  // setup, memory, train, checkpoint, summary
}

BOOST_AUTO_TEST_CASE(resume_of_a_finished_run_has_nothing_to_do) {
  RunConfig cfg = config(ShardingStrategy::FullShard, "finished");
  cfg.train.max_steps = 2;
  train(cfg, MPI_COMM_WORLD, quiet());
  size_t lines = world_rank() == 0 ? records_of("finished").size() : 0;
  cfg.checkpoint.resume = ResumeFrom::Auto;
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.nothing_to_do);
  BOOST_TEST(r.first_step == 2);
  BOOST_TEST(r.step_losses.empty());
  if (world_rank() == 0) BOOST_TEST(records_of("finished").size() == lines);  // no setup, no second summary
  // One more step asked for: it trains again.
  cfg.train.max_steps = 3;
  r = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(!r.nothing_to_do);
  BOOST_TEST(r.step_losses.size() == 1u);
}

BOOST_AUTO_TEST_CASE(auto_without_checkpoints_starts_fresh) {
  RunConfig cfg = config(ShardingStrategy::FullShard, "fresh");
  cfg.checkpoint.resume = ResumeFrom::Auto;
  cfg.checkpoint.at_end = false;
  cfg.train.max_steps = 2;
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.first_step == 0);
  BOOST_TEST(r.step_losses.size() == 2u);
  BOOST_TEST(r.last_checkpoint.empty());
}

// On the CPU backend the state is in host memory already: fsdp.cpu_offload (with offload_dir) changes
// nothing (docs/deck.md), the run trains as without it (it used to be refused at start).
BOOST_AUTO_TEST_CASE(cpu_offload_on_the_cpu_backend_changes_nothing) {
  RunConfig plain = config(ShardingStrategy::FullShard, "cpu_plain");
  plain.checkpoint.at_end = false;
  plain.train.max_steps = 3;
  plain.run.overwrite = true;
  RunConfig offload = plain;
  offload.run.dir = scratch("cpu_offload");
  offload.fsdp.cpu_offload = true;
  offload.fsdp.offload_dir = scratch("");
  const TrainResult a = train(plain, MPI_COMM_WORLD, quiet());
  const TrainResult b = train(offload, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(a.step_losses.size() == 3u);
  BOOST_TEST((b.step_losses == a.step_losses));
}

BOOST_AUTO_TEST_CASE(a_different_model_is_refused_on_every_rank) {
  uninterrupted();
  RunConfig cfg = config(ShardingStrategy::FullShard, "wrong_model");
  cfg.model.hidden_size = 64;
  const std::string message = refusal_of_resume_from_step10(cfg);
  BOOST_TEST(message.find("ckpt-00000010.h5") != std::string::npos);
}

// Resume compares the tokenizer too (its hash): another tokenizer of the same size is refused on
// every rank naming data.tokenizer; load_weights_only takes the weights into a new run with it.
BOOST_AUTO_TEST_CASE(another_tokenizer_is_refused_on_every_rank_unless_weights_only) {
  uninterrupted();
  const std::string tokenizer = scratch("swapped_tokenizer") + "/tokenizer.json";
  if (world_rank() == 0) write_swapped_byte_tokenizer(scratch("swapped_tokenizer"));
  MPI_Barrier(MPI_COMM_WORLD);
  RunConfig cfg = config(ShardingStrategy::FullShard, "other_tokenizer");
  cfg.data.tokenizer = TokenizerSource::File;
  cfg.data.tokenizer_file = tokenizer;
  const std::string message = refusal_of_resume_from_step10(cfg);
  BOOST_TEST(message.find("ckpt-00000010.h5 holds another model than this run's: data.tokenizer is byte in the "
                          "checkpoint, " + tokenizer + " (hash ") != std::string::npos, message);
  BOOST_TEST(message.find("checkpoint.load_weights_only = true") != std::string::npos, message);

  cfg.checkpoint.resume = ResumeFrom::Path;
  cfg.checkpoint.resume_path = step10();
  cfg.checkpoint.load_weights_only = true;
  cfg.run.dir = scratch("other_tokenizer_weights");
  cfg.train.max_steps = 2;
  TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.first_step == 0);
  BOOST_TEST(r.step_losses.size() == 2u);
}

// ---- LoRA runs: adapters in the checkpoints, PEFT's folder at the end --------------------------

namespace {

RunConfig lora_config(const std::string& name) {
  RunConfig cfg = config(ShardingStrategy::FullShard, name);
  cfg.model.lora.r = 4;
  cfg.model.lora.alpha = 8;
  for (const LinearModule& m : linear_modules(cfg.model)) cfg.model.lora.target_modules.push_back(m.name);
  cfg.train.lr = 3e-2;
  cfg.train.max_steps = 8;
  cfg.run.overwrite = true;  // a case may reuse a folder an earlier one (or run) left
  return cfg;
}

// A case's uninterrupted run, make(name) with a checkpoint every 4 steps: trained once per process.
// Every caller needs all 8 steps (their losses or the checkpoints), so each call requires them.
const TrainResult& uninterrupted(const std::string& name, RunConfig (*make)(const std::string&)) {
  static std::map<std::string, TrainResult> runs;
  auto it = runs.find(name);
  if (it == runs.end()) {
    RunConfig cfg = make(name);
    cfg.checkpoint.every = 4;
    it = runs.emplace(name, train(cfg, MPI_COMM_WORLD, quiet())).first;
  }
  BOOST_TEST_REQUIRE(it->second.step_losses.size() == 8u);
  return it->second;
}
std::string step4_of(const std::string& name) { return scratch(name) + "/checkpoints/ckpt-00000004.h5"; }

// make(name + "_resumed") resumed from the step-4 checkpoint of the case's uninterrupted run (`full`,
// in name + "_full") starts at step 4 and repeats that run's last 4 losses exactly.
void expect_step4_resume_repeats(const std::string& name, RunConfig (*make)(const std::string&),
                                 const TrainResult& full) {
  RunConfig cfg = make(name + "_resumed");
  cfg.checkpoint.resume = ResumeFrom::Path;
  cfg.checkpoint.resume_path = step4_of(name + "_full");
  const TrainResult resumed = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(resumed.first_step == 4);
  BOOST_TEST_REQUIRE(resumed.step_losses.size() == 4u);
  for (int i = 0; i < 4; ++i) BOOST_TEST(resumed.step_losses[i] == full.step_losses[4 + i]);
}

// Two untrained (lr 0) steps from the adapter folder of the case's uninterrupted run (name) and two
// from its final checkpoint's weights must give the same losses; returns those from the adapter.
std::vector<double> losses_from_adapter_match_weights(const std::string& name,
                                                      RunConfig (*make)(const std::string&)) {
  RunConfig from_adapter = make(name + "_from_adapter");
  from_adapter.model.adapter = scratch(name + "_full") + "/adapter";
  from_adapter.train.lr = 0;
  from_adapter.train.max_steps = 2;
  RunConfig from_weights = make(name + "_from_weights");
  from_weights.checkpoint.resume = ResumeFrom::Path;
  from_weights.checkpoint.resume_path = scratch(name + "_full") + "/checkpoints/ckpt-00000008.h5";
  from_weights.checkpoint.load_weights_only = true;
  from_weights.train.lr = 0;
  from_weights.train.max_steps = 2;
  const TrainResult a = train(from_adapter, MPI_COMM_WORLD, quiet());
  const TrainResult b = train(from_weights, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(a.step_losses.size() == 2u);
  BOOST_TEST_REQUIRE(b.step_losses.size() == 2u);
  for (int i = 0; i < 2; ++i) BOOST_TEST(a.step_losses[i] == b.step_losses[i], boost::test_tools::tolerance(1e-6));
  return a.step_losses;
}

const TrainResult& lora_uninterrupted() { return uninterrupted("lora_full", lora_config); }
std::string lora_step4() { return step4_of("lora_full"); }

}  // namespace

// The checkpoint holds the adapters and their AdamW state only, and a resume from it repeats the run.
BOOST_AUTO_TEST_CASE(lora_checkpoints_hold_the_adapters_and_resume_exactly) {
  const TrainResult& full = lora_uninterrupted();
  // A whole model's checkpoint of the same run for scale: the LoRA one is a small fraction of it.
  const uintmax_t lora_bytes = fs::file_size(lora_step4());
  const uintmax_t whole_bytes = fs::file_size(step10());
  BOOST_TEST(lora_bytes * 4 < whole_bytes, lora_bytes << " bytes against " << whole_bytes);
  CheckpointReader reader(lora_step4());
  BOOST_TEST(!reader.meta().lora.empty());
  BOOST_TEST(reader.meta().base_checksum.size() == 16u);
  for (const CheckpointTensor& t : reader.tensors()) BOOST_TEST(t.name.find(".lora_") != std::string::npos, t.name);

  expect_step4_resume_repeats("lora", lora_config, full);
}

// The adapter folder written at the end is PEFT's (read_peft_adapter reads it back), and a run
// started from it (model.adapter) begins where the adapters ended: the same losses as a run that
// takes the final checkpoint's weights.
BOOST_AUTO_TEST_CASE(lora_runs_write_peft_adapters_and_start_from_them) {
  (void)lora_uninterrupted();  // the run (made once) whose adapter folder is read below
  const std::string adapter = scratch("lora_full") + "/adapter";
  BOOST_TEST_REQUIRE(fs::is_regular_file(adapter + "/adapter_config.json"));
  const PeftAdapter read = read_peft_adapter(adapter, lora_config("x").model);
  BOOST_TEST(read.lora.r == 4);
  BOOST_TEST(read.tensors.size() == 4u * 2 * 2);  // 2 blocks x 4 modules x (A, B)

  const std::vector<double> a = losses_from_adapter_match_weights("lora", lora_config);
  // And not the fresh adapters' losses: the adapters were taken.
  RunConfig fresh = lora_config("lora_fresh");
  fresh.train.lr = 0;
  fresh.train.max_steps = 2;
  const TrainResult c = train(fresh, MPI_COMM_WORLD, quiet());
  BOOST_TEST(std::abs(c.step_losses.at(0) - a.at(0)) > 1e-3);
}

// Resume refuses adapters of another [lora] or trained on other base weights, and a whole model's
// checkpoint for a LoRA run.
BOOST_AUTO_TEST_CASE(lora_resume_refuses_other_adapters_or_base) {
  lora_uninterrupted();
  auto refusal = [](RunConfig cfg, const std::string& path) {
    cfg.checkpoint.resume = ResumeFrom::Path;
    cfg.checkpoint.resume_path = path;
    try {
      train(cfg, MPI_COMM_WORLD, quiet());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  RunConfig other_r = lora_config("lora_other_r");
  other_r.model.lora.r = 8;
  std::string e = refusal(other_r, lora_step4());
  BOOST_TEST(contains(e, "lora.r"), e);
  RunConfig other_base = lora_config("lora_other_base");
  other_base.train.seed = 12;  // the seeded base weights differ
  e = refusal(other_base, lora_step4());
  BOOST_TEST(contains(e, "other base weights"), e);
  e = refusal(lora_config("lora_from_whole"), step10());
  BOOST_TEST(contains(e, "this run trains LoRA adapters"), e);
  // load_weights_only takes adapters trained on another base (a new run from them).
  other_base.checkpoint.load_weights_only = true;
  other_base.train.max_steps = 1;
  e = refusal(other_base, lora_step4());
  BOOST_TEST(e.empty(), e);
}

// LoRA dropout: each micro-step's masks come from (train.seed, step, micro-step, rank), which a resume
// restores, so a resumed run with dropout repeats the uninterrupted one bit for bit; dropout changes
// the training from the third step on (PEFT's zero B hides the adapters' input from the loss until a
// step has moved B, and warmup's first step has lr 0); the adapter written at the end carries the value.
BOOST_AUTO_TEST_CASE(lora_dropout_trains_and_resumes_exactly) {
  const TrainResult& plain = lora_uninterrupted();
  RunConfig cfg = lora_config("lora_dropout_full");
  cfg.model.lora.dropout = 0.1;
  cfg.checkpoint.every = 4;
  const TrainResult full = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(full.step_losses.size() == 8u);
  for (int i = 0; i < 2; ++i) BOOST_TEST(full.step_losses[i] == plain.step_losses[i], "step " << i + 1);
  for (int i = 2; i < 8; ++i) BOOST_TEST(full.step_losses[i] != plain.step_losses[i], "step " << i + 1);
  BOOST_TEST(full.step_losses.back() < full.step_losses.front());
  const PeftAdapter adapter = read_peft_adapter(scratch("lora_dropout_full") + "/adapter", cfg.model);
  BOOST_TEST(adapter.lora.dropout == 0.1);

  RunConfig again = lora_config("lora_dropout_resumed");
  again.model.lora.dropout = 0.1;
  again.checkpoint.resume = ResumeFrom::Path;
  again.checkpoint.resume_path = scratch("lora_dropout_full") + "/checkpoints/ckpt-00000004.h5";
  const TrainResult resumed = train(again, MPI_COMM_WORLD, quiet());
  BOOST_TEST(resumed.first_step == 4);
  BOOST_TEST_REQUIRE(resumed.step_losses.size() == 4u);
  for (int i = 0; i < 4; ++i) BOOST_TEST(resumed.step_losses[i] == full.step_losses[4 + i], "step " << 5 + i);
}

// ---- LoRA with modules_to_save: the saved root modules in the checkpoints and adapters -----------

namespace {

// Llama (untied head) with LoRA on every linear layer and its final norm and head trained whole.
RunConfig saved_config(const std::string& name) {
  RunConfig cfg = lora_config(name);
  cfg.model.arch = "llama";
  cfg.model.num_kv_heads = 2;
  cfg.model.intermediate_size = 48;
  cfg.model.lora.target_modules.clear();
  for (const LinearModule& m : linear_modules(cfg.model)) cfg.model.lora.target_modules.push_back(m.name);
  cfg.model.lora.modules_to_save = {"model.norm", "lm_head"};
  return cfg;
}

const TrainResult& saved_uninterrupted() { return uninterrupted("saved_full", saved_config); }
std::string saved_step4() { return step4_of("saved_full"); }

}  // namespace

// The checkpoint holds the adapters and the saved modules with their AdamW state (the root unit's
// vectors), and resumes exactly on the same world and, resharded, on one rank.
BOOST_AUTO_TEST_CASE(saved_modules_are_checkpointed_and_resume_exactly) {
  const TrainResult& full = saved_uninterrupted();
  CheckpointReader reader(saved_step4());
  std::vector<std::string> root;
  for (const CheckpointTensor& t : reader.tensors())
    if (t.unit == "root") root.push_back(t.name);
  BOOST_TEST((root == std::vector<std::string>{"norm.weight", "lm_head.weight"}));
  BOOST_TEST_REQUIRE(!reader.unit_states().empty());
  BOOST_TEST(reader.unit_states().front().unit == "root");
  BOOST_TEST(reader.unit_states().front().optimizer.size() >= 2u);  // AdamW's two moments beside the param
  // The saved modules moved: the trained head is no longer the base's (the base is the seeded one).
  const CheckpointTensor& head = *std::find_if(reader.tensors().begin(), reader.tensors().end(),
                                               [](const CheckpointTensor& t) { return t.name == "lm_head.weight"; });
  const std::vector<float> trained = reader.read(head);
  const UnitLayout whole = model_layout(saved_config("x").model)[0];
  std::vector<float> seeded(whole.numel);
  init_unit_slice(whole, 0, saved_config("x").train.seed, 0, whole.numel, seeded.data());
  const TensorSpec& base_head = whole.tensors.back();
  BOOST_TEST_REQUIRE(base_head.name == "lm_head.weight");
  double moved = 0;
  for (size_t i = 0; i < trained.size(); ++i) moved = std::max(moved, double(std::fabs(trained[i] - seeded[base_head.offset + i])));
  BOOST_TEST(moved > 1e-3);

  expect_step4_resume_repeats("saved", saved_config, full);

  // Resharded onto one rank, NO_SHARD: the same losses to rounding.
  RunConfig one = saved_config("saved_one_rank");
  one.fsdp.strategy = ShardingStrategy::NoShard;
  one.checkpoint.resume = ResumeFrom::Path;
  one.checkpoint.resume_path = saved_step4();
  std::vector<double> losses(4, 0.0);
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &sub);
  if (sub != MPI_COMM_NULL) {
    const TrainResult r = train(one, sub, quiet());
    if (r.step_losses.size() == 4u) losses = r.step_losses;
    MPI_Comm_free(&sub);
  }
  MPI_Bcast(losses.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  for (int i = 0; i < 4; ++i) BOOST_TEST(losses[i] == full.step_losses[4 + i], boost::test_tools::tolerance(1e-5));
}

// Resume refuses a checkpoint trained with other modules_to_save (or none).
BOOST_AUTO_TEST_CASE(resume_refuses_other_saved_modules) {
  saved_uninterrupted();
  for (const std::vector<std::string>& other :
       {std::vector<std::string>{"lm_head"}, std::vector<std::string>{}}) {
    RunConfig cfg = saved_config("saved_other");
    cfg.model.lora.modules_to_save = other;
    cfg.checkpoint.resume = ResumeFrom::Path;
    cfg.checkpoint.resume_path = saved_step4();
    std::string e;
    try {
      train(cfg, MPI_COMM_WORLD, quiet());
    } catch (const Error& err) {
      e = err.what();
    }
    BOOST_TEST(contains(e, "lora.modules_to_save = '"), e);
    BOOST_TEST(contains(e, "(modules_to_save = 'model.norm,lm_head')"), e);
  }
}

// RUN_DIR/adapter holds the saved modules under PEFT's names; a run from it (model.adapter) starts
// where the run ended, as a run from the last checkpoint's weights does.
BOOST_AUTO_TEST_CASE(saved_modules_go_to_the_adapter_and_come_back) {
  (void)saved_uninterrupted();  // the run (made once) whose adapter folder is read below
  const std::string adapter = scratch("saved_full") + "/adapter";
  const PeftAdapter read = read_peft_adapter(adapter, saved_config("x").model);
  BOOST_TEST((read.lora.modules_to_save == std::vector<std::string>{"model.norm", "lm_head"}));
  BOOST_TEST(read.tensors.count("lm_head.weight") == 1u);
  BOOST_TEST(read.tensors.count("norm.weight") == 1u);
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : read_safetensors(adapter + "/adapter_model.safetensors")) names.push_back(e.name);
  BOOST_TEST(std::count(names.begin(), names.end(), "base_model.model.lm_head.weight") == 1);
  BOOST_TEST(std::count(names.begin(), names.end(), "base_model.model.model.norm.weight") == 1);
  // The file's head is the checkpoint's.
  CheckpointReader reader(scratch("saved_full") + "/checkpoints/ckpt-00000008.h5");
  for (const CheckpointTensor& t : reader.tensors())
    if (t.name == "lm_head.weight") BOOST_TEST((reader.read(t) == read.tensors.at("lm_head.weight").values));

  losses_from_adapter_match_weights("saved", saved_config);
}

// resume = auto passes over a newest checkpoint that is damaged (its tensor index, two vectors
// swapped), impossible (an old-format file without the contents checksum, so that only the reader's
// checks can tell) or past this deck's epochs, and resumes from the older intact one; the same file
// named in checkpoint.resume is refused naming it.
BOOST_AUTO_TEST_CASE(auto_falls_back_past_unusable_checkpoints) {
  RunConfig cfg = train_ten_steps("fallback");
  const std::string newest = checkpoint_of("fallback", 10), pristine = scratch("fallback") + "/pristine.h5";
  BOOST_TEST_REQUIRE(edited_on_rank0([&] { return fs::copy_file(newest, pristine); }));
  cfg.checkpoint.every = 0;
  cfg.checkpoint.at_end = false;  // the folder stays as it is: latest names step 10
  cfg.train.max_steps = 11;
  struct Case {
    const char* what;
    std::function<bool()> edit;
    const char* why;
  };
  using namespace ckpt_edit;
  const Case cases[] = {
      {"index", [&] { return flip_dataset_bytes(newest, "/units/h.0/index", 128, 1); }, " is damaged: its attributes"},
      {"swapped", [&] { return swap_datasets(newest, "/units/h.0/param", "/units/h.0/exp_avg"); },
       " is damaged: its attributes"},
      {"negative step", [&] { return set_integer(newest, "step", -1) && make_old_format(newest); },
       " is inconsistent: step -1 is negative"},
      {"epoch_step", [&] { return set_integer(newest, "epoch_step", 1000) && make_old_format(newest); },
       " is inconsistent with this run: epoch_step 1000 is past the "},
      {"epoch", [&] { return set_integer(newest, "epoch", 1000) && make_old_format(newest); },
       " is inconsistent with this run: epoch 1000 is past train.epochs"}};
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      BOOST_TEST_REQUIRE(edited_on_rank0([&] {
        return fs::copy_file(pristine, newest, fs::copy_options::overwrite_existing) && c.edit();
      }));
      cfg.checkpoint.resume = ResumeFrom::Auto;
      const TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
      BOOST_TEST(r.first_step == 5);
      BOOST_TEST(r.step_losses.size() == 6u);
      cfg.checkpoint.resume = ResumeFrom::Path;
      cfg.checkpoint.resume_path = newest;
      const std::string message = refusal_of(cfg);
      BOOST_TEST(contains(message, "checkpoint " + newest + c.why), message);
    }
  }
}

// Two runs with one checkpoint folder: a checkpoint another run wrote there is passed over by
// resume = auto, naming both run ids, the file and RUN_DIR/run_id, and refused when no other is
// left; named in checkpoint.resume it resumes, the run keeping its own id.
BOOST_AUTO_TEST_CASE(another_runs_checkpoint_is_refused_by_auto) {
  RunConfig a = train_ten_steps("run_a");
  train_ten_steps("run_b");
  const std::string id_a = run_id_of("run_a"), id_b = run_id_of("run_b");
  BOOST_TEST(!id_a.empty());
  BOOST_TEST(id_a != id_b);
  if (world_rank() == 0) {
    BOOST_TEST(CheckpointReader(checkpoint_of("run_a", 5)).meta().run_id == id_a);
    BOOST_TEST(CheckpointReader(checkpoint_of("run_b", 10)).meta().run_id == id_b);
  }
  const std::string theirs = checkpoint_of("run_a", 10);
  BOOST_TEST_REQUIRE(edited_on_rank0([&] {
    return fs::copy_file(checkpoint_of("run_b", 10), theirs, fs::copy_options::overwrite_existing);
  }));
  a.checkpoint.every = 0;
  a.checkpoint.at_end = false;
  a.train.max_steps = 11;
  a.checkpoint.resume = ResumeFrom::Auto;
  TrainResult r = train(a, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.first_step == 5);

  BOOST_TEST_REQUIRE(edited_on_rank0([&] { return fs::remove(checkpoint_of("run_a", 5)); }));
  const std::string message = refusal_of(a);
  BOOST_TEST(contains(message, concat("checkpoint ", theirs, " belongs to another run: its run id is ", id_b,
                                      ", this run's is ", id_a, " (", scratch("run_a"), "/run_id)")),
             message);
  BOOST_TEST(contains(message, concat(a.checkpoint_dir(), " holds no checkpoint of this run (run id ", id_a,
                                      "), only another run's: name one in checkpoint.resume")),
             message);

  a.checkpoint.resume = ResumeFrom::Path;
  a.checkpoint.resume_path = theirs;
  r = train(a, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.first_step == 10);
  BOOST_TEST(run_id_of("run_a") == id_a);
}

// A new run folder sharing another run's checkpoint.dir: resume = auto neither continues that run (taking its id
// and pruning its files) nor says "nothing to do" for it; it stops, naming the folder and what to do, and leaves
// the other run's files as they were. Named in checkpoint.resume, the other run's checkpoint resumes while the
// new folder keeps an id of its own.
BOOST_AUTO_TEST_CASE(a_new_run_folder_does_not_take_over_a_shared_checkpoint_folder) {
  const RunConfig a = train_ten_steps("shared_a");
  const std::string id_a = run_id_of("shared_a");
  start_afresh("shared_b");
  RunConfig b = config(ShardingStrategy::FullShard, "shared_b");
  b.checkpoint.dir = a.checkpoint_dir();
  b.checkpoint.resume = ResumeFrom::Auto;
  b.checkpoint.keep_last = 1;
  b.checkpoint.every = 2;
  const auto files_of_a = [&] {
    std::vector<std::string> names;
    if (world_rank() == 0)
      for (const fs::directory_entry& e : fs::directory_iterator(a.checkpoint_dir()))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> before = files_of_a();
  for (long steps : {20L, 10L}) {  // a longer run, and one the other run has finished
    BOOST_TEST_CONTEXT("max_steps " << steps) {
      b.train.max_steps = steps;
      const std::string message = refusal_of(b);
      BOOST_TEST(contains(message, concat(a.checkpoint_dir(), " holds no checkpoint of this run (run id ")), message);
      BOOST_TEST(contains(message, concat("its run id is ", id_a)), message);
      BOOST_TEST(files_of_a() == before);
      BOOST_TEST(run_id_of("shared_a") == id_a);
    }
  }
  b.checkpoint.resume = ResumeFrom::Path;
  b.checkpoint.resume_path = checkpoint_of("shared_a", 10);
  b.checkpoint.dir = "";  // its own folder for its own checkpoints
  b.train.max_steps = 12;
  const TrainResult r = train(b, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.first_step == 10);
  const std::string id_b = run_id_of("shared_b");
  BOOST_TEST(!id_b.empty());
  BOOST_TEST(id_b != id_a);
  if (world_rank() == 0) BOOST_TEST(CheckpointReader(checkpoint_of("shared_b", 12)).meta().run_id == id_b);
  BOOST_TEST(files_of_a() == before);
}

// Ranks that loaded other inputs stop together before any step, naming the rank and what differs: a rank started
// with its own options (another resolved deck), and one relative data path that names another file on each rank
// (as a node-local copy would).
BOOST_AUTO_TEST_CASE(ranks_that_loaded_other_inputs_stop_together) {
  if (world_size() < 2) return;  // nothing to compare
  start_afresh("other_inputs");
  RunConfig cfg = config(ShardingStrategy::FullShard, "other_inputs");
  cfg.train.max_steps = 2;
  RunConfig mine = cfg;
  if (world_rank() == 1) mine.data.train_size = 40;
  std::string message = refusal_of(mine);
  BOOST_TEST(contains(message, "rank 1 loaded other inputs than rank 0: another resolved deck"), message);

  const fs::path folder = fs::path(scratch("other_inputs")) / concat("rank", world_rank());
  fs::create_directories(folder);
  const char* file = world_rank() == 1 ? "/input/data/demo_squad_eval.json" : "/input/data/demo_squad_train.json";
  fs::copy_file(std::string(SHARDLM_SOURCE_DIR) + file, folder / "data.json", fs::copy_options::overwrite_existing);
  const fs::path was = fs::current_path();
  fs::current_path(folder);
  cfg.data.train_file = "data.json";
  message = refusal_of(cfg);
  fs::current_path(was);
  BOOST_TEST(contains(message, "rank 1 loaded other inputs than rank 0: "), message);
  BOOST_TEST(contains(message, " training examples from data.json where rank 0 loaded "), message);
  BOOST_TEST(contains(message, "must be the same on every node"), message);
}

// A resume with another train.batch_size is refused naming both batches, unless
// checkpoint.allow_new_batch; then the step count goes on.
BOOST_AUTO_TEST_CASE(a_different_global_batch_is_refused_unless_allowed) {
  start_afresh("batch");
  RunConfig cfg = config(ShardingStrategy::FullShard, "batch");
  cfg.train.max_steps = 4;
  train(cfg, MPI_COMM_WORLD, quiet());
  cfg.checkpoint.resume = ResumeFrom::Auto;
  cfg.train.batch_size = 16;
  cfg.train.max_steps = 6;
  const std::string message = refusal_of(cfg);
  BOOST_TEST(contains(message, "checkpoint " + checkpoint_of("batch", 4) +
                                   " was written with a global batch of 8, this run's train.batch_size is 16"),
             message);
  BOOST_TEST(contains(message, "checkpoint.allow_new_batch = true"), message);
  cfg.checkpoint.allow_new_batch = true;
  const TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.first_step == 4);
  BOOST_TEST(r.step_losses.size() == 2u);
  if (world_rank() == 0) BOOST_TEST(CheckpointReader(checkpoint_of("batch", 6)).meta().global_batch == 16);
  // To the end of the epoch in the new batches: 64 of the 200 examples done are 2 steps of 32, so 4 of the 6
  // are left, and the run ends with the data at step 10 (not at 6, the epoch's steps, as if none were done).
  cfg.train.epochs = 1;
  cfg.train.max_steps = 0;
  cfg.train.batch_size = 32;
  const TrainResult rest = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(rest.first_step == 6);
  BOOST_TEST(rest.step_losses.size() == 4u);
  if (world_rank() == 0) {
    const CheckpointMeta end = CheckpointReader(checkpoint_of("batch", 10)).meta();
    BOOST_TEST(end.epoch == 0);
    BOOST_TEST(end.epoch_step == 6);
    BOOST_TEST(end.total_steps == 10);
  }
}

// A checkpoint written before run ids, global batch and contents checksum, in a run folder without
// run_id, still resumes; the run then makes an id, which its next checkpoint keeps.
BOOST_AUTO_TEST_CASE(an_old_format_checkpoint_still_resumes) {
  start_afresh("old_format");
  RunConfig cfg = config(ShardingStrategy::FullShard, "old_format");
  cfg.train.max_steps = 4;
  train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(edited_on_rank0([&] {
    return ckpt_edit::make_old_format(checkpoint_of("old_format", 4)) && fs::remove(scratch("old_format") + "/run_id");
  }));
  cfg.checkpoint.resume = ResumeFrom::Auto;
  cfg.train.max_steps = 6;
  const TrainResult r = train(cfg, MPI_COMM_WORLD, quiet());
  BOOST_TEST(r.first_step == 4);
  BOOST_TEST(r.step_losses.size() == 2u);
  const std::string id = run_id_of("old_format");
  BOOST_TEST(!id.empty());
  if (world_rank() == 0) BOOST_TEST(CheckpointReader(checkpoint_of("old_format", 6)).meta().run_id == id);
}

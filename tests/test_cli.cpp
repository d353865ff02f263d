// Tests of the shardlm executable under mpirun: bad decks fail fast with one message on 1 and 4
// ranks; the demo deck trains (loss halves, eval each epoch) and writes its metrics and deck;
// chess games train; `shardlm report` compares runs of two world sizes; every command's --help.
#define BOOST_TEST_MODULE test_cli
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "shardlm/data.hpp"
#include "shardlm/io.hpp"
#include "shardlm/model.hpp"
#include "checkpoint_edit.hpp"
#include "launch_support.hpp"
#include "test_support.hpp"
#include "train_test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kDemo = SHARDLM_SOURCE_DIR "/input/demo.ini";

std::string host_name_for_test() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

fs::path scratch(const std::string& name) {
  fs::path dir = fs::path(SHARDLM_BINARY_DIR) / "test_runs" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// `shardlm ARGS` on np ranks fails quickly with one error message that says must_contain.
void expect_failure(int np, const std::string& args, const std::string& must_contain) {
  Outcome o = run_shardlm(np, args);
  BOOST_TEST_CONTEXT("np " << np << ": shardlm " << args << "\n" << o.output) {
    BOOST_TEST(o.exit_code != 0);
    BOOST_TEST(count_of(o.output, "shardlm: error:") == 1u);  // one message, not one per rank
    BOOST_TEST(count_of(o.output, must_contain) >= 1u);
    BOOST_TEST(o.seconds < 30.0);
  }
}

void expect_clean_failure(const std::string& args, const std::string& must_contain) {
  for (int np : {1, 4}) expect_failure(np, "train " + args, must_contain);
}

}  // namespace

BOOST_AUTO_TEST_CASE(typo_in_the_deck_names_the_nearest_key) {
  fs::path dir = scratch("cli_typo");
  std::ifstream in(kDemo);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.replace(text.find("weight_decay "), 13, "weight_decy  ");
  // The data paths in the demo deck are relative to its folder: make them absolute here.
  for (const char* f : {"data/demo_squad_train.json", "data/demo_squad_eval.json"})
    text.replace(text.find(f), std::string(f).size(), SHARDLM_SOURCE_DIR "/input/" + std::string(f));
  std::ofstream(dir / "typo.ini") << text;
  expect_clean_failure((dir / "typo.ini").string(), "did you mean 'train.weight_decay'");
}

BOOST_AUTO_TEST_CASE(bad_overrides_fail_with_the_key) {
  expect_clean_failure(kDemo + " --trian.lr=1", "did you mean 'train.lr'");
  expect_clean_failure(kDemo + " --train.lr=-0.1", "train.lr");
  expect_clean_failure(kDemo + " --train.epochs=many", "train.epochs");
  expect_clean_failure(kDemo + " --data.train_file=/nonexistent/train.json", "/nonexistent/train.json");
  expect_clean_failure(kDemo + " --train.batch_size=7", "set train.batch_size to a multiple of");
  expect_clean_failure(kDemo + " --fsdp.strategy=FULL", "fsdp.strategy");
}

BOOST_AUTO_TEST_CASE(missing_deck_fails_cleanly) {
  expect_clean_failure("/nonexistent/deck.ini", "/nonexistent/deck.ini");
}

// Sizes are checked before anything grows: a shape no model has, a run the host cannot hold (38 TiB
// a rank, refused by the plan before any allocation, on every rank together), a device as a deck.
BOOST_AUTO_TEST_CASE(hostile_sizes_fail_before_allocating) {
  const std::string batch = " --train.batch_size=16";  // divides for 1 and 4 ranks
  expect_clean_failure(kDemo + batch + " --model.num_layers=1000000000", "model.num_layers = 1000000000: more than");
  expect_clean_failure(kDemo + batch + " --model.vocab_size=16000000 --model.hidden_size=131072",
                       "of host memory per rank");
  expect_clean_failure("/dev/zero", "not a regular file");
}

// Keys that do nothing on the chosen backend or topology are named at start, once, and the run goes on.
BOOST_AUTO_TEST_CASE(keys_that_do_nothing_here_are_warned_about_at_start) {
  fs::path dir = scratch("cli_inert_keys");
  Outcome o = run_shardlm(2, "train " + kDemo + " --run.dir=" + (dir / "run").string() +
                                 " --train.max_steps=1 --fsdp.cpu_offload=true --fsdp.strategy=HYBRID_SHARD");
  BOOST_TEST(o.exit_code == 0, o.output);
  BOOST_TEST(count_of(o.output, "warning: fsdp.cpu_offload = true does nothing on the CPU backend") == 1u, o.output);
  BOOST_TEST(count_of(o.output, "warning: fsdp.strategy = HYBRID_SHARD on one node is FULL_SHARD") == 1u, o.output);
  // Two emulated nodes: HYBRID_SHARD acts, no warning.
  o = run_shardlm(2, "train " + kDemo + " --run.dir=" + (dir / "nodes").string() +
                         " --train.max_steps=1 --fsdp.strategy=HYBRID_SHARD --dist.ranks_per_node=1");
  BOOST_TEST(o.exit_code == 0, o.output);
  BOOST_TEST(count_of(o.output, "warning: fsdp.strategy") == 0u, o.output);
}

BOOST_AUTO_TEST_CASE(demo_trains_and_reports) {
  fs::path dir = scratch("cli_demo");
  Outcome o = run_shardlm(2, "train " + kDemo + " --run.dir=" + dir.string());
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  BOOST_TEST(o.output.find("master-shard") != std::string::npos);  // the per-rank memory table

  std::ifstream metrics(dir / "metrics.jsonl");
  std::vector<double> losses;
  int evals = 0, memory_lines = 0, summaries = 0, scored_evals = 0;
  std::string line;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string type = j.at("type");
    if (type == "train") {
      losses.push_back(j.at("loss"));
      // Hugging Face Trainer's keys, then ours.
      for (const char* key : {"loss", "grad_norm", "learning_rate", "epoch", "step", "tokens_per_second_per_gpu",
                              "mfu", "peak_memory_bytes", "lr", "tokens_per_s", "tokens_per_s_per_rank"})
        BOOST_TEST(j.contains(key), key);
      BOOST_TEST(j.at("peak_memory_bytes_per_rank").size() == 2u);
    } else if (type == "eval") {
      ++evals;
      BOOST_TEST(j.at("eval_loss").get<double>() > 0.0);
      BOOST_TEST(j.at("eval_samples_per_second").get<double>() > 0.0);
      BOOST_TEST(j.at("eval_steps_per_second").get<double>() > 0.0);
      for (const char* key : {"eval_runtime", "epoch"}) BOOST_TEST(j.contains(key), key);
      // eval.generate = end: only the last epoch's evaluation answers the questions.
      scored_evals += j.contains("eval_exact_match");
      if (evals == 10) {
        BOOST_TEST(j.contains("eval_exact_match"));
        BOOST_TEST(j.contains("eval_f1"));
        BOOST_TEST(j.at("eval_generation_runtime").get<double>() > 0.0);
      }
    } else if (type == "memory") {
      ++memory_lines;
    } else if (type == "summary") {
      ++summaries;
      for (const char* key : {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                              "epoch", "peak_memory_bytes"})
        BOOST_TEST(j.contains(key), key);
      BOOST_TEST(j.at("peak_memory_bytes").get<double>() > 0.0);
      BOOST_TEST(j.at("peak_memory_bytes_per_rank").size() == 2u);
      BOOST_TEST(j.contains("eval_exact_match"));
      BOOST_TEST(j.contains("eval_f1"));
    }
  }
  BOOST_TEST(scored_evals == 1);
  // Every eval question's answer, by id, for the official evaluation script.
  std::ifstream predictions_file(dir / "predictions.json");
  BOOST_TEST_REQUIRE(predictions_file.good());
  const nlohmann::json predictions = nlohmann::json::parse(predictions_file);
  std::ifstream eval_file(SHARDLM_SOURCE_DIR "/input/data/demo_squad_eval.json");
  size_t questions = 0;
  const nlohmann::json eval_json = nlohmann::json::parse(eval_file);
  for (const auto& article : eval_json.at("data"))
    for (const auto& paragraph : article.at("paragraphs"))
      for (const auto& qa : paragraph.at("qas")) {
        ++questions;
        BOOST_TEST(predictions.contains(qa.at("id").get<std::string>()), qa.at("id"));
      }
  BOOST_TEST(predictions.size() == questions);
  BOOST_TEST_REQUIRE(losses.size() >= 2u);
  BOOST_TEST(losses.back() <= losses.front() / 2.0);  // the demo's loss falls by at least half
  BOOST_TEST(evals == 10);                            // one per epoch
  BOOST_TEST(memory_lines == 2);                      // one per rank
  BOOST_TEST(summaries == 1);
  // Rank 0 closes with the summary table: train metrics, then one eval row per epoch.
  BOOST_TEST(count_of(o.output, "***** train summary *****") == 1u);
  BOOST_TEST(o.output.find("train_samples_per_second") != std::string::npos);
  BOOST_TEST(count_of(o.output, "***** eval per epoch *****") == 1u);
  // Output to a pipe gets log lines, never the terminal progress bar.
  BOOST_TEST(o.output.find('\r') == std::string::npos);

  // The resolved deck is a deck: it runs again as written.
  fs::path again = scratch("cli_demo_again");
  Outcome o2 = run_shardlm(1, "train " + (dir / "deck.resolved.ini").string() + " --train.max_steps=2 --run.dir=" + again.string());
  BOOST_TEST_INFO(o2.output);
  BOOST_TEST(o2.exit_code == 0);
  BOOST_TEST(fs::exists(again / "metrics.jsonl"));
}

// A stop signal during start-up (as soon as the handlers are in: before MPI has started, long before the first step) stops
// the run at its first step with a checkpoint and exit code 0, not by killing it; SIGUSR2 (which
// Open MPI's mpirun forwards too) does the same as SIGUSR1.
BOOST_AUTO_TEST_CASE(an_early_stop_signal_stops_at_the_first_step) {
  // "last": a one-step run, whose first step is its last: it checkpoints and finishes instead of stopping,
  // so a job script does not requeue a finished run (its summary is not preempted).
  for (const std::string sig : {"USR1", "USR2", "last"}) {
    BOOST_TEST_CONTEXT(sig) {
      const bool last = sig == "last";
      const fs::path dir = scratch("cli_early_" + sig);
      // The signal goes as soon as the process catches it (its SigCgt mask; bit 10 USR1, bit 12 USR2):
      // the handlers are the first thing main() does for train, but the libraries' own initialisers run
      // before main (0.4 s on a loaded 2-core machine), and a signal then kills any program.
      const std::string bit = sig == "USR2" ? "0x800" : "0x200", kill = last ? "USR1" : sig;
      const std::string caught = "for i in $(seq 400); do m=$(awk \"/SigCgt/{print \\$2}\" /proc/$pid/status); "
                                 "(( 0x$m & " + bit + " )) && break; sleep 0.01; done; ";
      fs::create_directories(dir);
      const std::string cmd = std::string(SHARDLM_BINARY_DIR "/bin/shardlm train ") + kDemo + " --data.eval_file= --run.dir=" +
                              dir.string() + (last ? " --train.max_steps=1" : "") + " > " + (dir / "out.txt").string() +
                              " 2>&1 & pid=$!; " + caught + "kill -" + kill + " $pid; wait $pid";
      const int status = std::system(("timeout 120 bash -c '" + cmd + "'").c_str());
      std::ifstream out(dir / "out.txt");
      const std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
      BOOST_TEST_INFO(text);
      BOOST_TEST(WIFEXITED(status));
      BOOST_TEST(WEXITSTATUS(status) == 0);
      BOOST_TEST(fs::exists(dir / "checkpoints" / "ckpt-00000001.h5"));
      if (!last) {
        BOOST_TEST(text.find("stop signal received: checkpoint written at step 1;") != std::string::npos);
        continue;
      }
      BOOST_TEST(text.find("stop signal received at the last step (1): checkpoint written; finishing") != std::string::npos);
      BOOST_TEST(text.find("done:") != std::string::npos);
      std::ifstream metrics(dir / "metrics.jsonl");
      const std::string records((std::istreambuf_iterator<char>(metrics)), std::istreambuf_iterator<char>());
      BOOST_TEST(records.find("\"preempted\":false") != std::string::npos, records);
      BOOST_TEST(records.find("\"preempted\":true") == std::string::npos, records);
    }
  }
}

BOOST_AUTO_TEST_CASE(stop_signal_checkpoints_and_exits_zero) {
  fs::path dir = scratch("cli_preempt");
  // Slurm's --signal=USR1@T reaches mpirun, which forwards SIGUSR1 to every rank.
  // The signal goes to mpirun itself (a wrapper such as timeout would die of it, not forward it);
  // the outer timeout only guards against a hang.
  fs::create_directories(dir);
  const std::string cmd = std::string(SHARDLM_MPIEXEC " -np 2 " SHARDLM_MPIEXEC_FLAGS " ") +
                          SHARDLM_BINARY_DIR "/bin/shardlm train " + kDemo + " --run.dir=" + dir.string() +
                          " > " + (dir / "out.txt").string() + " 2>&1 & pid=$!; sleep 4; kill -USR1 $pid; wait $pid";
  int status = std::system(("timeout 120 bash -c '" + cmd + "'").c_str());
  std::ifstream out(dir / "out.txt");
  std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  BOOST_TEST_INFO(text);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
  BOOST_TEST(text.find("stop signal received") != std::string::npos);
  BOOST_TEST(fs::exists(dir / "checkpoints" / "latest"));

  // The requeued job resumes from it on another world size and finishes.
  Outcome o = run_shardlm(1, "train " + kDemo + " --run.dir=" + dir.string() + " --checkpoint.resume=auto");
  BOOST_TEST_INFO(o.output);
  BOOST_TEST(o.exit_code == 0);
  BOOST_TEST(o.output.find("resumed from") != std::string::npos);
  BOOST_TEST(o.output.find("done:") != std::string::npos);
  // Once more: the run is finished, so there is nothing to do and nothing is recorded.
  auto metrics_text = [&] {
    std::ifstream in(dir / "metrics.jsonl");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string before = metrics_text();
  Outcome again = run_shardlm(2, "train " + kDemo + " --run.dir=" + dir.string() + " --checkpoint.resume=auto");
  BOOST_TEST(again.exit_code == 0, again.output);
  BOOST_TEST(again.output.find("nothing to do: finished at step 250") != std::string::npos, again.output);
  BOOST_TEST(again.output.find("done:") == std::string::npos, again.output);
  BOOST_TEST(metrics_text() == before);
  // report: one run of two segments, 2 then 1 rank(s), its totals over both.
  Outcome rep = run_shardlm(1, "report " + dir.string());
  BOOST_TEST(rep.exit_code == 0, rep.output);
  BOOST_TEST(rep.output.find("| cli_preempt | cpu | FULL_SHARD | fp32 | 2 then 1 |") != std::string::npos, rep.output);
  BOOST_TEST(rep.output.find("| cli_preempt | 0 | 2 | 1 | FULL_SHARD | 0-") != std::string::npos, rep.output);
  BOOST_TEST(rep.output.find("-250 |") != std::string::npos, rep.output);
  BOOST_TEST(rep.output.find("| preempted |") != std::string::npos, rep.output);

  // inspect and export read what it wrote.
  Outcome inspect = run_shardlm(1, "inspect " + (dir / "checkpoints").string());
  BOOST_TEST_INFO(inspect.output);
  BOOST_TEST(inspect.exit_code == 0);
  BOOST_TEST(inspect.output.find("h.1.mlp.dense_4h_to_h.weight") != std::string::npos);
  BOOST_TEST(inspect.output.find("FULL_SHARD on 1 rank(s)") != std::string::npos);  // the resumed segment wrote it
  BOOST_TEST(inspect.output.find("optimizer    state exp_avg, exp_avg_sq (fp32") != std::string::npos);
  BOOST_TEST(inspect.output.find("\ntokenizer    byte\n") != std::string::npos);  // the hash resume compares
  Outcome exported = run_shardlm(1, "export " + (dir / "checkpoints").string() + " " + (dir / "hf").string());
  BOOST_TEST_INFO(exported.output);
  BOOST_TEST(exported.exit_code == 0);
  BOOST_TEST(fs::exists(dir / "hf" / "config.json"));
  BOOST_TEST(fs::exists(dir / "hf" / "model.safetensors"));
  // What transformers needs beside the weights: the token ids, the dtype, generation_config.json
  // and the byte tokenizer's files.
  auto json_of = [](const fs::path& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json config = json_of(dir / "hf" / "config.json");
  BOOST_TEST(config.at("eos_token_id") == 257);
  BOOST_TEST(config.at("bos_token_id") == 256);
  BOOST_TEST(config.at("pad_token_id") == 258);
  BOOST_TEST(config.at("torch_dtype") == "float32");
  BOOST_TEST(json_of(dir / "hf" / "generation_config.json").at("eos_token_id") == 257);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    BOOST_TEST(fs::exists(dir / "hf" / file), file);
  // bf16 weights in shards of at most 1 MB (the demo's 1.7 MB of fp32 halve to 0.86 MB: two files).
  Outcome bf16 = run_shardlm(1, "export " + (dir / "checkpoints").string() + " " + (dir / "hf16").string() +
                                    " --dtype bf16 --max-shard-size 500KB");
  BOOST_TEST(bf16.exit_code == 0, bf16.output);
  BOOST_TEST(json_of(dir / "hf16" / "config.json").at("torch_dtype") == "bfloat16");
  BOOST_TEST(json_of(dir / "hf16" / "model.safetensors.index.json").at("metadata").at("total_size") == 430208 * 2);
  BOOST_TEST(!fs::exists(dir / "hf16" / "model.safetensors"));
  Outcome bad_dtype = run_shardlm(1, "export " + (dir / "checkpoints").string() + " " + (dir / "never").string() + " --dtype int8");
  BOOST_TEST(bad_dtype.exit_code != 0);
  BOOST_TEST(bad_dtype.output.find("--dtype = 'int8': expected bf16, fp16 or fp32") != std::string::npos, bad_dtype.output);
  Outcome missing = run_shardlm(1, "inspect /nonexistent/ckpt.h5");
  BOOST_TEST(missing.exit_code != 0);
  BOOST_TEST(missing.output.find("/nonexistent/ckpt.h5") != std::string::npos);
  // Subcommands name their own argument, not the deck key of a training run.
  BOOST_TEST(missing.output.find("shardlm inspect CHECKPOINT: '/nonexistent/ckpt.h5' does not exist") !=
             std::string::npos, missing.output);
  BOOST_TEST(missing.output.find("checkpoint.resume") == std::string::npos, missing.output);
  Outcome no_export = run_shardlm(1, "export /nonexistent/ckpt.h5 " + (dir / "never").string());
  BOOST_TEST(no_export.exit_code != 0);
  BOOST_TEST(no_export.output.find("shardlm export CHECKPOINT: '/nonexistent/ckpt.h5' does not exist") !=
             std::string::npos, no_export.output);
  // The run folder names its checkpoints as generate takes it.
  Outcome from_run = run_shardlm(1, "export " + dir.string() + " " + (dir / "hf_run").string());
  BOOST_TEST(from_run.exit_code == 0, from_run.output);
  BOOST_TEST(fs::exists(dir / "hf_run" / "model.safetensors"));
  // A checkpoint whose contents checksum says it was changed is refused, as resume and generate refuse it:
  // with param and exp_avg swapped the export would hold the first moment as weights.
  const fs::path swapped = dir / "swapped.h5";
  fs::copy_file(shardlm::resolve_checkpoint_path((dir / "checkpoints").string()), swapped);
  BOOST_TEST_REQUIRE(ckpt_edit::swap_datasets(swapped.string(), "/units/h.0/param", "/units/h.0/exp_avg"));
  Outcome damaged = run_shardlm(1, "export " + swapped.string() + " " + (dir / "never").string());
  BOOST_TEST(damaged.exit_code != 0);
  BOOST_TEST(damaged.output.find("is damaged: its attributes, tensor index or vectors' checksums") != std::string::npos,
             damaged.output);
  BOOST_TEST(!fs::exists(dir / "never"));
}

namespace {

// Runs a shell command, returning its exit code and stdout + stderr.
Outcome run_command(const std::string& cmd) {
  Outcome o;
  o.exit_code = run_shell(cmd + " 2>&1", o.output);
  return o;
}

}  // namespace

// A run started with a relative checkpoint.dir: inspect of its run folder finds the checkpoints from another
// folder (deck.resolved.ini keeps the folder absolute); after a resume with another batch it gives the epoch as
// the log counts it (epochs done plus the part of the current one, in the new batch's steps).
BOOST_AUTO_TEST_CASE(inspect_of_a_run_folder_with_a_relative_checkpoint_dir) {
  const fs::path dir = scratch("cli_relative_ckpt");
  const std::string cd = "cd " + dir.string() + " &&";
  // 48 examples: 6 steps of 8 an epoch; 8 steps are an epoch and 2 steps (16 examples) into the next.
  const std::string base = "train " + kDemo + " --data.train_size=48 --data.eval_file= --run.dir=run --checkpoint.dir=ckpts";
  Outcome o = run_shardlm(1, base + " --train.max_steps=8", cd);
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  // In batches of 16 (3 steps an epoch) the 16 examples are one step: step 9 is two of three into epoch 2.
  o = run_shardlm(1, base + " --train.max_steps=9 --train.batch_size=16 --checkpoint.allow_new_batch=true"
                            " --checkpoint.resume=auto", cd);
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  BOOST_TEST(contains(o.output, "epoch 1.67"), o.output);
  const Outcome inspect = run_shardlm(1, "inspect " + (dir / "run").string());
  BOOST_TEST_INFO(inspect.output);
  BOOST_TEST(inspect.exit_code == 0);
  BOOST_TEST(contains(inspect.output, "ckpts/ckpt-00000009.h5"), inspect.output);
  BOOST_TEST(contains(inspect.output, "step         9 (epoch 1.67, as the log counts epochs done"), inspect.output);
}

// checkpoint.every_epoch (Trainer's save_strategy = epoch): one checkpoint at each epoch's end.
BOOST_AUTO_TEST_CASE(a_checkpoint_every_epoch) {
  const fs::path dir = scratch("cli_every_epoch");
  fs::remove_all(dir);
  Outcome o = run_shardlm(1, "train " + kDemo + " --data.train_size=16 --train.epochs=3 --checkpoint.every_epoch=true"
                                   " --checkpoint.at_end=false --checkpoint.keep_last=0 --data.eval_file= --run.dir=" +
                                   dir.string());
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir / "checkpoints"))
    if (e.path().extension() == ".h5") files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  // 16 examples in batches of 8: 2 steps an epoch.
  BOOST_TEST((files == std::vector<std::string>{"ckpt-00000002.h5", "ckpt-00000004.h5", "ckpt-00000006.h5"}));
}

// eval.every_steps, checkpoint.keep_best and TensorBoard on the demo: the best checkpoint survives
// keep_last's pruning and a resume, which writes a second events file; a bf16 run exports bf16 by
// default (as save_pretrained); early stopping stops where Trainer's callback would.
BOOST_AUTO_TEST_CASE(evaluation_by_steps_keeps_the_best_and_writes_tensorboard) {
  const fs::path dir = scratch("cli_habits");
  const std::string args = " --eval.every_steps=4 --checkpoint.keep_best=eval_loss --checkpoint.keep_last=1"
                           " --checkpoint.every=4 --fsdp.param_dtype=bf16 --eval.generate=none --run.dir=" + dir.string();
  Outcome o = run_shardlm(1, "train " + kDemo + " --train.max_steps=12" + args);
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  auto records = [&](const std::string& type) {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("type", "") == type) out.push_back(j);
    }
    return out;
  };
  std::vector<long> eval_steps;
  for (const nlohmann::json& e : records("eval")) eval_steps.push_back(e.at("step").get<long>());
  BOOST_TEST((eval_steps == std::vector<long>{4, 8, 12}));  // every 4, the last one the epoch's (once)
  auto best_name = [&] {
    std::ifstream in(dir / "checkpoints" / "best");
    std::string name;
    std::getline(in, name);
    return name;
  };
  const std::string best = best_name();
  BOOST_TEST_REQUIRE(!best.empty());
  BOOST_TEST(fs::exists(dir / "checkpoints" / best));
  BOOST_TEST(fs::exists(dir / "checkpoints" / "ckpt-00000012.h5"));  // the last, kept beside the best
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir / "checkpoints")) files += e.path().extension() == ".h5";
  BOOST_TEST(files == (best == "ckpt-00000012.h5" ? 1u : 2u));
  BOOST_TEST(!records("best_checkpoint").empty());
  auto event_files = [&] {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir / "tensorboard"))
      n += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
    return n;
  };
  BOOST_TEST(event_files() == 1u);

  Outcome resumed = run_shardlm(1, "train " + kDemo + " --train.max_steps=16 --checkpoint.resume=auto" + args);
  BOOST_TEST_INFO(resumed.output);
  BOOST_TEST_REQUIRE(resumed.exit_code == 0);
  BOOST_TEST(resumed.output.find("best checkpoint so far: " + best) != std::string::npos);
  BOOST_TEST(event_files() == 2u);  // a resume appends a new file to the folder
  BOOST_TEST(fs::exists(dir / "checkpoints" / best_name()));

  // Export defaults to the dtype the run trained in.
  Outcome exported = run_shardlm(1, "export " + (dir / "checkpoints").string() + " " + (dir / "hf").string());
  BOOST_TEST_REQUIRE(exported.exit_code == 0, exported.output);
  std::ifstream config_file(dir / "hf" / "config.json");
  BOOST_TEST(nlohmann::json::parse(config_file).at("torch_dtype") == "bfloat16");
  Outcome fp32 = run_shardlm(1, "export " + (dir / "checkpoints").string() + " " + (dir / "hf32").string() + " --dtype fp32");
  BOOST_TEST_REQUIRE(fp32.exit_code == 0, fp32.output);
  std::ifstream config32(dir / "hf32" / "config.json");
  BOOST_TEST(nlohmann::json::parse(config32).at("torch_dtype") == "float32");

  // Early stopping: a threshold no evaluation can beat stops at the second evaluation (patience 1).
  const fs::path early = scratch("cli_early_stop");
  Outcome stopped = run_shardlm(1, "train " + kDemo + " --train.max_steps=12 --eval.every_steps=2 --eval.generate=none"
                                   " --train.early_stopping_patience=1 --train.early_stopping_threshold=100 --run.dir=" +
                                   early.string());
  BOOST_TEST_INFO(stopped.output);
  BOOST_TEST_REQUIRE(stopped.exit_code == 0);
  BOOST_TEST(stopped.output.find("early stopping at step 4") != std::string::npos);
  BOOST_TEST(stopped.output.find("done: 4 steps") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(hdf5_tools_read_a_checkpoint_with_readable_names) {
  // The checkpoint format promises that the standard HDF5 tools read it: they must be installed.
  if (std::system("command -v h5ls > /dev/null 2>&1 && command -v h5dump > /dev/null 2>&1") != 0)
    BOOST_FAIL("h5ls or h5dump is not on PATH: install Debian's hdf5-tools (apt-get install hdf5-tools, or make deps)");

  fs::path dir = scratch("cli_h5tools");
  Outcome o = run_shardlm(1, "train " + kDemo + " --train.max_steps=2 --checkpoint.at_end=true --run.dir=" + dir.string());
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  const fs::path file = dir / "checkpoints" / "ckpt-00000002.h5";
  BOOST_TEST_REQUIRE(fs::exists(file));

  Outcome ls = run_command("h5ls -r '" + file.string() + "'");
  BOOST_TEST_CONTEXT("h5ls -r " << file.string() << "\n" << ls.output) {
    BOOST_TEST(ls.exit_code == 0);
    for (const char* name : {"/units/h.0/param", "/units/h.1/exp_avg ", "/units/root/index", "/units/root/exp_avg_sq"})
      BOOST_TEST(ls.output.find(name) != std::string::npos, "h5ls lists " << name);
  }

  Outcome dump = run_command("h5dump -A '" + file.string() + "'");
  BOOST_TEST_CONTEXT("h5dump -A " << file.string() << "\n" << dump.output) {
    BOOST_TEST(dump.exit_code == 0);
    for (const char* attr : {"step", "strategy", "model_config", "checksum", "seed", "epoch_step"})
      BOOST_TEST(dump.output.find(std::string("ATTRIBUTE \"") + attr + "\"") != std::string::npos,
                 "h5dump shows attribute " << attr);
    BOOST_TEST(dump.output.find("DATASET \"exp_avg_sq\"") != std::string::npos);
    // Values read as text: the strategy and the model config JSON.
    BOOST_TEST(dump.output.find("\"FULL_SHARD\"") != std::string::npos);
    BOOST_TEST(dump.output.find("\"model_type\":\"bloom\"") != std::string::npos);
  }
}

// The exported model is the model: transformers 5.17 loaded an export of this exact run (2 steps of
// the demo on one rank, fp32) with no missing or unexpected keys, and recorded its loss on fixed
// inputs (tests/fixtures/hf/check_export.py, run on the GPU machine's PyTorch). shardlm's BLOOM on
// the weights read back from the exported safetensors must give the same loss.
// Per-step train losses of a run, from its metrics.jsonl.
std::vector<double> train_losses(const fs::path& run_dir) {
  std::ifstream metrics(run_dir / "metrics.jsonl");
  std::vector<double> losses;
  std::string line;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "train") losses.push_back(j.at("loss"));
  }
  return losses;
}

BOOST_AUTO_TEST_CASE(training_starts_from_a_model_directory) {
  // A demo run's checkpoint exported as a Hugging Face model directory...
  fs::path dir = scratch("cli_model_dir");
  fs::remove_all(dir);
  Outcome run = run_shardlm(1, "train " + kDemo + " --train.max_steps=30 --train.log_every=1 --data.eval_file= --run.dir=" +
                                   (dir / "a").string());
  BOOST_TEST_INFO(run.output);
  BOOST_TEST_REQUIRE(run.exit_code == 0);
  Outcome exported = run_shardlm(1, "export " + (dir / "a" / "checkpoints").string() + " " + (dir / "hf").string());
  BOOST_TEST_REQUIRE(exported.exit_code == 0);

  // ...pointed at from the command line by a deck with shape keys: config.json decides, and the run says
  // which of the deck's keys it did not use.
  Outcome both = run_shardlm(1, "train " + kDemo + " --model.dir=" + (dir / "hf").string() +
                                    " --train.max_steps=1 --data.eval_file= --run.dir=" + (dir / "from_cli").string());
  BOOST_TEST_INFO(both.output);
  BOOST_TEST(both.exit_code == 0);
  BOOST_TEST(both.output.find("model.dir from the command line: its config.json gives the model's shape; the deck's "
                              "model.arch, model.vocab_size, model.hidden_size, model.num_layers, model.num_heads, "
                              "model.layer_norm_eps are not used") != std::string::npos);
  BOOST_TEST(both.output.find("loaded weights from " + (dir / "hf").string()) != std::string::npos);

  // The demo deck without its [model] section, starting from the exported weights on 2 ranks.
  std::ifstream demo(kDemo);
  std::ostringstream deck;
  std::string line;
  bool in_model = false;
  while (std::getline(demo, line)) {
    if (!line.empty() && line[0] == '[') in_model = line.rfind("[model]", 0) == 0;
    if (!in_model) deck << line << "\n";
  }
  std::string text = deck.str();
  text = "[model]\ndir = " + (dir / "hf").string() + "\n" + text;
  // Data paths of the demo deck are relative to its folder.
  const std::string data_dir = fs::path(kDemo).parent_path().string() + "/data/";
  for (size_t at = 0; (at = text.find("= data/demo_squad", at)) != std::string::npos; at += data_dir.size())
    text.replace(at + 2, 5, data_dir);
  std::ofstream(dir / "from_hf.ini") << text;
  // data.tokenizer = auto: the export's own tokenizer.json (the byte tokenizer's, as transformers reads it).
  Outcome from_hf = run_shardlm(2, "train " + (dir / "from_hf.ini").string() +
                                       " --train.max_steps=3 --train.log_every=1 --data.eval_file= --data.tokenizer=auto"
                                       " --run.dir=" + (dir / "b").string());
  BOOST_TEST_INFO(from_hf.output);
  BOOST_TEST_REQUIRE(from_hf.exit_code == 0);
  BOOST_TEST(from_hf.output.find("loaded weights from " + (dir / "hf").string()) != std::string::npos);
  // The trained weights start far below a fresh model's loss (about ln 259 = 5.56).
  const std::vector<double> trained = train_losses(dir / "a"), resumed = train_losses(dir / "b");
  BOOST_TEST_REQUIRE(trained.size() == 30u);
  BOOST_TEST_REQUIRE(resumed.size() == 3u);
  BOOST_TEST(trained.front() > 5.0);
  BOOST_TEST(resumed.front() < trained.front() - 1.0, resumed.front() << " vs fresh " << trained.front());
  BOOST_TEST(std::fabs(resumed.front() - trained.back()) < 1.0, resumed.front() << " vs " << trained.back());

  // Its export copies the source folder's tokenizer files and generation config as they are, and
  // takes the token ids from its config.json.
  Outcome again = run_shardlm(1, "export " + (dir / "b" / "checkpoints").string() + " " + (dir / "hf_b").string());
  BOOST_TEST_REQUIRE(again.exit_code == 0, again.output);
  auto bytes_of = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
    BOOST_TEST(!bytes_of(dir / "hf" / file).empty(), file);
    BOOST_TEST(bytes_of(dir / "hf_b" / file) == bytes_of(dir / "hf" / file), file);
  }
  const nlohmann::json config_b = nlohmann::json::parse(bytes_of(dir / "hf_b" / "config.json"));
  BOOST_TEST(config_b.at("eos_token_id") == 257);
  BOOST_TEST(config_b.at("pad_token_id") == 258);
  // Elsewhere, without the source folder: an error naming it and the flag that helps.
  const std::string moved = (dir / "hf_moved").string();
  fs::rename(dir / "hf", moved);
  Outcome lost = run_shardlm(1, "export " + (dir / "b" / "checkpoints").string() + " " + (dir / "hf_c").string());
  BOOST_TEST(lost.exit_code != 0);
  BOOST_TEST(lost.output.find("--model-dir DIR") != std::string::npos, lost.output);
  Outcome found = run_shardlm(1, "export " + (dir / "b" / "checkpoints").string() + " " + (dir / "hf_c").string() +
                                     " --model-dir " + moved);
  BOOST_TEST(found.exit_code == 0, found.output);
  BOOST_TEST(bytes_of(dir / "hf_c" / "tokenizer.json") == bytes_of(fs::path(moved) / "tokenizer.json"));
  fs::rename(moved, dir / "hf");

  // LoRA on the same model folder: the base frozen, RUN_DIR/adapter at the end; a plain export of its
  // checkpoint is refused, --adapter writes the same folder, --merge the base with W + s B A. An
  // adapter.partial left by an attempt stopped while writing the adapter does not block it.
  fs::create_directories(dir / "lora" / "adapter.partial");
  Outcome lora = run_shardlm(2, "train " + (dir / "from_hf.ini").string() +
                                    " --lora.r=4 --lora.alpha=16 --lora.target_modules=all-linear --train.lr=3e-2"
                                    " --train.max_steps=3 --data.eval_file= --data.tokenizer=auto --run.dir=" +
                                    (dir / "lora").string());
  BOOST_TEST_INFO(lora.output);
  BOOST_TEST_REQUIRE(lora.exit_code == 0);
  BOOST_TEST(contains(lora.output, "loaded the frozen base weights from " + (dir / "hf").string()));
  BOOST_TEST(contains(lora.output, "adapter written to " + (dir / "lora" / "adapter").string()));
  BOOST_TEST(!fs::exists(dir / "lora" / "adapter.partial"));
  const std::string lora_ckpt = (dir / "lora" / "checkpoints").string();
  Outcome plain = run_shardlm(1, "export " + lora_ckpt + " " + (dir / "never").string());
  BOOST_TEST(plain.exit_code != 0);
  BOOST_TEST(contains(plain.output, "holds LoRA adapters: pass --adapter"), plain.output);
  Outcome as_adapter = run_shardlm(1, "export " + lora_ckpt + " " + (dir / "lora_adapter").string() + " --adapter");
  BOOST_TEST_REQUIRE(as_adapter.exit_code == 0, as_adapter.output);
  BOOST_TEST(bytes_of(dir / "lora_adapter" / "adapter_model.safetensors") ==
             bytes_of(dir / "lora" / "adapter" / "adapter_model.safetensors"));
  // The adapters go as trained: a dtype or a shard size is refused, not ignored.
  for (const char* option : {" --dtype bf16", " --max-shard-size 1MB"})
    expect_failure(1, "export " + lora_ckpt + " " + (dir / "never").string() + " --adapter" + option,
                   "--dtype and --max-shard-size apply to a whole or merged model");
  Outcome merged = run_shardlm(1, "export " + lora_ckpt + " " + (dir / "lora_merged").string() + " --merge");
  BOOST_TEST_REQUIRE(merged.exit_code == 0, merged.output);
  std::map<std::string, std::vector<float>> base_w, merged_w;
  for (auto& e : shardlm::read_safetensors((dir / "hf" / "model.safetensors").string())) base_w[e.name] = e.data;
  for (auto& e : shardlm::read_safetensors((dir / "lora_merged" / "model.safetensors").string())) merged_w[e.name] = e.data;
  BOOST_TEST_REQUIRE(merged_w.size() == base_w.size());
  for (const auto& [name, w] : base_w) {
    const bool adapted = contains(name, "query_key_value.weight") || contains(name, "dense.weight") ||
                         contains(name, "dense_h_to_4h.weight") || contains(name, "dense_4h_to_h.weight");
    BOOST_TEST((merged_w.at(name) != w) == adapted, name);  // the adapted weights moved, nothing else
  }
  // A base of the same shape but other weights (hf_c: run b trained further) is not the one the adapters
  // were trained on: the checkpoint's base checksum refuses it, as resume and generate do.
  expect_failure(1, "export " + lora_ckpt + " " + (dir / "never").string() + " --merge --model-dir " + (dir / "hf_c").string(),
                 "were trained on other base weights (checksum ");
  BOOST_TEST(!fs::exists(dir / "never"));
  // The adapter names its base folder: the run's model.dir (absolute), or --model-dir's once checked as
  // --merge checks it (a folder moved elsewhere is named; another model's weights or no model are refused).
  const auto base_named = [&](const fs::path& adapter) {
    return nlohmann::json::parse(bytes_of(adapter / "adapter_config.json")).at("base_model_name_or_path");
  };
  BOOST_TEST(base_named(dir / "lora_adapter") == fs::absolute(dir / "hf").lexically_normal().string());
  const std::string base_moved = (dir / "hf_base_moved").string();
  fs::rename(dir / "hf", base_moved);
  Outcome named = run_shardlm(1, "export " + lora_ckpt + " " + (dir / "lora_adapter_moved").string() +
                                     " --adapter --model-dir " + base_moved);
  BOOST_TEST_REQUIRE(named.exit_code == 0, named.output);
  BOOST_TEST(contains(named.output, "(PEFT adapter of " + base_moved + ")"), named.output);
  BOOST_TEST(base_named(dir / "lora_adapter_moved") == base_moved);
  fs::rename(base_moved, dir / "hf");
  expect_failure(1, "export " + lora_ckpt + " " + (dir / "never").string() + " --adapter --model-dir " + (dir / "hf_c").string(),
                 "export --adapter --model-dir: the adapters of ");
  expect_failure(1, "export " + lora_ckpt + " " + (dir / "never").string() + " --adapter --model-dir " + (dir / "a").string(),
                 "model directory " + (dir / "a").string());
  BOOST_TEST(!fs::exists(dir / "never"));

  // lora.modules_to_save: the final LayerNorm trained whole, starting from the folder's; the adapter
  // holds it under PEFT's names and --merge writes the trained one where the base's was.
  Outcome saved = run_shardlm(2, "train " + (dir / "from_hf.ini").string() +
                                     " --lora.r=4 --lora.target_modules=dense --lora.modules_to_save=transformer.ln_f"
                                     " --train.lr=3e-2 --train.max_steps=3 --data.eval_file= --data.tokenizer=auto"
                                     " --run.dir=" + (dir / "lora_saved").string());
  BOOST_TEST_INFO(saved.output);
  BOOST_TEST_REQUIRE(saved.exit_code == 0);
  BOOST_TEST(contains(saved.output, "loaded the modules trained whole (ln_f) from " + (dir / "hf").string()));
  std::map<std::string, std::vector<float>> adapter_w;
  for (auto& e : shardlm::read_safetensors((dir / "lora_saved" / "adapter" / "adapter_model.safetensors").string()))
    adapter_w[e.name] = e.data;
  BOOST_TEST_REQUIRE(adapter_w.count("base_model.model.transformer.ln_f.weight") == 1u);
  BOOST_TEST_REQUIRE(adapter_w.count("base_model.model.transformer.ln_f.bias") == 1u);
  Outcome merged_saved = run_shardlm(1, "export " + (dir / "lora_saved" / "checkpoints").string() + " " +
                                            (dir / "saved_merged").string() + " --merge");
  BOOST_TEST_REQUIRE(merged_saved.exit_code == 0, merged_saved.output);
  std::map<std::string, std::vector<float>> saved_w;
  for (auto& e : shardlm::read_safetensors((dir / "saved_merged" / "model.safetensors").string())) saved_w[e.name] = e.data;
  BOOST_TEST_REQUIRE(saved_w.size() == base_w.size());
  for (const auto& [name, w] : base_w) {
    const bool ln_f = contains(name, "ln_f.");
    BOOST_TEST((saved_w.at(name) != w) == (ln_f || contains(name, ".dense.weight")), name);
    if (ln_f) BOOST_TEST((saved_w.at(name) == adapter_w.at("base_model.model." + name)), name);
  }
  // The base with the adapter (its saved ln_f in place of the base's) computes the merged export's
  // logits (export_logits, the tool that tests/fixtures/peft/check_lora_export.py compares with PEFT's).
  std::ofstream(dir / "ids.json") << "[72, 101, 108, 108, 111, 32, 1, 2, 200, 250]";
  // export_logits MODEL ids.json OUT [ADAPTER], and the logits it wrote.
  const auto logits_of = [&](const fs::path& model, const std::string& out, const std::string& adapter) {
    Outcome o = run_command(SHARDLM_BINARY_DIR "/bin/export_logits " + model.string() + " " +
                            (dir / "ids.json").string() + " " + (dir / out).string() + " " + adapter);
    BOOST_TEST_REQUIRE(o.exit_code == 0, o.output);
    return nlohmann::json::parse(bytes_of(dir / out)).at("logits").get<std::vector<std::vector<float>>>();
  };
  const std::vector<std::vector<float>> a = logits_of(dir / "hf", "adapter_logits.json",
                                                      (dir / "lora_saved" / "adapter").string()),
                                        m = logits_of(dir / "saved_merged", "merged_logits.json", "");
  BOOST_TEST_REQUIRE(a.size() == 10u);
  BOOST_TEST_REQUIRE(m.size() == a.size());
  double scale = 0, diff = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t v = 0; v < a[t].size(); ++v) {
      scale = std::max(scale, static_cast<double>(std::fabs(a[t][v])));
      diff = std::max(diff, static_cast<double>(std::fabs(a[t][v] - m[t][v])));
    }
  BOOST_TEST(diff <= 1e-5 * scale, "adapter vs merged logits: " << diff << " of " << scale);

  // A tokenizer larger than the model's vocabulary is refused before training.
  Outcome too_big = run_shardlm(1, "train " + (dir / "from_hf.ini").string() + " --data.tokenizer=" SHARDLM_SOURCE_DIR
                                   "/tests/fixtures/tokenizer/gpt2/tokenizer.json --run.dir=" + (dir / "c").string());
  BOOST_TEST(too_big.exit_code != 0);
  BOOST_TEST(too_big.output.find("more than the model's vocab_size 259") != std::string::npos, too_big.output);
}

// Trains the demo for 2 steps (extra overrides select the model), exports the checkpoint, and
// checks that shardlm's loss on the inputs transformers was given equals the loss transformers
// computed on the same export (tests/fixtures/hf/check_export.py on the GPU machine, recorded in
// `fixture`), with no missing or unexpected keys when transformers loaded it.
void expect_transformers_loss(const std::string& name, const std::string& overrides, const std::string& fixture) {
  fs::path dir = scratch(name);
  fs::remove_all(dir);
  Outcome run = run_shardlm(1, "train " + kDemo + " --train.max_steps=2 --data.eval_file= --run.dir=" + dir.string() +
                                   overrides);
  BOOST_TEST_INFO(run.output);
  BOOST_TEST_REQUIRE(run.exit_code == 0);
  Outcome exported = run_shardlm(1, "export " + (dir / "checkpoints").string() + " " + (dir / "hf").string());
  BOOST_TEST_REQUIRE(exported.exit_code == 0);

  std::ifstream in(SHARDLM_SOURCE_DIR "/tests/fixtures/hf/" + fixture);
  const nlohmann::json ref = nlohmann::json::parse(in);
  BOOST_TEST(ref.at("missing_keys").empty());
  BOOST_TEST(ref.at("unexpected_keys").empty());

  // The export is a model directory: read it back as a run would.
  shardlm::HfModelDir model_dir((dir / "hf").string());
  const shardlm::ModelConfig& cfg = model_dir.config();
  BOOST_TEST(cfg.hidden_size == ref["config"]["hidden_size"].get<int>());
  std::vector<std::vector<float>> flat;
  for (size_t u = 0; u < model_dir.layout().size(); ++u) {
    std::vector<float> f(model_dir.layout()[u].numel);
    model_dir.read_unit_slice(u, 0, f.size(), f.data());
    flat.push_back(std::move(f));
  }

  // transformers' causal-LM loss: position t predicts labels[t + 1]; -100 takes no loss.
  const auto ids = ref.at("input_ids").get<std::vector<std::vector<int>>>();
  const auto labels = ref.at("labels").get<std::vector<std::vector<int>>>();
  const int B = static_cast<int>(ids.size()), T = static_cast<int>(ids[0].size());
  std::vector<int32_t> tokens, targets;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      tokens.push_back(ids[b][t]);
      const int next = t + 1 < T ? labels[b][t + 1] : -100;
      targets.push_back(next == -100 ? -1 : next);
    }
  std::unique_ptr<shardlm::CpuModel> model = shardlm::make_cpu_model(cfg, B, T);
  std::vector<float> h[2] = {std::vector<float>(static_cast<size_t>(B) * T * cfg.hidden_size),
                             std::vector<float>(static_cast<size_t>(B) * T * cfg.hidden_size)};
  model->embed_forward(flat[0].data(), tokens.data(), B, T, h[0].data());
  for (int l = 0; l < cfg.num_layers; ++l)
    model->block_forward(l, flat[1 + l].data(), h[l % 2].data(), h[1 - l % 2].data(), B, T);
  int64_t count = 0;
  const double sum = model->head_loss(flat[0].data(), h[cfg.num_layers % 2].data(), targets.data(), B, T, &count, 0.0f,
                                      nullptr, nullptr);
  const double want = ref.at("transformers_loss").get<double>();
  BOOST_TEST(sum / static_cast<double>(count) == want, boost::test_tools::tolerance(1e-5));
}

BOOST_AUTO_TEST_CASE(exported_weights_give_the_transformers_loss) {
  expect_transformers_loss("cli_hf_parity", "", "demo_step2_transformers.json");
}

BOOST_AUTO_TEST_CASE(exported_llama_weights_give_the_transformers_loss) {
  expect_transformers_loss("cli_hf_parity_llama",
                           " --model.arch=llama --model.num_kv_heads=2 --model.intermediate_size=256",
                           "demo_llama_step2_transformers.json");
}

// data.format = chess trains from the shipped games (JSON lines for training, text for eval).
// export_logits (what check_export_tokenizer.py and check_lora_export.py compare with transformers and PEFT)
// gives the logits transformers recorded for each family's tiny model, every position of one forward: for
// Phi-3 the 16 positions are past LongRoPE's original context of 8, so all of them rotate with the long
// factors (a prefix of 8 or fewer would take the short ones).
BOOST_AUTO_TEST_CASE(export_logits_gives_the_recorded_transformers_logits) {
  const fs::path dir = scratch("export_logits_reference");
  for (const std::string family : {"bloom", "llama", "qwen2", "qwen3", "mistral", "gemma3", "phi3"}) {
    BOOST_TEST_CONTEXT(family) {
      const std::string fixtures = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/";
      std::map<std::string, shardlm::SafetensorsEntry> ref;
      for (auto& e : shardlm::read_safetensors(fixtures + "tiny_" + family + "_reference.safetensors"))
        ref[e.name] = std::move(e);
      const shardlm::SafetensorsEntry& ids = ref.at("input_ids");
      const shardlm::SafetensorsEntry& want = ref.at("logits");
      const size_t T = static_cast<size_t>(ids.shape.at(1)), V = static_cast<size_t>(want.shape.at(2));
      std::vector<int> first(T);
      for (size_t t = 0; t < T; ++t) first[t] = static_cast<int>(ids.data[t]);
      std::ofstream(dir / "ids.json") << nlohmann::json(first).dump();
      const fs::path out = dir / (family + ".json");
      Outcome o = run_command(SHARDLM_BINARY_DIR "/bin/export_logits " + fixtures + "tiny_" + family + " " +
                              (dir / "ids.json").string() + " " + out.string());
      BOOST_TEST_REQUIRE(o.exit_code == 0, o.output);
      std::ifstream in(out);
      const auto got = nlohmann::json::parse(in).at("logits").get<std::vector<std::vector<float>>>();
      BOOST_TEST_REQUIRE(got.size() == T);
      double scale = 1, diff = 0;
      for (size_t t = 0; t < T; ++t)
        for (size_t v = 0; v < V; ++v) {
          scale = std::max(scale, static_cast<double>(std::fabs(want.data[t * V + v])));
          diff = std::max(diff, static_cast<double>(std::fabs(got[t][v] - want.data[t * V + v])));
        }
      BOOST_TEST(diff <= 1e-5 * scale, "largest difference " << diff << " of " << scale);
    }
  }
}

BOOST_AUTO_TEST_CASE(chess_games_train) {
  fs::path dir = scratch("cli_chess");
  Outcome o = run_shardlm(2, "train " + kDemo + " --data.format=chess --data.train_file=" SHARDLM_SOURCE_DIR
                                 "/input/data/demo_chess_train.jsonl --data.eval_file=" SHARDLM_SOURCE_DIR
                                 "/input/data/demo_chess_eval.txt --train.epochs=2 --run.dir=" + dir.string());
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  BOOST_TEST(o.output.find("data: 28 train / 6 eval examples") != std::string::npos);
  BOOST_TEST(o.output.find("optimizer: AdamW on the host (") != std::string::npos);  // path and threads
  BOOST_TEST(count_of(o.output, "eval  epoch") == 2u);
}

namespace {

// Each line of a CSV text split at commas (the report quotes no field of these runs).
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream fields(line);
    while (std::getline(fields, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    rows.push_back(cells);
  }
  return rows;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const std::string kShardlm = SHARDLM_BINARY_DIR "/bin/shardlm";

}  // namespace

BOOST_AUTO_TEST_CASE(report_compares_runs_of_two_world_sizes) {
  const fs::path root = scratch("cli_report");
  const std::string common = " --train.epochs=2 --train.log_every=2";
  Outcome one = run_shardlm(1, "train " + kDemo + common + " --run.dir=" + (root / "one_rank").string());
  BOOST_TEST_INFO(one.output);
  BOOST_TEST_REQUIRE(one.exit_code == 0);
  Outcome two = run_shardlm(2, "train " + kDemo + common + " --fsdp.strategy=SHARD_GRAD_OP --run.dir=" +
                                   (root / "two_ranks").string());
  BOOST_TEST_INFO(two.output);
  BOOST_TEST_REQUIRE(two.exit_code == 0);

  // Run directly, without mpirun: report needs no MPI.
  const fs::path csv = root / "runs.csv", plots = root / "plots";
  Outcome rep = run_command(kShardlm + " report " + (root / "two_ranks").string() + " " +
                            (root / "one_rank").string() + " --csv " + csv.string() + " --svg=" + plots.string());
  BOOST_TEST_INFO(rep.output);
  BOOST_TEST_REQUIRE(rep.exit_code == 0);
  BOOST_TEST(rep.output.find("| run | backend | strategy |") != std::string::npos);
  BOOST_TEST(rep.output.find("| two_ranks | cpu | SHARD_GRAD_OP | fp32 | 2 | 1 |") != std::string::npos);
  BOOST_TEST(rep.output.find("| one_rank | cpu | FULL_SHARD | fp32 | 1 | 1 |") != std::string::npos);
  BOOST_TEST(rep.output.find("against one_rank (1 rank(s))") != std::string::npos);  // the smallest run is the base

  // The CSV: a header and one row per run, in the order given; the base run's speed-up is 1 and
  // the other's equals the ratio of the summaries' samples/s.
  const auto rows = parse_csv(read_text(csv));
  BOOST_TEST_REQUIRE(rows.size() == 3u);
  const std::vector<std::string>& header = rows[0];
  auto column = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    BOOST_TEST_REQUIRE((it != header.end()), "CSV column " << name);
    return static_cast<size_t>(it - header.begin());
  };
  for (size_t r = 1; r < rows.size(); ++r) BOOST_TEST(rows[r].size() == header.size());
  BOOST_TEST(rows[1][column("run")] == "two_ranks");
  BOOST_TEST(rows[2][column("run")] == "one_rank");
  BOOST_TEST(rows[1][column("ranks")] == "2");
  BOOST_TEST(std::stod(rows[2][column("speedup")]) == 1.0);
  auto summary_sps = [&](const fs::path& run) {
    std::ifstream in(run / "metrics.jsonl");
    double sps = 0;
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.at("type") == "summary") sps = j.at("train_samples_per_second");
    }
    return sps;
  };
  const double want = summary_sps(root / "two_ranks") / summary_sps(root / "one_rank");
  BOOST_TEST(std::stod(rows[1][column("speedup")]) == want, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(std::stod(rows[1][column("efficiency")]) == want / 2, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(std::stod(rows[1][column("eval_loss_2")]) > 0.0);
  BOOST_TEST(std::stod(rows[2][column("peak_memory_bytes")]) > 0.0);

  // The plots: well-formed SVG, one polyline per run for the losses; the scaling plot has both
  // strategies and the dashed ideal line.
  const std::string loss = read_text(plots / "loss.svg");
  BOOST_TEST(loss.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0u);
  BOOST_TEST(loss.find("</svg>") == loss.size() - 7);
  BOOST_TEST(count_of(loss, "<polyline") == 2u);
  BOOST_TEST(count_of(loss, "<title>one_rank</title>") == 1u);
  const std::string scaling = read_text(plots / "scaling.svg");
  BOOST_TEST(scaling.rfind("<svg", 0) == 0u);
  BOOST_TEST(count_of(scaling, "<polyline") == 3u);  // ideal + one per strategy
  BOOST_TEST(count_of(scaling, "stroke-dasharray") >= 1u);
  // Tags open and close in balance (no stray '<' from a run name).
  BOOST_TEST(count_of(loss, "<") == count_of(loss, ">"));
}

BOOST_AUTO_TEST_CASE(report_names_a_missing_or_garbled_run_dir) {
  Outcome missing = run_command(kShardlm + " report /nonexistent/run");
  BOOST_TEST(missing.exit_code == 1);
  BOOST_TEST(missing.output.find("shardlm: error: report: '/nonexistent/run' is not a directory") != std::string::npos,
             missing.output);

  const fs::path dir = scratch("cli_report_garbled");
  Outcome not_a_run = run_command(kShardlm + " report " + dir.string());
  BOOST_TEST(not_a_run.exit_code == 1);
  BOOST_TEST(not_a_run.output.find("deck.resolved.ini: cannot open") != std::string::npos, not_a_run.output);

  std::ofstream(dir / "deck.resolved.ini") << "[run]\nbackend = cpu\n";
  std::ofstream(dir / "metrics.jsonl") << "{\"type\":\"setup\",\"world_size\":1,\"num_nodes\":1,\"strategy\":\"NO_SHARD\"}\n"
                                       << "{\"type\":\"train\",\"step\":1,\"loss\":\n";
  // A torn line (a crash mid-write) is named with its line number and skipped; the run is reported.
  Outcome garbled = run_command(kShardlm + " report " + dir.string());
  BOOST_TEST(garbled.exit_code == 0);
  BOOST_TEST(garbled.output.find("shardlm: report: warning: " + (dir / "metrics.jsonl").string() + ":2: skipped") !=
                 std::string::npos, garbled.output);
  BOOST_TEST(garbled.output.find("| cli_report_garbled | cpu | NO_SHARD |") != std::string::npos, garbled.output);

  std::ofstream(dir / "metrics.jsonl") << "{\"type\":\"train\",\"step\":1,\"loss\":2.5}\n";
  Outcome no_setup = run_command(kShardlm + " report " + dir.string());
  BOOST_TEST(no_setup.exit_code == 1);
  BOOST_TEST(no_setup.output.find("no 'setup' record") != std::string::npos, no_setup.output);

  Outcome usage = run_command(kShardlm + " report");
  BOOST_TEST(usage.exit_code == 2);
  BOOST_TEST(usage.output.find("usage: shardlm report") != std::string::npos);
}

// ---- shardlm eval ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(eval_prints_the_official_scripts_line) {
  const std::string dir = SHARDLM_SOURCE_DIR "/tests/fixtures/squad_unicode";
  std::ifstream in(dir + "/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  // Run directly: eval needs no MPI.
  Outcome o = run_command(kShardlm + " eval --predictions " + dir + "/predictions.json " + dir + "/dev.json");
  BOOST_TEST(o.exit_code == 0, o.output);
  BOOST_TEST(o.output.find(expected["official_output"].get<std::string>() + "\n") != std::string::npos, o.output);
  BOOST_TEST(o.output.find("Unanswered question unanswered will receive score 0.") != std::string::npos, o.output);
  Outcome missing = run_command(kShardlm + " eval --predictions /nonexistent.json " + dir + "/dev.json");
  BOOST_TEST(missing.exit_code == 1);
  BOOST_TEST(missing.output.find("/nonexistent.json") != std::string::npos, missing.output);
  Outcome usage = run_command(kShardlm + " eval " + dir + "/dev.json");
  BOOST_TEST(usage.exit_code == 2);
  BOOST_TEST(usage.output.find("--predictions FILE is required") != std::string::npos, usage.output);
}

// ---- help --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(every_command_has_help_printed_once) {
  // Each command's --help and -h under mpirun on 2 ranks: its usage, its flags and its docs, once,
  // exit 0; also after other arguments, and as `shardlm help COMMAND`.
  const std::pair<std::string, std::string> commands[] = {
      {"train", "--section.key=value"}, {"inspect", "CHECKPOINT"}, {"export", "CHECKPOINT DIR"},
      {"report", "--csv FILE"},         {"plan", "--gpu-memory=SIZE"}, {"comm-test", "--max-bytes=N"},
      {"import-accelerate", "--training-args FILE"},
      {"eval", "--predictions FILE"},   {"generate", "--prompt-file FILE"}};
  for (const auto& [command, flag] : commands)
    for (const std::string& ask :
         {command + " --help", command + " -h", "help " + command, command + " " + kDemo + " --help"}) {
      Outcome o = run_shardlm(2, ask);
      BOOST_TEST_CONTEXT("shardlm " << ask << "\n" << o.output) {
        BOOST_TEST(o.exit_code == 0);
        BOOST_TEST(count_of(o.output, "usage:") == 1u);
        BOOST_TEST(count_of(o.output, " shardlm " + command + " ") == 1u);
        BOOST_TEST(count_of(o.output, flag) >= 1u);
        BOOST_TEST(count_of(o.output, "-h, --help") == 1u);
        BOOST_TEST(count_of(o.output, "\ndocs, in /") == 1u);  // where the docs are, and which page says what
        BOOST_TEST(count_of(o.output, ".md ") >= 1u);
      }
    }
  Outcome top = run_shardlm(2, "--help");
  BOOST_TEST(top.exit_code == 0);
  BOOST_TEST(count_of(top.output, "usage: mpirun -np N shardlm COMMAND") == 1u, top.output);
  Outcome none = run_shardlm(2, "");
  BOOST_TEST(none.exit_code != 0);
  BOOST_TEST(count_of(none.output, "usage: mpirun -np N shardlm COMMAND") == 1u, none.output);
  Outcome unknown = run_shardlm(2, "trian --help");
  BOOST_TEST(unknown.exit_code != 0);
  BOOST_TEST(count_of(unknown.output, "unknown command 'trian'") == 1u, unknown.output);
}

BOOST_AUTO_TEST_CASE(usage_errors_say_what_is_missing_with_the_commands_usage) {
  // Under mpirun: once, what is wrong and the command's own usage (not the top-level help).
  const std::pair<std::string, std::string> cases[] = {
      {"train", "no deck given"},
      {"train --train.epochs=1", "the first argument must be the deck, not the option '--train.epochs=1'"},
      {"inspect", "no checkpoint given"},
      {"inspect a.h5 b.h5", "expected one checkpoint, got 2 arguments"},
      {"inspect --verify a.h5 --verify", "--verify given twice"},
      {"inspect a.h5 --deep", "unknown option '--deep'"},
      {"export ckpt.h5 --dtype bf16", "no output folder given"},
      {"comm-test --bogus", "--bogus"},
      {"report --csv runs.csv", "no run folder given: RUN_DIR"},
      {"plan --ranks=2", "the first argument must be the deck"},
      {"generate --prompt hi", "the first argument must be the model, not the option '--prompt'"}};
  for (const auto& [args, problem] : cases) {
    const std::string command = args.substr(0, args.find(' '));
    // report and plan run without MPI, on each rank they are started on: one rank for them.
    Outcome o = run_shardlm(command == "report" || command == "plan" ? 1 : 2, args);
    BOOST_TEST_CONTEXT("shardlm " << args << "\n" << o.output) {
      BOOST_TEST(o.exit_code != 0);
      BOOST_TEST(count_of(o.output, "shardlm " + command + ": ") == 1u);
      BOOST_TEST(count_of(o.output, problem) >= 1u);
      BOOST_TEST(count_of(o.output, "usage: ") >= 1u);
      BOOST_TEST(count_of(o.output, " shardlm " + command + " ") >= 1u);
      BOOST_TEST(count_of(o.output, "usage: mpirun -np N shardlm COMMAND") == 0u);
    }
  }
}

// ---- shardlm import-accelerate ---------------------------------------------------------------

#ifdef SHARDLM_HAVE_YAMLCPP
BOOST_AUTO_TEST_CASE(import_accelerate_writes_a_deck_and_says_its_warnings) {
  const fs::path dir = scratch("import_accelerate");
  const std::string examples = SHARDLM_SOURCE_DIR "/input/accelerate/";
  const std::string deck = (dir / "course.ini").string();
  Outcome o = run_shardlm(1, "import-accelerate " + examples + "course-fsdp-4gpu.yaml --training-args " + examples +
                                 "squad-training-args.json -o " + deck + " --model.dir=m --data.train_file=t --data.eval_file=e");
  BOOST_TEST(o.exit_code == 0, o.output);
  BOOST_TEST(count_of(o.output, "wrote " + deck + " (1 warning); run it on 4 ranks") == 1u, o.output);
  BOOST_TEST(count_of(o.output, "shardlm: warning: ") == 1u, o.output);
  BOOST_TEST(fs::exists(deck));
  BOOST_TEST(!fs::exists(deck + ".tmp"));
  Outcome missing = run_shardlm(1, "import-accelerate " + examples + "course-fsdp-4gpu.yaml");
  BOOST_TEST(missing.exit_code == 2);
  BOOST_TEST(count_of(missing.output, "-o DECK is missing") == 1u, missing.output);
  Outcome bad = run_shardlm(1, "import-accelerate " + (dir / "nowhere.yaml").string() + " -o " + deck);
  BOOST_TEST(bad.exit_code == 1);
  BOOST_TEST(count_of(bad.output, "shardlm: error: cannot open Accelerate config") == 1u, bad.output);
  // Deck keys as `--section.key value` too, as train, plan, preprocess and generate take them: the same deck but for
  // its first line (the command line as given).
  const std::string spaced = (dir / "spaced.ini").string();
  Outcome space = run_shardlm(1, "import-accelerate " + examples + "course-fsdp-4gpu.yaml --training-args " + examples +
                                     "squad-training-args.json -o " + spaced + " --model.dir m --data.train_file t --data.eval_file=e");
  BOOST_TEST(space.exit_code == 0, space.output);
  const auto body = [](const std::string& path) {
    const std::string text = read_text_file(path);
    return text.substr(text.find('\n'));
  };
  BOOST_TEST(body(spaced) == body(deck));
  Outcome last = run_shardlm(1, "import-accelerate " + examples + "course-fsdp-4gpu.yaml -o " + spaced + " --model.dir");
  BOOST_TEST(last.exit_code == 2);
  BOOST_TEST(count_of(last.output, "model.dir needs a value on the command line (write --model.dir=VALUE)") == 1u, last.output);
}
#endif

// ---- shardlm comm-test ----------------------------------------------------------------------

namespace {

struct CommTable {
  int group_size = 0;
  int group_count = 0;
  std::vector<nlohmann::json> rows;
  int summaries = 0;
};

// The sizes comm-test must report for a sweep 8 B .. max by x2 in fp32: nccl-tests' convention,
// whole fp32 elements per rank for all_gather and reduce_scatter, rows with none left out.
std::vector<size_t> expected_sizes(const std::string& collective, int ranks, size_t max_bytes) {
  std::vector<size_t> sizes;
  for (size_t nominal = 8; nominal <= max_bytes; nominal *= 2) {
    const bool per_rank = collective == "all_gather" || collective == "reduce_scatter";
    const size_t unit = per_rank ? 4 * static_cast<size_t>(ranks) : 4;
    if (nominal / unit > 0) sizes.push_back(nominal / unit * unit);
  }
  return sizes;
}

// nccl-tests' bus-bandwidth factor, written out again here to check the output against.
double expected_bus_factor(const std::string& collective, int n) {
  if (collective == "all_reduce") return 2.0 * (n - 1) / n;
  if (collective == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

// A wrong option is a usage error ("shardlm comm-test: ..." and the usage, before MPI starts); what
// only the run finds is "shardlm: error: ...". Either way one message.
void expect_comm_test_failure(int np, const std::string& args, const std::string& must_contain) {
  Outcome o = run_shardlm(np, "comm-test " + args);
  BOOST_TEST_CONTEXT("np " << np << ": shardlm comm-test " << args << "\n" << o.output) {
    BOOST_TEST(o.exit_code != 0);
    BOOST_TEST(count_of(o.output, "shardlm: error:") + count_of(o.output, "shardlm comm-test: ") == 1u);
    BOOST_TEST(count_of(o.output, must_contain) >= 1u);
    BOOST_TEST(o.seconds < 30.0);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(comm_test_measures_every_collective_and_group) {
  const size_t max_bytes = 64 * 1024;
  // ranks, --dist.ranks_per_node, and the groups that must be measured (name -> size, count).
  struct Case {
    int np;
    int ranks_per_node;
    std::map<std::string, std::pair<int, int>> groups;
  };
  const Case cases[] = {{1, 0, {{"world", {1, 1}}}},
                        {2, 0, {{"world", {2, 1}}}},  // one host: intra is the world, inter single ranks
                        {4, 2, {{"world", {4, 1}}, {"intra", {2, 2}}, {"inter", {2, 2}}}}};
  for (const Case& c : cases) {
    fs::path dir = scratch("cli_comm_test_np" + std::to_string(c.np) + "_k" + std::to_string(c.ranks_per_node));
    const std::string args = "comm-test -b 8 -e 64K -n 3 -w 1 --run.dir=" + dir.string() +
                             (c.ranks_per_node ? " --dist.ranks_per_node=" + std::to_string(c.ranks_per_node) : "");
    Outcome o = run_shardlm(c.np, args);
    BOOST_TEST_CONTEXT("np " << c.np << ": shardlm " << args << "\n" << o.output) {
      BOOST_TEST_REQUIRE(o.exit_code == 0);
      // nccl-tests' table: column heads, one average per table, the wrong-values verdict.
      const size_t tables = c.groups.size() * 4;
      BOOST_TEST(count_of(o.output, "#wrong") == tables);
      BOOST_TEST(count_of(o.output, "# Avg bus bandwidth    :") == tables);
      BOOST_TEST(o.output.find("# Wrong values         : 0 OK") != std::string::npos);
      for (const char* call : {"MPI_Allgather", "MPI_Reduce_scatter_block", "MPI_Allreduce", "MPI_Bcast"})
        BOOST_TEST(count_of(o.output, call) == c.groups.size());

      // The JSON lines: one row per size, then a summary, per (group, collective).
      std::ifstream in(dir / "comm_test.jsonl");
      BOOST_TEST_REQUIRE(in.good());
      std::map<std::string, CommTable> seen;
      int setups = 0;
      std::string line;
      while (std::getline(in, line)) {
        const nlohmann::json j = nlohmann::json::parse(line);
        const std::string type = j.at("type");
        if (type == "comm_test_setup") {
          ++setups;
          BOOST_TEST(j.at("world_size").get<int>() == c.np);
          continue;
        }
        if (type == "comm_test_skipped") continue;
        const std::string key = j.at("group").get<std::string>() + " " + j.at("collective").get<std::string>();
        CommTable& t = seen[key];
        t.group_size = j.at("group_size");
        t.group_count = j.at("group_count");
        if (type == "comm_test_summary") {
          ++t.summaries;
          double mean = 0;
          for (const auto& r : t.rows) mean += r.at("busbw_gbps").get<double>();
          mean /= static_cast<double>(t.rows.size());
          BOOST_TEST(j.at("avg_busbw_gbps").get<double>() == mean, boost::test_tools::tolerance(1e-12));
          BOOST_TEST(j.at("wrong").get<int>() == 0);
        } else {
          BOOST_TEST(type == "comm_test");
          t.rows.push_back(j);
        }
      }
      BOOST_TEST(setups == 1);
      BOOST_TEST(seen.size() == tables);
      for (const auto& [group, shape] : c.groups)
        for (const std::string collective : {"all_gather", "reduce_scatter", "all_reduce", "broadcast"}) {
          const std::string key = group + " " + collective;
          BOOST_TEST_CONTEXT(key) {
            BOOST_TEST_REQUIRE(seen.count(key) == 1u);
            const CommTable& t = seen[key];
            BOOST_TEST(t.group_size == shape.first);
            BOOST_TEST(t.group_count == shape.second);
            BOOST_TEST(t.summaries == 1);
            std::vector<size_t> sizes;
            for (const auto& r : t.rows) {
              sizes.push_back(r.at("size_bytes"));
              BOOST_TEST(r.at("count").get<size_t>() * 4 == r.at("size_bytes").get<size_t>());
              BOOST_TEST(r.at("wrong").get<int>() == 0);
              BOOST_TEST(r.at("dtype") == "fp32");
              BOOST_TEST(r.at("time_us").get<double>() > 0.0);
              const double algbw = r.at("algbw_gbps"), time_us = r.at("time_us");
              BOOST_TEST(algbw == r.at("size_bytes").get<double>() / (time_us * 1e3), boost::test_tools::tolerance(1e-9));
              BOOST_TEST(r.at("busbw_gbps").get<double>() == algbw * expected_bus_factor(collective, t.group_size),
                         boost::test_tools::tolerance(1e-9));
              // The table shows the same row: its size and count open a line of the output.
              char head[64];
              std::snprintf(head, sizeof head, "  %10zu  %12zu  ", r.at("size_bytes").get<size_t>(),
                            r.at("count").get<size_t>());
              BOOST_TEST(o.output.find(head) != std::string::npos, "table row for " << head);
            }
            BOOST_TEST(sizes == expected_sizes(collective, t.group_size, max_bytes), boost::test_tools::per_element());
          }
        }
    }
  }
}

BOOST_AUTO_TEST_CASE(comm_test_options_and_output_file) {
  // --ops, --groups, --dtype, a factor and an explicit output file.
  fs::path dir = scratch("cli_comm_test_options");
  const fs::path out = dir / "sub" / "bench.jsonl";
  Outcome o = run_shardlm(2, "comm-test --ops=all_reduce,broadcast --groups=world -d bf16 -b 16 -e 4K -f 4 -n 2 -w 0 -o " +
                                 out.string());
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  BOOST_TEST(count_of(o.output, "#wrong") == 2u);
  BOOST_TEST(o.output.find("bfloat16") != std::string::npos);
  std::ifstream in(out);
  std::vector<size_t> sizes;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") == "comm_test" && j.at("collective") == "all_reduce") {
      sizes.push_back(j.at("size_bytes"));
      BOOST_TEST(j.at("count").get<size_t>() * 2 == j.at("size_bytes").get<size_t>());
    }
  }
  BOOST_TEST(sizes == (std::vector<size_t>{16, 64, 256, 1024, 4096}), boost::test_tools::per_element());

  Outcome help = run_shardlm(1, "comm-test --help");
  BOOST_TEST(help.exit_code == 0);
  BOOST_TEST(help.output.find("--max-bytes") != std::string::npos);
  BOOST_TEST(help.output.find("--dist.timeout=S") != std::string::npos);
  Outcome usage = run_shardlm(1, "--help");
  BOOST_TEST(usage.output.find("comm-test") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(comm_test_bad_options_fail_with_the_option) {
  // A file where the output's folder should be: unwritable even for root.
  const fs::path blocker = scratch("cli_comm_test_bad") / "a-file";
  std::ofstream(blocker) << "x";
  const std::string unwritable = (blocker / "comm.jsonl").string();
  // The arguments and what the error must say, on 1 and on 4 ranks.
  const std::pair<std::string, std::string> bad_options[] = {
      {"--bogus", "unrecognised option '--bogus'"},
      {"world", "unexpected argument 'world'"},
      {"--ops=alltoall", "unknown collective 'alltoall'"},
      {"--groups=rack", "unknown group 'rack'"},
      {"--max-bytes=12X", "--max-bytes=12X: expected a byte count"},
      {"-b 1M -e 1K", "--min-bytes=1048576 is larger than --max-bytes=1024"},
      {"--step-factor=1", "--step-factor=1"},
      {"--iters=0", "--iters=0"},
      {"--dtype=int8", "--dtype=int8"},
      {"--backend=tpu", "--backend=tpu"},
      {"--dist.timeout=0", "--dist.timeout=0: must be > 0"},
      // An explicit size the memory cannot hold is refused before anything is allocated.
      {"-b 1G -e 4096G", "lower --max-bytes"},
      {"-o " + unwritable + " -e 64", unwritable},
  };
  for (int np : {1, 4})
    for (const auto& [args, must_contain] : bad_options) expect_comm_test_failure(np, args, must_contain);
  expect_comm_test_failure(2, "--groups=inter", "nothing to measure on 2 rank(s); inter: groups of 1 rank");
  expect_comm_test_failure(4, "--dist.ranks_per_node=3", "dist.ranks_per_node = 3 does not divide the world size 4");
#ifndef SHARDLM_HAVE_CUDA
  expect_comm_test_failure(2, "--backend=cuda", "built without the CUDA backend");
#endif
}

// A run folder belongs to one job: a second job is refused while the first holds the lock; a stale
// lock of a dead process on this host is broken; a fresh run into a folder holding a run is
// refused unless it resumes or run.overwrite = true, which says what it replaces.
BOOST_AUTO_TEST_CASE(a_run_folder_belongs_to_one_job) {
  const fs::path dir = scratch("cli_run_folder");
  const std::string train = "train " + kDemo + " --data.eval_file= --run.dir=" + dir.string();
  Outcome first = run_shardlm(1, train + " --train.max_steps=2");
  BOOST_TEST_REQUIRE(first.exit_code == 0, first.output);
  BOOST_TEST(!fs::exists(dir / "lock"));  // removed when the run ends

  expect_failure(1, train + " --train.max_steps=2", "already holds a run (metrics.jsonl, 1 checkpoint(s) in");
  Outcome replaced = run_shardlm(1, train + " --train.max_steps=2 --run.overwrite=true");
  BOOST_TEST(replaced.exit_code == 0, replaced.output);
  BOOST_TEST(count_of(replaced.output, "run.overwrite = true: replaced the earlier run in") == 1u, replaced.output);
  // The permission is not kept: the resolved deck, run again as it is, is refused like any fresh run.
  expect_failure(1, "train " + (dir / "deck.resolved.ini").string(), "already holds a run (metrics.jsonl");

  // A live job's lock (this test process, on this host) refuses a second job, naming its owner.
  {
    std::ofstream(dir / "lock") << "host=" << host_name_for_test() << "\npid=" << ::getpid()
                                << "\nslurm_job_id=\nstarted=2026-01-01T00:00:00Z\n";
  }
  expect_failure(1, train + " --train.max_steps=2 --checkpoint.resume=auto", "is in use by another job (host ");
  BOOST_TEST(fs::exists(dir / "lock"));
  // A lock whose process has ended is broken with a warning.
  {
    std::ofstream(dir / "lock") << "host=" << host_name_for_test() << "\npid=999999999\nslurm_job_id=\nstarted=x\n";
  }
  Outcome resumed = run_shardlm(1, train + " --checkpoint.resume=auto --train.max_steps=3");
  BOOST_TEST(resumed.exit_code == 0, resumed.output);
  BOOST_TEST(count_of(resumed.output, "breaking the stale lock") == 1u, resumed.output);
  BOOST_TEST(!fs::exists(dir / "lock"));

  // A lock from another host is broken only by a later attempt of the same (requeued) Slurm job.
  auto slurm_attempt = [&](int restart_count) {
    {
      std::ofstream(dir / "lock") << "host=another-node\npid=1\nslurm_job_id=4242\nslurm_restart_count=0\n";
    }
    Outcome o;
    o.exit_code = run_shell(std::string("timeout 120 " SHARDLM_MPIEXEC " -np 1 " SHARDLM_MPIEXEC_FLAGS
                                        " -x SLURM_JOB_ID=4242 -x SLURM_RESTART_COUNT=") +
                                std::to_string(restart_count) + " " SHARDLM_BINARY_DIR "/bin/shardlm " + train +
                                " --train.max_steps=3 --checkpoint.resume=auto 2>&1",
                            o.output);
    return o;
  };
  Outcome same_attempt = slurm_attempt(0);  // could be another step of the same job, still running
  BOOST_TEST(same_attempt.exit_code != 0, same_attempt.output);
  BOOST_TEST(count_of(same_attempt.output, "is in use by another job (host another-node, PID 1, Slurm job 4242") == 1u,
             same_attempt.output);
  Outcome requeued = slurm_attempt(1);
  BOOST_TEST(requeued.exit_code == 0, requeued.output);
  BOOST_TEST(count_of(requeued.output, "breaking the stale lock") == 1u, requeued.output);
  BOOST_TEST(!fs::exists(dir / "lock"));
}

namespace {

// Every entry under ROOT (relative path -> bytes; "<dir>" for a folder, "-> target" for a link).
std::map<std::string, std::string> tree_of(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = fs::relative(it->path(), root).string();
    if (it->is_symlink()) {
      out[rel] = "-> " + fs::read_symlink(it->path()).string();
    } else if (it->is_directory()) {
      out[rel] = "<dir>";
    } else {
      std::ifstream in(it->path(), std::ios::binary);
      out[rel] = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
  }
  return out;
}

}  // namespace

// run.overwrite = true touches nothing of the earlier run before the new one has passed every check
// a run makes before its first step (the backend, the tokenizer against the vocabulary, the data):
// a failed start leaves it byte-identical. A start that succeeds removes it after its first step.
BOOST_AUTO_TEST_CASE(an_overwrite_that_fails_to_start_leaves_the_earlier_run_as_it_was) {
  const fs::path dir = scratch("cli_overwrite");
  const std::string train = "train " + kDemo + " --data.eval_file= --run.dir=" + (dir / "run").string();
  Outcome first = run_shardlm(1, train + " --train.max_steps=2 --run.trace_step=1");
  BOOST_TEST_REQUIRE(first.exit_code == 0, first.output);
  { std::ofstream(dir / "run" / "run_id") << "the earlier run\n"; }
  { std::ofstream(dir / "run" / "notes.txt") << "the user's\n"; }
  { std::ofstream(dir / "bad.json") << "{\"version\": \"1.1\", \"data\": 7}"; }
  const auto before = tree_of(dir / "run");
  BOOST_TEST_REQUIRE(before.count("checkpoints/ckpt-00000002.h5") == 1u);
  BOOST_TEST_REQUIRE(before.count("trace_step1_rank0.json") == 1u);
  std::vector<std::pair<std::string, std::string>> failures = {
      {" --model.vocab_size=100", "model.vocab_size = 100"},
      {" --data.train_file=" + (dir / "bad.json").string(), "bad.json"}};
#ifndef SHARDLM_HAVE_CUDA
  failures.push_back({" --run.backend=cuda", "CUDA"});
#endif
  for (const auto& [bad, message] : failures) {
    BOOST_TEST_CONTEXT(bad) {
      Outcome o = run_shardlm(1, train + " --train.max_steps=2 --run.overwrite=true" + bad);
      BOOST_TEST(o.exit_code != 0, o.output);
      BOOST_TEST(count_of(o.output, message) >= 1u, o.output);
      BOOST_TEST(count_of(o.output, "replaced the earlier run") == 0u, o.output);
      BOOST_TEST((tree_of(dir / "run") == before));
    }
  }

  // A start that fails after the earlier run was set aside (its step-2 timeline cannot be written
  // where a folder of that name stands) puts it back as it was.
  fs::create_directories(dir / "run" / "trace_step2_rank0.json");
  const auto with_folder = tree_of(dir / "run");
  Outcome late = run_shardlm(1, train + " --train.max_steps=3 --run.trace_step=2 --run.overwrite=true");
  BOOST_TEST(late.exit_code != 0, late.output);
  BOOST_TEST(count_of(late.output, "is set aside in .replaced-run") == 1u, late.output);
  BOOST_TEST(count_of(late.output, "the earlier run in " + (dir / "run").string() + " is back as it was") == 1u,
             late.output);
  BOOST_TEST((tree_of(dir / "run") == with_folder));
  fs::remove(dir / "run" / "trace_step2_rank0.json");

  Outcome replaced = run_shardlm(1, train + " --train.max_steps=3 --checkpoint.every=0 --run.overwrite=true");
  BOOST_TEST_REQUIRE(replaced.exit_code == 0, replaced.output);
  BOOST_TEST(count_of(replaced.output, "is set aside in .replaced-run until this run's first logged step") == 1u,
             replaced.output);
  BOOST_TEST(count_of(replaced.output, "run.overwrite = true: replaced the earlier run in") == 1u, replaced.output);
  // The first logged step comes before the line that says the earlier run is gone.
  BOOST_TEST(replaced.output.find("step 3/3") < replaced.output.find("replaced the earlier run"), replaced.output);
  const auto after = tree_of(dir / "run");
  for (const char* gone : {"trace_step1_rank0.json", "checkpoints/ckpt-00000002.h5", ".replaced-run",
                           "checkpoints/.replaced-run"})
    BOOST_TEST(after.count(gone) == 0u, gone);
  // The new run has an identity of its own; the earlier one's went with it.
  BOOST_TEST_REQUIRE(after.count("run_id") == 1u);
  BOOST_TEST(after.at("run_id") != "the earlier run\n");
  BOOST_TEST(after.at("notes.txt") == "the user's\n");
  BOOST_TEST(after.count("checkpoints/ckpt-00000003.h5") == 1u);
  BOOST_TEST(count_of(after.at("metrics.jsonl"), "\"type\":\"setup\"") == 1u, after.at("metrics.jsonl"));
}

// Two jobs with their own run.dir but one checkpoint.dir: the second is refused, naming the lock
// in the checkpoint folder and its owner (here this test process, standing in for a live job).
BOOST_AUTO_TEST_CASE(two_runs_sharing_a_checkpoint_dir_are_refused) {
  const fs::path dir = scratch("cli_shared_checkpoints");
  const std::string shared = " --checkpoint.dir=" + (dir / "ckpt").string();
  const std::string train = "train " + kDemo + " --data.eval_file= --train.max_steps=2" + shared;
  Outcome first = run_shardlm(1, train + " --run.dir=" + (dir / "a").string());
  BOOST_TEST_REQUIRE(first.exit_code == 0, first.output);
  BOOST_TEST(!fs::exists(dir / "ckpt" / "lock"));  // given back at the end
  {
    std::ofstream(dir / "ckpt" / "lock") << "host=" << host_name_for_test() << "\npid=" << ::getpid()
                                         << "\nslurm_job_id=77\nstarted=2026-01-01T00:00:00Z\n";
  }
  const auto before = tree_of(dir / "ckpt");
  expect_failure(1, train + " --run.dir=" + (dir / "b").string() + " --checkpoint.resume=auto",
                 "checkpoint.dir = '" + (dir / "ckpt").string() + "' is in use by another job (host " +
                     host_name_for_test());
  Outcome second = run_shardlm(1, train + " --run.dir=" + (dir / "b").string() + " --checkpoint.resume=auto");
  BOOST_TEST(count_of(second.output, "Slurm job 77") == 1u, second.output);
  BOOST_TEST(count_of(second.output, (dir / "ckpt" / "lock").string()) >= 1u, second.output);
  BOOST_TEST((tree_of(dir / "ckpt") == before));
  BOOST_TEST(!fs::exists(dir / "b" / "lock"));
}

// export into a folder that holds files: refused without --overwrite; with it, only the export's
// own files are replaced. A leftover DIR.partial and a DIR that is a symbolic link are refused and
// left as they are.
// The checkpoint keeps the hash of the tokenizer it trained with; an export that would copy another
// (the file changed since) refuses, as resume does, instead of shipping ids that do not match the weights.
BOOST_AUTO_TEST_CASE(export_refuses_a_tokenizer_that_changed_since_training) {
  const fs::path dir = scratch("export_tokenizer");
  const fs::path tok = dir / "tok" / "tokenizer.json";
  fs::create_directories(tok.parent_path());
  for (const auto& [name, text] : shardlm::ByteTokenizer::hf_files(256)) std::ofstream(tok.parent_path() / name) << text;
  Outcome o = run_shardlm(1, "train " + kDemo + " --train.max_steps=2 --checkpoint.every=2 --data.tokenizer=" +
                                 tok.string() + " --run.dir=" + (dir / "run").string());
  BOOST_TEST_REQUIRE(o.exit_code == 0, o.output);
  Outcome same = run_shardlm(1, "export " + (dir / "run").string() + " " + (dir / "hf").string());
  BOOST_TEST(same.exit_code == 0, same.output);
  std::ofstream(tok, std::ios::app) << "\n";
  Outcome changed = run_shardlm(1, "export " + (dir / "run").string() + " " + (dir / "hf2").string());
  BOOST_TEST(changed.exit_code != 0);
  BOOST_TEST(changed.output.find("is not the tokenizer the run trained with") != std::string::npos, changed.output);
  BOOST_TEST(!fs::exists(dir / "hf2"));
}

// Samples cut before any of their trained tokens (chat turns past data.max_length) are said at start:
// they would train nothing, and a step of only such samples logs loss 0.
BOOST_AUTO_TEST_CASE(samples_without_a_target_are_warned_about) {
  const fs::path dir = scratch("cli_no_target");
  Outcome o = run_shardlm(1, "train " + kDemo + " --data.format=chat --data.train_file=" SHARDLM_SOURCE_DIR
                                 "/input/data/demo_chat.jsonl --data.eval_file= --data.max_length=64 --data.chat_template="
                                 SHARDLM_SOURCE_DIR "/tests/fixtures/chat/templates/qwen2.5-instruct.jinja"
                                 " --train.batch_size=1 --train.micro_batch_size=1 --train.max_steps=1 --run.dir=" +
                                 dir.string());
  BOOST_TEST(o.exit_code == 0, o.output);
  BOOST_TEST(contains(o.output, "demo_chat.jsonl: 3 of 3 samples have no token that takes the loss"), o.output);
  Outcome fits = run_shardlm(1, "train " + kDemo + " --data.eval_file= --train.max_steps=1 --run.dir=" +
                                    (dir / "squad").string());
  BOOST_TEST(!contains(fits.output, "no token that takes the loss"), fits.output);
}

// Early stopping ends the run at an evaluation: that one is the last, so eval.generate = end answers there.
BOOST_AUTO_TEST_CASE(early_stopping_still_generates_the_final_answers) {
  const fs::path dir = scratch("cli_early_stopping");
  Outcome o = run_shardlm(1, "train " + kDemo + " --train.epochs=5 --train.early_stopping_patience=1"
                                 " --train.early_stopping_threshold=100 --data.train_size=16 --data.eval_size=4"
                                 " --eval.max_new_tokens=4 --run.dir=" + dir.string());
  BOOST_TEST_REQUIRE(o.exit_code == 0, o.output);
  BOOST_TEST(contains(o.output, "early stopping at step"), o.output);
  BOOST_TEST(count_of(o.output, "| EM ") == 1u, o.output);  // at the stopping evaluation only
  BOOST_TEST(fs::exists(dir / "predictions.json"));
}

// A resume under another seed or subset continues the epoch in another order: said at start.
BOOST_AUTO_TEST_CASE(a_resume_on_other_data_settings_is_warned_about) {
  const fs::path dir = scratch("cli_resume_data");
  const std::string train = "train " + kDemo + " --data.eval_file= --checkpoint.every=1 --run.dir=" + dir.string();
  BOOST_TEST_REQUIRE(run_shardlm(1, train + " --train.max_steps=2").exit_code == 0);
  Outcome same = run_shardlm(1, train + " --train.max_steps=3 --checkpoint.resume=auto");
  BOOST_TEST(same.exit_code == 0, same.output);
  BOOST_TEST(!contains(same.output, "was trained on other data settings"), same.output);
  Outcome other = run_shardlm(1, train + " --train.max_steps=4 --checkpoint.resume=auto --train.seed=7 --data.train_size=40");
  BOOST_TEST(other.exit_code == 0, other.output);
  BOOST_TEST(contains(other.output, "was trained on other data settings (train.seed 42 -> 7; data.train_size 0 -> 40)"),
             other.output);
}

// The same settings over a training file changed since (edited in place): said at start from the
// examples' hash the checkpoint keeps, which the unchanged file matches.
BOOST_AUTO_TEST_CASE(a_resume_on_a_changed_training_file_is_warned_about) {
  const fs::path dir = scratch("cli_resume_changed_data");
  const fs::path data = dir / "train.json";
  fs::create_directories(dir);
  std::string text = read_text_file(SHARDLM_SOURCE_DIR "/input/data/demo_squad_train.json");
  { std::ofstream(data) << text; }
  const std::string train = "train " + kDemo + " --data.eval_file= --checkpoint.every=1 --data.train_file=" +
                            data.string() + " --run.dir=" + (dir / "run").string();
  BOOST_TEST_REQUIRE(run_shardlm(1, train + " --train.max_steps=2").exit_code == 0);
  Outcome same = run_shardlm(1, train + " --train.max_steps=3 --checkpoint.resume=auto");
  BOOST_TEST(same.exit_code == 0, same.output);
  BOOST_TEST(!contains(same.output, "was trained on other"), same.output);
  // Every " the " becomes " a ": as many examples, other tokens.
  for (size_t at = text.find(" the "); at != std::string::npos; at = text.find(" the ", at)) text.replace(at, 5, " a ");
  { std::ofstream(data) << text; }
  Outcome changed = run_shardlm(1, train + " --train.max_steps=4 --checkpoint.resume=auto");
  BOOST_TEST(changed.exit_code == 0, changed.output);
  BOOST_TEST(contains(changed.output, "was trained on other examples than " + data.string() + " gives now"),
             changed.output);
  BOOST_TEST(!contains(changed.output, "other data settings"), changed.output);
}

// RUN/adapter.partial holding something other than an adapter write's files is not removed: the run's
// adapter write refuses it, naming it, and the file stays.
BOOST_AUTO_TEST_CASE(an_adapter_partial_with_other_files_is_kept) {
  const fs::path dir = scratch("cli_adapter_partial");
  fs::create_directories(dir / "adapter.partial");
  { std::ofstream(dir / "adapter.partial" / "notes.txt") << "mine\n"; }
  Outcome o = run_shardlm(1, "train " + kDemo + " --data.eval_file= --train.max_steps=1 --lora.r=2 --lora.alpha=4"
                                 " --lora.target_modules=all-linear --run.dir=" + dir.string());
  BOOST_TEST(o.exit_code != 0);
  BOOST_TEST(contains(o.output, (dir / "adapter.partial").string() + " exists"), o.output);
  BOOST_TEST(fs::exists(dir / "adapter.partial" / "notes.txt"));
}

BOOST_AUTO_TEST_CASE(export_never_touches_what_it_did_not_write) {
  const fs::path dir = scratch("cli_export_safety");
  const std::string train = "train " + kDemo + " --data.eval_file= --train.max_steps=1 --run.dir=" + (dir / "run").string();
  Outcome trained = run_shardlm(1, train);
  BOOST_TEST_REQUIRE(trained.exit_code == 0, trained.output);
  const std::string ckpt = (dir / "run" / "checkpoints").string();
  fs::create_directories(dir / "out" / "mine");
  { std::ofstream(dir / "out" / "mine" / "model.safetensors") << "the user's\n"; }
  { std::ofstream(dir / "out" / "config.json") << "{\"the user's\": 1}\n"; }
  { std::ofstream(dir / "out" / "model-00001-of-00009.safetensors.txt") << "notes\n"; }
  const auto before = tree_of(dir / "out");
  const std::string out = (dir / "out").string();
  expect_failure(1, "export " + ckpt + " " + out, out + " is not empty: pass --overwrite");
  BOOST_TEST((tree_of(dir / "out") == before));
  expect_failure(1, "export " + ckpt + " " + out + " --adapter", "is not empty: pass --overwrite");
  BOOST_TEST((tree_of(dir / "out") == before));

  Outcome replaced = run_shardlm(1, "export " + ckpt + " " + out + " --overwrite --max-shard-size 500KB");
  BOOST_TEST_REQUIRE(replaced.exit_code == 0, replaced.output);
  auto after = tree_of(dir / "out");
  BOOST_TEST(after.at("mine/model.safetensors") == "the user's\n");
  BOOST_TEST(after.at("model-00001-of-00009.safetensors.txt") == "notes\n");
  BOOST_TEST(after.at("config.json") != before.at("config.json"));  // a file the export writes: replaced
  BOOST_TEST(after.count("model.safetensors.index.json") == 1u);
  // Again as one file: the shards and index of the earlier export go, nothing else.
  Outcome single = run_shardlm(1, "export " + ckpt + " " + out + " --overwrite");
  BOOST_TEST_REQUIRE(single.exit_code == 0, single.output);
  after = tree_of(dir / "out");
  BOOST_TEST(after.count("model.safetensors.index.json") == 0u);
  BOOST_TEST(after.count("model.safetensors") == 1u);
  for (const auto& entry : after)
    BOOST_TEST((entry.first.find("-of-0000") == std::string::npos || entry.first.find(".txt") != std::string::npos),
               entry.first);
  BOOST_TEST(after.at("mine/model.safetensors") == "the user's\n");
  BOOST_TEST(!fs::exists(out + ".partial"));

  // Weights shardlm did not write, in the other layout (a sharded model where this export writes one file):
  // kept, they would sit beside the new weights and a loader would take one of the two. Refused, untouched.
  fs::create_directories(dir / "theirs");
  { std::ofstream(dir / "theirs" / "model.safetensors.index.json") << "{\"weight_map\": {}}\n"; }
  { std::ofstream(dir / "theirs" / "model-00001-of-00002.safetensors") << "theirs\n"; }
  expect_failure(1, "export " + ckpt + " " + (dir / "theirs").string() + " --overwrite",
                 "theirs/model.safetensors.index.json holds weights shardlm did not write");
  BOOST_TEST(tree_of(dir / "theirs").size() == 2u);
  BOOST_TEST(!fs::exists(dir / "theirs" / "model.safetensors"));

  // A leftover DIR.partial: an error naming it, kept as it was.
  fs::create_directories(dir / "new.partial");
  { std::ofstream(dir / "new.partial" / "x") << "x"; }
  expect_failure(1, "export " + ckpt + " " + (dir / "new").string() + " --overwrite",
                 (dir / "new.partial").string() + " exists");
  BOOST_TEST(tree_of(dir / "new.partial").at("x") == "x");
  BOOST_TEST(!fs::exists(dir / "new"));

  // A symbolic link to another scratch folder: refused, never followed.
  fs::create_directories(dir / "target");
  { std::ofstream(dir / "target" / "keep") << "kept\n"; }
  fs::create_directory_symlink(dir / "target", dir / "link");
  for (const std::string flags : {"", " --overwrite", " --overwrite --adapter", " --overwrite --merge"}) {
    Outcome o = run_shardlm(1, "export " + ckpt + " " + (dir / "link").string() + flags);
    BOOST_TEST(o.exit_code != 0, o.output);
    BOOST_TEST(count_of(o.output, (dir / "link").string() + " is a symbolic link") == 1u, o.output);
    BOOST_TEST((tree_of(dir / "target") == std::map<std::string, std::string>{{"keep", "kept\n"}}));
    BOOST_TEST(fs::is_symlink(dir / "link"));
  }
}

// Output folders are checked before step 1; a partial last line of metrics.jsonl is cut off when a
// run resumes; the final checkpoint is written before the last evaluation.
BOOST_AUTO_TEST_CASE(outputs_are_checked_at_start_and_metrics_stay_whole) {
  const fs::path dir = scratch("cli_outputs");
  { std::ofstream(dir / "a_file") << "x"; }
  expect_failure(1, "train " + kDemo + " --run.dir=" + (dir / "run").string() + " --checkpoint.dir=" +
                        (dir / "a_file").string(), "checkpoint.dir = '");
  BOOST_TEST(!fs::exists(dir / "run" / "metrics.jsonl"));

  const std::string train = "train " + kDemo + " --data.eval_size=2 --eval.max_new_tokens=2 --run.dir=" +
                            (dir / "run").string();
  Outcome first = run_shardlm(1, train + " --train.max_steps=2");
  BOOST_TEST_REQUIRE(first.exit_code == 0, first.output);
  // The step-2 checkpoint line comes before the evaluation's line.
  BOOST_TEST(first.output.find("checkpoint step 2:") < first.output.find("eval_loss"), first.output);
  { std::ofstream(dir / "run" / "metrics.jsonl", std::ios::app) << R"({"type":"train","loss":1.)"; }
  Outcome resumed = run_shardlm(1, train + " --checkpoint.resume=auto --train.max_steps=3");
  BOOST_TEST(resumed.exit_code == 0, resumed.output);
  BOOST_TEST(count_of(resumed.output, "ended in a partial record") == 1u, resumed.output);
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  std::string line;
  size_t lines = 0;
  while (std::getline(metrics, line)) {
    ++lines;
    BOOST_CHECK_NO_THROW(nlohmann::json::parse(line));
  }
  BOOST_TEST(lines > 3u);
}

namespace {

// Step -> loss of the train records of a run (the last record of a step wins: a resumed run's).
std::map<long, double> losses_by_step(const fs::path& run_dir) {
  std::ifstream metrics(run_dir / "metrics.jsonl");
  std::map<long, double> out;
  std::string line;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "train") out[j.at("step").get<long>()] = j.at("loss").get<double>();
  }
  return out;
}

// Flips one bit of the data of dataset `where` in an HDF5 file (past the metadata, where only the
// checksum can see it).
void flip_data_bit(const fs::path& file, const std::string& where) {
  BOOST_REQUIRE(ckpt_edit::flip_dataset_bytes(file.string(), where, 101, 1, 0x10));
}

std::string first_line_of(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

// resume = auto skips a truncated or bit-flipped newest checkpoint with a warning naming it and
// resumes from the one before; the losses after it equal the uninterrupted run's. A missing latest
// pointer resumes from the newest checkpoint instead of starting afresh.
BOOST_AUTO_TEST_CASE(resume_skips_a_damaged_newest_checkpoint) {
  const fs::path dir = scratch("cli_damaged_resume");
  const std::string common = "train " + kDemo + " --train.log_every=1 --data.eval_file= "
                             "--checkpoint.every=2 --checkpoint.keep_last=0 --run.dir=" + dir.string();
  const std::string train = common + " --train.max_steps=4";
  Outcome first = run_shardlm(2, train);
  BOOST_TEST_REQUIRE(first.exit_code == 0, first.output);
  const std::map<long, double> uninterrupted = losses_by_step(dir);
  BOOST_TEST_REQUIRE(uninterrupted.size() == 4u);
  const fs::path newest = dir / "checkpoints" / "ckpt-00000004.h5";

  auto resume_from_two = [&](const std::string& why) {
    Outcome o = run_shardlm(2, train + " --checkpoint.resume=auto");
    BOOST_TEST_CONTEXT(why << "\n" << o.output) {
      BOOST_TEST(o.exit_code == 0);
      BOOST_TEST(count_of(o.output, "warning: skipping a damaged checkpoint: ") == 1u);
      BOOST_TEST(count_of(o.output, "ckpt-00000004.h5") >= 1u);
      BOOST_TEST(count_of(o.output, "resumed from " + (dir / "checkpoints" / "ckpt-00000002.h5").string()) == 1u);
      const std::map<long, double> resumed = losses_by_step(dir);
      for (long step : {3L, 4L}) BOOST_TEST(resumed.at(step) == uninterrupted.at(step), "step " << step);
    }
  };
  fs::resize_file(newest, fs::file_size(newest) / 2);
  resume_from_two("truncated");
  flip_data_bit(newest, "/units/h.1/param");  // the resumed run wrote step 4 again
  resume_from_two("bit-flipped");
  Outcome intact = run_shardlm(1, "inspect --verify " + newest.string());  // the resumed run's step 4
  BOOST_TEST(intact.exit_code == 0, intact.output);
  BOOST_TEST(count_of(intact.output, ": intact (9 datasets") == 1u, intact.output);
  flip_data_bit(newest, "/units/h.0/exp_avg_sq");
  Outcome verify = run_shardlm(1, "inspect --verify " + newest.string());
  BOOST_TEST(verify.exit_code != 0, verify.output);
  BOOST_TEST(count_of(verify.output, "checksum mismatch") >= 1u, verify.output);
  Outcome after = run_shardlm(1, "inspect " + newest.string() + " --verify");  // the option after the path too
  BOOST_TEST(after.exit_code == verify.exit_code, after.output);
  BOOST_TEST(count_of(after.output, "checksum mismatch") >= 1u, after.output);

  // No latest pointer: the newest checkpoint, with a warning, not a fresh start.
  fs::remove(dir / "checkpoints" / "latest");
  flip_data_bit(newest, "/units/h.0/exp_avg_sq");  // back to intact
  Outcome o = run_shardlm(2, common + " --checkpoint.resume=auto --train.max_steps=5");
  BOOST_TEST(o.exit_code == 0, o.output);
  BOOST_TEST(count_of(o.output, "has no 'latest' pointer") == 1u, o.output);
  BOOST_TEST(count_of(o.output, "resumed from " + newest.string()) == 1u, o.output);
}

// A newest checkpoint whose param and exp_avg were swapped (each still matches its own checksum)
// or that another run wrote into this run's checkpoint folder: inspect --verify says so and exits
// 1, resume = auto skips it with a warning naming the file (and both run ids) and resumes from the
// one before; the run keeps its run_id, which each checkpoint carries.
BOOST_AUTO_TEST_CASE(resume_skips_a_swapped_or_foreign_newest_checkpoint) {
  const fs::path dir = scratch("cli_swapped_resume"), other = scratch("cli_swapped_other");
  const std::string common = "train " + kDemo + " --data.eval_file= --checkpoint.every=2 --checkpoint.keep_last=0"
                             " --checkpoint.at_end=false --run.dir=";
  Outcome first = run_shardlm(2, common + dir.string() + " --train.max_steps=4");
  BOOST_TEST_REQUIRE(first.exit_code == 0, first.output);
  const std::string id = first_line_of(dir / "run_id");
  BOOST_TEST(id.size() == 32u, id);
  const fs::path newest = dir / "checkpoints" / "ckpt-00000004.h5", pristine = dir / "pristine.h5";
  fs::copy_file(newest, pristine);
  BOOST_TEST_REQUIRE(ckpt_edit::swap_datasets(newest.string(), "/units/h.0/param", "/units/h.0/exp_avg"));
  Outcome verify = run_shardlm(1, "inspect --verify " + newest.string());
  BOOST_TEST(verify.exit_code == 1, verify.output);
  BOOST_TEST(count_of(verify.output, newest.string() + " is damaged: its attributes, tensor index or vectors' "
                                     "checksums are not those its contents_checksum was computed over") == 1u,
             verify.output);
  const std::string resume = common + dir.string() + " --checkpoint.resume=auto --train.max_steps=5";
  auto resumes_from_two = [&](const std::string& warning) {
    Outcome o = run_shardlm(2, resume);
    BOOST_TEST(o.exit_code == 0, o.output);
    BOOST_TEST(count_of(o.output, warning) == 1u, o.output);
    BOOST_TEST(count_of(o.output, "resumed from " + (dir / "checkpoints" / "ckpt-00000002.h5").string()) == 1u,
               o.output);
  };
  resumes_from_two("warning: skipping a damaged checkpoint: checkpoint " + newest.string() + " is damaged: ");

  Outcome b = run_shardlm(2, common + other.string() + " --train.max_steps=4");
  BOOST_TEST_REQUIRE(b.exit_code == 0, b.output);
  const std::string other_id = first_line_of(other / "run_id");
  fs::copy_file(other / "checkpoints" / "ckpt-00000004.h5", newest, fs::copy_options::overwrite_existing);
  resumes_from_two(shardlm::concat("warning: skipping a checkpoint: checkpoint ", newest.string(),
                          " belongs to another run: its run id is ", other_id, ", this run's is ", id, " (",
                          (dir / "run_id").string(), ")"));
  BOOST_TEST(first_line_of(dir / "run_id") == id);
}

// A full disk under the run's other outputs (/dev/full answers every write with ENOSPC): metrics
// (rank 0's own file) and predictions (agreed by every rank) end the job with one error naming the
// file and the cause, on 1 and 2 ranks; the final checkpoint, written before the evaluation, stays.
BOOST_AUTO_TEST_CASE(outputs_on_a_full_disk_end_the_job_with_the_cause) {
  if (!fs::exists("/dev/full")) return;  // Linux has it
  for (int np : {1, 2}) {
    const fs::path dir = scratch("cli_full_disk_np" + std::to_string(np));
    fs::create_symlink("/dev/full", dir / "metrics.jsonl");
    // (a metrics file that is a device holds no run: nothing to refuse or set aside)
    expect_failure(np, "train " + kDemo + " --train.max_steps=2 --data.eval_file= --checkpoint.resume=auto --run.dir=" +
                           dir.string(),
                   "writing metrics file '" + (dir / "metrics.jsonl").string() + "': No space left on device");

    const fs::path run = dir / "predictions";
    fs::create_directories(run);
    fs::create_symlink("/dev/full", run / "predictions.json.tmp");
    expect_failure(np, "train " + kDemo + " --train.max_steps=2 --data.eval_size=2 --eval.max_new_tokens=2 "
                       "--run.dir=" + run.string(),
                   "writing predictions file '" + (run / "predictions.json.tmp").string() +
                       "': No space left on device");
    BOOST_TEST(fs::exists(run / "checkpoints" / "ckpt-00000002.h5"));
    BOOST_TEST(!fs::exists(run / "predictions.json"));
    BOOST_TEST(!fs::exists(run / "lock"));
  }
}

// Resume compares the whole model config and names the key that differs; load_weights_only takes
// the parameters into a new run of another config with the same shapes.
BOOST_AUTO_TEST_CASE(resume_refuses_another_model_unless_weights_only) {
  const fs::path dir = scratch("cli_other_model");
  const std::string base = "train " + kDemo + " --data.eval_file= --train.max_steps=2";
  Outcome first = run_shardlm(1, base + " --run.dir=" + (dir / "a").string());
  BOOST_TEST_REQUIRE(first.exit_code == 0, first.output);
  const std::string resume = " --checkpoint.resume=" + (dir / "a" / "checkpoints").string();
  expect_failure(1, base + " --model.num_heads=8 --run.dir=" + (dir / "b").string() + resume,
                 "n_head is 4 in the checkpoint, 8 in this run");
  expect_failure(1, base + " --model.layer_norm_eps=1e-6 --run.dir=" + (dir / "b").string() + resume,
                 "layer_norm_epsilon is 1e-05 in the checkpoint, 1e-06 in this run");
  Outcome weights = run_shardlm(1, base + " --model.layer_norm_eps=1e-6 --checkpoint.load_weights_only=true --run.dir=" +
                                       (dir / "c").string() + resume);
  BOOST_TEST(weights.exit_code == 0, weights.output);
  BOOST_TEST(count_of(weights.output, "loaded the weights of ") == 1u, weights.output);
  BOOST_TEST(train_losses(dir / "c").size() == 1u);  // steps 1 and 2 of a new run, one log line
}

// The tokenizer is compared by its hash: another one of the same size (the byte tokenizer's files with
// two ids swapped) is refused naming data.tokenizer, both sources and hashes; load_weights_only takes
// it; a checkpoint written before the hash was kept still resumes, with one warning on any world.
BOOST_AUTO_TEST_CASE(resume_refuses_another_tokenizer_unless_weights_only) {
  const fs::path dir = scratch("cli_other_tokenizer");
  const std::string tokenizer = write_swapped_byte_tokenizer((dir / "swapped").string());
  const std::string base = "train " + kDemo + " --data.eval_file=";
  Outcome first = run_shardlm(1, base + " --train.max_steps=2 --run.dir=" + (dir / "a").string());
  BOOST_TEST_REQUIRE(first.exit_code == 0, first.output);
  const fs::path step2 = dir / "a" / "checkpoints" / "ckpt-00000002.h5";
  const std::string resume = " --checkpoint.resume=" + step2.string() + " --data.tokenizer=" + tokenizer;
  Outcome refused = run_shardlm(2, base + " --train.max_steps=3 --run.dir=" + (dir / "b").string() + resume);
  BOOST_TEST_CONTEXT(refused.output) {
    BOOST_TEST(refused.exit_code != 0);
    BOOST_TEST(count_of(refused.output, "shardlm: error:") == 1u);
    BOOST_TEST(contains(refused.output, "data.tokenizer is byte in the checkpoint, " + tokenizer + " (hash "));
    BOOST_TEST(contains(refused.output, "checkpoint.load_weights_only = true"));
  }
  Outcome weights = run_shardlm(1, base + " --train.max_steps=2 --checkpoint.load_weights_only=true --run.dir=" +
                                       (dir / "c").string() + resume);
  BOOST_TEST(weights.exit_code == 0, weights.output);
  BOOST_TEST(count_of(weights.output, "loaded the weights of ") == 1u, weights.output);

  // A checkpoint as written before the tokenizer's hash was kept: the attribute removed, with those
  // kept since (the run id, global batch and contents checksum).
  const fs::path old = dir / "old" / "ckpt-00000002.h5";
  fs::create_directories(old.parent_path());
  fs::copy_file(step2, old);
  BOOST_TEST_REQUIRE(ckpt_edit::remove_attributes(old.string(), {"tokenizer_hash"}));
  BOOST_TEST_REQUIRE(ckpt_edit::make_old_format(old.string()));
  Outcome inspect = run_shardlm(1, "inspect " + old.string());
  BOOST_TEST(contains(inspect.output, "\ntokenizer    byte (no hash kept: written before checkpoints kept one)\n"),
             inspect.output);
  Outcome resumed = run_shardlm(2, base + " --train.max_steps=3 --checkpoint.resume=" + old.string() +
                                       " --data.tokenizer=" + tokenizer + " --run.dir=" + (dir / "d").string());
  BOOST_TEST_CONTEXT(resumed.output) {
    BOOST_TEST(resumed.exit_code == 0);
    BOOST_TEST(count_of(resumed.output, "resumed from " + old.string() + ": step 2") == 1u);
    BOOST_TEST(count_of(resumed.output, "written before checkpoints kept their tokenizer's hash") == 1u);
  }
}

// Tests of the shardlm executable under mpirun: bad decks fail fast with one message on 1 and 4
// ranks; the demo deck trains (loss halves, eval each epoch) and writes its metrics and deck.
#define BOOST_TEST_MODULE test_cli
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace fs = std::filesystem;

namespace {

struct Outcome {
  int exit_code = -1;
  std::string output;
  double seconds = 0;
};

// Runs `shardlm ARGS` under mpirun with np ranks.
Outcome shardlm(int np, const std::string& args) {
  const std::string cmd = std::string("timeout 120 " SHARDLM_MPIEXEC " -np ") + std::to_string(np) +
                          " " SHARDLM_MPIEXEC_FLAGS " " SHARDLM_BINARY_DIR "/bin/shardlm " + args + " 2>&1";
  auto start = std::chrono::steady_clock::now();
  Outcome o;
  FILE* pipe = popen(cmd.c_str(), "r");
  BOOST_TEST_REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) o.output.append(buf, n);
  int status = pclose(pipe);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++count;
  return count;
}

const std::string kDemo = SHARDLM_SOURCE_DIR "/input/demo.ini";

fs::path scratch(const std::string& name) {
  fs::path dir = fs::path(SHARDLM_BINARY_DIR) / "test_runs" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void expect_clean_failure(const std::string& args, const std::string& must_contain) {
  for (int np : {1, 4}) {
    Outcome o = shardlm(np, "train " + args);
    BOOST_TEST_CONTEXT("np " << np << ": shardlm " << args << "\n" << o.output) {
      BOOST_TEST(o.exit_code != 0);
      BOOST_TEST(count_of(o.output, "shardlm: error:") == 1u);  // one message, not one per rank
      BOOST_TEST(count_of(o.output, must_contain) >= 1u);
      BOOST_TEST(o.seconds < 30.0);
    }
  }
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
  expect_clean_failure(kDemo + " --train.batch_size=6", "train.batch_size");
  expect_clean_failure(kDemo + " --fsdp.strategy=FULL", "fsdp.strategy");
}

BOOST_AUTO_TEST_CASE(missing_deck_fails_cleanly) {
  expect_clean_failure("/nonexistent/deck.ini", "/nonexistent/deck.ini");
}

BOOST_AUTO_TEST_CASE(demo_trains_and_reports) {
  fs::path dir = scratch("cli_demo");
  Outcome o = shardlm(2, "train " + kDemo + " --run.dir=" + dir.string());
  BOOST_TEST_INFO(o.output);
  BOOST_TEST_REQUIRE(o.exit_code == 0);
  BOOST_TEST(o.output.find("master-shard") != std::string::npos);  // the per-rank memory table

  std::ifstream metrics(dir / "metrics.jsonl");
  std::vector<double> losses;
  int evals = 0, memory_lines = 0, summaries = 0;
  std::string line;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string type = j.at("type");
    if (type == "train") {
      losses.push_back(j.at("loss"));
      for (const char* key : {"step", "epoch", "grad_norm", "lr", "tokens_per_s"}) BOOST_TEST(j.contains(key));
    } else if (type == "eval") {
      ++evals;
      BOOST_TEST(j.at("eval_loss").get<double>() > 0.0);
      BOOST_TEST(j.at("eval_samples_per_second").get<double>() > 0.0);
    } else if (type == "memory") {
      ++memory_lines;
    } else if (type == "summary") {
      ++summaries;
      for (const char* key : {"train_runtime", "train_samples_per_second", "train_loss", "peak_memory_bytes"})
        BOOST_TEST(j.contains(key));
      BOOST_TEST(j.at("peak_memory_bytes").get<double>() > 0.0);
    }
  }
  BOOST_TEST_REQUIRE(losses.size() >= 2u);
  BOOST_TEST(losses.back() <= losses.front() / 2.0);  // the demo's loss falls by at least half
  BOOST_TEST(evals == 10);                            // one per epoch
  BOOST_TEST(memory_lines == 2);                      // one per rank
  BOOST_TEST(summaries == 1);

  // The resolved deck is a deck: it runs again as written.
  fs::path again = scratch("cli_demo_again");
  Outcome o2 = shardlm(1, "train " + (dir / "deck.resolved.ini").string() + " --train.max_steps=2 --run.dir=" + again.string());
  BOOST_TEST_INFO(o2.output);
  BOOST_TEST(o2.exit_code == 0);
  BOOST_TEST(fs::exists(again / "metrics.jsonl"));
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

  // The requeued job resumes from it and finishes.
  Outcome o = shardlm(2, "train " + kDemo + " --run.dir=" + dir.string() + " --checkpoint.resume=auto");
  BOOST_TEST_INFO(o.output);
  BOOST_TEST(o.exit_code == 0);
  BOOST_TEST(o.output.find("resumed from") != std::string::npos);
  BOOST_TEST(o.output.find("done:") != std::string::npos);

  // inspect and export read what it wrote.
  Outcome inspect = shardlm(1, "inspect " + (dir / "checkpoints").string());
  BOOST_TEST_INFO(inspect.output);
  BOOST_TEST(inspect.exit_code == 0);
  BOOST_TEST(inspect.output.find("h.1.mlp.dense_4h_to_h.weight") != std::string::npos);
  BOOST_TEST(inspect.output.find("FULL_SHARD on 2 rank(s)") != std::string::npos);
  Outcome exported = shardlm(1, "export " + (dir / "checkpoints").string() + " " + (dir / "hf").string());
  BOOST_TEST_INFO(exported.output);
  BOOST_TEST(exported.exit_code == 0);
  BOOST_TEST(fs::exists(dir / "hf" / "config.json"));
  BOOST_TEST(fs::exists(dir / "hf" / "model.safetensors"));
  Outcome missing = shardlm(1, "inspect /nonexistent/ckpt.h5");
  BOOST_TEST(missing.exit_code != 0);
  BOOST_TEST(missing.output.find("/nonexistent/ckpt.h5") != std::string::npos);
}

namespace {

// Runs a shell command, returning its exit code and stdout + stderr.
Outcome run_command(const std::string& cmd) {
  Outcome o;
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  BOOST_TEST_REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) o.output.append(buf, n);
  const int status = pclose(pipe);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE(hdf5_tools_read_a_checkpoint_with_readable_names) {
  // The checkpoint format promises that the standard HDF5 tools read it: they must be installed.
  if (std::system("command -v h5ls > /dev/null 2>&1 && command -v h5dump > /dev/null 2>&1") != 0)
    BOOST_FAIL("h5ls or h5dump is not on PATH: install Debian's hdf5-tools (apt-get install hdf5-tools, or make deps)");

  fs::path dir = scratch("cli_h5tools");
  Outcome o = shardlm(1, "train " + kDemo + " --train.max_steps=2 --checkpoint.at_end=true --run.dir=" + dir.string());
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

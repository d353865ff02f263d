// Every input bounded and every wait bounded (issue 29, item 3) and a stop signal during a
// checkpoint write (item 5): pipes, sockets and folders refused before an open() could block,
// JSON nesting and token ids bounded, eval.max_new_tokens checked before training, many short
// records reaching the first step at once, and SIGTERM / SIGKILL during a checkpoint write.
#define BOOST_TEST_MODULE test_inputs
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../src/core/input_file.hpp"
#include "../src/data/data_file.hpp"
#include "config_test_support.hpp"
#include "launch_support.hpp"
#include "shardlm/data.hpp"
#include "shardlm/io.hpp"
#include "shardlm/model.hpp"
#include "temp_dir.hpp"
#include "test_support.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

const std::string kDemo = SHARDLM_SOURCE_DIR "/input/demo.ini";

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The error `f` throws, checked to come at once and to say `part`.
void expect_quick_error(const std::function<void()>& f, const std::string& part) {
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of(f);
  BOOST_TEST(contains(message, part), message);
  BOOST_TEST(seconds_since(start) < 2.0, message);
}

std::string make_fifo(const TempDir& t, const std::string& name) {
  const std::string path = (t.root / name).string();
  BOOST_REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  return path;
}

// A listening Unix socket at root/name; the descriptor stays open until `fd` is closed.
std::string make_socket(const TempDir& t, const std::string& name, int& fd) {
  const std::string path = (t.root / name).string();
  fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  BOOST_REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  BOOST_REQUIRE(path.size() < sizeof addr.sun_path);
  std::copy(path.begin(), path.end(), addr.sun_path);
  BOOST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return path;
}

std::string nested_arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// A tiny BLOOM's config.json.
std::string tiny_bloom_config() {
  return hf_config_json(bloom_shape(259, 32, 1, 2));
}

// `shardlm ARGS` on np ranks fails within a few seconds with one message saying must_contain.
void expect_cli_failure(int np, const std::string& args, const std::string& must_contain) {
  const Outcome o = run_shardlm(np, args, "", 60);
  BOOST_TEST_CONTEXT("np " << np << ": shardlm " << args << "\n" << o.output) {
    BOOST_TEST(o.exit_code != 0);
    BOOST_TEST(o.exit_code != 124);  // not stopped by the timeout
    BOOST_TEST(count_of(o.output, "shardlm: error:") == 1u);
    BOOST_TEST(contains(o.output, must_contain));
    BOOST_TEST(o.seconds < 20.0);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(pipes_sockets_and_folders_are_refused_before_open) {
  TempDir t("inputs_kinds");
  const std::string fifo = make_fifo(t, "fifo");
  int socket_fd = -1;
  const std::string socket = make_socket(t, "socket", socket_fd);
  const std::string folder = (t.root / "folder").string();
  fs::create_directories(folder);

  for (const std::string& path : {fifo, socket, folder}) {
    BOOST_TEST_CONTEXT(path) {
      const std::string kind = path == fifo ? "a pipe (FIFO)" : path == socket ? "a socket" : "it is a directory";
      expect_quick_error([&] { check_input_file(path, "data file", 100); }, "cannot open data file '" + path + "': ");
      expect_quick_error([&] { check_input_file(path, "data file", 100); }, kind);
      expect_quick_error([&] { read_input_file(path, "input deck", kMaxDeckBytes); }, kind);
      expect_quick_error([&] { open_input_file(path, "data file", kMaxDataFileBytes); }, kind);
      expect_quick_error([&] { read_data_file(path); }, kind);
      expect_quick_error([&] { for_each_record_line(path, [](const std::string&, const std::string&) {}); }, kind);
      // The readers that open files themselves.
      expect_quick_error([&] { read_safetensors(path); }, "cannot open safetensors file '" + path + "': ");
      expect_quick_error([&] { read_safetensors(path); }, kind);
      expect_quick_error([&] { SafetensorsFile weights(path); }, kind);
      expect_quick_error([&] { CheckpointReader reader(path); }, "cannot open checkpoint '" + path + "': ");
      expect_quick_error([&] { CheckpointReader reader(path); }, kind);
      expect_quick_error([&] { HfTokenizer::from_file(path); }, kind);
    }
  }
  ::close(socket_fd);
}

BOOST_AUTO_TEST_CASE(json_nesting_is_bounded) {
  BOOST_TEST(parse_json_bounded(nested_arrays(kMaxJsonNesting), "x").is_array());
  expect_quick_error([] { parse_json_bounded(nested_arrays(kMaxJsonNesting + 2), "deep.json"); },
                     "deep.json: nests deeper than 64 levels");
  // A megabyte of '[' ends at its 65th, not after building a million arrays.
  expect_quick_error([] { parse_json_bounded(std::string(1 << 20, '['), "bomb.json"); }, "bomb.json: nests deeper");
  // The readers of config.json, tokenizer.json and data records.
  const std::string deep = "{\"a\": " + nested_arrays(1000) + "}";
  expect_quick_error([&] { model_config_from_hf(deep, "m/config.json"); }, "nests deeper than 64 levels");
  expect_quick_error([&] { HfTokenizer::from_json(deep, "t/tokenizer.json"); }, "t/tokenizer.json: nests deeper");
  expect_quick_error([&] { parse_json_record(deep, "d.jsonl:3"); }, "d.jsonl:3: nests deeper");
}

BOOST_AUTO_TEST_CASE(token_ids_are_bounded_with_the_memory_they_would_take) {
  std::string vocab_bomb = kTinyTokenizerJson;
  vocab_bomb.replace(vocab_bomb.find("\"ab\": 2"), 7, "\"ab\": 1000000000");
  expect_quick_error([&] { HfTokenizer::from_json(vocab_bomb, "tok.json"); },
                     "tok.json: model.vocab.ab: id 1000000000 is larger than the limit of 16777215");
  expect_quick_error([&] { HfTokenizer::from_json(vocab_bomb, "tok.json"); }, "GiB");
  std::string added_bomb = kTinyTokenizerJson;
  added_bomb.replace(added_bomb.find("\"id\": 5"), 7, "\"id\": 1000000000");
  expect_quick_error([&] { HfTokenizer::from_json(added_bomb, "tok.json"); },
                     "tok.json: added_tokens[0].id: id 1000000000 is larger than the limit");
  // The largest id allowed still reads.
  std::string largest = kTinyTokenizerJson;
  largest.replace(largest.find("\"id\": 5"), 7, "\"id\": 300000");
  BOOST_TEST(HfTokenizer::from_json(largest, "tok.json").vocab_size() == 300001);
}

// A data file that loads for longer than 5 s says how far it is, on stdout (rank 0's log).
BOOST_AUTO_TEST_CASE(a_slow_data_file_load_prints_progress) {
  TempDir t("inputs_progress");
  std::string lines;
  for (int i = 0; i < 3000; ++i) lines += "{\"text\": \"x\"}\n";
  const std::string path = t.write("data.jsonl", lines);
  const std::string captured = (t.root / "stdout.txt").string();
  std::fflush(stdout);
  const int saved = ::dup(1);
  const int file = ::open(captured.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  BOOST_REQUIRE(saved >= 0 && file >= 0);
  ::dup2(file, 1);
  size_t records = 0;
  for_each_record_line(path, [&](const std::string&, const std::string&) {
    if (++records == 1000) ::usleep(5200 * 1000);  // as if the first thousand lines took 5.2 s
  });
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  ::close(file);
  const std::string out = read_text_file(captured);
  BOOST_TEST(records == 3000u);
  BOOST_TEST(contains(out, "reading data file " + path + ": 0 of 0 MiB, 1024 lines, 5."), out);
  BOOST_TEST(contains(out, "read data file " + path + ": 3000 lines in 5."), out);
}

// The order of every epoch is what it was when each micro-batch recomputed it: the epoch's
// seeded_permutation (seed + epoch x 0x9E3779B97F4A7C15) cut into global batches.
BOOST_AUTO_TEST_CASE(sampler_order_is_unchanged_and_costs_the_batch_not_the_dataset) {
  const size_t n = 1003, global = 8;
  const uint64_t seed = 77;
  for (bool shuffle : {true, false}) {
    DistributedSampler sampler(n, global, seed, shuffle);
    // Epochs asked out of order (a resume, the padding count of epoch 0 after epoch 2) give the same.
    for (size_t epoch : {0, 2, 0, 1, 1}) {
      std::vector<size_t> expected(n);
      if (shuffle) {
        expected = seeded_permutation(n, seed + static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ULL);
      } else {
        for (size_t i = 0; i < n; ++i) expected[i] = i;
      }
      for (size_t step = 0; step < sampler.steps_per_epoch(); ++step) {
        const std::vector<size_t> batch = sampler.global_batch(epoch, step);
        BOOST_REQUIRE(std::equal(batch.begin(), batch.end(), expected.begin() + step * global));
        const std::vector<size_t> second = sampler.micro_batch(epoch, step, 1, 2, 1, 2);  // rank 1's 2nd of 2
        BOOST_REQUIRE(std::equal(second.begin(), second.end(), expected.begin() + step * global + 6));
      }
    }
  }
  // Pinned: the first global batch of epoch 1 of a shuffled 100-example set, seed 42.
  DistributedSampler pinned(100, 4, 42, true);
  const std::vector<size_t> first = seeded_permutation(100, 42 + 0x9E3779B97F4A7C15ULL);
  BOOST_TEST(pinned.global_batch(1, 0) == std::vector<size_t>(first.begin(), first.begin() + 4),
             boost::test_tools::per_element());

  // A million records: every micro-batch of an epoch (what the start-up padding count walks) in
  // well under a second each thousand steps, where each used to shuffle the whole million again.
  const size_t many = 1000000;
  DistributedSampler big(many, 16, 1, true);
  const auto start = std::chrono::steady_clock::now();
  size_t seen = 0;
  for (size_t step = 0; step < big.steps_per_epoch(); ++step)
    for (int rank = 0; rank < 2; ++rank)
      for (int micro = 0; micro < 4; ++micro) seen += big.micro_batch(0, step, rank, 2, micro, 2).size();
  BOOST_TEST(seen == many);
  BOOST_TEST(seconds_since(start) < 10.0);
}

BOOST_AUTO_TEST_CASE(the_cli_refuses_a_pipe_in_every_input_at_once) {
  TempDir t("inputs_cli");
  const std::string fifo = make_fifo(t, "fifo");
  // A deck's data file, on 1 and 2 ranks.
  for (int np : {1, 2}) expect_cli_failure(np, "train " + kDemo + " --data.train_file=" + fifo, "a pipe (FIFO)");
  expect_cli_failure(1, "train " + kDemo + " --data.eval_file=" + fifo, "data.eval_file");
  // The deck itself, a tokenizer file.
  expect_cli_failure(1, "train " + fifo, "a pipe (FIFO)");
  expect_cli_failure(1, "train " + kDemo + " --data.tokenizer=" + fifo, "a pipe (FIFO)");

  // A model folder whose weights are a pipe, a folder, or an index naming "." or a folder.
  const fs::path model = t.root / "model";
  fs::create_directories(model);
  t.write("model/config.json", tiny_bloom_config());
  BOOST_REQUIRE(::mkfifo((model / "model.safetensors").c_str(), 0600) == 0);
  // The deck's [model] keys would clash with config.json: drop them with an empty deck section.
  const std::string deck = t.write("model.ini", "[data]\nformat = squad\ntrain_file = " SHARDLM_SOURCE_DIR
                                                "/input/data/demo_squad_train.json\ntokenizer = byte\n[train]\nbatch_size = 8\n"
                                                "micro_batch_size = 2\n[run]\nbackend = cpu\n");
  const std::string model_run = "train " + deck + " --model.dir=" + model.string() + " --run.dir=" +
                                (t.root / "run").string();
  expect_cli_failure(1, model_run, "cannot open safetensors file '" + (model / "model.safetensors").string() +
                                       "': not a regular file but a pipe (FIFO)");
  fs::remove(model / "model.safetensors");
  fs::create_directories(model / "model.safetensors");
  expect_cli_failure(1, model_run, "model.safetensors': it is a directory");
  fs::remove_all(model / "model.safetensors");
  t.write("model/model.safetensors.index.json", R"({"weight_map": {"word_embeddings.weight": "."}})");
  expect_cli_failure(1, model_run, "= '.' is not a file name in the directory");
  fs::create_directories(model / "shards");
  t.write("model/model.safetensors.index.json", R"({"weight_map": {"word_embeddings.weight": "shards"}})");
  expect_cli_failure(1, model_run, "shards': it is a directory");
  fs::remove(model / "model.safetensors.index.json");
  BOOST_REQUIRE(::mkfifo((model / "model.safetensors.index.json").c_str(), 0600) == 0);
  expect_cli_failure(1, model_run, "a pipe (FIFO)");

  // The run folder report reads, a checkpoint inspect reads, an Accelerate config.
  const fs::path run = t.root / "report_run";
  fs::create_directories(run);
  t.write("report_run/deck.resolved.ini", "[run]\nbackend = cpu\n");
  BOOST_REQUIRE(::mkfifo((run / "metrics.jsonl").c_str(), 0600) == 0);
  expect_cli_failure(1, "report " + run.string(), "a pipe (FIFO)");
  expect_cli_failure(1, "inspect " + fifo, "a pipe (FIFO)");
  // A run folder whose metrics.jsonl is a pipe: its writes would wait once the pipe is full.
  const fs::path piped = t.root / "piped_run";
  fs::create_directories(piped);
  BOOST_REQUIRE(::mkfifo((piped / "metrics.jsonl").c_str(), 0600) == 0);
  expect_cli_failure(1, "train " + kDemo + " --train.max_steps=1 --data.eval_file= --checkpoint.resume=auto --run.dir=" +
                            piped.string(), "metrics.jsonl': it is a pipe (FIFO)");
  const Outcome yaml = run_shardlm(1, "import-accelerate " + fifo + " -o " + (t.root / "out.ini").string(), "", 60);
  BOOST_TEST(yaml.exit_code != 0, yaml.output);
  BOOST_TEST(yaml.exit_code != 124, yaml.output);
  BOOST_TEST((contains(yaml.output, "a pipe (FIFO)") || contains(yaml.output, "yaml-cpp")), yaml.output);
}

// eval.max_new_tokens sizes the generation's key/value cache: checked with the deck, before training.
BOOST_AUTO_TEST_CASE(eval_max_new_tokens_is_checked_before_training) {
  TempDir t("inputs_generation");
  const Outcome o = run_shardlm(2, "train " + kDemo + " --eval.max_new_tokens=1000000000 --run.dir=" +
                                       (t.root / "run").string(), "", 60);
  BOOST_TEST(o.exit_code != 0, o.output);
  BOOST_TEST(contains(o.output, "eval.max_new_tokens = 1000000000: the generation's key/value cache would take"),
             o.output);
  BOOST_TEST(!contains(o.output, "step "), o.output);  // refused before the first step
  BOOST_TEST(!contains(o.output, "bad_alloc"), o.output);
  BOOST_TEST(o.seconds < 20.0);
  const Outcome wrap = run_shardlm(1, "train " + kDemo + " --eval.max_new_tokens=2147483600 --run.dir=" +
                                          (t.root / "run").string(), "", 60);
  BOOST_TEST(contains(wrap.output, "eval.max_new_tokens = 2147483600: with data.max_length (256) gives"), wrap.output);
  // A tokenizer whose id would take gigabytes fails with that, not std::bad_alloc.
  std::string bomb = kTinyTokenizerJson;
  bomb.replace(bomb.find("\"ab\": 2"), 7, "\"ab\": 1000000000");
  const std::string tok = t.write("tok/tokenizer.json", bomb);
  expect_cli_failure(1, "train " + kDemo + " --data.tokenizer=" + tok + " --run.dir=" + (t.root / "run2").string(),
                     "id 1000000000 is larger than the limit");
}

// 200k short {"text"} lines load and reach their first step in seconds (each micro-batch of the
// start-up padding count used to reshuffle the whole dataset: a minute for 100k lines).
BOOST_AUTO_TEST_CASE(many_short_records_reach_the_first_step_in_seconds) {
  TempDir t("inputs_many");
  {
    std::ofstream out(t.root / "many.jsonl");
    for (int i = 0; i < 200000; ++i) out << "{\"text\": \"line " << i % 97 << "\"}\n";
  }
  const Outcome o = run_shardlm(2, "train " + kDemo + " --data.format=jsonl --data.train_file=" +
                                       (t.root / "many.jsonl").string() +
                                       " --data.eval_file= --train.max_steps=2 --train.log_every=1 --run.dir=" +
                                       (t.root / "run").string(), "", 120);
  BOOST_TEST(o.exit_code == 0, o.output);
  BOOST_TEST(contains(o.output, "step 2/2"), o.output);
  BOOST_TEST(o.seconds < 30.0, o.output);
}

namespace {

// Starts `shardlm train` on 2 ranks in the background with checkpoints that take about a second to
// write (SHARDLM_FAULT_CHECKPOINT=slow_units), waits until the write of step `step` is under way,
// sends `sig` to the ranks (as srun does: both get it), or with to_mpirun to mpirun alone, and waits
// for the job. Returns its output; *status gets the shell's exit status.
std::string signal_during_write(const fs::path& run, int step, const char* sig, const std::string& extra,
                                int* status, bool to_mpirun = false) {
  char tmp_name[32];
  std::snprintf(tmp_name, sizeof tmp_name, "ckpt-%08d.h5.tmp", step);
  const std::string out = (run.parent_path() / (run.filename().string() + ".out")).string();
  const std::string script =
      "SHARDLM_FAULT_CHECKPOINT=slow_units:500 " SHARDLM_MPIEXEC " -np 2 " SHARDLM_MPIEXEC_FLAGS " " SHARDLM_BINARY_DIR
      "/bin/shardlm train " + kDemo + " --data.eval_file= --checkpoint.every=2 --train.log_every=1 --run.dir=" +
      run.string() + " " + extra + " > " + out + " 2>&1 & pid=$!; " +
      "for i in $(seq 600); do [ -e " + (run / "checkpoints" / tmp_name).string() + " ] && break; sleep 0.05; done; " +
      "kill -" + sig + (to_mpirun ? " $pid" : " $(pgrep -P $pid)") + "; wait $pid";
  *status = std::system(("timeout 120 bash -c '" + script + "'").c_str());
  return read_text_file(out);
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

// SIGTERM (srun's, or mpirun's before it kills) while a checkpoint is written: the write finishes,
// latest names it, and the run stops there instead of training on towards another one.
BOOST_AUTO_TEST_CASE(sigterm_during_a_checkpoint_write_finishes_it_and_stops) {
  TempDir t("inputs_sigterm");
  int status = 0;
  const std::string text = signal_during_write(t.root / "run", 4, "TERM", "", &status);
  BOOST_TEST_INFO(text);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
  BOOST_TEST(contains(text, "stop signal received: checkpoint written at step 4;"));
  const fs::path ckpts = t.root / "run" / "checkpoints";
  BOOST_TEST(read_text_file((ckpts / "latest").string()) == "ckpt-00000004.h5\n");
  BOOST_TEST(names_in(ckpts) == (std::vector<std::string>{"ckpt-00000002.h5", "ckpt-00000004.h5", "latest"}),
             boost::test_tools::per_element());
  BOOST_TEST(CheckpointReader((ckpts / "ckpt-00000004.h5").string()).verify().empty());
}

// SIGKILL mid-write (mpirun's, a few seconds after its SIGTERM): latest still names the complete
// checkpoint before it, and the next start removes the unfinished file and resumes from latest.
BOOST_AUTO_TEST_CASE(a_write_killed_midway_leaves_latest_and_the_next_start_clears_it) {
  TempDir t("inputs_sigkill");
  int status = 0;
  const std::string text = signal_during_write(t.root / "run", 4, "KILL", "", &status);
  BOOST_TEST_INFO(text);
  const fs::path ckpts = t.root / "run" / "checkpoints";
  BOOST_TEST(read_text_file((ckpts / "latest").string()) == "ckpt-00000002.h5\n");
  BOOST_TEST(fs::exists(ckpts / "ckpt-00000004.h5.tmp"));
  BOOST_TEST(!fs::exists(ckpts / "ckpt-00000004.h5"));

  // The killed job's processes may still be going away (mpirun tears down asynchronously): while the
  // run folder's lock says so, the next start is refused; it is tried again for up to 10 s.
  Outcome resumed;
  for (int attempt = 0; attempt < 20; ++attempt) {
    resumed = run_shardlm(2, "train " + kDemo + " --data.eval_file= --train.max_steps=3 --run.dir=" +
                                 (t.root / "run").string() + " --checkpoint.resume=auto", "", 120);
    if (!contains(resumed.output, "is in use by another job")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  BOOST_TEST(resumed.exit_code == 0, resumed.output);
  BOOST_TEST(contains(resumed.output, "removed 1 unfinished checkpoint write(s) of a job stopped while writing "
                                      "(ckpt-00000004.h5.tmp)"), resumed.output);
  BOOST_TEST(contains(resumed.output, "resumed from"), resumed.output);
  for (const std::string& name : names_in(ckpts)) BOOST_TEST(name.find(".tmp") == std::string::npos, name);
}

// SIGTERM to mpirun during a write: mpirun passes it on and kills the ranks a few seconds later.
// Whether the write beat the kill or not, latest names a complete checkpoint, nothing is left
// half-renamed, and the next start leaves no .tmp behind.
BOOST_AUTO_TEST_CASE(sigterm_to_mpirun_during_a_write_keeps_latest_complete) {
  TempDir t("inputs_mpirun_term");
  int status = 0;
  const std::string text = signal_during_write(t.root / "run", 4, "TERM", "", &status, true);
  BOOST_TEST_INFO(text);
  const fs::path ckpts = t.root / "run" / "checkpoints";
  const std::string latest = read_text_file((ckpts / "latest").string());
  BOOST_TEST((latest == "ckpt-00000004.h5\n" || latest == "ckpt-00000002.h5\n"), latest);
  const std::string newest = (ckpts / latest.substr(0, latest.size() - 1)).string();
  BOOST_TEST(CheckpointReader(newest).verify().empty());
  BOOST_TEST(!fs::exists(ckpts / "ckpt-00000006.h5"));  // no step trained on past the signal

  const Outcome resumed = run_shardlm(2, "train " + kDemo + " --data.eval_file= --train.max_steps=5 --run.dir=" +
                                             (t.root / "run").string() + " --checkpoint.resume=auto", "", 120);
  BOOST_TEST(resumed.exit_code == 0, resumed.output);
  for (const std::string& name : names_in(ckpts)) BOOST_TEST(name.find(".tmp") == std::string::npos, name);
}

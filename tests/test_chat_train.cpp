#define BOOST_TEST_MODULE test_chat_train
// Training on chat data (data.format = chat) end to end on the CPU: a tiny Llama learns the
// assistant's turns of a small synthetic chat set, data.train_on_prompt changes what it trains on,
// and packed and unpacked runs, and 1 rank or the world, give the same losses.
#include "mpi_fixture.hpp"

#include <cmath>
#include <fstream>

#include "train_test_support.hpp"
#include "shardlm/config.hpp"

using namespace shardlm;

namespace {

void write_chat_files_here(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/chatml.jinja")
      << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  std::ofstream data(dir + "/chat.jsonl");
  const char* words[] = {"cat", "dog", "bird", "fish", "lion", "wolf", "bear", "frog"};
  for (int i = 0; i < 48; ++i) {
    std::string w = std::string(words[i % 8]) + std::string(words[(i / 8) % 8]);
    std::string r(w.rbegin(), w.rend());
    nlohmann::json record = {{"messages",
                              {{{"role", "system"}, {"content", "Reverse the word."}},
                               {{"role", "user"}, {"content", w}},
                               {{"role", "assistant"}, {"content", r}}}}};
    data << record.dump() << "\n";
  }
}

// A ChatML template and 48 conversations whose answers follow from the question (the word reversed),
// written by rank 0 while the others wait.
std::string write_chat_files(const std::string& dir) {
  if (world_rank() == 0) write_chat_files_here(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

RunConfig chat_config(const std::string& name) {
  static const std::string files = write_chat_files(concat(SHARDLM_BINARY_DIR, "/test_runs/chat_files_np", world_size()));
  RunConfig cfg = tiny_squad_config(32);  // a global batch of 8 in micro-batches of 2
  make_tiny_llama(cfg.model);
  cfg.data.format = DataFormat::Chat;
  cfg.data.train_file = files + "/chat.jsonl";
  cfg.data.chat_template = files + "/chatml.jinja";
  cfg.data.max_length = 160;  // byte tokens: the longest conversation is about 125
  cfg.train.epochs = 6;
  cfg.train.max_steps = 30;
  cfg.train.warmup_steps = 2;
  cfg.train.seed = 11;
  cfg.run.dir = concat(SHARDLM_BINARY_DIR, "/test_runs/chat_np", world_size(), "_", name);
  cfg.run.overwrite = true;
  return cfg;
}

// The losses of a run on one rank alone, broadcast to the world.
std::vector<double> single_rank_losses(const RunConfig& cfg, size_t steps) {
  std::vector<double> losses(steps, 0.0);
  if (world_rank() == 0) losses = train(cfg, MPI_COMM_SELF, quiet()).step_losses;
  losses.resize(steps);
  MPI_Bcast(losses.data(), static_cast<int>(steps), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return losses;
}

}  // namespace

BOOST_AUTO_TEST_CASE(assistant_turns_train_and_the_world_agrees) {
  const TrainResult r = train(chat_config("assistant"), MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(r.step_losses.size() == 30u);
  for (double l : r.step_losses) BOOST_TEST(std::isfinite(l));
  BOOST_TEST(r.step_losses.back() < r.step_losses.front() * 0.8);
  const std::vector<double> single = single_rank_losses(chat_config("assistant_single"), 30);
  for (size_t i = 0; i < 30; ++i) BOOST_TEST(r.step_losses[i] == single[i], boost::test_tools::tolerance(1e-4));
}

BOOST_AUTO_TEST_CASE(train_on_prompt_trains_on_more) {
  RunConfig all = chat_config("prompt");
  all.train.max_steps = 3;
  all.data.train_on_prompt = true;
  RunConfig assistant = chat_config("assistant_short");
  assistant.train.max_steps = 3;
  const TrainResult a = train(all, MPI_COMM_WORLD, quiet());
  const TrainResult b = train(assistant, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(a.step_losses.size() == 3u);
  BOOST_TEST(std::fabs(a.step_losses[0] - b.step_losses[0]) > 1e-3);
}

BOOST_AUTO_TEST_CASE(packed_and_unpacked_give_the_same_losses) {
  RunConfig unpacked = chat_config("unpacked");
  unpacked.train.max_steps = 6;
  RunConfig packed = unpacked;
  packed.data.packing = packed.model.packed = true;  // a deck sets both from data.packing
  packed.run.dir += "_packed";
  const TrainResult u = train(unpacked, MPI_COMM_WORLD, quiet());
  const TrainResult p = train(packed, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(u.step_losses.size() == 6u);
  BOOST_TEST_REQUIRE(p.step_losses.size() == 6u);
  for (size_t i = 0; i < 6; ++i) BOOST_TEST(p.step_losses[i] == u.step_losses[i], boost::test_tools::tolerance(1e-5));
}

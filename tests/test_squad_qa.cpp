// Learning the task, end to end: a small Llama trained from scratch on a synthetic extractive QA
// set in SQuAD v1.1 format ("Question: m Context: m=kqd Answer: kqd") reaches exact match above
// 0.9 on held-out questions through `train` (sharded over the ranks, answers by greedy generation).
// The same model, data and steps trained the way a widespread tutorial builds its labels (the
// answer tokenized separately as the labels of the prompt's positions, so the labels do not line
// up with the tokens they should follow) stays near exact match 0, although its own loss falls.
#define BOOST_TEST_MODULE test_squad_qa
#include "mpi_fixture.hpp"

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "engine.hpp"
#include "generate.hpp"
#include "shardlm/data.hpp"
#include "shardlm/optim.hpp"
#include "shardlm/train.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

// Questions whose answer is the value of the key they name; consonants only, so no value is one
// of the articles the SQuAD normalisation drops. Different seeds give disjoint-looking sets.
void write_synthetic_squad(const fs::path& path, int questions, uint32_t seed, const std::string& prefix) {
  const std::string letters = "bcdfghjklmnpqrstvwxz";
  std::mt19937 rng(seed);
  nlohmann::json paragraphs = nlohmann::json::array();
  for (int i = 0; i < questions; ++i) {
    std::string pool = letters;
    std::shuffle(pool.begin(), pool.end(), rng);
    const std::string key = pool.substr(0, 1), value = pool.substr(1, 3);
    const std::string context = key + "=" + value;
    paragraphs.push_back({{"context", context},
                          {"qas", {{{"id", prefix + std::to_string(i)},
                                    {"question", key},
                                    {"answers", {{{"text", value}, {"answer_start", 2}}}}}}}});
  }
  const nlohmann::json root = {{"version", "1.1"}, {"data", {{{"title", "synthetic"}, {"paragraphs", paragraphs}}}}};
  std::ofstream(path) << root.dump();
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(SHARDLM_BINARY_DIR) / "test_runs" / concat("squad_qa_np", world_size(), "_", name);
  if (world_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

RunConfig qa_config(const fs::path& dir) {
  RunConfig cfg;
  cfg.model.arch = "llama";
  cfg.model.vocab_size = 259;  // the byte tokenizer
  cfg.model.hidden_size = 64;
  cfg.model.num_layers = 2;
  cfg.model.num_heads = 4;
  cfg.data.format = DataFormat::Squad;
  cfg.data.train_file = (dir / "train.json").string();
  cfg.data.eval_file = (dir / "dev.json").string();
  cfg.data.max_length = 48;
  cfg.data.tokenizer = TokenizerSource::Byte;
  cfg.train.epochs = 5;
  cfg.train.batch_size = 32;
  cfg.train.micro_batch_size = 32 / world_size();
  cfg.train.lr = 2e-3;
  cfg.train.lr_schedule = LrSchedule::Constant;
  cfg.train.weight_decay = 0.0;
  cfg.train.log_every = 1000;
  cfg.fsdp.strategy = ShardingStrategy::FullShard;
  cfg.eval.generate = EvalGenerate::End;
  cfg.eval.max_new_tokens = 8;
  cfg.checkpoint.at_end = false;
  cfg.run.dir = (dir / "run").string();
  return cfg;
}

fs::path write_data() {
  const fs::path dir = scratch("data");
  if (world_rank() == 0) {
    write_synthetic_squad(dir / "train.json", 2000, 1, "train-");
    write_synthetic_squad(dir / "dev.json", 100, 2, "dev-");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

// The tutorial's labels: the prompt alone is the input and the answer, tokenized on its own
// (BOS first, as a Llama tokenizer gives it), is the label sequence of the same positions; the
// causal-LM shift then makes position t learn label t + 1. Nothing ties a label to the token it
// should follow, so the model learns to emit answer pieces at the start of the prompt.
Example misaligned(const Example& aligned, int32_t bos) {
  const std::vector<int32_t> prompt = completion_prompt(aligned);
  std::vector<int32_t> labels = {bos};
  labels.insert(labels.end(), aligned.tokens.begin() + static_cast<long>(prompt.size()), aligned.tokens.end());
  Example ex;
  ex.tokens = prompt;
  ex.targets.assign(prompt.size(), -1);
  for (size_t t = 0; t + 1 < labels.size() && t < prompt.size(); ++t) ex.targets[t] = labels[t + 1];
  return ex;
}

}  // namespace

BOOST_AUTO_TEST_CASE(aligned_labels_learn_the_task_and_misaligned_ones_do_not) {
  const fs::path data = write_data();
  RunConfig cfg = qa_config(data);
  const TrainResult aligned = train(cfg, MPI_COMM_WORLD, TrainOptions{false});
  BOOST_TEST_MESSAGE("aligned labels: exact match " << aligned.exact_match << ", F1 " << aligned.f1);
  BOOST_TEST(aligned.exact_match > 90.0);
  BOOST_TEST(aligned.f1 > 90.0);
  BOOST_TEST(fs::exists(fs::path(cfg.run.dir) / "predictions.json"));

  // The same model, data, batches, optimizer and number of steps, with the tutorial's labels.
  ByteTokenizer tok;
  DatasetOptions opt;
  opt.max_length = cfg.data.max_length;
  const std::vector<Example> train_set = load_squad(cfg.data.train_file, tok, opt);
  const std::vector<Example> dev_set = load_squad(cfg.data.eval_file, tok, opt);
  const std::vector<SquadQuestion> questions = load_squad_questions(cfg.data.eval_file, opt);
  std::vector<Example> tutorial;
  for (const Example& ex : train_set) tutorial.push_back(misaligned(ex, tok.bos_id()));

  const int rank = world_rank(), world = world_size(), micro = cfg.train.micro_batch_size;
  const Topology topo = make_topology(MPI_COMM_WORLD, 0);
  std::unique_ptr<FsdpEngine> engine = make_engine(cfg, MPI_COMM_WORLD, topo, micro);
  DistributedSampler sampler(tutorial.size(), cfg.train.batch_size, cfg.train.seed, true);
  std::vector<double> losses;
  for (int epoch = 0; epoch < cfg.train.epochs; ++epoch)
    for (size_t s = 0; s < sampler.steps_per_epoch(); ++s) {
      const MicroBatch mb = make_micro_batch(tutorial, sampler.micro_batch(epoch, s, rank, world, 0, micro),
                                             tok.pad_id());
      const double count = mpi_sum(MPI_COMM_WORLD, static_cast<double>(mb.target_count));
      engine->zero_grad();
      const double loss = mpi_sum(MPI_COMM_WORLD, engine->forward_backward(mb, static_cast<float>(1.0 / count), 0));
      losses.push_back(loss / count);
      const double norm = engine->grad_norm();
      engine->optimizer_step(cfg.train.lr, static_cast<float>(clip_factor(norm, cfg.train.max_grad_norm)));
    }
  BOOST_TEST(losses.size() == static_cast<size_t>(aligned.step_losses.size()));
  // It did learn its labels (the loss falls by half)...
  BOOST_TEST(losses.back() < 0.5 * losses.front());
  // ...and answers no better than chance.
  const SquadGeneration g = squad_generate(*engine, dev_set, questions, tok, micro, cfg.eval.max_new_tokens,
                                           MPI_COMM_WORLD);
  BOOST_TEST_MESSAGE("misaligned labels: exact match " << g.exact_match << ", F1 " << g.f1);
  BOOST_TEST(g.exact_match < 5.0);
}

#define BOOST_TEST_MODULE test_config
#include <boost/test/unit_test.hpp>
// test_config: the input deck, overrides, checks, error messages and the resolved deck round trip.

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "config_test_support.hpp"
#include "temp_dir.hpp"
#include "shardlm/config.hpp"
#include "shardlm/fsdp.hpp"

namespace fs = std::filesystem;
using namespace shardlm;

namespace {


// The smallest valid deck: the required keys, a vocabulary big enough for the byte tokenizer.
const std::string kBase =
    "[model]\nvocab_size = 300\nhidden_size = 64\nnum_layers = 2\nnum_heads = 4\n"
    "[data]\ntrain_file = train.json\n"
    "[train]\nbatch_size = 8\n";

// Runs the deck `extra` appended to kBase (in the temp dir, with its data files).
struct Fixture {
  TempDir tmp{"config"};
  Fixture() {
    tmp.write("train.json", "{}");
    tmp.write("eval.json", "{}");
  }
  std::string deck(const std::string& text, const std::string& name = "deck.ini") const {
    return tmp.write(name, text);
  }
  RunConfig load(const std::string& text, const std::vector<std::string>& overrides = {},
                 int world = 1) const {
    return load_run_config(deck(text), overrides, world);
  }
};

// The message of the Error `f` throws, or a marker that none was thrown.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error thrown>";
}

bool has(const std::string& msg, const std::string& part) {
  if (msg.find(part) != std::string::npos) return true;
  BOOST_TEST_MESSAGE("'" << part << "' not in: " << msg);
  return false;
}

std::string value_of(const RunConfig& cfg, const std::string& key) {
  for (const auto& [k, v] : cfg.resolved)
    if (k == key) return v;
  return "<missing>";
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(deck, Fixture)

BOOST_AUTO_TEST_CASE(values_are_parsed) {
  RunConfig c = load(
      "# a full deck\n"
      "[model]\narch = bloom\nvocab_size = 300 ; inline ';' comment\nhidden_size = 64\n"
      "num_layers = 3\nnum_heads = 8\nlayer_norm_eps = 1e-6\ninit_std = 0.01\n"
      "; a ';' comment line\n"
      "[data]\nformat = jsonl\ntrain_file = train.json\neval_file = eval.json\nmax_length = 64\n"
      "train_size = 100\neval_size = 10\ntokenizer = byte\n"
      "[train]\nepochs = 3\nbatch_size = 16\nmicro_batch_size = 2\nlr = 3e-4\nweight_decay = 0\n"
      "warmup_steps = 5\nlr_schedule = constant_with_warmup\nadam_beta1 = 0.8\nadam_beta2 = 0.95\n"
      "adam_eps = 1e-6\nmax_grad_norm = 0.5\nseed = 18446744073709551615\nshuffle = no\n"
      "log_every = 7\nmax_steps = 20\n"
      "[fsdp]\nstrategy = shard_grad_op\nparam_dtype = bf16\nreduce_dtype = FP16\n"
      "[dist]\nranks_per_node = 2\n"
      "[run]\ndir = out/x\nbackend = cpu\n",
      {}, 4);
  BOOST_TEST(c.model.arch == "bloom");
  check_bloom_shape(c.model, 300, 64, 3, 8, 1e-6f, 0.01f);
  BOOST_TEST(c.data.format == DataFormat::Jsonl);
  BOOST_TEST(c.data.train_file == (tmp.root / "train.json").string());
  BOOST_TEST(c.data.eval_file == (tmp.root / "eval.json").string());
  BOOST_TEST(c.data.max_length == 64);
  BOOST_TEST(c.data.train_size == 100u);
  BOOST_TEST(c.data.eval_size == 10u);
  BOOST_TEST(c.train.epochs == 3);
  BOOST_TEST(c.train.batch_size == 16);
  BOOST_TEST(c.train.micro_batch_size == 2);
  BOOST_TEST(c.train.lr == 3e-4);
  BOOST_TEST(c.train.weight_decay == 0.0);
  BOOST_TEST(c.train.warmup_steps == 5);
  BOOST_TEST(c.train.lr_schedule == LrSchedule::ConstantWithWarmup);
  BOOST_TEST(c.train.adam_beta1 == 0.8);
  BOOST_TEST(c.train.adam_beta2 == 0.95);
  BOOST_TEST(c.train.adam_eps == 1e-6);
  BOOST_TEST(c.train.max_grad_norm == 0.5);
  BOOST_TEST(c.train.seed == 18446744073709551615ull);
  BOOST_TEST(c.train.shuffle == false);
  BOOST_TEST(c.train.log_every == 7);
  BOOST_TEST(c.train.max_steps == 20);
  BOOST_TEST(c.fsdp.strategy == ShardingStrategy::ShardGradOp);
  BOOST_TEST(c.fsdp.param_dtype == DType::BF16);
  BOOST_TEST(c.fsdp.reduce_dtype == DType::F16);
  BOOST_TEST(c.dist.ranks_per_node == 2);
  BOOST_TEST(c.run.dir == "out/x");
  BOOST_TEST(c.grad_accum(4) == 2);
  BOOST_TEST(value_of(c, "fsdp.strategy") == "SHARD_GRAD_OP");
  BOOST_TEST(value_of(c, "fsdp.reduce_dtype") == "fp16");
  BOOST_TEST(value_of(c, "train.shuffle") == "false");
  BOOST_TEST(value_of(c, "train.lr") == "3e-04");  // shortest text that reads back the same
}

BOOST_AUTO_TEST_CASE(defaults_fill_the_rest) {
  RunConfig c = load(kBase);
  RunConfig d;
  BOOST_TEST(c.train.lr == d.train.lr);
  BOOST_TEST(c.train.epochs == d.train.epochs);
  BOOST_TEST(c.data.max_length == d.data.max_length);
  BOOST_TEST(c.data.eval_file.empty());
  BOOST_TEST(c.run.dir == d.run.dir);
  BOOST_TEST(c.fsdp.strategy == ShardingStrategy::FullShard);
  BOOST_TEST(c.model.layer_norm_eps == d.model.layer_norm_eps);
  // Every key is in `resolved`, in the fixed order, sections model .. run.
  // LoRA is off without [lora], and the resolved deck then has no [lora] keys.
  BOOST_TEST(c.resolved.size() == 108u);  // grows with each new key; the list below pins the order
  BOOST_TEST(c.resolved.front().first == "model.arch");
  std::vector<std::string> checkpoint_keys;
  for (const auto& kv : c.resolved)
    if (kv.first.rfind("checkpoint.", 0) == 0) checkpoint_keys.push_back(kv.first);
  BOOST_TEST((checkpoint_keys == std::vector<std::string>{"checkpoint.dir", "checkpoint.every", "checkpoint.keep_last",
                                                          "checkpoint.resume", "checkpoint.at_end",
                                                          "checkpoint.collective_buffering",
                                                          "checkpoint.load_weights_only",
                                                          "checkpoint.allow_new_batch", "checkpoint.keep_best",
                                                          "checkpoint.every_epoch"}));
  BOOST_TEST(c.resolved[1].first == "model.vocab_size");
  BOOST_TEST(c.resolved.back().first == "run.smoke");
}

BOOST_AUTO_TEST_CASE(eval_generation_keys) {
  const RunConfig d = load(kBase);
  BOOST_TEST(d.eval.generate == EvalGenerate::End);
  BOOST_TEST(d.eval.max_new_tokens == 50);
  BOOST_TEST(d.eval.batch_size == 0);
  const RunConfig c = load(kBase + "[eval]\ngenerate = epoch\nmax_new_tokens = 8\nbatch_size = 4\n");
  BOOST_TEST(c.eval.generate == EvalGenerate::Epoch);
  BOOST_TEST(c.eval.max_new_tokens == 8);
  BOOST_TEST(c.eval.batch_size == 4);
  BOOST_TEST(has(error_of([&] { load(kBase, {"--eval.generate=sometimes"}); }), "eval.generate"));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--eval.max_new_tokens=0"}); }), "eval.max_new_tokens = 0: must be >= 1"));
  // Llama SQuAD evaluation on the GPU generates as BLOOM's does (it was refused before Llama had a
  // GPU decoding path): every choice of eval.generate loads.
  const std::string llama_cuda = kBase + "[run]\nbackend = cuda\n";
  const std::vector<std::string> llama = {"--model.arch=llama", "--data.eval_file=" + deck("{}", "eval_llama.json")};
  BOOST_TEST(load(llama_cuda, llama).eval.generate == EvalGenerate::End);
  for (const char* choice : {"epoch", "none"}) {
    std::vector<std::string> chosen = llama;
    chosen.push_back(std::string("--eval.generate=") + choice);
    BOOST_TEST(eval_generate_name(load(llama_cuda, chosen).eval.generate) == std::string(choice));
  }
}

// transformers' schedule names and arguments, the warm-up ratio, evaluation by steps, the best
// checkpoint, early stopping and TensorBoard: parsed, written back, and refused where they would do nothing.
BOOST_AUTO_TEST_CASE(schedule_evaluation_and_tensorboard_keys) {
  const RunConfig d = load(kBase);
  BOOST_TEST(d.train.warmup_ratio == 0.0);
  BOOST_TEST(d.train.lr_end == 1e-7);
  BOOST_TEST(d.run.tensorboard);
  BOOST_TEST((d.checkpoint.keep_best == KeepBest::None));
  BOOST_TEST(value_of(d, "checkpoint.keep_best") == "none");
  for (const char* name : {"linear", "constant", "constant_with_warmup", "cosine", "cosine_with_restarts", "polynomial",
                           "cosine_with_min_lr"})
    BOOST_TEST(value_of(load(kBase + "lr_schedule = " + name + "\n"), "train.lr_schedule") == name);
  const RunConfig c = load(kBase + "warmup_ratio = 0.1\nlr_schedule = cosine_with_min_lr\nmin_lr_ratio = 0.1\n"
                                   "lr_num_cycles = 1\nearly_stopping_patience = 3\nearly_stopping_threshold = 0.01\n"
                                   "[data]\neval_file = eval.json\n[eval]\nevery_steps = 50\n"
                                   "[checkpoint]\nkeep_best = eval_loss\n[run]\ntensorboard = false\n");
  BOOST_TEST(c.train.warmup_ratio == 0.1);
  BOOST_TEST(c.train.min_lr_ratio == 0.1);
  BOOST_TEST(c.train.lr_num_cycles == 1.0);
  BOOST_TEST(c.train.early_stopping_patience == 3);
  BOOST_TEST(c.train.early_stopping_threshold == 0.01);
  BOOST_TEST(c.eval.every_steps == 50);
  BOOST_TEST((c.checkpoint.keep_best == KeepBest::EvalLoss));
  BOOST_TEST(!c.run.tensorboard);
  BOOST_TEST(value_of(c, "train.warmup_ratio") == "0.1");
  BOOST_TEST(value_of(c, "checkpoint.keep_best") == "eval_loss");
  BOOST_TEST(value_of(c, "run.tensorboard") == "false");
  const RunConfig p = load(kBase + "lr_schedule = polynomial\nlr_power = 2\nlr_end = 1e-6\n");
  BOOST_TEST(p.train.lr_power == 2.0);
  BOOST_TEST(p.train.lr_end == 1e-6);
  // Refused: a key the chosen schedule ignores, a warm-up transformers' constant would ignore.
  BOOST_TEST(has(error_of([&] { load(kBase + "warmup_steps = 3\nlr_schedule = constant\n"); }),
                 "train.lr_schedule = constant: has no warm-up"));
  BOOST_TEST(has(error_of([&] { load(kBase + "warmup_ratio = 0.1\nlr_schedule = constant\n"); }), "constant_with_warmup"));
  BOOST_TEST(has(error_of([&] { load(kBase + "min_lr_ratio = 0.1\nlr_schedule = cosine\n"); }),
                 "train.min_lr_ratio = 0.1: is cosine_with_min_lr's floor"));
  BOOST_TEST(has(error_of([&] { load(kBase + "lr_num_cycles = 2\n"); }), "train.lr_num_cycles = 2: applies to the cosine"));
  BOOST_TEST(has(error_of([&] { load(kBase + "lr_power = 2\n"); }), "train.lr_power = 2: applies to the polynomial"));
  BOOST_TEST(has(error_of([&] { load(kBase + "lr_schedule = polynomial\nlr_end = 1\n"); }),
                 "train.lr_end = 1: must be below train.lr"));
  BOOST_TEST(has(error_of([&] { load(kBase + "warmup_ratio = 1.5\n"); }), "train.warmup_ratio = 1.5: must be in [0, 1]"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[eval]\nevery_steps = 5\n"); }), "eval.every_steps = 5: needs data.eval_file"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[checkpoint]\nkeep_best = eval_loss\n"); }),
                 "checkpoint.keep_best = eval_loss: needs data.eval_file"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[checkpoint]\nkeep_best = accuracy\n"); }),
                 "checkpoint.keep_best = 'accuracy': must be none or eval_loss"));
  BOOST_TEST(has(error_of([&] { load(kBase + "early_stopping_patience = 2\n"); }),
                 "train.early_stopping_patience = 2: needs data.eval_file"));
}

BOOST_AUTO_TEST_CASE(booleans) {
  for (auto [text, v] : std::vector<std::pair<std::string, bool>>{
           {"true", true}, {"1", true}, {"yes", true}, {"false", false}, {"0", false}, {"no", false}})
    BOOST_TEST(load(kBase + "shuffle = " + text + "\n").train.shuffle == v);
  std::string m = error_of([&] { load(kBase + "shuffle = maybe\n"); });
  BOOST_TEST(has(m, "train.shuffle = 'maybe'"));
}

BOOST_AUTO_TEST_CASE(overrides_win) {
  RunConfig c = load(kBase + "lr = 1e-3\nepochs = 2\n",
                     {"--train.lr=5e-4", "--train.epochs", "3", "--fsdp.strategy=NO_SHARD",
                      "--train.warmup_steps", "-0"});
  BOOST_TEST(c.train.lr == 5e-4);
  BOOST_TEST(c.train.epochs == 3);
  BOOST_TEST(c.fsdp.strategy == ShardingStrategy::NoShard);
  BOOST_TEST(c.model.hidden_size == 64);  // deck values not overridden stay
  // A negative value as the next token is taken as the value, and checked.
  std::string m = error_of([&] { load(kBase, {"--train.lr", "-1"}); });
  BOOST_TEST(has(m, "train.lr = -1: must be > 0"));
  // An override can supply a required key the deck lacks.
  RunConfig d = load("[model]\nvocab_size = 300\nhidden_size = 64\nnum_layers = 2\nnum_heads = 4\n"
                     "[data]\ntrain_file = train.json\n",
                     {"--train.batch_size=4"});
  BOOST_TEST(d.train.batch_size == 4);
}

BOOST_AUTO_TEST_CASE(relative_paths) {
  tmp.write("sub/data/t.json", "{}");
  std::string deck_path = tmp.write("sub/deck.ini",
                                    "[model]\nvocab_size = 300\nhidden_size = 64\nnum_layers = 2\n"
                                    "num_heads = 4\n[data]\ntrain_file = data/./t.json\n"
                                    "eval_file = ../eval.json\n[train]\nbatch_size = 8\n");
  RunConfig c = load_run_config(deck_path, {}, 1);
  BOOST_TEST(c.data.train_file == (fs::absolute(tmp.root) / "sub/data/t.json").string());
  BOOST_TEST(c.data.eval_file == (fs::absolute(tmp.root) / "eval.json").string());

  // Overrides are relative to the current directory, not to the deck.
  std::string rel = fs::relative(tmp.root / "train.json", fs::current_path()).string();
  RunConfig o = load_run_config(deck_path, {"--data.train_file=" + rel}, 1);
  BOOST_TEST(o.data.train_file == (fs::absolute(tmp.root) / "train.json").string());
  // An empty eval_file turns evaluation off.
  BOOST_TEST(load_run_config(deck_path, {"--data.eval_file="}, 1).data.eval_file.empty());

  // Data files not checked (plan, generate): missing files pass, kept as the same absolute paths, so that what
  // needs an evaluation file named (eval.every_steps, checkpoint.keep_best, early stopping) reads as in train.
  const std::string later = tmp.write("later.ini", "[model]\nvocab_size = 300\nhidden_size = 64\nnum_layers = 2\n"
                                                   "num_heads = 4\n[data]\ntrain_file = not_yet/t.json\n"
                                                   "eval_file = not_yet/e.json\n[train]\nbatch_size = 8\n"
                                                   "early_stopping_patience = 2\n[eval]\nevery_steps = 10\n"
                                                   "[checkpoint]\nkeep_best = eval_loss\n");
  BOOST_TEST(has(error_of([&] { load_run_config(later, {}, 1); }), "not_yet/t.json"));
  const RunConfig unchecked = load_run_config(later, {}, 1, false);
  BOOST_TEST(unchecked.data.eval_file == (fs::absolute(tmp.root) / "not_yet/e.json").string());
  BOOST_TEST(unchecked.eval.every_steps == 10);
  BOOST_TEST(has(error_of([&] { load_run_config(later, {"--data.eval_file="}, 1, false); }),
                 "needs data.eval_file"));
}

BOOST_AUTO_TEST_CASE(unknown_key_in_deck) {
  std::string d = deck("[trian]\nlr=1\n" + kBase);
  std::string m = error_of([&] { load_run_config(d, {}, 1); });
  BOOST_TEST(has(m, "unknown key 'trian.lr' in " + d));
  BOOST_TEST(has(m, "(did you mean 'train.lr'?)"));
  // The right key in no section: the exact key part is a good enough hint.
  m = error_of([&] { load("lr = 1\n" + kBase); });
  BOOST_TEST(has(m, "unknown key 'lr'"));
  BOOST_TEST(has(m, "train.lr"));
}

BOOST_AUTO_TEST_CASE(unknown_key_on_command_line) {
  std::string m = error_of([&] { load(kBase, {"--train.lrr=1"}); });
  BOOST_TEST(has(m, "unknown key 'train.lrr' on the command line (did you mean 'train.lr'?)"));
  m = error_of([&] { load(kBase, {"--zzzz.qqqqqq=1"}); });
  BOOST_TEST(has(m, "unknown key 'zzzz.qqqqqq' on the command line"));
  BOOST_TEST(m.find("did you mean") == std::string::npos);
  // No prefix guessing: an abbreviation is unknown, not silently some other key.
  m = error_of([&] { load(kBase, {"--train.l=1"}); });
  BOOST_TEST(has(m, "unknown key 'train.l'"));
  m = error_of([&] { load(kBase, {"train.lr=1"}); });
  BOOST_TEST(has(m, "unexpected argument 'train.lr=1'"));
  m = error_of([&] { load(kBase, {"--train.lr"}); });
  BOOST_TEST(has(m, "train.lr needs a value"));
  m = error_of([&] { load(kBase, {"--train.lr=1", "--train.lr=2"}); });
  BOOST_TEST(has(m, "train.lr is given twice on the command line"));
}

BOOST_AUTO_TEST_CASE(bad_values) {
  BOOST_TEST(has(error_of([&] { load(kBase + "lr = -1\n"); }), "train.lr = -1: must be > 0"));
  BOOST_TEST(has(error_of([&] { load(kBase + "lr = nan\n"); }), "train.lr = nan: must be finite"));
  BOOST_TEST(has(error_of([&] { load(kBase + "epochs = abc\n"); }), "train.epochs = 'abc'"));
  BOOST_TEST(has(error_of([&] { load(kBase + "epochs = 1.5\n"); }), "train.epochs = '1.5'"));
  BOOST_TEST(has(error_of([&] { load(kBase + "lr = 1e-3x\n"); }), "train.lr = '1e-3x': not a number"));
  BOOST_TEST(has(error_of([&] { load(kBase + "epochs = 0\n"); }), "train.epochs = 0: must be >= 1"));
  BOOST_TEST(has(error_of([&] { load(kBase + "epochs = 99999999999\n"); }), "out of range"));
  BOOST_TEST(has(error_of([&] { load(kBase + "adam_beta2 = 1\n"); }), "train.adam_beta2 = 1"));
  BOOST_TEST(has(error_of([&] { load(kBase + "seed = -3\n"); }), "train.seed = -3: must be >= 0"));
  BOOST_TEST(has(error_of([&] { load(kBase + "lr_schedule = cosine_annealing\n"); }),
                 "train.lr_schedule = 'cosine_annealing'"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[data]\nmax_length = 4\n"); }), "data.max_length = 4"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[data]\nformat = csv\n"); }), "data.format = 'csv'"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[fsdp]\nparam_dtype = fp8\n"); }),
                 "fsdp.param_dtype = 'fp8'"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[model]\narch = gpt2\n"); }), "model.arch = 'gpt2'"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[run]\nbackend = gpu\n"); }), "run.backend = 'gpu'"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[run]\ndir =\n"); }), "run.dir"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[model]\ninit_std = 0\n"); }), "model.init_std = 0"));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--train.lr=-1e-3"}); }), "train.lr = -1e-3"));
}

// model.sliding_window: Mistral's window of keys, 0 (none) by default; negative values are refused by
// the key, a window for a family without one by the family check, naming the key either way.
BOOST_AUTO_TEST_CASE(model_sliding_window) {
  BOOST_TEST(load(kBase).model.sliding_window == 0);
  BOOST_TEST(value_of(load(kBase), "model.sliding_window") == "0");
  const std::string mistral = kBase + "[model]\narch = mistral\n";
  const RunConfig c = load(mistral + "sliding_window = 4096\n");
  BOOST_TEST(c.model.sliding_window == 4096);
  BOOST_TEST(value_of(c, "model.sliding_window") == "4096");
  BOOST_TEST(has(resolved_deck_ini(c), "sliding_window = 4096"));
  BOOST_TEST(has(error_of([&] { load(mistral + "sliding_window = -1\n"); }), "model.sliding_window = -1: must be >= 0"));
  BOOST_TEST(has(error_of([&] { load(mistral + "sliding_window = 2.5\n"); }), "model.sliding_window = '2.5'"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[model]\narch = llama\nsliding_window = 8\n"); }),
                 "model.sliding_window = 8: applies to the families with sliding-window attention (qwen2, qwen3, mistral, "
                 "gemma3, phi3), not llama"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[model]\nsliding_window = 8\n"); }), "not bloom"));
}

// Gemma 3's attention keys: local / global layers, the local rope base, the global table's linear factor and
// the score scale; 0 (off) by default, in the resolved deck, refused for other families naming the key.
BOOST_AUTO_TEST_CASE(model_gemma3_attention_keys) {
  const RunConfig d = load(kBase);
  BOOST_TEST(d.model.sliding_window_pattern == 0);
  BOOST_TEST(d.model.rope_local_theta == 0.0f);
  BOOST_TEST(d.model.query_pre_attn_scalar == 0.0f);
  const std::string gemma = kBase + "[model]\narch = gemma3\nnum_kv_heads = 2\nhead_dim = 16\nsliding_window = 8\n";
  const RunConfig c = load(gemma + "sliding_window_pattern = 6\nrope_local_theta = 10000\nrope_linear_factor = 8\n"
                                   "query_pre_attn_scalar = 256\n");
  BOOST_TEST(c.model.sliding_window_pattern == 6);
  BOOST_TEST(c.model.rope_local_theta == 10000.0f);
  BOOST_TEST(c.model.rope_linear_factor == 8.0f);
  BOOST_TEST(c.model.query_pre_attn_scalar == 256.0f);
  BOOST_TEST(has(resolved_deck_ini(c), "sliding_window_pattern = 6"));
  BOOST_TEST(has(resolved_deck_ini(c), "query_pre_attn_scalar = 256"));
  BOOST_TEST(has(error_of([&] { load(gemma + "sliding_window_pattern = -1\n"); }), "model.sliding_window_pattern = -1"));
  BOOST_TEST(has(error_of([&] { load(gemma + "rope_local_theta = -5\n"); }), "model.rope_local_theta"));
  // Local layers without a window: config.json could not say it (checkpoints, export).
  const std::string no_window = kBase + "[model]\narch = gemma3\nnum_kv_heads = 2\nhead_dim = 16\n";
  BOOST_TEST(has(error_of([&] { load(no_window); }), "model.sliding_window = 0: gemma3's local layers need a window"));
  BOOST_TEST(has(error_of([&] { load(no_window + "sliding_window_pattern = 6\n"); }), "sliding_window_pattern = 6"));
  BOOST_TEST(load(no_window + "sliding_window_pattern = 1\n").model.sliding_window == 0);  // global layers only
  BOOST_TEST(has(error_of([&] { load(kBase + "[model]\narch = llama\nquery_pre_attn_scalar = 256\n"); }),
                 "model.query_pre_attn_scalar = 256: applies to gemma3, not llama"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[model]\narch = mistral\nsliding_window_pattern = 6\n"); }),
                 "model.sliding_window_pattern = 6: applies to gemma3, not mistral"));
  // The Llama-style layer's keys in BLOOM (its default family here), and the chat records' keys in another
  // format, would do nothing: refused, naming the key, unless left at their defaults.
  for (const std::string key : {"num_kv_heads = 2", "intermediate_size = 100", "rms_norm_eps = 0.1",
                                 "tie_word_embeddings = true", "rope_theta = 5"}) {
    const std::string name = "model." + key.substr(0, key.find(' '));
    BOOST_TEST(has(error_of([&] { load(kBase + "[model]\n" + key + "\n"); }), name), key);
    BOOST_TEST(has(error_of([&] { load(kBase + "[model]\n" + key + "\n"); }), ": applies to the"), key);
    BOOST_TEST(error_of([&] { load(kBase + "[model]\narch = llama\n" + key + "\n"); }) == "<no error thrown>", key);
  }
  BOOST_TEST(load(kBase + "[model]\nrope_theta = 10000\nnum_kv_heads = 0\n").model.arch == "bloom");
  BOOST_TEST(has(error_of([&] { load(kBase + "[data]\ntrain_on_prompt = true\n"); }),
                 "data.train_on_prompt = true: applies to data.format = chat, not squad"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[data]\nchat_format = sharegpt\n"); }),
                 "data.chat_format = sharegpt: applies to data.format = chat"));
}

// Phi-3's rotary keys: model.partial_rotary_factor and LongRoPE's factors, original context and attention factor;
// read, shown in the resolved deck, checked against the rotary dimension and refused for other families.
BOOST_AUTO_TEST_CASE(model_rotary_options) {
  BOOST_TEST(value_of(load(kBase), "model.partial_rotary_factor") == "1");
  BOOST_TEST(value_of(load(kBase), "model.longrope_short_factor") == "");
  const std::string phi3 = kBase + "[model]\narch = phi3\nnum_kv_heads = 2\nintermediate_size = 64\n";
  const std::string longrope = "longrope_short_factor = 1, 1.5, 2.5\nlongrope_long_factor = 1.25,3,7\n"
                               "longrope_original_max_position_embeddings = 8\n";
  // The base deck's 4 heads of 16: 6 rotating dimensions, 3 frequencies.
  const RunConfig c = load(phi3 + "partial_rotary_factor = 0.375\n" + longrope);
  BOOST_TEST(c.model.rotary_dim() == 6);
  BOOST_TEST((c.model.longrope.long_factor == std::vector<float>{1.25f, 3.0f, 7.0f}));
  BOOST_TEST(c.model.longrope.original_max_position_embeddings == 8);
  BOOST_TEST(value_of(c, "model.longrope_short_factor") == "1, 1.5, 2.5");
  BOOST_TEST(has(resolved_deck_ini(c), "partial_rotary_factor = 0.375"));
  BOOST_TEST(has(error_of([&] { load(phi3 + "partial_rotary_factor = 0\n"); }),
                 "model.partial_rotary_factor = 0: must be in (0, 1]"));
  BOOST_TEST(has(error_of([&] { load(phi3 + "partial_rotary_factor = 0.5\n" + longrope); }),
                 "one value per rotary frequency, 4 each"));
  BOOST_TEST(has(error_of([&] { load(phi3 + "longrope_short_factor = 1, -1, 2\n"); }), "model.longrope_short_factor"));
  BOOST_TEST(has(error_of([&] { load(phi3 + "partial_rotary_factor = 0.375\nlongrope_short_factor = 1,1,1\n"
                                            "longrope_long_factor = 1,1,1\n"); }),
                 "model.longrope_original_max_position_embeddings = 0: must be > 0"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[model]\narch = llama\npartial_rotary_factor = 0.5\n"); }),
                 "applies to the families with partial rotary and LongRoPE (phi3), not llama"));
}

// model.attention: how the CUDA backend runs attention; not part of the shape, so it may sit beside
// model.dir (whose config.json gives the shape) and survives reading it.
BOOST_AUTO_TEST_CASE(model_attention) {
  BOOST_TEST((load(kBase).model.attention == AttentionImpl::Auto));
  BOOST_TEST(value_of(load(kBase), "model.attention") == "auto");
  BOOST_TEST((load(kBase, {"--model.attention=cudnn"}).model.attention == AttentionImpl::Cudnn));
  BOOST_TEST((load(kBase, {"--model.attention=native"}).model.attention == AttentionImpl::Native));
  const std::string m = error_of([&] { load(kBase, {"--model.attention=flash"}); });
  BOOST_TEST(has(m, "model.attention = 'flash'"));
  BOOST_TEST(has(m, "cudnn"));
  const std::string dir = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/tiny_llama";
  const RunConfig c = load("[model]\ndir = " + dir + "\nattention = native\n[data]\ntrain_file = train.json\n"
                           "tokenizer = byte\n[train]\nbatch_size = 8\n");
  BOOST_TEST(c.model.arch == "llama");
  BOOST_TEST((c.model.attention == AttentionImpl::Native));
  // Its resolved deck shows the folder's shape as comments and loads again as it is (shardlm generate, a rerun).
  const std::string ini = resolved_deck_ini(c);
  BOOST_TEST(has(ini, "\n# arch = llama  (config.json)\n"), ini);
  const RunConfig again = load(ini);
  BOOST_TEST(again.model.hidden_size == c.model.hidden_size);
  BOOST_TEST(resolved_deck_ini(again) == ini);
  // So do the other keys that are not part of the shape, given or at their defaults (the folder's
  // initializer_range does not replace init_std).
  const RunConfig d = load("[model]\ndir = " + dir + "\ninit_std = 0.05\nhead_chunk_tokens = 512\n[data]\n"
                           "train_file = train.json\ntokenizer = byte\n[train]\nbatch_size = 8\n");
  BOOST_TEST(d.model.init_std == 0.05f);
  BOOST_TEST(d.model.head_chunk_tokens == 512);
  BOOST_TEST((d.model.attention == AttentionImpl::Auto));
  BOOST_TEST(load("[model]\ndir = " + dir + "\n[data]\ntrain_file = train.json\ntokenizer = byte\n[train]\n"
                  "batch_size = 8\n").model.init_std == RunConfig().model.init_std);
}

// model.fp8_linear: off by default; on with bf16 parameters on the CUDA backend, kept when model.dir
// gives the shape; refused on the CPU backend and with fp32 parameters, naming the key and why. So is
// model.fp8_keep_weights (off by default), and refused without model.fp8_linear.
BOOST_AUTO_TEST_CASE(model_fp8_linear) {
  BOOST_TEST(!load(kBase).model.fp8_linear);
  const std::vector<std::string> cuda_bf16 = {"--run.backend=cuda", "--fsdp.param_dtype=bf16", "--model.fp8_linear=true"};
  const RunConfig c = load(kBase, cuda_bf16);
  BOOST_TEST(c.model.fp8_linear);
  BOOST_TEST(has(resolved_deck_ini(c), "fp8_linear = true"));
  const std::string dir = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/tiny_llama";
  std::vector<std::string> keeping = cuda_bf16;
  keeping.push_back("--model.fp8_keep_weights=true");
  BOOST_TEST(!c.model.fp8_keep_weights);
  BOOST_TEST(load(kBase, keeping).model.fp8_keep_weights);
  const RunConfig from_dir =
      load("[model]\ndir = " + dir + "\n[data]\ntrain_file = train.json\ntokenizer = byte\n[train]\nbatch_size = 8\n",
           keeping);
  BOOST_TEST(from_dir.model.fp8_linear);
  BOOST_TEST(from_dir.model.fp8_keep_weights);
  BOOST_TEST(has(error_of([&] { load(kBase, {"--run.backend=cuda", "--fsdp.param_dtype=bf16", "--model.fp8_keep_weights=true"}); }),
                 "model.fp8_keep_weights = true: keeps the E4M3 weights of model.fp8_linear, which is off"));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--fsdp.param_dtype=bf16", "--model.fp8_linear=true"}); }),
                 "model.fp8_linear = true: needs the CUDA backend"));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--run.backend=cuda", "--model.fp8_linear=true"}); }),
                 "needs 16-bit parameters (fsdp.param_dtype = bf16)"));
}

BOOST_AUTO_TEST_CASE(model_shape_checks) {
  std::string m = error_of([&] { load(kBase, {"--model.num_heads=5"}); });
  BOOST_TEST(has(m, "model.num_heads = 5"));
  m = error_of([&] { load(kBase, {"--model.vocab_size=100"}); });
  BOOST_TEST(has(m, "model.vocab_size = 100: must be >= 259"));
  m = error_of([&] { load(kBase, {"--model.hidden_size=0"}); });
  BOOST_TEST(has(m, "model.hidden_size = 0: must be > 0"));
}

BOOST_AUTO_TEST_CASE(unknown_strategy) {
  std::string m = error_of([&] { load(kBase + "[fsdp]\nstrategy = FULLSHARD\n"); });
  BOOST_TEST(has(m, "fsdp.strategy = 'FULLSHARD'"));
  BOOST_TEST(has(m, "FULL_SHARD"));
  BOOST_TEST(has(m, "HYBRID_SHARD"));
  m = error_of([&] { parse_strategy("zero3"); });
  BOOST_TEST(has(m, "'zero3'"));
  BOOST_TEST(has(m, "SHARD_GRAD_OP"));
  BOOST_TEST(all_strategies().size() == 5u);
  for (ShardingStrategy s : all_strategies()) BOOST_TEST(parse_strategy(strategy_name(s)) == s);
  BOOST_TEST(parse_strategy("hybrid_shard") == ShardingStrategy::HybridShard);
  // PyTorch's private name of the ZeRO-2 hybrid, and the deck's spellings of it.
  BOOST_TEST(parse_strategy("_HYBRID_SHARD_ZERO2") == ShardingStrategy::HybridShardZero2);
  BOOST_TEST(parse_strategy("hybrid-shard-zero2") == ShardingStrategy::HybridShardZero2);
  BOOST_TEST(strategy_name(ShardingStrategy::HybridShardZero2) == std::string("HYBRID_SHARD_ZERO2"));
  RunConfig c = load(kBase, {"--dist.ranks_per_node=2", "--fsdp.strategy=hybrid_shard_zero2"}, 4);
  BOOST_TEST(c.fsdp.strategy == ShardingStrategy::HybridShardZero2);
  BOOST_TEST(has(resolved_deck_ini(c), "strategy = HYBRID_SHARD_ZERO2"));
  for (const char* bad : {"HYBRID_SHARD_ZERO3", "ZERO2", "HYBRID_ZERO2", "__HYBRID_SHARD_ZERO2"}) {
    m = error_of([&] { load(kBase, {concat("--fsdp.strategy=", bad)}); });
    BOOST_TEST(has(m, concat("fsdp.strategy = '", bad, "'")), m);
    BOOST_TEST(has(m, "HYBRID_SHARD_ZERO2"), m);
  }
}

// dist.timeout: 600 s by default, SHARDLM_NCCL_TIMEOUT replaces the default, the key wins over both (the
// variable, malformed, then stops nothing).
BOOST_AUTO_TEST_CASE(dist_timeout) {
  unsetenv("SHARDLM_NCCL_TIMEOUT");
  RunConfig c = load(kBase);
  BOOST_TEST(c.dist.timeout == 600.0);
  BOOST_TEST(has(resolved_deck_ini(c), "[dist]\nranks_per_node = 0\ntimeout = 600\n"));
  BOOST_TEST(load(kBase + "[dist]\ntimeout = 90.5\n").dist.timeout == 90.5);
  for (const char* bad : {"0", "-5"})
    BOOST_TEST(has(error_of([&] { load(kBase, {concat("--dist.timeout=", bad)}); }),
                   concat("dist.timeout = ", bad, ": must be > 0")));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--dist.timeout=soon"}); }), "dist.timeout = 'soon': not a number"));

  setenv("SHARDLM_NCCL_TIMEOUT", "120", 1);
  BOOST_TEST(load(kBase).dist.timeout == 120.0);
  BOOST_TEST(load(kBase, {"--dist.timeout=30"}).dist.timeout == 30.0);
  BOOST_TEST(load(kBase + "[dist]\ntimeout = 45\n").dist.timeout == 45.0);
  for (const char* bad : {"ten", "0", "-1", "5s"}) {
    setenv("SHARDLM_NCCL_TIMEOUT", bad, 1);
    BOOST_TEST(has(error_of([&] { load(kBase); }), concat("SHARDLM_NCCL_TIMEOUT = '", bad, "'")), bad);
    // The key given, the variable is not read: a malformed one stops nothing.
    BOOST_TEST(load(kBase, {"--dist.timeout=30"}).dist.timeout == 30.0, bad);
    BOOST_TEST(load(kBase + "[dist]\ntimeout = 45\n").dist.timeout == 45.0, bad);
  }
  unsetenv("SHARDLM_NCCL_TIMEOUT");
}

// checkpoint.dir: empty for RUN_DIR/checkpoints; a relative path kept absolute, from the current folder, in the
// config and the resolved deck alike (so a run folder names its checkpoints from anywhere).
BOOST_AUTO_TEST_CASE(checkpoint_dir_is_kept_absolute) {
  BOOST_TEST(load(kBase).checkpoint.dir.empty());
  const RunConfig c = load(kBase, {"--checkpoint.dir=ckpts/./a/"});
  const std::string want = (fs::current_path() / "ckpts/a/").lexically_normal().string();
  BOOST_TEST(c.checkpoint.dir == want);
  BOOST_TEST(c.checkpoint_dir() == want);
  BOOST_TEST(has(resolved_deck_ini(c), "[checkpoint]\ndir = " + want + "\n"));
  BOOST_TEST(load(kBase, {"--checkpoint.dir=/scratch/ckpts"}).checkpoint.dir == "/scratch/ckpts");
}

// fsdp.offload_dir: kept as written, written back in the resolved deck; without fsdp.cpu_offload refused.
BOOST_AUTO_TEST_CASE(offload_dir) {
  BOOST_TEST(load(kBase).fsdp.offload_dir.empty());
  const RunConfig c = load(kBase, {"--fsdp.cpu_offload=true", "--fsdp.offload_dir=/local/nvme"});
  BOOST_TEST(c.fsdp.offload_dir == "/local/nvme");
  BOOST_TEST(has(resolved_deck_ini(c), "offload_dir = /local/nvme\n"));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--fsdp.offload_dir=/local/nvme"}); }),
                 "fsdp.offload_dir = '/local/nvme': keeps the host AdamW's moments of an offloaded run: set "
                 "fsdp.cpu_offload = true"));
}

// fsdp.offload_accumulate: host by default, device kept and written back; without fsdp.cpu_offload refused.
BOOST_AUTO_TEST_CASE(offload_accumulate) {
  BOOST_TEST((load(kBase).fsdp.offload_accumulate == OffloadAccumulate::Host));
  const RunConfig c = load(kBase, {"--fsdp.cpu_offload=true", "--fsdp.offload_accumulate=device"});
  BOOST_TEST((c.fsdp.offload_accumulate == OffloadAccumulate::Device));
  BOOST_TEST(has(resolved_deck_ini(c), "offload_accumulate = device\n"));
  BOOST_TEST(fsdp_options(c.fsdp).offload_accumulate_on_device());
  BOOST_TEST(!fsdp_options(load(kBase, {"--fsdp.cpu_offload=true"}).fsdp).offload_accumulate_on_device());
  BOOST_TEST(has(error_of([&] { load(kBase, {"--fsdp.offload_accumulate=device"}); }),
                 "fsdp.offload_accumulate = device: says where an offloaded run sums its micro-steps' gradients: set "
                 "fsdp.cpu_offload = true"));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--fsdp.cpu_offload=true", "--fsdp.offload_accumulate=gpu"}); }),
                 "fsdp.offload_accumulate"));
}

// train.optim: TrainingArguments' names, adamw_torch by default, written back; another name is refused
// naming the key; adamw_8bit offloaded updates the root on the host, so the device's root update and its
// resident state are refused with it.
BOOST_AUTO_TEST_CASE(train_optim) {
  BOOST_TEST((load(kBase).train.optim == Optim::AdamWTorch));
  const RunConfig c = load(kBase, {"--train.optim=adamw_8bit"});
  BOOST_TEST((c.train.optim == Optim::AdamW8bit));
  BOOST_TEST(has(resolved_deck_ini(c), "optim = adamw_8bit\n"));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--train.optim=sgd"}); }), "train.optim"));
  BOOST_TEST(has(error_of([&] {
                   load(kBase, {"--train.optim=adamw_8bit", "--fsdp.cpu_offload=true", "--fsdp.offload_root_update=device"});
                 }),
                 "train.optim = adamw_8bit: updates an offloaded run's root unit on the host"));
  BOOST_TEST(has(error_of([&] {
                   load(kBase, {"--train.optim=adamw_8bit", "--fsdp.cpu_offload=true", "--fsdp.offload_resident_gib=1"});
                 }),
                 "train.optim = adamw_8bit"));
  load(kBase, {"--train.optim=adamw_8bit", "--fsdp.cpu_offload=true"});  // auto: the root on the host
}

// fsdp.offload_root_update: auto by default (the engine measures the link), host and device kept and
// written back; device refused without fsdp.cpu_offload and with fsdp.offload_dir; without offload the
// engine's option is host.
BOOST_AUTO_TEST_CASE(offload_root_update) {
  BOOST_TEST((load(kBase).fsdp.offload_root_update == OffloadRootUpdate::Auto));
  BOOST_TEST((fsdp_options(load(kBase).fsdp).offload_root_update == OffloadRootUpdate::Host));
  const RunConfig c = load(kBase, {"--fsdp.cpu_offload=true", "--fsdp.offload_root_update=device"});
  BOOST_TEST((c.fsdp.offload_root_update == OffloadRootUpdate::Device));
  BOOST_TEST(has(resolved_deck_ini(c), "offload_root_update = device\n"));
  BOOST_TEST((fsdp_options(c.fsdp).offload_root_update == OffloadRootUpdate::Device));
  BOOST_TEST((fsdp_options(load(kBase, {"--fsdp.cpu_offload=true"}).fsdp).offload_root_update == OffloadRootUpdate::Auto));
  BOOST_TEST((load(kBase, {"--fsdp.offload_root_update=host"}).fsdp.offload_root_update == OffloadRootUpdate::Host));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--fsdp.offload_root_update=device"}); }),
                 "fsdp.offload_root_update = device: says where an offloaded run updates its root unit"));
  BOOST_TEST(has(error_of([&] {
                   load(kBase, {"--fsdp.cpu_offload=true", "--fsdp.offload_dir=/tmp", "--fsdp.offload_root_update=device"});
                 }),
                 "fsdp.offload_dir keeps them in files"));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--fsdp.cpu_offload=true", "--fsdp.offload_root_update=gpu"}); }),
                 "fsdp.offload_root_update"));
}

// fsdp.root_reduction: auto by default; split and whole read and written back; another word is refused
// naming the key.
BOOST_AUTO_TEST_CASE(root_reduction) {
  BOOST_TEST((load(kBase).fsdp.root_reduction == RootReduction::Auto));
  const RunConfig c = load(kBase, {"--fsdp.root_reduction=split"});
  BOOST_TEST((c.fsdp.root_reduction == RootReduction::Split));
  BOOST_TEST(has(resolved_deck_ini(c), "root_reduction = split\n"));
  BOOST_TEST((load(kBase, {"--fsdp.root_reduction=whole"}).fsdp.root_reduction == RootReduction::Whole));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--fsdp.root_reduction=halves"}); }), "fsdp.root_reduction"));
}

// fsdp.fresh_block_grads: on by default; false read and written back.
BOOST_AUTO_TEST_CASE(fresh_block_grads) {
  BOOST_TEST(load(kBase).fsdp.fresh_block_grads);
  const RunConfig c = load(kBase, {"--fsdp.fresh_block_grads=false"});
  BOOST_TEST(!c.fsdp.fresh_block_grads);
  BOOST_TEST(has(resolved_deck_ini(c), "fresh_block_grads = false\n"));
}

// fsdp.no_sync: auto by default; every word read and written back; another word is refused naming the key.
BOOST_AUTO_TEST_CASE(no_sync) {
  BOOST_TEST((load(kBase).fsdp.no_sync == NoSync::Auto));
  for (NoSync n : {NoSync::Off, NoSync::Replicate, NoSync::Full}) {
    const RunConfig c = load(kBase, {concat("--fsdp.no_sync=", no_sync_name(n))});
    BOOST_TEST((c.fsdp.no_sync == n));
    BOOST_TEST(has(resolved_deck_ini(c), concat("no_sync = ", no_sync_name(n), "\n")));
  }
  BOOST_TEST(has(error_of([&] { load(kBase, {"--fsdp.no_sync=sometimes"}); }), "fsdp.no_sync"));
}

// docs/deck.md's key tables are written from the keys' declarations between marker comments: a stale
// row goes, the prose around the tables stays, the committed file is what the declarations give (CTest's
// deck_reference checks the same through `shardlm deck-reference --check`), and a section without its
// markers is an error naming it.
BOOST_AUTO_TEST_CASE(deck_reference_tables_come_from_the_declarations) {
  std::ifstream in(SHARDLM_SOURCE_DIR "/docs/deck.md", std::ios::binary);
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOOST_TEST(deck_reference_tables(doc) == doc);
  const std::string row = "| `offload_resident_gib` | float >= 0 | `0` | cuda | with `cpu_offload = true`";
  BOOST_TEST(has(doc, row));
  std::string stale = doc;
  const size_t at = stale.find(row);
  stale.insert(at, "| `gone` | int | `1` | both | a key that is no more |\n");
  stale.replace(stale.find("| float >= 0 | `0` | cuda | with `cpu_offload"), 10, "| number  ");
  BOOST_TEST(deck_reference_tables(stale) == doc);
  std::string unmarked = doc;
  const size_t end = unmarked.find("<!-- end of the keys of [eval] -->");
  unmarked.erase(end, unmarked.find('\n', end) - end);
  BOOST_TEST(has(error_of([&] { deck_reference_tables(unmarked); }), "no place for the keys of [eval]"));
}

// fsdp.offload_resident_gib: 0 by default; GiB of the root's state kept on the GPU, in bytes in the
// engine's options; refused negative, without cpu_offload, with the root on the host or with offload_dir.
BOOST_AUTO_TEST_CASE(offload_resident_gib) {
  BOOST_TEST(load(kBase).fsdp.offload_resident_gib == 0.0);
  BOOST_TEST(fsdp_options(load(kBase).fsdp).offload_resident_bytes() == 0u);
  const RunConfig c = load(kBase, {"--fsdp.cpu_offload=true", "--fsdp.offload_resident_gib=2.5"});
  BOOST_TEST(c.fsdp.offload_resident_gib == 2.5);
  BOOST_TEST(has(resolved_deck_ini(c), "offload_resident_gib = 2.5\n"));
  BOOST_TEST(fsdp_options(c.fsdp).offload_resident_bytes() == (size_t(5) << 29));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--fsdp.cpu_offload=true", "--fsdp.offload_resident_gib=-1"}); }),
                 "fsdp.offload_resident_gib"));
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--fsdp.offload_resident_gib=1"},
        {"--fsdp.cpu_offload=true", "--fsdp.offload_root_update=host", "--fsdp.offload_resident_gib=1"},
        {"--fsdp.cpu_offload=true", "--fsdp.offload_dir=/tmp", "--fsdp.offload_resident_gib=1"}})
    BOOST_TEST(has(error_of([&] { load(kBase, bad); }), "keeps part of the root unit's optimizer state on the GPU"));
}

// run.trace_step: 0 (no timeline) unless given; negative refused.
BOOST_AUTO_TEST_CASE(trace_step) {
  BOOST_TEST(load(kBase).run.trace_step == 0);
  BOOST_TEST(load(kBase, {"--run.trace_step=5"}).run.trace_step == 5);
  BOOST_TEST(has(error_of([&] { load(kBase, {"--run.trace_step=-1"}); }), "run.trace_step"));
}

// model.head_chunk_tokens: 0 (the family's 2048) unless given; an offloaded engine takes 512 for 0 and
// keeps a given value; negative values are refused.
BOOST_AUTO_TEST_CASE(head_chunk_tokens) {
  const RunConfig c = load(kBase);
  BOOST_TEST(c.model.head_chunk_tokens == 0);
  BOOST_TEST(c.model.head_chunk(100000) == kDefaultHeadChunkTokens);
  BOOST_TEST(c.model.head_chunk(300) == 300);
  FsdpOptions off = fsdp_options(c.fsdp);
  BOOST_TEST(model_for_engine(c.model, off).head_chunk_tokens == 0);
  off.cpu_offload = true;
  BOOST_TEST(model_for_engine(c.model, off).head_chunk(100000) == kOffloadHeadChunkTokens);
  const RunConfig given = load(kBase, {"--model.head_chunk_tokens=1024"});
  BOOST_TEST(given.model.head_chunk_tokens == 1024);
  BOOST_TEST(model_for_engine(given.model, off).head_chunk(100000) == 1024);
  BOOST_TEST(has(resolved_deck_ini(given), "head_chunk_tokens = 1024\n"));
  BOOST_TEST(has(error_of([&] { load(kBase, {"--model.head_chunk_tokens=-1"}); }), "model.head_chunk_tokens"));
}

// A quoted value would keep its quotes (a run folder named '"runs'): refused, with the bare form.
BOOST_AUTO_TEST_CASE(quoted_values_are_refused) {
  std::string m = error_of([&] { load(kBase + "[run]\ndir = \"runs/demo\"\n"); });
  BOOST_TEST(has(m, "run.dir = \"runs/demo\": deck values are written without quotes (dir = runs/demo)"), m);
  m = error_of([&] { load(kBase + "[run]\ndir = 'runs/demo'\n"); });
  BOOST_TEST(has(m, "deck values are written without quotes"), m);
}

BOOST_AUTO_TEST_CASE(missing_files) {
  std::string m = error_of([&] { load_run_config((tmp.root / "nope.ini").string(), {}, 1); });
  BOOST_TEST(has(m, "cannot open input deck '" + (tmp.root / "nope.ini").string() + "'"));
  m = error_of([&] { load(kBase + "[data]\ntrain_file = missing.json\n"); });
  BOOST_TEST(has(m, "is given twice"));  // train_file is also in kBase
  m = error_of([&] { load(kBase, {"--data.train_file=" + (tmp.root / "missing.json").string()}); });
  BOOST_TEST(has(m, "data.train_file = '" + (tmp.root / "missing.json").string() + "': file not found"));
  m = error_of([&] { load(kBase + "[data]\neval_file = gone.json\n"); });
  BOOST_TEST(has(m, "data.eval_file = 'gone.json': file not found"));
  m = error_of([&] { load(kBase + "[data]\neval_file = .\n"); });
  BOOST_TEST(has(m, "data.eval_file"));
}

BOOST_AUTO_TEST_CASE(batch_and_world_size) {
  std::string m = error_of([&] { load(kBase, {"--train.batch_size=6", "--train.micro_batch_size=4"}, 4); });
  BOOST_TEST(has(m, "train.batch_size = 6 is not divisible by micro_batch_size (4) x world size (4): "
                    "set train.batch_size to a multiple of 16"));
  BOOST_TEST(!has(m, "or train.micro_batch_size"));  // 6 samples do not split over 4 ranks
  // The error gives the fix: a batch that divides, or the micro-batch that divides each rank's share.
  m = error_of([&] { load(kBase, {"--train.batch_size=8", "--train.micro_batch_size=4"}, 4); });
  BOOST_TEST(has(m, "train.batch_size = 8 is not divisible by micro_batch_size (4) x world size (4): "
                    "set train.batch_size to a multiple of 16, or train.micro_batch_size to 2"));
  m = error_of([&] { load(kBase, {"--train.batch_size=12", "--train.micro_batch_size=4"}, 2); });
  BOOST_TEST(has(m, "or train.micro_batch_size to 3"));
  RunConfig c = load(kBase, {"--train.batch_size=32", "--train.micro_batch_size=4"}, 4);
  BOOST_TEST(c.grad_accum(4) == 2);
  m = error_of([&] { load(kBase, {"--dist.ranks_per_node=3"}, 4); });
  BOOST_TEST(has(m, "dist.ranks_per_node = 3"));
  c = load(kBase, {"--dist.ranks_per_node=2", "--fsdp.strategy=HYBRID_SHARD"}, 4);
  BOOST_TEST(c.grad_accum(4) == 2);
  c = load(kBase, {"--fsdp.strategy=HYBRID_SHARD"}, 2);  // 0: the real topology
  BOOST_TEST(c.fsdp.strategy == ShardingStrategy::HybridShard);
}

BOOST_AUTO_TEST_CASE(duplicate_key) {
  std::string m = error_of([&] { load(kBase + "lr = 1\nlr = 2\n"); });
  BOOST_TEST(has(m, "train.lr is given twice"));
  BOOST_TEST(has(m, "lines"));
  // The same key in the deck and on the command line is an override, not a duplicate.
  BOOST_TEST(load(kBase + "lr = 1\n", {"--train.lr=2"}).train.lr == 2.0);
}

BOOST_AUTO_TEST_CASE(missing_required_key) {
  std::string m = error_of([&] {
    load("[model]\nvocab_size = 300\nnum_layers = 2\nnum_heads = 4\n"
         "[data]\ntrain_file = train.json\n[train]\nbatch_size = 8\n");
  });
  BOOST_TEST(has(m, "model.hidden_size is required (set it in the deck or with --model.hidden_size=N)"));
  m = error_of([&] {
    load("[model]\nvocab_size = 300\nhidden_size = 64\nnum_layers = 2\nnum_heads = 4\n"
         "[train]\nbatch_size = 8\n");
  });
  BOOST_TEST(has(m, "data.train_file is required"));
  m = error_of([&] { load(kBase, {"--train.batch_size="}); });
  BOOST_TEST(has(m, "train.batch_size is required"));
  // A deck that names no model (as import-accelerate writes one without --model.dir): one error naming
  // every key to add, model.dir first, not the shape of a random model.
  const std::string deck = tmp.write("imported.ini", "[train]\nlr = 1e-4\n[fsdp]\nstrategy = FULL_SHARD\n");
  m = error_of([&] { load_run_config(deck, {}, 1); });
  BOOST_TEST(has(m, "input deck '" + deck + "' is missing model.dir, data.train_file, train.batch_size: add dir = PATH "
                    "under [model], train_file = PATH under [data], batch_size = N under [train] (or give "
                    "--model.dir=PATH --data.train_file=PATH --train.batch_size=N)"));
  BOOST_TEST(has(m, "model.dir is a Hugging Face model folder"));
  BOOST_TEST(!has(m, "vocab_size is required"));
  // With the model named, the data alone.
  const std::string dir = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/tiny_llama";
  m = error_of([&] { load_run_config(deck, {"--model.dir=" + dir, "--data.tokenizer=byte"}, 1); });
  BOOST_TEST(has(m, "is missing data.train_file, train.batch_size: add train_file = PATH under [data], batch_size = N "
                    "under [train]"));
}

// model.dir on the command line points a deck with shape keys at a Hugging Face folder: its config.json
// decides the shape, and the run is told which of the deck's keys went unused. In the deck itself, or with
// shape keys on the command line, the two still contradict each other.
BOOST_AUTO_TEST_CASE(model_dir_on_the_command_line_replaces_the_decks_shape) {
  const std::string dir = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/tiny_qwen3";
  const RunConfig c = load(kBase + "[model]\narch = bloom\n", {"--model.dir=" + dir, "--data.tokenizer=byte"});
  BOOST_TEST(c.model.arch == "qwen3");
  BOOST_TEST(c.model.hidden_size == 32);
  BOOST_TEST_REQUIRE(c.notes.size() == 1u);
  BOOST_TEST(c.notes[0] == "model.dir from the command line: its config.json gives the model's shape; the deck's "
                           "model.arch, model.vocab_size, model.hidden_size, model.num_layers, model.num_heads are not used");
  BOOST_TEST(has(error_of([&] { load(kBase, {"--model.dir=" + dir, "--model.num_layers=3"}); }),
                 "model.num_layers is read from model.dir's config.json; remove it from the command line"));
  BOOST_TEST(has(error_of([&] { load(kBase + "[model]\ndir = " + dir + "\n"); }),
                 "is read from model.dir's config.json; remove it from the deck"));
  BOOST_TEST(load(kBase).notes.empty());
}

// run.smoke: the deck's family at a tiny size, its shape's proportions kept; missing files replaced.
BOOST_AUTO_TEST_CASE(smoke_runs_keep_the_family_and_replace_what_is_missing) {
  // Qwen3 from its folder: grouped heads (2 per key/value head), head_dim apart from hidden/heads.
  const std::string qwen3 = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/tiny_qwen3";
  RunConfig c = load("[model]\ndir = " + qwen3 + "\n[data]\ntrain_file = train.json\n[train]\nbatch_size = 64\n"
                     "micro_batch_size = 8\n[run]\ndir = runs/q\n",
                     {"--run.smoke=true"}, 2);
  BOOST_TEST(c.model.arch == "qwen3");
  BOOST_TEST(c.model.num_layers == 2);
  BOOST_TEST(c.model.num_kv_heads == 2);
  BOOST_TEST(c.model.num_heads == 4);
  BOOST_TEST(c.model.head_size == 16);
  BOOST_TEST(c.model.hidden_size == 32);  // heads x head_dim twice the width, as in the folder's config
  BOOST_TEST(c.model.dir.empty());       // random weights: the folder's are another size
  BOOST_TEST(c.model.vocab_size == 259);
  BOOST_TEST((c.data.tokenizer == TokenizerSource::Byte));
  BOOST_TEST(c.train.batch_size == 4);   // micro-batch 1 x accumulation 2 x 2 ranks
  BOOST_TEST(c.grad_accum(2) == 2);
  BOOST_TEST(c.train.max_steps == 2);
  BOOST_TEST(c.run.dir == "runs/q-smoke");
  BOOST_TEST(!c.data.train_file.empty());  // the deck's file is here: kept
  // Llama-3.1-8B's shape in the deck (32 heads over 8, untied): 4 query heads per key/value head.
  c = load("[model]\narch = llama\nvocab_size = 128256\nhidden_size = 4096\nnum_layers = 32\nnum_heads = 32\n"
           "num_kv_heads = 8\nintermediate_size = 14336\n[data]\ntrain_file = missing.jsonl\nformat = jsonl\n"
           "[train]\nbatch_size = 8\n", {"--run.smoke=true", "--run.dir=/tmp/x"});
  BOOST_TEST(c.model.num_heads == 8);
  BOOST_TEST(c.model.num_kv_heads == 2);
  BOOST_TEST(c.model.hidden_size == 128);
  BOOST_TEST(c.model.intermediate_size == 448);  // 3.5 x the width, as 14336 / 4096
  BOOST_TEST(!c.model.tie_word_embeddings);
  BOOST_TEST(c.data.train_file.empty());  // synthetic text
  BOOST_TEST(c.run.dir == "/tmp/x");      // as the command line says
  BOOST_TEST(!c.run.overwrite);
  bool said = false;
  for (const std::string& n : c.notes) said = said || has(n, "missing.jsonl': file not found");
  BOOST_TEST(said);
  // A missing model folder: the family its name says.
  c = load("[model]\ndir = models/Qwen2.5-0.5B\n[data]\ntrain_file = train.json\n[train]\nbatch_size = 8\n",
           {"--run.smoke=true"});
  BOOST_TEST(c.model.arch == "qwen2");
  BOOST_TEST(c.model.num_kv_heads == 2);
  // Separators inside a family's name do not hide it (the Phi-3 and Gemma 3 decks' folders).
  for (const auto& [dir, family] : std::vector<std::pair<std::string, std::string>>{
           {"models/Phi-3-mini-4k-instruct", "phi3"}, {"models/gemma-3-1b-pt", "gemma3"}, {"models/Qwen3-1.7B", "qwen3"}}) {
    c = load("[model]\ndir = " + dir + "\n[data]\ntrain_file = train.json\n[train]\nbatch_size = 8\n", {"--run.smoke=true"});
    BOOST_TEST(c.model.arch == family, dir);
    if (family == "gemma3") {  // a local layer with a window, then a global one: what config.json can say
      BOOST_TEST(c.model.sliding_window == 64);
      BOOST_TEST(c.model.sliding_window_pattern == 2);
      BOOST_TEST(c.model.layer_is_local(0));
      BOOST_TEST(!c.model.layer_is_local(1));
    }
  }
  // No family in the name: BLOOM, and the note says how to choose one.
  c = load("[model]\ndir = models/my-model\n[data]\ntrain_file = train.json\n[train]\nbatch_size = 8\n", {"--run.smoke=true"});
  BOOST_TEST(c.model.arch == "bloom");
  said = false;
  for (const std::string& n : c.notes) said = said || has(n, "--model.dir= --model.arch=FAMILY");
  BOOST_TEST(said);
  // Without run.smoke the same deck stops at the missing folder.
  BOOST_TEST(has(error_of([&] { load("[model]\ndir = models/Qwen2.5-0.5B\n[data]\ntrain_file = train.json\n"
                                     "[train]\nbatch_size = 8\n"); }),
                 "model.dir = 'models/Qwen2.5-0.5B': is not a directory"));
}

// A missing model folder and no shape keys (a shipped deck without its model) leave no proportions to keep: the
// heads are the family's default, which the run says with how to give the model's own; given, they are kept.
BOOST_AUTO_TEST_CASE(a_smoke_run_without_a_shape_says_the_familys_default_is_used) {
  const auto note_with = [](const RunConfig& c, const std::string& text) {
    return std::any_of(c.notes.begin(), c.notes.end(), [&](const std::string& n) { return has(n, text); });
  };
  const std::string deck = "[model]\ndir = models/llama-3.1-8b\n[data]\ntrain_file = train.json\n[train]\nbatch_size = 8\n";
  RunConfig c = load(deck, {"--run.smoke=true"});
  BOOST_TEST(c.model.arch == "llama");
  BOOST_TEST(c.model.num_heads == 4);
  BOOST_TEST(c.model.num_kv_heads == 2);
  BOOST_TEST(note_with(c, "llama of 2 layers, width 64, 4 heads over 2 key/value heads; random weights (the "
                          "family's default shape: no config.json or shape keys give the model's; "
                          "--model.dir= --model.arch=llama --model.num_heads=N --model.num_kv_heads=K do)"));
  // Llama-3.1-8B's 32 heads over 8 given on the command line: 8 over 2, and no such note.
  c = load(deck, {"--run.smoke=true", "--model.dir=", "--model.arch=llama", "--model.num_heads=32",
                  "--model.num_kv_heads=8"});
  BOOST_TEST(c.model.num_heads == 8);
  BOOST_TEST(c.model.num_kv_heads == 2);
  BOOST_TEST(!note_with(c, "default shape"));
  // A config.json's shape is the model's own.
  const std::string qwen3 = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/tiny_qwen3";
  c = load("[model]\ndir = " + qwen3 + "\n[data]\ntrain_file = train.json\n[train]\nbatch_size = 8\n", {"--run.smoke=true"});
  BOOST_TEST(!note_with(c, "default shape"));
  BOOST_TEST(note_with(c, "(shape from " + qwen3 + "/config.json)"));
}

BOOST_AUTO_TEST_CASE(syntax_errors) {
  std::string m = error_of([&] { load(kBase + "just words\n"); });
  BOOST_TEST(has(m, "line 10"));
  BOOST_TEST(has(m, "just words"));
  m = error_of([&] { load(kBase + "[]\n"); });
  BOOST_TEST(has(m, "bad section header"));
}

BOOST_AUTO_TEST_CASE(resolved_round_trip) {
  RunConfig a = load(kBase + "lr = 3e-4\nadam_eps = 1e-7\nseed = 123456789012345\nshuffle = 0\n"
                             "[model]\nlayer_norm_eps = 1e-5\ninit_std = 0.0123456789\n"
                             "[data]\neval_file = eval.json\n[fsdp]\nstrategy = hybrid_shard\n"
                             "param_dtype = bfloat16\n[run]\ndir = my run/x\n",
                     {"--train.weight_decay=0.1", "--train.max_grad_norm=0.30000000000000004"}, 2);
  std::string ini = resolved_deck_ini(a);
  // One header line (the log prints it as it is), then the sections.
  BOOST_TEST(ini.rfind("# shardlm " SHARDLM_VERSION ": resolved input deck\n\n[model]\n", 0) == 0);
  BOOST_TEST(std::count(ini.begin(), ini.end(), '#') == 1);
  BOOST_TEST(has(ini, "[train]\nepochs = 1\n"));
  // Loaded again from another folder: paths are absolute, every value parses back the same.
  std::string again = tmp.write("other/resolved.ini", ini);
  RunConfig b = load_run_config(again, {}, 2);
  BOOST_TEST((a.resolved == b.resolved));
  BOOST_TEST(resolved_deck_ini(b) == ini);
  BOOST_TEST(b.train.max_grad_norm == 0.30000000000000004);
  BOOST_TEST(b.model.init_std == a.model.init_std);
  BOOST_TEST(b.train.seed == 123456789012345ull);
  BOOST_TEST(b.run.dir == "my run/x");
}

// ---- [lora] and model.adapter ----------------------------------------------------------------

// kBase's shape as a Llama (untied head): its linear modules are q_proj .. down_proj.
const std::string kLlama = kBase + "[model]\narch = llama\n";

BOOST_AUTO_TEST_CASE(lora_is_off_without_its_section) {
  const RunConfig c = load(kLlama);
  BOOST_TEST(!c.model.lora.enabled());
  for (const auto& kv : c.resolved) BOOST_TEST(kv.first.rfind("lora.", 0) != 0u, kv.first);
  BOOST_TEST(resolved_deck_ini(c).find("[lora]") == std::string::npos);
  BOOST_TEST(value_of(c, "model.adapter") == "");
}

BOOST_AUTO_TEST_CASE(lora_section_values) {
  const RunConfig c = load(kLlama + "[lora]\nr = 16\nalpha = 32\ndropout = 0.05\n"
                                    "target_modules = v_proj, q_proj ,q_proj\nmodules_to_save = lm_head,model.norm,embed_tokens\n"
                                    "use_rslora = true\ninit = Gaussian\n");
  const LoraConfig& l = c.model.lora;
  BOOST_TEST(l.enabled());
  BOOST_TEST(l.r == 16);
  BOOST_TEST(l.alpha == 32.0);
  BOOST_TEST(l.dropout == 0.05);
  // Resolved in the family's order, the repeat gone.
  BOOST_TEST((l.target_modules == std::vector<std::string>{"q_proj", "v_proj"}));
  BOOST_TEST((l.modules_to_save == std::vector<std::string>{"embed_tokens", "model.norm", "lm_head"}));
  BOOST_TEST(l.use_rslora);
  BOOST_TEST(l.init == LoraInit::Gaussian);
  BOOST_TEST(value_of(c, "lora.target_modules") == "q_proj,v_proj");
  BOOST_TEST(value_of(c, "lora.modules_to_save") == "embed_tokens,model.norm,lm_head");
  BOOST_TEST(value_of(c, "lora.init") == "gaussian");
}

BOOST_AUTO_TEST_CASE(lora_defaults_and_all_linear) {
  const RunConfig c = load(kLlama + "[lora]\nr = 8\ntarget_modules = all-linear\n");
  const LoraConfig& l = c.model.lora;
  BOOST_TEST(l.alpha == 8.0);  // PEFT's default
  BOOST_TEST(l.dropout == 0.0);
  BOOST_TEST(l.modules_to_save.empty());
  BOOST_TEST(!l.use_rslora);
  BOOST_TEST(l.init == LoraInit::Kaiming);
  BOOST_TEST((l.target_modules ==
              std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  // all-linear with names beside it is still every module, in order.
  BOOST_TEST(load(kLlama, {"--lora.r=2", "--lora.target_modules=down_proj,all-linear"}).model.lora.target_modules ==
             l.target_modules);
  // BLOOM's modules.
  const RunConfig b = load(kBase + "[lora]\nr = 4\ntarget_modules = all-linear\n");
  BOOST_TEST((b.model.lora.target_modules ==
              std::vector<std::string>{"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}));
  // BLOOM's root modules (its head is tied: the embedding is not one), by any end of their paths as PEFT
  // matches them, resolved to the shortest name that selects each alone.
  BOOST_TEST((load(kBase, {"--lora.r=4", "--lora.target_modules=dense,query_key_value",
                           "--lora.modules_to_save=transformer.ln_f,word_embeddings_layernorm"})
                  .model.lora.modules_to_save == std::vector<std::string>{"word_embeddings_layernorm", "ln_f"}));
}

BOOST_AUTO_TEST_CASE(lora_refusals) {
  const auto refused = [&](const std::string& deck, const std::vector<std::string>& overrides = {}) {
    return error_of([&] { load(deck, overrides); });
  };
  // The section without its required keys.
  BOOST_TEST(has(refused(kLlama + "[lora]\ntarget_modules = q_proj\n"), "lora.r is required"));
  BOOST_TEST(has(refused(kLlama, {"--lora.alpha=16"}), "lora.r is required"));
  BOOST_TEST(has(refused(kLlama + "[lora]\nr = 8\n"), "lora.target_modules is required"));
  BOOST_TEST(has(refused(kLlama + "[lora]\nr = 8\ntarget_modules =\n"), "lora.target_modules is required"));
  // Values out of range.
  const std::string lora = kLlama + "[lora]\ntarget_modules = q_proj\n";
  BOOST_TEST(has(refused(lora, {"--lora.r=0"}), "lora.r = 0: must be >= 1"));
  BOOST_TEST(has(refused(lora, {"--lora.r=8", "--lora.alpha=0"}), "lora.alpha = 0: must be > 0"));
  BOOST_TEST(has(refused(lora, {"--lora.r=8", "--lora.dropout=1"}), "lora.dropout = 1: must be in [0, 1)"));
  BOOST_TEST(has(refused(lora, {"--lora.r=8", "--lora.dropout=-0.1"}), "lora.dropout = -0.1: must be in [0, 1)"));
  BOOST_TEST(has(refused(lora, {"--lora.r=8", "--lora.use_rslora=maybe"}), "lora.use_rslora = 'maybe'"));
  BOOST_TEST(has(refused(lora, {"--lora.r=8", "--lora.init=pissa"}), "lora.init = 'pissa': must be kaiming or gaussian"));
  // Names the family does not have, each message listing the valid ones.
  BOOST_TEST(has(refused(kLlama + "[lora]\nr = 8\ntarget_modules = q_proj,foo\n"),
                 "lora.target_modules = 'q_proj,foo': 'foo' is not a linear module of llama: must be q_proj, k_proj, "
                 "v_proj, o_proj, gate_proj, up_proj, down_proj or all-linear"));
  BOOST_TEST(has(refused(kBase + "[lora]\nr = 8\ntarget_modules = q_proj\n"),
                 "'q_proj' is not a linear module of bloom: must be query_key_value, dense, dense_h_to_4h, "
                 "dense_4h_to_h or all-linear"));
  BOOST_TEST(has(refused(kLlama + "[lora]\nr = 8\ntarget_modules = q_proj,,v_proj\n"),
                 "lora.target_modules = 'q_proj,,v_proj': an empty name"));
  BOOST_TEST(has(refused(lora, {"--lora.r=8", "--lora.modules_to_save=classifier"}),
                 "lora.modules_to_save = 'classifier': 'classifier' is not a module of llama that can be trained "
                 "whole: must be embed_tokens, model.norm or lm_head"));
  // PEFT's 'norm' selects every module whose path ends in it: each block's norms too, which shardlm
  // does not train whole (model.norm names the final norm alone); a block's module likewise.
  const std::string norm = refused(lora, {"--lora.r=8", "--lora.modules_to_save=norm"});
  BOOST_TEST(has(norm, "lora.modules_to_save = 'norm': 'norm' selects model.layers.0.input_layernorm and 3 more "
                       "module(s) (PEFT trains every module whose path ends with the name)"), norm);
  BOOST_TEST(has(norm, "not of the blocks: must be embed_tokens, model.norm or lm_head"), norm);
  BOOST_TEST(has(refused(lora, {"--lora.r=8", "--lora.modules_to_save=post_attention_layernorm"}),
                 "'post_attention_layernorm' selects model.layers.0.post_attention_layernorm and 1 more"));
  BOOST_TEST(has(refused(lora, {"--lora.r=8", "--lora.modules_to_save=model"}), "'model' selects model"));
  // A tied head and its embedding are one matrix, which PEFT would train as two: refused, BLOOM's
  // always, Llama's with tie_word_embeddings, saying what is valid.
  const std::string bloom_head = refused(kBase + "[lora]\nr = 8\ntarget_modules = dense\nmodules_to_save = lm_head\n");
  BOOST_TEST(has(bloom_head, "lora.modules_to_save = 'lm_head': 'lm_head' selects lm_head, but this bloom model's LM "
                             "head is tied to its embedding"), bloom_head);
  BOOST_TEST(has(bloom_head, "Valid here: must be word_embeddings_layernorm or ln_f"), bloom_head);
  BOOST_TEST(has(refused(kBase + "[lora]\nr = 8\ntarget_modules = dense\nmodules_to_save = word_embeddings\n"),
                 "'word_embeddings' selects transformer.word_embeddings, but this bloom model's LM head is tied"));
  for (const char* tied : {"lm_head", "embed_tokens"})
    BOOST_TEST(has(refused(lora, {"--lora.r=8", concat("--lora.modules_to_save=", tied), "--model.tie_word_embeddings=true"}),
                   "but this llama model's LM head is tied to its embedding (one matrix)"), tied);
  // Unknown keys of the section get the nearest one.
  BOOST_TEST(has(refused(kLlama + "[lora]\nrank = 8\n"), "unknown key 'lora.rank'"));
  BOOST_TEST(has(refused(kLlama, {"--lora.alpah=16"}), "(did you mean 'lora.alpha'?)"));
}

// The family comes from model.dir's config.json: the names are checked against it, not the deck's arch.
BOOST_AUTO_TEST_CASE(lora_names_checked_against_model_dir) {
  const std::string dir = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/tiny_llama";
  const std::string deck = "[model]\ndir = " + dir + "\n[data]\ntrain_file = train.json\ntokenizer = byte\n"
                           "[train]\nbatch_size = 8\n[lora]\nr = 4\n";
  BOOST_TEST(load(deck + "target_modules = all-linear\n").model.lora.target_modules.size() == 7u);
  BOOST_TEST(has(error_of([&] { load(deck + "target_modules = query_key_value\n"); }),
                 "'query_key_value' is not a linear module of llama"));
}

BOOST_AUTO_TEST_CASE(lora_resolved_round_trip) {
  const RunConfig a = load(kLlama + "[lora]\nr = 16\nalpha = 0.1\ndropout = 0.05\ntarget_modules = all-linear\n"
                                    "modules_to_save = lm_head\nuse_rslora = yes\ninit = gaussian\n");
  const std::string ini = resolved_deck_ini(a);
  BOOST_TEST(has(ini, "[lora]\nr = 16\nalpha = 0.1\ndropout = 0.05\n"
                      "target_modules = q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj\n"
                      "modules_to_save = lm_head\nuse_rslora = true\ninit = gaussian\n"));
  const RunConfig b = load_run_config(tmp.write("other/resolved.ini", ini), {}, 1);
  BOOST_TEST((a.resolved == b.resolved));
  BOOST_TEST(resolved_deck_ini(b) == ini);
  BOOST_TEST(b.model.lora.alpha == 0.1);
  BOOST_TEST((b.model.lora.target_modules == a.model.lora.target_modules));
  BOOST_TEST(b.model.lora.init == LoraInit::Gaussian);
}

// An adapter folder in the temp dir: adapter_config.json as given (PEFT's format), a placeholder
// adapter_model.safetensors (the deck only checks that it is there; read_peft_adapter reads it).
std::string adapter_folder(const TempDir& tmp, const std::string& config) {
  tmp.write("adapter/adapter_model.safetensors", "");
  tmp.write("adapter/adapter_config.json", config);
  return (tmp.root / "adapter").string();
}

std::string peft_llama_config() {
  std::ifstream in(SHARDLM_SOURCE_DIR "/tests/fixtures/peft/adapter_config_llama.json");
  BOOST_REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

BOOST_AUTO_TEST_CASE(model_adapter_supplies_lora) {
  const std::string adapter = adapter_folder(tmp, peft_llama_config());
  const RunConfig c = load(kLlama + "[model]\nadapter = adapter\n");
  BOOST_TEST(c.model.adapter == adapter);
  const LoraConfig& l = c.model.lora;
  BOOST_TEST(l.r == 16);
  BOOST_TEST(l.alpha == 32.0);
  BOOST_TEST(l.dropout == 0.05);
  BOOST_TEST((l.target_modules == std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  BOOST_TEST(l.modules_to_save.empty());
  // The resolved deck holds the adapter's values and loads again.
  const std::string ini = resolved_deck_ini(c);
  BOOST_TEST(has(ini, "adapter = " + adapter + "\n"));
  BOOST_TEST(has(ini, "[lora]\nr = 16\nalpha = 32\n"));
  const RunConfig again = load_run_config(tmp.write("other/resolved.ini", ini), {}, 1);
  BOOST_TEST((again.resolved == c.resolved));

  // The deck may repeat the adapter's values (in any order), and set how training goes on.
  const RunConfig same = load(kLlama + "[model]\nadapter = adapter\n[lora]\nr = 16\ntarget_modules = down_proj,v_proj,q_proj\n"
                                       "dropout = 0.1\n");
  BOOST_TEST(same.model.lora.dropout == 0.1);
  BOOST_TEST(same.model.lora.r == 16);
  // Not change what the adapters are: each disagreement names both values.
  const auto refused = [&](const std::string& override_) {
    return error_of([&] { load(kLlama + "[model]\nadapter = adapter\n", {override_}); });
  };
  const std::string file = adapter + "/adapter_config.json";
  BOOST_TEST(has(refused("--lora.r=8"), "lora.r = 8 disagrees with " + file + " (r = 16)"));
  BOOST_TEST(has(refused("--lora.alpha=16"), "lora.alpha = 16 disagrees with " + file + " (lora_alpha = 32)"));
  BOOST_TEST(has(refused("--lora.target_modules=q_proj"),
                 "lora.target_modules = 'q_proj' disagrees with " + file + " (target_modules = 'q_proj,v_proj,down_proj')"));
  BOOST_TEST(has(refused("--lora.modules_to_save=lm_head"), "(modules_to_save = '')"));
  BOOST_TEST(has(refused("--lora.use_rslora=true"), "(use_rslora = false)"));
  // The adapter's names are checked against the model's family too.
  const std::string bloom = error_of([&] { load(kBase + "[model]\nadapter = adapter\n"); });
  BOOST_TEST(has(bloom, file + ": target_modules = "));
  BOOST_TEST(has(bloom, "'v_proj' is not a linear module of bloom"));
}

// An adapter PEFT saved (tests/fixtures/peft/tiny_llama_lora, made by make_lora_parity.py) on the
// model it was made for.
BOOST_AUTO_TEST_CASE(model_adapter_of_peft_beside_its_base) {
  const RunConfig c = load("[model]\ndir = " SHARDLM_SOURCE_DIR "/tests/fixtures/hf/tiny_llama\n"
                           "adapter = " SHARDLM_SOURCE_DIR "/tests/fixtures/peft/tiny_llama_lora\n"
                           "[data]\ntrain_file = train.json\ntokenizer = byte\n[train]\nbatch_size = 8\n");
  BOOST_TEST(c.model.lora.r == 4);
  BOOST_TEST(c.model.lora.alpha == 8.0);
  BOOST_TEST(value_of(c, "lora.target_modules") == "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
}

BOOST_AUTO_TEST_CASE(model_adapter_folder_refusals) {
  BOOST_TEST(has(error_of([&] { load(kLlama + "[model]\nadapter = nowhere\n"); }),
                 "model.adapter = 'nowhere': is not a directory"));
  tmp.write("half/adapter_config.json", peft_llama_config());
  BOOST_TEST(has(error_of([&] { load(kLlama + "[model]\nadapter = half\n"); }),
                 "model.adapter = 'half': has no adapter_model.safetensors (a PEFT adapter directory is expected)"));
  adapter_folder(tmp, "{\"peft_type\": \"LORA\", \"r\": 8, \"target_modules\": [\"q_proj\"], \"use_dora\": true}");
  BOOST_TEST(has(error_of([&] { load(kLlama + "[model]\nadapter = adapter\n"); }), "use_dora = true: not supported"));
  // Beside model.dir (the adapter is not part of the shape).
  adapter_folder(tmp, peft_llama_config());
  const std::string dir = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/tiny_llama";
  const RunConfig c = load("[model]\ndir = " + dir + "\nadapter = adapter\n[data]\ntrain_file = train.json\n"
                           "tokenizer = byte\n[train]\nbatch_size = 8\n");
  BOOST_TEST(c.model.lora.r == 16);
  BOOST_TEST(c.model.num_kv_heads == 2);
}

BOOST_AUTO_TEST_CASE(demo_deck_loads) {
#ifdef SHARDLM_SOURCE_DIR
  // Copied next to placeholder data files: input/data/ is not this module's to write.
  fs::path demo = fs::path(SHARDLM_SOURCE_DIR) / "input/demo.ini";
  fs::copy_file(demo, tmp.root / "demo.ini");
  tmp.write("data/demo_squad_train.json", "{}");
  tmp.write("data/demo_squad_eval.json", "{}");
  RunConfig c = load_run_config((tmp.root / "demo.ini").string(), {}, 2);
  BOOST_TEST(c.model.vocab_size == 259);
  BOOST_TEST(c.model.hidden_size == 128);
  BOOST_TEST(c.data.format == DataFormat::Squad);
  BOOST_TEST(c.data.train_file == (fs::absolute(tmp.root) / "data/demo_squad_train.json").string());
  BOOST_TEST(c.train.batch_size == 8);
  BOOST_TEST(c.train.log_every == 5);
  BOOST_TEST(c.run.dir == "runs/demo");
  BOOST_TEST(c.grad_accum(2) == 2);
  BOOST_TEST(c.grad_accum(4) == 1);  // the README's 4-rank examples divide
#else
  BOOST_TEST_MESSAGE("SHARDLM_SOURCE_DIR not defined: demo deck not checked");
#endif
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(edit_distance_values) {
  BOOST_TEST(edit_distance("", "") == 0u);
  BOOST_TEST(edit_distance("abc", "") == 3u);
  BOOST_TEST(edit_distance("", "abc") == 3u);
  BOOST_TEST(edit_distance("abc", "abc") == 0u);
  BOOST_TEST(edit_distance("kitten", "sitting") == 3u);
  BOOST_TEST(edit_distance("flaw", "lawn") == 2u);
  BOOST_TEST(edit_distance("trian.lr", "train.lr") == 2u);
  BOOST_TEST(edit_distance("train.lrr", "train.lr") == 1u);
  BOOST_TEST(edit_distance("a", "b") == 1u);
}

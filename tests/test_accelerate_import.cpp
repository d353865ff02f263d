#define BOOST_TEST_MODULE test_accelerate_import
#include <boost/test/unit_test.hpp>
// test_accelerate_import: `shardlm import-accelerate` turns the Accelerate configs shipped in
// input/accelerate/ (the course's own and two variants) and TrainingArguments into decks that load,
// with the settings they name; every key gets a comment; differences are warned; bad input is an
// error naming the key; docs/accelerate.md lists every key the importer knows.

#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>

#include "accelerate_import.hpp"
#include "config_test_support.hpp"
#include "shardlm/config.hpp"
#include "shardlm/model.hpp"
#include "temp_dir.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace shardlm;

namespace {

const fs::path kSource = SHARDLM_SOURCE_DIR;
const fs::path kExamples = kSource / "input" / "accelerate";

std::string read_text(const fs::path& p) { return read_text_file(p.string()); }

// A model folder (tiny Llama's config.json, a tokenizer) and a SQuAD file the decks can name.
struct Stand_ins {
  TempDir dir{"accelerate"};
  std::string model, train, eval;
  Stand_ins() {
    dir.write("model/config.json", read_text(kSource / "tests/fixtures/hf/tiny_llama/config.json"));
    dir.write("model/tokenizer.json", kTinyTokenizerJson);
    model = (dir.root / "model").string();
    train = (kSource / "input/data/demo_squad_train.json").string();
    eval = (kSource / "input/data/demo_squad_eval.json").string();
  }
  std::vector<std::string> keys() const {
    return {"--model.dir=" + model, "--data.train_file=" + train, "--data.eval_file=" + eval};
  }
};

AccelerateImport convert(const std::string& yaml, const std::string& args_json, const std::vector<std::string>& keys) {
  return import_accelerate(read_text(kExamples / yaml), yaml,
                           args_json.empty() ? "" : read_text(kExamples / args_json), args_json, keys, "test");
}

// The deck written to a file and loaded as `shardlm train` would, on `ranks` ranks.
RunConfig load(const TempDir& dir, const AccelerateImport& im, int ranks) {
  const std::string deck = dir.write("deck.ini", im.deck);
  return load_run_config(deck, {}, ranks);
}

// An example converted with the stand-ins' keys and loaded on the ranks it asks for.
struct Loaded {
  Stand_ins s;
  AccelerateImport im;
  RunConfig cfg;
  Loaded(const std::string& yaml, const std::string& args, int ranks) : im(convert(yaml, args, s.keys())) {
    BOOST_TEST(im.ranks == ranks);
    cfg = load(s.dir, im, ranks);
  }
};

bool has_warning(const AccelerateImport& im, const std::string& part) {
  for (const std::string& w : im.warnings)
    if (contains(w, part)) return true;
  return false;
}

std::string converted_text(const std::string& yaml, const std::string& args) {
  return import_accelerate(yaml, "c.yaml", args, "args.json", {}, "test").deck;
}

const char* kFsdpYaml = "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n";

}  // namespace

// The deck shipped beside the course's config is what the importer writes today.
BOOST_AUTO_TEST_CASE(shipped_course_deck_is_the_importers_output) {
  const std::string shipped = read_text(kExamples / "course-fsdp-4gpu.ini");
  const std::string command = shipped.substr(std::string("# Written by: ").size(),
                                             shipped.find('\n') - std::string("# Written by: ").size());
  std::vector<std::string> keys;
  std::istringstream words(command);
  for (std::string w; words >> w;)
    if (w.rfind("--", 0) == 0 && w.find('.') < w.find('=')) keys.push_back(w);
  BOOST_TEST(keys.size() == 3u);
  const AccelerateImport im = import_accelerate(read_text(kExamples / "course-fsdp-4gpu.yaml"), "course-fsdp-4gpu.yaml",
                         read_text(kExamples / "squad-training-args.json"), "squad-training-args.json", keys, command);
  BOOST_TEST(im.deck == shipped, "input/accelerate/course-fsdp-4gpu.ini differs from what `" << command
                                     << "` writes now: run it again from input/accelerate/");
}

BOOST_AUTO_TEST_CASE(course_config_and_tutorial_arguments_load_with_their_settings) {
  const Loaded l("course-fsdp-4gpu.yaml", "squad-training-args.json", 4);
  const AccelerateImport& im = l.im;
  const RunConfig& cfg = l.cfg;
  BOOST_TEST(cfg.fsdp.strategy == ShardingStrategy::FullShard);
  BOOST_TEST(cfg.fsdp.param_dtype == DType::BF16);
  BOOST_TEST(cfg.fsdp.reduce_dtype == DType::BF16);
  BOOST_TEST(cfg.fsdp.backward_prefetch == BackwardPrefetch::Pre);
  BOOST_TEST(cfg.fsdp.forward_prefetch);
  BOOST_TEST(!cfg.fsdp.cpu_offload);
  BOOST_TEST(!cfg.fsdp.activation_checkpointing);
  BOOST_TEST(cfg.run.backend == BackendKind::Cuda);
  BOOST_TEST(cfg.train.micro_batch_size == 1);
  BOOST_TEST(cfg.grad_accum(4) == 4);
  BOOST_TEST(cfg.train.batch_size == 16);
  BOOST_TEST(cfg.train.epochs == 5);
  BOOST_TEST(cfg.train.lr == 5e-5);
  BOOST_TEST(cfg.train.weight_decay == 0.01);
  BOOST_TEST(cfg.train.lr_schedule == LrSchedule::Linear);
  BOOST_TEST(cfg.checkpoint.every == 50);
  BOOST_TEST(cfg.checkpoint.keep_last == 3);
  BOOST_TEST(cfg.run.dir == "runs/accelerate-squad");
  BOOST_TEST(has_warning(im, "fsdp_state_dict_type"));
}

BOOST_AUTO_TEST_CASE(hybrid_offload_fp16_variant_loads_on_its_eight_ranks) {
  const Loaded l("hybrid-offload-2nodes-fp16.yaml", "", 8);
  const AccelerateImport& im = l.im;
  const RunConfig& cfg = l.cfg;
  BOOST_TEST(cfg.fsdp.strategy == ShardingStrategy::HybridShard);
  BOOST_TEST(cfg.fsdp.cpu_offload);
  BOOST_TEST(cfg.fsdp.activation_checkpointing);
  BOOST_TEST(!cfg.fsdp.forward_prefetch);
  BOOST_TEST(cfg.fsdp.param_dtype == DType::F16);
  BOOST_TEST(cfg.train.loss_scale == 0.0);  // 0: dynamic scaling on, since fp16 is used
  // No TrainingArguments: Trainer's defaults, not shardlm's.
  BOOST_TEST(cfg.train.micro_batch_size == 8);
  BOOST_TEST(cfg.train.batch_size == 64);
  BOOST_TEST(cfg.train.epochs == 3);
  BOOST_TEST(cfg.train.weight_decay == 0.0);
  BOOST_TEST(cfg.train.log_every == 500);
  BOOST_TEST(cfg.checkpoint.every == 500);
  BOOST_TEST(cfg.checkpoint.keep_last == 0);
  BOOST_TEST(cfg.run.dir == "trainer_output");
  BOOST_TEST(has_warning(im, "FULL_STATE_DICT"));
  BOOST_TEST(has_warning(im, "dataloader_drop_last"));
  BOOST_TEST(!has_warning(im, "fsdp_transformer_layer_cls_to_wrap"));  // LlamaDecoderLayer is shardlm's block
}

BOOST_AUTO_TEST_CASE(fsdp2_without_resharding_is_shard_grad_op) {
  Stand_ins s;
  const AccelerateImport im = convert("fsdp2-shard-grad-op.yaml", "squad-training-args.json", s.keys());
  const RunConfig cfg = load(s.dir, im, 2);
  BOOST_TEST(cfg.fsdp.strategy == ShardingStrategy::ShardGradOp);
  BOOST_TEST(cfg.fsdp.backward_prefetch == BackwardPrefetch::Pre);  // FSDP2 always prefetches as BACKWARD_PRE
  BOOST_TEST(!cfg.fsdp.forward_prefetch);  // and has no forward prefetch in Accelerate
  BOOST_TEST(contains(im.deck, "fsdp_version 2: FSDP2 always prefetches the next block before this block's backward"),
             im.deck);
  BOOST_TEST(cfg.train.batch_size == 8);
}

// FSDP2 has no prefetch settings: backward prefetch is always BACKWARD_PRE's, forward prefetch is not done in
// Accelerate. Absent keys say so; a key asking for something else is ignored with a warning, as Accelerate does.
BOOST_AUTO_TEST_CASE(fsdp2_prefetches_backward_pre_and_never_forward) {
  const std::string v2 = "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n";
  const AccelerateImport absent = import_accelerate(v2, "c.yaml", "", "", {}, "test");
  BOOST_TEST(contains(absent.deck, "backward_prefetch = pre\n"), absent.deck);
  BOOST_TEST(contains(absent.deck, "forward_prefetch = false\n"), absent.deck);
  BOOST_TEST(contains(absent.deck, "fsdp_version 2: FSDP2 in Accelerate has no forward prefetch"), absent.deck);
  BOOST_TEST(!has_warning(absent, "prefetch"));
  for (const char* value : {"NO_PREFETCH", "BACKWARD_POST"}) {
    BOOST_TEST_CONTEXT(value) {
      const AccelerateImport im = import_accelerate(concat(v2, "  fsdp_backward_prefetch: ", value, "\n"), "c.yaml", "", "", {}, "test");
      BOOST_TEST(contains(im.deck, "backward_prefetch = pre\n"), im.deck);
      BOOST_TEST(has_warning(im, "fsdp_backward_prefetch: " + std::string(value) + ": ignored with fsdp_version 2"));
    }
  }
  const AccelerateImport pre = import_accelerate(v2 + "  fsdp_backward_prefetch: BACKWARD_PRE\n", "c.yaml", "", "", {}, "test");
  BOOST_TEST(contains(pre.deck, "backward_prefetch = pre\n"), pre.deck);
  BOOST_TEST(!has_warning(pre, "prefetch"));
  const AccelerateImport forward = import_accelerate(v2 + "  fsdp_forward_prefetch: true\n", "c.yaml", "", "", {}, "test");
  BOOST_TEST(contains(forward.deck, "forward_prefetch = false\n"), forward.deck);
  BOOST_TEST(has_warning(forward, "fsdp_forward_prefetch: true: not done with fsdp_version 2"));
  // TrainingArguments' fsdp_config under Accelerate's FSDP2 is FSDP2's too.
  const AccelerateImport trainer =
      import_accelerate(v2, "c.yaml", R"({"fsdp_config": {"backward_prefetch": "backward_post"}})", "a.json", {}, "test");
  BOOST_TEST(contains(trainer.deck, "backward_prefetch = pre\n"), trainer.deck);
  BOOST_TEST(has_warning(trainer, "ignored with fsdp_version 2"));
  // FSDP1 without the key prefetches nothing, as before.
  BOOST_TEST(contains(converted_text(kFsdpYaml, ""), "backward_prefetch = none\n"));
}

// Every key of both files is named in a comment line of the deck.
BOOST_AUTO_TEST_CASE(every_key_of_both_files_has_a_comment_line) {
  for (const char* yaml : {"course-fsdp-4gpu.yaml", "hybrid-offload-2nodes-fp16.yaml", "fsdp2-shard-grad-op.yaml"}) {
    BOOST_TEST_CONTEXT(yaml) {
      const AccelerateImport im = convert(yaml, "squad-training-args.json", {});
      std::string comments;
      for (std::istringstream in(im.deck); in.good();) {
        std::string line;
        std::getline(in, line);
        if (line.rfind("#", 0) == 0) comments += line + "\n";
      }
      std::vector<std::string> keys;
      std::istringstream y(read_text(kExamples / yaml));
      for (std::string line; std::getline(y, line);) {
        if (line.empty() || line[0] == '#' || line.find(':') == std::string::npos) continue;
        std::string key = line.substr(line.find_first_not_of(' '), line.find(':') - line.find_first_not_of(' '));
        keys.push_back(key);
      }
      std::istringstream j(read_text(kExamples / "squad-training-args.json"));
      for (std::string line; std::getline(j, line);)
        if (line.find('"') != std::string::npos) keys.push_back(line.substr(line.find('"') + 1, line.find('"', line.find('"') + 1) - line.find('"') - 1));
      for (const std::string& k : keys)
        if (k != "fsdp_config")
          BOOST_CHECK_MESSAGE(contains(comments, ": " + k + ": "), k << " has no comment line in the deck");
    }
  }
}

// TrainingArguments' optim: bitsandbytes' 8-bit AdamW names are train.optim = adamw_8bit, Trainer's AdamW
// names adamw_torch; another optimizer is a warning and AdamW.
BOOST_AUTO_TEST_CASE(optim_maps_to_train_optim) {
  for (const char* name : {"adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit"}) {
    const AccelerateImport im = import_accelerate(kFsdpYaml, "c.yaml", concat(R"({"optim": ")", name, R"("})"), "a.json",
                                                  {}, "test");
    BOOST_TEST(contains(im.deck, "optim = adamw_8bit\n"), name);
  }
  const AccelerateImport fused = import_accelerate(kFsdpYaml, "c.yaml", R"({"optim": "adamw_torch_fused"})", "a.json",
                                                   {}, "test");
  BOOST_TEST(contains(fused.deck, "optim = adamw_torch\n"));
  const AccelerateImport sgd = import_accelerate(kFsdpYaml, "c.yaml", R"({"optim": "sgd"})", "a.json", {}, "test");
  BOOST_TEST(has_warning(sgd, "optim"));
  BOOST_TEST(!contains(sgd.deck, "optim = "));
}

BOOST_AUTO_TEST_CASE(differences_are_warned) {
  const std::string yaml = std::string(kFsdpYaml) + "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 100000000\n";
  const AccelerateImport im = import_accelerate(yaml, "c.yaml",
                                                R"({"lr_scheduler_type": "inverse_sqrt", "report_to": ["wandb"], "optim": "adafactor",
                                                    "num_train_epochs": 2.5, "eval_strategy": "steps"})",
                                                "a.json", {}, "test");
  for (const char* w : {"fsdp_auto_wrap_policy", "fsdp_min_num_params", "lr_scheduler_type", "report_to", "optim",
                        "num_train_epochs", "eval_strategy"})
    BOOST_CHECK_MESSAGE(has_warning(im, w), "no warning for " << w);
  BOOST_TEST(contains(im.deck, "lr_schedule = linear"));
  BOOST_TEST(contains(im.deck, "epochs = 3"));
  // Defaults given explicitly are no difference.
  const AccelerateImport quiet = import_accelerate(kFsdpYaml, "c.yaml", R"({"report_to": "none", "debug": "", "dataloader_drop_last": true})",
                                                   "a.json", {"--model.dir=m", "--data.train_file=t"}, "test");
  // What remains are the absent keys whose Accelerate defaults shardlm does differently: no wrapping
  // (NO_WRAP) and a full state dict.
  BOOST_TEST(quiet.warnings.size() == 2u);
  BOOST_TEST(has_warning(quiet, "fsdp_state_dict_type absent"));
  BOOST_TEST(has_warning(quiet, "fsdp_auto_wrap_policy absent"));
}

// Every family's decoder layer is a block shardlm wraps, as the registry says; another class is warned
// about with the registry's classes named.
BOOST_AUTO_TEST_CASE(layer_classes_to_wrap_are_the_registrys) {
  auto wrapping = [](const std::string& classes) {
    return import_accelerate(std::string(kFsdpYaml) + "  fsdp_transformer_layer_cls_to_wrap: " + classes + "\n",
                             "c.yaml", "", "", {}, "test");
  };
  for (const char* accepted : {"MistralDecoderLayer", "Qwen3DecoderLayer", "BloomBlock, Qwen2DecoderLayer"})
    BOOST_TEST_CONTEXT(accepted) {
      const AccelerateImport im = wrapping(accepted);
      BOOST_TEST(!has_warning(im, "fsdp_transformer_layer_cls_to_wrap"));
      BOOST_TEST(contains(im.deck, "fsdp_transformer_layer_cls_to_wrap"));  // said in a comment line
    }
  for (const char* refused : {"GPT2Block", "MistralDecoderLayer, GPT2Block"})
    BOOST_TEST_CONTEXT(refused) {
      const AccelerateImport im = wrapping(refused);
      BOOST_TEST(has_warning(im, "fsdp_transformer_layer_cls_to_wrap"));
      BOOST_TEST(has_warning(im, hf_block_class_names()));
      for (const ModelFamily* f : model_families()) BOOST_TEST(has_warning(im, f->hf_block_class));
    }
  BOOST_TEST(hf_block_classes().size() == model_families().size());
  BOOST_TEST(contains(find_foreign_key("fsdp_config", "fsdp_transformer_layer_cls_to_wrap")->deck,
                      hf_block_class_names()));
}

BOOST_AUTO_TEST_CASE(warmup_ratio_stays_a_ratio) {
  const std::string deck = converted_text(kFsdpYaml, R"({"warmup_ratio": 0.1, "max_steps": 250})");
  BOOST_TEST(contains(deck, "warmup_steps = 0"));
  BOOST_TEST(contains(deck, "warmup_ratio = 0.1"));
  BOOST_TEST(contains(deck, "max_steps = 250"));
  // transformers 5 spells a ratio as warmup_steps below 1; warmup_steps wins over warmup_ratio.
  BOOST_TEST(contains(converted_text(kFsdpYaml, R"({"warmup_steps": 0.05})"), "warmup_ratio = 0.05"));
  const std::string both = converted_text(kFsdpYaml, R"({"warmup_steps": 7, "warmup_ratio": 0.1})");
  BOOST_TEST(contains(both, "warmup_steps = 7"));
  BOOST_TEST(!contains(both, "warmup_ratio = 0.1"));
}

// transformers' schedules keep their names and arguments (lr_scheduler_kwargs).
BOOST_AUTO_TEST_CASE(schedules_and_their_arguments_are_mapped) {
  const std::string cosine = converted_text(
      kFsdpYaml, R"({"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1, "num_cycles": 0.5}})");
  BOOST_TEST(contains(cosine, "lr_schedule = cosine_with_min_lr"));
  BOOST_TEST(contains(cosine, "min_lr_ratio = 0.1"));
  BOOST_TEST(contains(cosine, "lr_num_cycles = 0.5"));
  const std::string poly = converted_text(
      kFsdpYaml, R"({"lr_scheduler_type": "polynomial", "learning_rate": 1e-4, "lr_scheduler_kwargs": {"power": 2.0, "lr_end": 1e-6}})");
  BOOST_TEST(contains(poly, "lr_schedule = polynomial"));
  BOOST_TEST(contains(poly, "lr_power = 2"));
  BOOST_TEST(contains(poly, "lr_end = 1e-06"));
  for (const char* name : {"cosine", "cosine_with_restarts", "constant_with_warmup"})
    BOOST_TEST(contains(converted_text(kFsdpYaml, concat(R"({"lr_scheduler_type": ")", name, R"("})")),
                        concat("lr_schedule = ", name, "\n")), name);
  // Trainer's constant ignores the warm-up: the deck says 0 and the importer warns.
  const AccelerateImport im = import_accelerate(kFsdpYaml, "c.yaml", R"({"lr_scheduler_type": "constant", "warmup_steps": 10})",
                                                "a.json", {}, "test");
  BOOST_TEST(contains(im.deck, "warmup_steps = 0"));
  BOOST_TEST(has_warning(im, "warmup_steps"));
}

// eval_strategy steps, eval_steps and load_best_model_at_end with an eval file.
BOOST_AUTO_TEST_CASE(evaluation_by_steps_and_the_best_checkpoint_are_mapped) {
  const AccelerateImport im = import_accelerate(
      kFsdpYaml, "c.yaml",
      R"({"eval_strategy": "steps", "eval_steps": 50, "load_best_model_at_end": true, "metric_for_best_model": "eval_loss"})",
      "a.json", {"--data.eval_file=e.json"}, "test");
  BOOST_TEST(contains(im.deck, "every_steps = 50"));
  BOOST_TEST(contains(im.deck, "keep_best = eval_loss"));
  BOOST_TEST(has_warning(im, "load_best_model_at_end"));  // kept, not loaded at the end
  const AccelerateImport other = import_accelerate(
      kFsdpYaml, "c.yaml", R"({"eval_strategy": "steps", "load_best_model_at_end": true, "metric_for_best_model": "accuracy"})",
      "a.json", {"--data.eval_file=e.json"}, "test");
  BOOST_TEST(has_warning(other, "metric_for_best_model"));
  BOOST_TEST(contains(other.deck, "every_steps = 500"));  // eval_steps null: logging_steps, Trainer's default 500
}

BOOST_AUTO_TEST_CASE(training_arguments_win_over_accelerate_as_in_trainer) {
  const std::string yaml = std::string(kFsdpYaml) + "mixed_precision: bf16\n";
  const AccelerateImport im = import_accelerate(yaml, "c.yaml", R"({"fp16": true, "fsdp": "shard_grad_op offload"})", "a.json",
                                                {}, "test");
  BOOST_TEST(contains(im.deck, "param_dtype = fp16"));
  BOOST_TEST(contains(im.deck, "strategy = SHARD_GRAD_OP"));
  BOOST_TEST(contains(im.deck, "cpu_offload = true"));
  BOOST_TEST(has_warning(im, "replaces c.yaml's mixed_precision BF16"));
  BOOST_TEST(has_warning(im, "replaces c.yaml's FULL_SHARD"));
  // Trainer's fsdp_config, with and without the fsdp_ prefix.
  const std::string deck = converted_text(kFsdpYaml, R"({"fsdp_config": {"backward_prefetch": "BACKWARD_POST", "fsdp_activation_checkpointing": true}})");
  BOOST_TEST(contains(deck, "backward_prefetch = post"));
  BOOST_TEST(contains(deck, "activation_checkpointing = true"));
}

// Accelerate's mixed_precision: fp8 is bf16 with the blocks' linear layers in FP8 (model.fp8_linear);
// on the CPU backend, which has no FP8, bf16 throughout and a warning. A Transformer Engine fp8_config
// (HYBRID format, amax history) is not read, and the warning says which recipe runs instead.
BOOST_AUTO_TEST_CASE(fp8_mixed_precision_maps_to_fp8_linear_layers) {
  const AccelerateImport gpu = import_accelerate(std::string(kFsdpYaml) + "mixed_precision: fp8\n", "c.yaml", "", "", {}, "t");
  BOOST_TEST(contains(gpu.deck, "param_dtype = bf16"));
  BOOST_TEST(contains(gpu.deck, "fp8_linear = true"));
  BOOST_TEST(contains(gpu.deck, "compute capability 8.9"));
  const AccelerateImport cpu =
      import_accelerate(std::string(kFsdpYaml) + "mixed_precision: fp8\nuse_cpu: true\n", "c.yaml", "", "", {}, "t");
  BOOST_TEST(contains(cpu.deck, "param_dtype = bf16"));
  BOOST_TEST(!contains(cpu.deck, "fp8_linear = true"));
  BOOST_TEST(has_warning(cpu, "the CPU backend has no FP8"));
  const AccelerateImport te = import_accelerate(
      std::string(kFsdpYaml) + "mixed_precision: fp8\nfp8_config:\n  backend: TE\n  fp8_format: HYBRID\n  amax_history_len: 32\n",
      "c.yaml", "", "", {}, "t");
  BOOST_TEST(contains(te.deck, "fp8_linear = true"));
  BOOST_TEST(has_warning(te, "torchao's tensorwise current scaling, E4M3 for every operand"));
}

BOOST_AUTO_TEST_CASE(command_line_keys_win_and_are_said) {
  const AccelerateImport im = import_accelerate(kFsdpYaml, "c.yaml", "", "", {"--fsdp.strategy=NO_SHARD", "--train.lr=1e-3"}, "test");
  BOOST_TEST(contains(im.deck, "strategy = NO_SHARD"));
  BOOST_TEST(contains(im.deck, "lr = 1e-3"));
  BOOST_TEST(contains(im.deck, "replaced by the command line"));
  BOOST_TEST(contains(error_of([] { import_accelerate(kFsdpYaml, "c.yaml", "", "", {"--nope.x=1"}, "t"); }),
                      "unknown key 'nope.x' on the command line"));
}

// Every key and value the deck gets is checked by the deck's own key table before anything is written, as
// `shardlm train` would check it: an unknown key with the nearest one, a value out of the key's range naming
// the file key it came from. The files a path names are the run's to look for.
BOOST_AUTO_TEST_CASE(deck_keys_and_values_are_checked_before_writing) {
  const auto with_keys = [](std::vector<std::string> keys) {
    return error_of([&] { import_accelerate(kFsdpYaml, "c.yaml", "", "", keys, "t"); });
  };
  BOOST_TEST(contains(with_keys({"--train.lrr=1"}), "unknown key 'train.lrr' on the command line (did you mean 'train.lr'?)"),
             with_keys({"--train.lrr=1"}));
  BOOST_TEST(contains(with_keys({"--train.lr=abc"}), "train.lr = 'abc': not a number"), with_keys({"--train.lr=abc"}));
  BOOST_TEST(contains(with_keys({"--fsdp.strategy=BOGUS"}), "fsdp.strategy = 'BOGUS': must be FULL_SHARD"),
             with_keys({"--fsdp.strategy=BOGUS"}));
  const struct {
    const char* args;
    const char* error;
  } bad[] = {{R"({"weight_decay": -1})", "a.json: weight_decay: -1: train.weight_decay = -1: must be >= 0"},
             {R"({"adam_beta1": 1.5})", "a.json: adam_beta1: 1.5: train.adam_beta1 = 1.5: must be in [0, 1)"},
             {R"({"learning_rate": 0})", "a.json: learning_rate: 0: train.lr = 0: must be > 0"}};
  for (const auto& b : bad) {
    BOOST_TEST_CONTEXT(b.args) {
      const std::string m = error_of([&] { import_accelerate(kFsdpYaml, "c.yaml", b.args, "a.json", {}, "t"); });
      BOOST_TEST(contains(m, b.error), m);
    }
  }
  // Trainer does not clip at max_grad_norm <= 0: the deck's no clipping, 0.
  for (const char* norm : {"-1", "0"}) {
    BOOST_TEST_CONTEXT(norm) {
      const std::string deck = converted_text(kFsdpYaml, concat(R"({"max_grad_norm": )", norm, "}"));
      BOOST_TEST(contains(deck, "max_grad_norm = 0\n"), deck);
    }
  }
  BOOST_TEST(contains(converted_text(kFsdpYaml, R"({"max_grad_norm": -1})"), "no clipping"));
  // Paths are not looked for, and [lora] keys are written under their section.
  const AccelerateImport im = import_accelerate(kFsdpYaml, "c.yaml", "", "",
                                                {"--model.dir=not/here", "--data.train_file=t.json", "--lora.r=8"}, "t");
  BOOST_TEST(contains(im.deck, "[lora]\n# command line: --lora.r=8\nr = 8\n"), im.deck);
}

BOOST_AUTO_TEST_CASE(other_distributed_types) {
  BOOST_TEST(contains(converted_text("distributed_type: MULTI_GPU\nnum_processes: 4\n", ""), "strategy = NO_SHARD"));
  const std::string cpu = converted_text("distributed_type: MULTI_CPU\nnum_processes: 2\n", "");
  BOOST_TEST(contains(cpu, "backend = cpu"));
  BOOST_TEST(contains(error_of([] { converted_text("distributed_type: DEEPSPEED\n", ""); }), "distributed_type DEEPSPEED"));
}

BOOST_AUTO_TEST_CASE(bad_input_is_an_error_naming_the_key) {
  BOOST_TEST(contains(error_of([] { converted_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_ofload_params: true\n", ""); }),
                      "unknown key 'fsdp_ofload_params' (did you mean 'fsdp_offload_params'?)"));
  BOOST_TEST(contains(error_of([] { converted_text("distributd_type: FSDP\n", ""); }), "did you mean 'distributed_type'?"));
  BOOST_TEST(contains(error_of([] { converted_text(kFsdpYaml, R"({"learning_rte": 1e-4})"); }), "did you mean 'learning_rate'?"));
  BOOST_TEST(contains(error_of([] { converted_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HALF\n", ""); }),
                      "unknown sharding strategy 'HALF'"));
  BOOST_TEST(contains(error_of([] { converted_text("num_processes: [1\n", ""); }), "c.yaml: not valid YAML"));
  BOOST_TEST(contains(error_of([] { converted_text("- a\n- b\n", ""); }), "expected an Accelerate config"));
  BOOST_TEST(contains(error_of([] { converted_text(kFsdpYaml, "{\"seed\": 1,"); }), "args.json: not valid JSON"));
  BOOST_TEST(contains(error_of([] { converted_text(kFsdpYaml, "[1]"); }), "expected a JSON object"));
  BOOST_TEST(contains(error_of([] { converted_text(kFsdpYaml, R"({"per_device_train_batch_size": 0})"); }),
                      "per_device_train_batch_size: expected a whole number >= 1"));
  BOOST_TEST(contains(error_of([] { converted_text(kFsdpYaml, R"({"bf16": true, "fp16": true})"); }), "both true"));
  BOOST_TEST(contains(error_of([] { converted_text("distributed_type: FSDP\nnum_processes: 3\nnum_machines: 2\n", ""); }),
                      "not a multiple of num_machines"));
}

// Every TrainingArguments key the importer maps has a case here: a value other than Trainer's default
// that shows in the deck (the line given) or in a warning naming the key. A mapped key added to the table
// without a case fails the coverage check.
BOOST_AUTO_TEST_CASE(every_mapped_trainer_key_has_a_tested_mapping) {
  struct Case {
    const char* key;
    const char* args;     // TrainingArguments JSON
    const char* expect;   // a deck line (with "\n") or "warning" (a warning naming the key)
  };
  const std::vector<Case> cases = {
      {"output_dir", R"({"output_dir": "out/x"})", "dir = out/x\n"},
      {"per_device_train_batch_size", R"({"per_device_train_batch_size": 3})", "micro_batch_size = 3\n"},
      {"per_gpu_train_batch_size", R"({"per_gpu_train_batch_size": 5})", "micro_batch_size = 5\n"},
      {"gradient_accumulation_steps", R"({"gradient_accumulation_steps": 3})", "batch_size = 48\n"},
      {"num_train_epochs", R"({"num_train_epochs": 7})", "epochs = 7\n"},
      {"max_steps", R"({"max_steps": 40})", "max_steps = 40\n"},
      {"learning_rate", R"({"learning_rate": 0.001})", "lr = 0.001\n"},
      {"lr_scheduler_type", R"({"lr_scheduler_type": "cosine"})", "lr_schedule = cosine\n"},
      {"lr_scheduler_kwargs", R"({"lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {"num_cycles": 2}})",
       "lr_num_cycles = 2\n"},
      {"warmup_steps", R"({"warmup_steps": 9})", "warmup_steps = 9\n"},
      {"warmup_ratio", R"({"warmup_ratio": 0.2})", "warmup_ratio = 0.2\n"},
      {"optim", R"({"optim": "sgd"})", "warning"},
      {"weight_decay", R"({"weight_decay": 0.1})", "weight_decay = 0.1\n"},
      {"adam_beta1", R"({"adam_beta1": 0.8})", "adam_beta1 = 0.8\n"},
      {"adam_beta2", R"({"adam_beta2": 0.95})", "adam_beta2 = 0.95\n"},
      {"adam_epsilon", R"({"adam_epsilon": 1e-6})", "adam_eps = 1e-06\n"},
      {"max_grad_norm", R"({"max_grad_norm": 0.5})", "max_grad_norm = 0.5\n"},
      {"average_tokens_across_devices", R"({"average_tokens_across_devices": false})", "warning"},
      {"bf16", R"({"bf16": true})", "param_dtype = bf16\n"},
      {"fp16", R"({"fp16": true})", "param_dtype = fp16\n"},
      {"gradient_checkpointing", R"({"gradient_checkpointing": true})", "activation_checkpointing = true\n"},
      {"logging_strategy", R"({"logging_strategy": "epoch"})", "warning"},
      {"logging_steps", R"({"logging_steps": 25})", "log_every = 25\n"},
      {"eval_strategy", R"({"eval_strategy": "steps", "eval_steps": 30})", "every_steps = 30\n"},
      {"evaluation_strategy", R"({"evaluation_strategy": "steps", "eval_steps": 20})", "every_steps = 20\n"},
      {"eval_steps", R"({"eval_strategy": "steps", "eval_steps": 0.5})", "warning"},
      {"per_device_eval_batch_size", R"({"per_device_eval_batch_size": 6})", "batch_size = 6\n"},
      {"per_gpu_eval_batch_size", R"({"per_gpu_eval_batch_size": 7})", "batch_size = 7\n"},
      {"save_strategy", R"({"save_strategy": "epoch"})", "every_epoch = true\n"},
      {"save_steps", R"({"save_steps": 75})", "every = 75\n"},
      {"save_total_limit", R"({"save_total_limit": 2})", "keep_last = 2\n"},
      {"load_best_model_at_end", R"({"load_best_model_at_end": true})", "keep_best = eval_loss\n"},
      {"metric_for_best_model", R"({"load_best_model_at_end": true, "metric_for_best_model": "accuracy"})", "warning"},
      {"seed", R"({"seed": 7})", "seed = 7\n"},
      {"use_cpu", R"({"use_cpu": true})", "backend = cpu\n"},
      {"no_cuda", R"({"no_cuda": true})", "backend = cpu\n"},
      {"fsdp", R"({"fsdp": "hybrid_shard"})", "strategy = HYBRID_SHARD\n"},
      {"fsdp_config", R"({"fsdp_config": {"forward_prefetch": true}})", "forward_prefetch = true\n"},
      {"fsdp_transformer_layer_cls_to_wrap", R"({"fsdp_transformer_layer_cls_to_wrap": "GPT2Block"})", "warning"},
      {"dataloader_drop_last", R"({"dataloader_drop_last": false})", "warning"},
      {"train_sampling_strategy", R"({"train_sampling_strategy": "sequential"})", "shuffle = false\n"},
      // TRL's SFTConfig keys, in the same file.
      {"max_length", R"({"max_length": 2048})", "max_length = 2048\n"},
      {"max_seq_length", R"({"max_seq_length": 300})", "max_length = 300\n"},
      {"packing", R"({"packing": true})", "packing = true\n"},
      {"packing_strategy", R"({"packing": true, "packing_strategy": "wrapped"})", "warning"},
      {"assistant_only_loss", R"({"assistant_only_loss": true})", "train_on_prompt = false\n"},
      {"completion_only_loss", R"({"completion_only_loss": false})", "warning"},
      {"chat_template_path", R"({"chat_template_path": "t/llama3.jinja"})", "chat_template = t/llama3.jinja\n"},
      {"loss_type", R"({"loss_type": "dft"})", "warning"},
  };
  std::set<std::string> covered;
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.key) {
      covered.insert(c.key);
      const AccelerateImport im =
          import_accelerate(kFsdpYaml, "c.yaml", c.args, "a.json", {"--data.eval_file=e.json"}, "test");
      if (std::string(c.expect) == "warning") {
        bool named = false;
        for (const std::string& w : im.warnings) named = named || contains(w, std::string(": ") + c.key);
        BOOST_TEST(named);
      } else {
        BOOST_TEST(contains(im.deck, c.expect), im.deck);
        // Not the default conversion's line already.
        BOOST_TEST(!contains(import_accelerate(kFsdpYaml, "c.yaml", "{}", "a.json", {"--data.eval_file=e.json"}, "test").deck,
                             c.expect));
      }
    }
  }
  for (const ForeignKey& k : foreign_keys())
    if ((std::string(k.source) == "training_args" || std::string(k.source) == "sft_config") && k.use == ForeignKeyUse::Mapped)
      BOOST_CHECK_MESSAGE(covered.count(k.name), k.name << " is mapped but has no case here");
}

// Every key shardlm does not do warns when it asks for something other than Trainer's default, and a
// key with no effect never warns: both with a value of the key's kind that is not its default.
BOOST_AUTO_TEST_CASE(every_unmapped_trainer_key_warns_or_is_silent_as_its_table_says) {
  for (const ForeignKey& k : foreign_keys()) {
    if ((std::string(k.source) != "training_args" && std::string(k.source) != "sft_config") || k.use == ForeignKeyUse::Mapped)
      continue;
    BOOST_TEST_CONTEXT(k.name) {
      const std::string d = k.default_json;
      const std::string value = d == "false" ? "true" : d == "true" ? "false"
                              : d == "null" || d.front() == '"' ? "\"something\""
                              : d.front() == '[' ? "[\"x\"]" : d.front() == '{' ? "{\"x\": 1}" : "12345";
      const AccelerateImport im = import_accelerate(kFsdpYaml, "c.yaml", concat("{\"", k.name, "\": ", value, "}"), "a.json",
                                                    {"--model.dir=m", "--data.train_file=t"}, "test");
      bool named = false;
      for (const std::string& w : im.warnings) named = named || contains(w, concat(": ", k.name, ": "));
      BOOST_TEST(named == (k.use == ForeignKeyUse::NotDone));
      BOOST_TEST(contains(im.deck, concat(": ", k.name, ": ")));  // said in the deck either way
    }
  }
}

// A file naming TRL's SFTConfig keys is an SFTConfig: its own defaults apply to the TrainingArguments keys it
// leaves out (learning rate 2e-5, logging every 10 steps, gradient checkpointing, bf16 unless fp16), its
// data keys become the deck's, and the deck loads as a chat run.
BOOST_AUTO_TEST_CASE(an_sft_config_brings_trls_defaults_and_its_data_keys) {
  TempDir dir("accelerate_sft");
  dir.write("model/config.json", read_text(kSource / "tests/fixtures/hf/tiny_llama/config.json"));
  dir.write("model/tokenizer.json", kTinyTokenizerJson);
  const std::string tmpl = (kSource / "tests/fixtures/chat/templates/qwen2.5-instruct.jinja").string();
  const std::string args = concat(R"({"output_dir": "sft-out", "assistant_only_loss": true, "packing": true,)",
                                  R"( "max_length": 256, "chat_template_path": ")", tmpl, R"("})");
  const AccelerateImport im = import_accelerate(kFsdpYaml, "c.yaml", args, "sft.json",
                                                {"--model.dir=" + (dir.root / "model").string(),
                                                 "--data.train_file=" + (kSource / "input/data/demo_chat.jsonl").string(),
                                                 "--data.format=chat", "--data.eval_file="},
                                                "test");
  for (const char* line : {"lr = 2e-05\n", "log_every = 10\n", "activation_checkpointing = true\n", "param_dtype = bf16\n",
                           "max_length = 256\n", "packing = true\n", "train_on_prompt = false\n"})
    BOOST_TEST(contains(im.deck, line), line << " missing from\n" << im.deck);
  BOOST_TEST(contains(im.deck, "sft.json: learning_rate absent: SFTConfig's default 2e-05"), im.deck);
  BOOST_TEST(contains(im.deck, "bf16 absent: SFTConfig's default true"), im.deck);
  BOOST_TEST(contains(im.deck, "TRL's SFTConfig sft.json"), im.deck);
  // TRL's batch counts packed rows, the deck's samples: said above train.batch_size and on stderr.
  BOOST_TEST(has_warning(im, "sft.json: packing: true: TRL packs the data set into rows of max_length tokens"));
  BOOST_TEST(contains(im.deck, "# warning: TRL packs the data set into rows of max_length tokens before batching, so "
                               "per_device_train_batch_size counts packed rows"), im.deck);
  BOOST_TEST(im.deck.find("# warning: TRL packs") < im.deck.find("\nbatch_size = "), im.deck);
  const RunConfig cfg = load(dir, im, 2);
  BOOST_TEST(cfg.data.format == DataFormat::Chat);
  BOOST_TEST(cfg.data.packing);
  BOOST_TEST(!cfg.data.train_on_prompt);
  BOOST_TEST(cfg.data.max_length == 256);
  BOOST_TEST(cfg.data.chat_template == tmpl);
  // TRL's default (assistant_only_loss false) trains on every token, and says that shardlm's does not.
  const std::string whole = converted_text(kFsdpYaml, R"({"packing": false})");
  BOOST_TEST(!contains(whole, "TRL packs"), whole);
  BOOST_TEST(contains(whole, "train_on_prompt = true\n"), whole);
  BOOST_TEST(contains(whole, "shardlm's own default is the assistant's turns only"), whole);
  // fp16 keeps SFTConfig's bf16 off; plain TrainingArguments keep Trainer's defaults.
  BOOST_TEST(contains(converted_text(kFsdpYaml, R"({"packing": false, "fp16": true})"), "param_dtype = fp16\n"));
  const std::string plain = converted_text(kFsdpYaml, R"({"seed": 3})");
  BOOST_TEST(contains(plain, "lr = 5e-05\n"));
  BOOST_TEST(!contains(plain, "train_on_prompt"));
  // A folder names its tokenizer_config.json.
  BOOST_TEST(contains(converted_text(kFsdpYaml, R"({"chat_template_path": "models/Qwen2.5-7B-Instruct"})"),
                      "chat_template = models/Qwen2.5-7B-Instruct/tokenizer_config.json\n"));
}

// Without --model.dir and --data.train_file the deck is written, and `shardlm train`'s first error says
// exactly which keys to add (not a random model's shape keys).
BOOST_AUTO_TEST_CASE(a_deck_without_model_and_data_says_which_keys_to_add) {
  TempDir dir("accelerate_missing");
  const AccelerateImport im = convert("course-fsdp-4gpu.yaml", "squad-training-args.json", {});
  BOOST_TEST(has_warning(im, "give --model.dir=PATH"));
  const std::string deck = dir.write("deck.ini", im.deck);
  const std::string m = error_of([&] { load_run_config(deck, {}, 4); });
  BOOST_TEST(contains(m, "input deck '" + deck + "' is missing model.dir, data.train_file: add dir = PATH under [model], "
                         "train_file = PATH under [data] (or give --model.dir=PATH --data.train_file=PATH)"), m);
  // Given on the command line instead, it loads.
  Stand_ins s;
  BOOST_TEST(load_run_config(deck, {"--model.dir=" + s.model, "--data.train_file=" + s.train}, 4).model.arch == "llama");
}

// docs/accelerate.md holds the importer's key tables as `--key-tables` prints them.
BOOST_AUTO_TEST_CASE(docs_list_every_key) {
  const std::string doc = read_text(kSource / "docs/accelerate.md");
  BOOST_TEST(contains(doc, foreign_key_tables()), "docs/accelerate.md lacks the current key tables: paste "
                                                  "`shardlm import-accelerate --key-tables` into it");
}

// Aliases let a few lines stand for a billion values (and an anchor can hold its own alias): the
// conversion stops at a bound at once, with a message, instead of growing by gigabytes.
BOOST_AUTO_TEST_CASE(yaml_alias_bombs_and_deep_nesting_are_refused_at_once) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'j'; ++c)
    bomb += concat(std::string(1, c), ": &", std::string(1, c), " [*", std::string(1, char(c - 1)), ", *",
                   std::string(1, char(c - 1)), ", *", std::string(1, char(c - 1)), ", *", std::string(1, char(c - 1)),
                   ", *", std::string(1, char(c - 1)), ", *", std::string(1, char(c - 1)), ", *",
                   std::string(1, char(c - 1)), ", *", std::string(1, char(c - 1)), ", *", std::string(1, char(c - 1)),
                   ", *", std::string(1, char(c - 1)), "]\n");
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { import_accelerate(bomb, "bomb.yaml", "", "", {}, "test"); });
  BOOST_TEST(contains(message, "bomb.yaml: expands to more than 100000 values"), message);
  BOOST_TEST(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 3.0);

  std::string deep = "compute_environment: LOCAL_MACHINE\nfsdp_config: ";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  deep += "\n";
  BOOST_TEST(contains(error_of([&] { import_accelerate(deep, "deep.yaml", "", "", {}, "test"); }),
                      "deep.yaml: nests deeper than 64 levels"));
  // TrainingArguments JSON nested past the bound.
  const std::string args = "{\"a\": " + std::string(200, '[') + std::string(200, ']') + "}";
  BOOST_TEST(contains(error_of([&] {
                        import_accelerate(read_text(kExamples / "course-fsdp-4gpu.yaml"), "course-fsdp-4gpu.yaml", args,
                                          "args.json", {}, "test");
                      }),
                      "args.json: nests deeper than 64 levels"));
}

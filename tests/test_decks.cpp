#define BOOST_TEST_MODULE test_decks
#include <boost/test/unit_test.hpp>
// test_decks: every deck under input/ loads for the GPU count it is written for, its relative
// paths name the layout its header tells users to create, and docs/deck.md documents every key.
//
// What this can and cannot check. The real model directories (1 to 16 GB) and data sets are not in
// CI, so each deck is copied into a temporary work folder with stand-ins at the paths it names: a
// config.json with the real model's shape (the numbers of its config.json on the Hugging Face Hub,
// so the shape checks are the real ones), a tiny valid tokenizer.json, and data files of one
// record (load_run_config checks that data files exist, not what they hold). What passes here:
// every key exists, every value parses and is in range, the global batch divides over the deck's
// GPU count with the accumulation its header states, the SQuAD decks carry the tutorial's values,
// and the paths resolve to the documented layout. Not checked: training with the real files.

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "config_test_support.hpp"
#include "temp_dir.hpp"
#include "shardlm/config.hpp"
#include "gemma3_1b_config.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace shardlm;

namespace {

const fs::path kSource = SHARDLM_SOURCE_DIR;

// ---- stand-ins ------------------------------------------------------------------------------

// Llama 3.1 8B's config.json, the same in its instruct model's folder.
const char* const kLlama31_8b =
    R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
       "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
       "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
       "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                        "original_max_position_embeddings": 8192, "rope_type": "llama3"},
       "max_position_embeddings": 131072, "hidden_act": "silu", "attention_bias": false,
       "mlp_bias": false, "tie_word_embeddings": false, "pretraining_tp": 1})";

// The fields shardlm reads from each model's config.json on the Hub, with the Hub's values.
const std::map<std::string, std::string> kModelConfigs = {
    {"bloom-560m", R"({"model_type": "bloom", "vocab_size": 250880, "hidden_size": 1024, "n_layer": 24,
                       "n_head": 16, "layer_norm_epsilon": 1e-05, "initializer_range": 0.02,
                       "apply_residual_connection_post_layernorm": false})"},
    {"codellama-7b", R"({"model_type": "llama", "vocab_size": 32016, "hidden_size": 4096,
                         "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                         "num_key_value_heads": 32, "rms_norm_eps": 1e-05, "rope_theta": 1000000,
                         "rope_scaling": null, "max_position_embeddings": 16384, "hidden_act": "silu",
                         "tie_word_embeddings": false, "pretraining_tp": 1})"},
    {"qwen3-0.6b", R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
                       "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                       "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-06,
                       "rope_theta": 1000000, "max_position_embeddings": 40960, "hidden_act": "silu",
                       "attention_bias": false, "use_sliding_window": false, "sliding_window": null,
                       "max_window_layers": 28, "tie_word_embeddings": true})"},
    {"mistral-7b-v0.1", R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32000,
                            "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                            "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                            "rope_theta": 10000.0, "sliding_window": 4096, "max_position_embeddings": 32768,
                            "hidden_act": "silu", "initializer_range": 0.02, "tie_word_embeddings": false})"},
    {"gemma-3-1b-pt", kGemma3_1bConfig},
    {"phi-3-mini-4k-instruct", R"({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064,
                                   "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                                   "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
                                   "rope_theta": 10000.0, "rope_scaling": null, "sliding_window": 2047,
                                   "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
                                   "hidden_act": "silu", "attention_bias": false, "resid_pdrop": 0.0,
                                   "embd_pdrop": 0.0, "attention_dropout": 0.0, "initializer_range": 0.02,
                                   "tie_word_embeddings": false})"},
    {"llama-3.1-8b", kLlama31_8b},
    {"llama-3.1-8b-instruct", kLlama31_8b},
};

const char* kSquadRecord =
    R"({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.",
        "qas": [{"id": "q1", "question": "Where is Paris?", "answers": [{"answer_start": 12, "text": "France"}]}]}]}]})";
const char* kChatRecord = R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})";
const char* kChessRecord = R"({"Moves": ["e2e4", "e7e5", "g1f3"], "Termination": "NORMAL", "Result": "1-0"})";

// ---- the decks ------------------------------------------------------------------------------

struct DeckCase {
  std::string deck;                     // under input/
  int gpus;                             // the GPU count its header is written for
  int accumulation;                     // micro-steps per optimizer step on that many GPUs
  std::string model;                    // models/NAME beside the deck; "" = shape keys in the deck
  std::vector<std::string> data_files;  // beside the deck, stand-ins (empty: the deck's shipped files)
  std::vector<std::string> overrides;   // what its driver passes ({} for decks run as they are)
};

const std::vector<std::string> kSquadFiles = {"data/squad/train-v1.1.json", "data/squad/dev-v1.1.json"};

std::vector<DeckCase> deck_cases() {
  std::vector<DeckCase> cases = {
      {"demo.ini", 2, 2, "", {}, {}},
      // bench/gpu_compare.sh passes the generated data file: its name in the deck is a placeholder.
      {"bench/bloom560m.ini", 1, 1, "", {}, {"--data.train_file=BENCH_DATA"}},
      {"bench/codellama7b.ini", 2, 1, "", {}, {"--data.train_file=BENCH_DATA", "--train.batch_size=8"}},
      {"bench/qwen25-05b.ini", 1, 1, "", {}, {"--data.train_file=BENCH_DATA"}},
      {"bench/llama31-8b.ini", 1, 1, "", {}, {"--data.train_file=BENCH_DATA"}},
      {"bench/llama32-1b.ini", 1, 1, "", {}, {"--data.train_file=BENCH_DATA"}},
      {"bench/llama32-3b.ini", 1, 1, "", {}, {"--data.train_file=BENCH_DATA"}},
      {"bench/qwen3-17b.ini", 1, 1, "", {}, {"--data.train_file=BENCH_DATA"}},
      {"bench/mistral-7b.ini", 1, 1, "", {}, {"--data.train_file=BENCH_DATA"}},
      {"bench/gemma3-1b.ini", 1, 1, "", {}, {"--data.train_file=BENCH_DATA"}},
      {"bench/phi3-mini.ini", 1, 1, "", {}, {"--data.train_file=BENCH_DATA"}},
      {"squad/bloom560m-baseline.ini", 1, 4, "bloom-560m", kSquadFiles, {}},
      {"chess/codellama7b.ini", 8, 4, "codellama-7b", {"data/chess/train.jsonl", "data/chess/eval.jsonl"}, {}},
      {"llama/llama31-8b.ini", 8, 4, "llama-3.1-8b", kSquadFiles, {}},
      {"llama/llama31-8b-lora.ini", 1, 4, "llama-3.1-8b", kSquadFiles, {}},
      {"llama/llama31-8b-instruct-chat-lora.ini", 1, 4, "llama-3.1-8b-instruct",
       {"data/chat/train.jsonl", "data/chat/eval.jsonl"}, {}},
      {"squad/bloom560m-lora.ini", 1, 4, "bloom-560m", kSquadFiles, {}},
      {"qwen3/qwen3-0.6b.ini", 1, 4, "qwen3-0.6b", kSquadFiles, {}},
      {"mistral/mistral-7b-v0.1-lora.ini", 1, 4, "mistral-7b-v0.1", kSquadFiles, {}},
      {"gemma3/gemma3-1b-lora.ini", 1, 4, "gemma-3-1b-pt", kSquadFiles, {}},
      {"phi3/phi3-mini-4k-lora.ini", 1, 4, "phi-3-mini-4k-instruct", kSquadFiles, {}},
      // Written by `shardlm import-accelerate` from the course's Accelerate config (its first line).
      {"accelerate/course-fsdp-4gpu.ini", 4, 4, "llama-3.1-8b", kSquadFiles, {}},
  };
  for (std::string offload : {"", "-offload"}) {
    cases.push_back({"squad/bloom560m-fsdp-1gpu" + offload + ".ini", 1, 4, "bloom-560m", kSquadFiles, {}});
    for (std::string s : {"full-shard", "shard-grad-op", "no-shard"})
      cases.push_back({"squad/bloom560m-" + s + offload + ".ini", 4, 4, "bloom-560m", kSquadFiles, {}});
    cases.push_back({"squad/bloom560m-hybrid-shard" + offload + ".ini", 8, 4, "bloom-560m", kSquadFiles, {}});
  }
  return cases;
}

// The deck copied into `work` at its place under input/, with stand-ins for what it reads.
fs::path lay_out(const DeckCase& c, const fs::path& work) {
  const fs::path deck = work / "input" / c.deck;
  fs::create_directories(deck.parent_path());
  fs::copy_file(kSource / "input" / c.deck, deck);
  const fs::path folder = deck.parent_path();
  if (!c.model.empty()) {
    write_text_file(folder / "models" / c.model / "config.json", kModelConfigs.at(c.model));
    write_text_file(folder / "models" / c.model / "tokenizer.json", kTinyTokenizerJson);
  }
  for (const std::string& f : c.data_files)
    write_text_file(folder / f, f.find("chess") != std::string::npos ? kChessRecord
                                : f.find("chat") != std::string::npos ? kChatRecord : kSquadRecord);
  return deck;
}

std::string abs_path(const fs::path& p) { return fs::absolute(p).lexically_normal().string(); }


// Every *.ini under input/, relative to it.
std::set<std::string> decks_on_disk() {
  std::set<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(kSource / "input"))
    if (e.is_regular_file() && e.path().extension() == ".ini")
      found.insert(e.path().lexically_relative(kSource / "input").generic_string());
  return found;
}

// ---- docs/deck.md -----------------------------------------------------------------------------

std::vector<std::string> table_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < line.size(); ++i) {  // line[0] is the leading '|'
    if (line[i] == '|' && line[i - 1] != '\\') {
      size_t b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
      cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  return cells;
}

// The `...` spans of a cell, in order.
std::vector<std::string> code_spans(const std::string& cell) {
  std::vector<std::string> spans;
  for (size_t b = cell.find('`'); b != std::string::npos; b = cell.find('`', b)) {
    size_t e = cell.find('`', b + 1);
    if (e == std::string::npos) break;
    spans.push_back(cell.substr(b + 1, e - b - 1));
    b = e + 1;
  }
  return spans;
}

struct DocRow {
  std::string default_cell;
  int line = 0;
};

// "section.key" -> its row, from the key tables under the "## [section]" headings.
std::map<std::string, DocRow> documented_keys(const std::string& md) {
  std::map<std::string, DocRow> keys;
  std::istringstream in(md);
  std::string line, section;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.rfind("## ", 0) == 0) {
      size_t b = line.find('['), e = line.find(']');
      section = b == 3 && e != std::string::npos ? line.substr(b + 1, e - b - 1) : "";
      continue;
    }
    if (section.empty() || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells = table_cells(line);
    BOOST_REQUIRE_MESSAGE(cells.size() >= 3, "docs/deck.md line " << n << ": a key row needs key, type, default");
    std::vector<std::string> names = code_spans(cells[0]);
    std::vector<std::string> defaults = code_spans(cells[2]);
    for (size_t i = 0; i < names.size(); ++i) {
      // A row of several keys ("`adam_beta1`, `adam_beta2`") lists their defaults in the same order.
      std::string d = names.size() > 1 && defaults.size() == names.size() ? "`" + defaults[i] + "`" : cells[2];
      BOOST_CHECK_MESSAGE(keys.emplace(section + "." + names[i], DocRow{d, n}).second,
                          "docs/deck.md documents " << section << "." << names[i] << " twice");
    }
  }
  return keys;
}

bool same_value(const std::string& documented, const std::string& resolved) {
  if (documented == resolved) return true;
  char* end1 = nullptr;
  char* end2 = nullptr;
  double a = std::strtod(documented.c_str(), &end1), b = std::strtod(resolved.c_str(), &end2);
  bool numbers = !documented.empty() && !resolved.empty() && *end1 == '\0' && *end2 == '\0';
  return numbers && std::fabs(a - b) <= 1e-6 * std::fabs(b);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_deck_under_input_is_checked) {
  std::set<std::string> listed;
  for (const DeckCase& c : deck_cases()) listed.insert(c.deck);
  for (const std::string& d : decks_on_disk())
    BOOST_CHECK_MESSAGE(listed.count(d), "input/" << d << " is not in test_decks' table: add its GPU count and files");
  for (const std::string& d : listed)
    BOOST_CHECK_MESSAGE(fs::exists(kSource / "input" / d), "test_decks lists input/" << d << ", which does not exist");
}

BOOST_AUTO_TEST_CASE(decks_load_for_their_gpu_count) {
  for (const DeckCase& c : deck_cases()) {
    BOOST_TEST_CONTEXT("input/" << c.deck) {
      TempDir work{"decks"};
      const bool shipped = c.model.empty() && c.data_files.empty() && c.overrides.empty();
      const fs::path deck = shipped ? kSource / "input" / c.deck : lay_out(c, work.root);
      std::vector<std::string> overrides;
      for (const std::string& o : c.overrides) {
        std::string v = o;
        if (v == "--data.train_file=BENCH_DATA") {
          write_text_file(work.root / "bench.jsonl", "{\"text\": \"x\"}\n");
          v = "--data.train_file=" + (work.root / "bench.jsonl").string();
        }
        overrides.push_back(v);
      }

      RunConfig cfg;
      try {
        cfg = load_run_config(deck.string(), overrides, c.gpus);
      } catch (const Error& e) {
        BOOST_ERROR("does not load on " << c.gpus << " GPU(s): " << e.what());
        continue;
      }
      BOOST_TEST(cfg.grad_accum(c.gpus) == c.accumulation);
      BOOST_TEST(cfg.train.batch_size == cfg.train.micro_batch_size * c.accumulation * c.gpus);

      const fs::path folder = deck.parent_path();
      if (!c.model.empty()) {
        BOOST_TEST(cfg.model.dir == abs_path(folder / "models" / c.model));
        BOOST_TEST(contains(cfg.data.tokenizer_file, "models/" + c.model));
        BOOST_TEST(cfg.run.backend == BackendKind::Cuda);
        BOOST_TEST(cfg.fsdp.param_dtype == DType::BF16);
      }
      if (!c.data_files.empty()) {
        BOOST_TEST(cfg.data.train_file == abs_path(folder / c.data_files[0]));
        BOOST_TEST(cfg.data.eval_file == abs_path(folder / c.data_files[1]));
      }
    }
  }
}

// The SQuAD decks carry the tutorial's values; their names say the strategy and the offload.
BOOST_AUTO_TEST_CASE(squad_decks_carry_the_tutorials_values) {
  const std::map<std::string, ShardingStrategy> strategy_of = {
      {"baseline", ShardingStrategy::NoShard},       {"fsdp-1gpu", ShardingStrategy::FullShard},
      {"full-shard", ShardingStrategy::FullShard},   {"shard-grad-op", ShardingStrategy::ShardGradOp},
      {"hybrid-shard", ShardingStrategy::HybridShard}, {"no-shard", ShardingStrategy::NoShard},
      {"lora", ShardingStrategy::FullShard}};
  int checked = 0;
  for (const DeckCase& c : deck_cases()) {
    if (c.deck.rfind("squad/", 0) != 0) continue;
    BOOST_TEST_CONTEXT("input/" << c.deck) {
      TempDir work{"decks"};
      const fs::path deck = lay_out(c, work.root);
      const RunConfig cfg = load_run_config(deck.string(), {}, c.gpus);
      BOOST_TEST(cfg.data.format == DataFormat::Squad);
      BOOST_TEST(cfg.data.max_length == 512);
      BOOST_TEST(cfg.data.train_size == 250u);
      BOOST_TEST(cfg.data.eval_size == 100u);
      BOOST_TEST(cfg.train.epochs == 5);
      BOOST_TEST(cfg.train.micro_batch_size == 1);
      BOOST_TEST(cfg.train.weight_decay == 0.01);
      BOOST_TEST(cfg.model.hidden_size == 1024);  // BLOOM-560M's shape, from config.json

      std::string name = fs::path(c.deck).stem().string().substr(std::string("bloom560m-").size());
      // The LoRA deck trains adapters at LoRA's usual rate, on every linear layer.
      BOOST_TEST(cfg.train.lr == (name == "lora" ? 2e-4 : 5e-5));
      BOOST_TEST(cfg.model.lora.enabled() == (name == "lora"));
      if (name == "lora") {
        BOOST_TEST(cfg.model.lora.r == 16);
        BOOST_TEST(cfg.model.lora.alpha == 32.0);
        BOOST_TEST(cfg.model.lora.target_modules.size() == 4u);
      }
      const bool offload = name.size() > 8 && name.compare(name.size() - 8, 8, "-offload") == 0;
      if (offload) name.resize(name.size() - 8);
      BOOST_REQUIRE_MESSAGE(strategy_of.count(name), "no strategy known for the name " << name);
      BOOST_TEST(cfg.fsdp.strategy == strategy_of.at(name));
      BOOST_TEST(cfg.fsdp.cpu_offload == offload);

      // The batch rule of the headers: on W GPUs, --train.batch_size=4W keeps accumulation 4.
      for (int w : {1, 2, 8, 16}) {
        std::vector<std::string> o;
        o.push_back("--train.batch_size=" + std::to_string(4 * w));
        BOOST_TEST(load_run_config(deck.string(), o, w).grad_accum(w) == 4);
      }
      ++checked;
    }
  }
  BOOST_TEST(checked == 12);  // baseline, FSDP on one GPU, four strategies; offload variants; LoRA
}

BOOST_AUTO_TEST_CASE(deck_reference_documents_every_key_and_its_default) {
  const std::string md = read_text_file((kSource / "docs/deck.md").string());
  const std::map<std::string, DocRow> documented = documented_keys(md);

  // The resolved defaults: a deck with only the required keys.
  TempDir tmp{"decks"};
  write_text_file(tmp.root / "train.json", kSquadRecord);
  write_text_file(tmp.root / "deck.ini",
             "[model]\nvocab_size = 300\nhidden_size = 64\nnum_layers = 2\nnum_heads = 4\n"
             "[data]\ntrain_file = train.json\n[train]\nbatch_size = 1\n");
  const RunConfig cfg = load_run_config((tmp.root / "deck.ini").string(), {}, 1);
  // [lora] is in the resolved deck only when given: its defaults are those of a deck with its required keys.
  const RunConfig lora = load_run_config((tmp.root / "deck.ini").string(),
                                         {"--lora.r=8", "--lora.target_modules=query_key_value"}, 1);
  std::vector<std::pair<std::string, std::string>> resolved = cfg.resolved;
  for (const auto& [key, value] : lora.resolved)
    if (key.rfind("lora.", 0) == 0) resolved.emplace_back(key, value);
  const std::set<std::string> required = {"model.vocab_size", "model.hidden_size", "model.num_layers",
                                          "model.num_heads", "data.train_file", "train.batch_size",
                                          "lora.r", "lora.target_modules"};
  std::set<std::string> keys;
  for (const auto& [key, value] : resolved) {
    keys.insert(key);
    auto row = documented.find(key);
    if (row == documented.end()) {
      BOOST_ERROR("docs/deck.md has no row for " << key);
      continue;
    }
    const std::string& d = row->second.default_cell;
    if (required.count(key)) {
      BOOST_CHECK_MESSAGE(d == "required", key << ": docs/deck.md line " << row->second.line
                                               << " should say the key is required, not " << d);
      continue;
    }
    std::vector<std::string> spans = code_spans(d);
    // data.tokenizer's default `auto` resolves to model.dir's tokenizer.json; without model.dir, to byte.
    const bool resolved_auto = key == "data.tokenizer" && spans.size() == 1 && spans[0] == "auto" && value == "byte";
    const bool ok =
        d == "empty" ? value.empty() : spans.size() == 1 && (same_value(spans[0], value) || resolved_auto);
    BOOST_CHECK_MESSAGE(ok, key << ": docs/deck.md line " << row->second.line << " gives the default " << d
                                << ", the deck resolves to '" << value << "'");
  }
  for (const auto& [key, row] : documented)
    BOOST_CHECK_MESSAGE(keys.count(key), "docs/deck.md line " << row.line << " documents " << key
                                                               << ", which is not a deck key");
  // And it lists every deck of input/.
  for (const std::string& d : decks_on_disk())
    BOOST_CHECK_MESSAGE(contains(md, "`" + d + "`"), "docs/deck.md does not list input/" << d);
}

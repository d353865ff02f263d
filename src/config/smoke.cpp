// Smoke runs (run.smoke, `shardlm train DECK --tiny`): any deck shrunk to a run of a few seconds on a
// laptop or in CI, keeping what makes the deck's model what it is (family, grouped-query ratio, a head_dim
// apart from hidden/heads, a tied head, biases, LoRA; the shape's as config.json or the shape keys give it, else the
// family's default) and its strategy and precision.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include "config_internal.hpp"

namespace shardlm::config_detail {

namespace {

namespace fs = std::filesystem;

constexpr int kSmokeLayers = 2;
constexpr int kSmokeHeadDim = 16;
constexpr int kSmokeSteps = 2;
constexpr int kSmokeMaxLength = 256;  // a SQuAD question and its answer fit
constexpr int kSmokeEvalRecords = 4;
constexpr int kSmokeNewTokens = 4;
constexpr int kSmokeWindow = 64;               // Gemma 3's local layers without its config.json
constexpr double kSmokeLocalTheta = 10000.0;   // and their rotary base (Gemma 3 1B's)

// The family a folder's name suggests (codellama-7b: llama; Qwen2.5-0.5B: qwen2; Phi-3-mini-4k-instruct: phi3;
// gemma-3-1b-pt: gemma3), or "" when none does. Case and the separators - _ . and spaces do not count.
std::string family_in_name(const std::string& path) {
  std::string name = fs::path(path).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(path).lexically_normal().parent_path().filename().string();
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const auto separator = [](char c) { return c == '-' || c == '_' || c == '.' || c == ' '; };
  name.erase(std::remove_if(name.begin(), name.end(), separator), name.end());
  for (const std::string& family : model_family_names())
    if (name.find(family) != std::string::npos) return family;
  return "";
}

// The model at a tiny width and depth: the same family and proportions, random weights.
void shrink_model(ModelSection& m) {
  const int heads = m.num_heads > 0 ? m.num_heads : 4;
  const int kv = m.num_kv_heads > 0 ? m.num_kv_heads : heads;
  const int group = std::max(1, heads / std::max(1, kv));  // query heads per key/value head
  const int kv_small = std::min(kv, 2);
  const bool own_head_dim = m.head_size > 0 && m.hidden_size > 0 && m.head_size * heads != m.hidden_size;
  const int old_hidden = m.hidden_size;
  m.num_heads = kv_small * group;
  if (m.num_kv_heads > 0) m.num_kv_heads = kv_small;
  // Qwen3's head_dim apart from hidden/heads: heads x head_dim twice the width, as 0.6B's.
  m.hidden_size = m.num_heads * kSmokeHeadDim / (own_head_dim ? 2 : 1);
  m.head_size = own_head_dim ? kSmokeHeadDim : 0;
  if (m.intermediate_size > 0 && old_hidden > 0) {
    const double ratio = static_cast<double>(m.intermediate_size) / old_hidden;
    m.intermediate_size = std::max(8, static_cast<int>(std::lround(ratio * m.hidden_size / 8.0)) * 8);
  }
  m.num_layers = kSmokeLayers;
  m.vocab_size = kByteVocab;
  m.dir.clear();
  m.adapter.clear();
}

// The smoke run's model: the deck's family (or the one the missing folder's name says) shrunk to a few layers,
// its proportions kept where config.json or the shape keys give them; `say` tells what was done.
void smoke_model(ModelSection& m, const std::map<std::string, SkippedPath>& missing,
                 const std::function<void(const std::string&)>& say) {
  const std::string model_dir = m.dir;
  if (auto it = missing.find("model.dir"); it != missing.end()) {
    const std::string guessed = family_in_name(it->second.text);
    if (!guessed.empty()) m.arch = guessed;
    say(concat(it->second.error, ": a random tiny ", m.arch, " instead",
               guessed.empty() ? " (to choose the family: --model.dir= --model.arch=FAMILY)" : " (the family its name says)"));
  }
  // No shape at all (no config.json, no shape keys): nothing to keep the proportions of, so the family's default
  // (grouped query heads where the family has them), said as such; a folder's name says no more than the family.
  const bool default_shape = m.num_heads == 0;
  if (default_shape) {
    m.num_heads = 4;
    m.hidden_size = 4 * kSmokeHeadDim;
    if (model_family(m.arch).grouped_query) m.num_kv_heads = 2;
  }
  // Gemma 3 without its config.json: local and global layers as its own (a window, five local layers of six),
  // here one of each, the window shorter than the samples.
  if (model_family(m.arch).local_global_layers && m.sliding_window == 0 && m.sliding_window_pattern != 1) {
    m.sliding_window_pattern = kSmokeLayers;
    m.sliding_window = kSmokeWindow;
    if (m.rope_local_theta == 0) m.rope_local_theta = kSmokeLocalTheta;
    say(concat(m.arch, ": a local layer (window ", m.sliding_window, ", rope theta ", format_double(m.rope_local_theta),
               ") then a global one"));
  }
  if (auto it = missing.find("model.adapter"); it != missing.end()) say(it->second.error + ": no adapter");
  else if (!m.adapter.empty()) say("model.adapter " + m.adapter + " fits the full-size model: LoRA starts afresh");
  shrink_model(m);
  const std::string shape_from =
      !model_dir.empty() ? " (shape from " + model_dir + "/config.json)"
      : default_shape    ? concat(" (the family's default shape: no config.json or shape keys give the model's; "
                                  "--model.dir= --model.arch=", m.arch, " --model.num_heads=N",
                                  model_family(m.arch).grouped_query ? " --model.num_kv_heads=K" : "", " do)")
                         : std::string();
  say(concat(m.arch, " of ", m.num_layers, " layers, width ", m.hidden_size, ", ", m.num_heads, " heads",
             m.num_kv_heads > 0 ? concat(" over ", m.num_kv_heads, " key/value heads") : std::string(),
             m.head_size > 0 ? concat(", head_dim ", m.head_size) : std::string(), m.tied_head() ? ", tied head" : "",
             "; random weights", shape_from, "; the byte tokenizer"));
}

}  // namespace

void shrink_for_smoke(RunConfig& cfg, const std::map<std::string, SkippedPath>& missing,
                      const std::set<std::string>& given_on_cli, int world_size) {
  std::vector<std::string>& notes = cfg.notes;
  auto say = [&](const std::string& text) { notes.push_back("smoke run: " + text); };

  // ---- the model ----
  const std::string model_dir = cfg.model.dir;
  smoke_model(cfg.model, missing, say);

  // ---- the data: the deck's files where they are, else synthetic ----
  DataSection& d = cfg.data;
  d.tokenizer = TokenizerSource::Byte;
  d.tokenizer_file.clear();
  if (auto it = missing.find("data.tokenizer"); it != missing.end()) say(it->second.error + ": the byte tokenizer");
  // A chat file is rendered with a template: the deck's own file, else the model folder's.
  if (d.format == DataFormat::Chat && d.chat_template.empty() && !model_dir.empty()) {
    const fs::path config = fs::path(model_dir) / "tokenizer_config.json";
    if (fs::exists(config)) d.chat_template = config.string();
  }
  const bool no_template = d.format == DataFormat::Chat && d.chat_template.empty();
  if (auto it = missing.find("data.chat_template"); it != missing.end()) say(it->second.error);
  if (missing.count("data.train_file") || d.train_file.empty() || no_template) {
    const auto it = missing.find("data.train_file");
    say(concat(it != missing.end() ? it->second.error : no_template ? "no chat template (model.dir is not here)"
                                                              : std::string("no data.train_file"),
               ": synthetic text instead"));
    d.train_file.clear();
    d.eval_file.clear();
  } else if (auto e = missing.find("data.eval_file"); e != missing.end()) {
    say(e->second.error + ": no evaluation");
    d.eval_file.clear();
  }
  d.max_length = std::min(d.max_length, kSmokeMaxLength);

  // ---- the steps: micro-batch 1, accumulation 2 (both code paths), a few steps ----
  TrainSection& t = cfg.train;
  t.micro_batch_size = 1;
  t.batch_size = 2 * world_size;
  t.epochs = 1;
  t.max_steps = kSmokeSteps;
  t.log_every = 1;
  d.train_size = static_cast<size_t>(t.batch_size) * kSmokeSteps;
  d.eval_size = kSmokeEvalRecords;
  if (d.eval_file.empty()) {
    cfg.eval.every_steps = 0;
    cfg.checkpoint.keep_best = KeepBest::None;
    t.early_stopping_patience = 0;
  }
  if (d.train_file.empty() || d.format != DataFormat::Squad) cfg.eval.generate = EvalGenerate::None;
  cfg.eval.max_new_tokens = std::min(cfg.eval.max_new_tokens, kSmokeNewTokens);
  cfg.eval.batch_size = 0;
  if (cfg.dist.ranks_per_node > 0 && world_size % cfg.dist.ranks_per_node != 0) {
    say(concat("dist.ranks_per_node = ", cfg.dist.ranks_per_node, " does not divide ", world_size, " rank(s): the real nodes"));
    cfg.dist.ranks_per_node = 0;
  }
  say(concat(kSmokeSteps, " steps of ", t.batch_size, " samples (micro-batch 1, accumulation 2) of at most ",
             d.max_length, " tokens"));

  // ---- where it goes: its own folder, never the deck's real run or checkpoints ----
  cfg.checkpoint.resume = ResumeFrom::None;
  cfg.checkpoint.resume_path.clear();
  cfg.checkpoint.every = 0;
  if (!given_on_cli.count("run.dir")) {
    cfg.run.dir += "-smoke";
    cfg.run.overwrite = true;  // the smoke folder of an earlier smoke run
  }
  if (!given_on_cli.count("checkpoint.dir")) cfg.checkpoint.dir.clear();
  say(concat("written to ", cfg.run.dir));
}

}  // namespace shardlm::config_detail

// `shardlm inspect CKPT`: what a checkpoint holds (run position, model, strategy, tensors and norms).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "../../core/input_file.hpp"
#include "commands.hpp"
#include "shardlm/data.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/io.hpp"

namespace shardlm {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string names_text(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return names.empty() ? "none" : s;
}

// The optimizer vectors stored beside param: one line when every unit holds the same, else per unit.
void print_optimizer_state(const std::vector<CheckpointUnitState>& units) {
  const auto differs = [&](const CheckpointUnitState& u) { return u.optimizer != units.front().optimizer; };
  if (!units.empty() && std::none_of(units.begin(), units.end(), differs)) {
    std::printf("optimizer    state %s (fp32, beside each unit's param)\n", names_text(units.front().optimizer).c_str());
    return;
  }
  for (const CheckpointUnitState& u : units)
    std::printf("optimizer    %s: state %s\n", u.unit.c_str(), names_text(u.optimizer).c_str());
}

// A number of the [train] section of the resolved deck the checkpoint stores (its key names are
// unique over the sections); -1 when absent.
long train_key(const std::string& deck, const std::string& key) {
  const size_t at = deck.find("\n" + key + " = ", deck.find("\n[train]\n"));
  return at == std::string::npos ? -1 : std::atol(deck.c_str() + at + key.size() + 4);
}

// The checkpoint's position as the log counts it: epochs done, e.g. "epoch 10.00" after ten epochs
// (the file's `epoch` is 0-based and `epoch_step` counts into it: epoch + epoch_step / steps_per_epoch,
// as TrainPosition::epochs_done, also after a resume with another batch). A file from before
// steps_per_epoch was kept: steps per epoch from the epochs already done, else from total_steps when
// train.max_steps did not cap it.
std::string position_text(const CheckpointMeta& m) {
  char text[64];
  if (m.steps_per_epoch > 0) {
    std::snprintf(text, sizeof text, "epoch %.2f, as the log counts epochs done",
                  static_cast<double>(m.epoch) + static_cast<double>(m.epoch_step) / static_cast<double>(m.steps_per_epoch));
    return text;
  }
  long per_epoch = 0;
  if (m.epoch > 0) {
    per_epoch = (m.step - m.epoch_step) / m.epoch;
  } else {
    const long epochs = train_key(m.deck, "epochs"), max_steps = train_key(m.deck, "max_steps");
    if (epochs > 0 && (max_steps <= 0 || m.total_steps < max_steps)) per_epoch = m.total_steps / epochs;
  }
  if (per_epoch <= 0) return concat(m.epoch_step, " steps into epoch ", m.epoch + 1, ", counted from 1");
  std::snprintf(text, sizeof text, "epoch %.2f, as the log counts epochs done",
                static_cast<double>(m.step) / static_cast<double>(per_epoch));
  return text;
}

void print_checkpoint(const std::string& path) {
  CheckpointReader reader(path);
  const CheckpointMeta& m = reader.meta();
  std::printf("checkpoint   %s\n", path.c_str());
  std::printf("format       %d (written by shardlm %s)\n", m.format_version, m.version.c_str());
  std::printf("step         %ld (%s; optimizer step %ld)\n", m.step, position_text(m).c_str(), m.optimizer_steps);
  std::printf("schedule     %s, lr %g, warmup %ld, total %ld steps; seed %llu\n", m.lr_schedule.c_str(), m.base_lr,
              m.warmup_steps, m.total_steps, static_cast<unsigned long long>(m.seed));
  std::printf("layout       %s on %d rank(s), shard group %d\n", m.strategy.c_str(), m.world_size, m.shard_group_size);
  if (!m.run_id.empty())
    std::printf("run          %s; global batch %ld, %ld steps/epoch\n", m.run_id.c_str(), m.global_batch,
                m.steps_per_epoch);
  else
    std::printf("run          not kept (written before run ids, global batch and contents checksum)\n");
  if (!m.train_data_hash.empty()) std::printf("data         training examples' hash %s\n", m.train_data_hash.c_str());
  for (const std::string& problem : reader.metadata_problems()) std::printf("warning      %s\n", problem.c_str());
  std::printf("model        %s: vocab %d, hidden %d, layers %d, heads %d", m.model.arch.c_str(), m.model.vocab_size,
              m.model.hidden_size, m.model.num_layers, m.model.num_heads);
  if (model_family(m.model.arch).grouped_query)
    std::printf(", kv heads %d, intermediate %d%s", m.model.kv_heads(), m.model.ffn_size(),
                m.model.tie_word_embeddings ? ", tied head" : "");
  std::printf("\n");
  std::printf("tokenizer    %s\n", checkpoint_tokenizer_text(m).c_str());
  print_optimizer_state(reader.unit_states());
  std::printf("\n%-48s %-16s %12s %14s %14s\n", "tensor", "shape", "numel", "l2 norm", "max |x|");
  size_t total = 0;
  for (const CheckpointTensor& t : reader.tensors()) {
    std::vector<float> v = reader.read(t);
    double sq = 0, mx = 0;
    for (float x : v) {
      sq += static_cast<double>(x) * x;
      mx = std::max(mx, static_cast<double>(std::fabs(x)));
    }
    total += t.numel;
    std::printf("%-48s %-16s %12zu %14.6g %14.6g\n", t.name.c_str(), shape_text(t.shape).c_str(), t.numel,
                std::sqrt(sq), mx);
  }
  std::printf("\n%zu tensors, %zu parameters\n", reader.tensors().size(), total);
}

// A serial command: rank 0 does the work, the others only agree on the outcome.
void on_rank0(MPI_Comm comm, const std::function<void()>& work) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  run_collectively(comm, [&] {
    if (rank == 0) work();
  });
}

}  // namespace

int command_inspect(const std::vector<std::string>& args) {
  if (const std::string problem = mpi_command_usage_problem("inspect", args); !problem.empty()) {
    log_info(usage_error("inspect", problem));
    return 2;
  }
  // One checkpoint and perhaps --verify, in either order (mpi_command_usage_problem checked it).
  const bool verify = std::find(args.begin(), args.end(), "--verify") != args.end();
  const std::string spec = args.front() == "--verify" ? args.back() : args.front();
  if (!verify) {
    on_rank0(MPI_COMM_WORLD, [&] { print_checkpoint(resolve_checkpoint_path(spec, "shardlm inspect CHECKPOINT")); });
    return 0;
  }
  // --verify: the contents checksum and impossible attributes, then every dataset's checksum; the
  // damage is the agreed error, so the exit code is 1.
  on_rank0(MPI_COMM_WORLD, [&] {
    const std::string path = resolve_checkpoint_path(spec, "shardlm inspect CHECKPOINT");
    CheckpointReader reader(path);
    const std::vector<std::string> damage = reader.verify();
    if (!damage.empty()) {
      std::string text = damage.front();
      for (size_t i = 1; i < damage.size(); ++i) text += "\n  " + damage[i];
      throw Error(concat(text, damage.size() > 1 ? concat("\n  (", damage.size(), " findings)") : ""));
    }
    size_t datasets = 0;
    for (const CheckpointUnitState& u : reader.unit_states()) datasets += 1 + u.optimizer.size();
    std::printf("%s: intact (%zu datasets, every checksum verified)\n", path.c_str(), datasets);
  });
  return 0;
}

namespace {

namespace fs = std::filesystem;

// The tokenizer files transformers reads, copied from the run's tokenizer folder where present.
const char* const kTokenizerFiles[] = {"tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
                                       "tokenizer.model",   "added_tokens.json",     "vocab.json",
                                       "merges.txt",        "chat_template.jinja",   "chat_template.json"};

// The special-token ids of `config` (a source model's config.json) that are integers.
void take_token_ids(const nlohmann::json& config, std::map<std::string, int>& ids) {
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (auto it = config.find(key); it != config.end() && it->is_number_integer()) ids[key] = it->get<int>();
}

// What goes beside the weights: the tokenizer's files and ids, and a source model's
// generation_config.json, from the run's deck (model.dir, data.tokenizer) or `model_dir`.
void add_tokenizer_and_generation(const CheckpointMeta& meta, const std::string& model_dir_flag,
                                  HfExportOptions& options) {
  const std::map<std::string, std::string> deck = ini_values(meta.deck, "the checkpoint's deck");
  auto value = [&](const std::string& key) {
    auto it = deck.find(key);
    return it == deck.end() ? std::string() : it->second;
  };
  const std::string model_dir = model_dir_flag.empty() ? value("model.dir") : model_dir_flag;
  const std::string tokenizer = value("data.tokenizer");
  const std::string where = model_dir_flag.empty() ? "the run's model.dir" : "--model-dir";
  std::error_code ec;
  if (!model_dir.empty())
    SHARDLM_CHECK(fs::is_directory(model_dir, ec), "export: ", where, " '", model_dir,
                  "' is not a folder here; pass --model-dir DIR naming the model folder the run started from");
  if (tokenizer == "byte" || tokenizer.empty()) {
    const int max_length = std::atoi(value("data.max_length").c_str());
    options.text_files = ByteTokenizer::hf_files(max_length > 0 ? max_length : 1024);
    options.token_ids = {{"bos_token_id", ByteTokenizer::kBos},
                         {"eos_token_id", ByteTokenizer::kEos},
                         {"pad_token_id", ByteTokenizer::kPad}};
  } else {
    // A tokenizer.json (or its folder); "auto" means model.dir's.
    fs::path file = tokenizer == "auto" ? fs::path(model_dir) / "tokenizer.json" : fs::path(tokenizer);
    if (!model_dir_flag.empty() && !fs::exists(file, ec)) file = fs::path(model_dir) / "tokenizer.json";
    if (fs::is_directory(file, ec)) file /= "tokenizer.json";
    SHARDLM_CHECK(fs::is_regular_file(file, ec), "export: the run's tokenizer '", file.string(),
                  "' (data.tokenizer) is not a file here; pass --model-dir DIR naming the folder that holds its "
                  "tokenizer.json");
    // The checkpoint keeps the hash of the tokenizer it trained with: another one would ship ids that
    // do not match the weights.
    const std::string hash = tokenizer_hash(file.string());
    SHARDLM_CHECK(meta.tokenizer_hash.empty() || meta.tokenizer_hash == hash, "export: ", file.string(),
                  " is not the tokenizer the run trained with (its hash is ", hash, ", the checkpoint's ",
                  meta.tokenizer_hash, "): restore that file, or pass --model-dir DIR naming a folder with the run's "
                  "tokenizer.json");
    for (const char* name : kTokenizerFiles)
      if (fs::is_regular_file(file.parent_path() / name, ec)) options.copy_files.push_back((file.parent_path() / name).string());
    const std::unique_ptr<Tokenizer> tok = make_tokenizer(file.string());
    if (tok->bos_id() >= 0) options.token_ids["bos_token_id"] = tok->bos_id();
    options.token_ids["eos_token_id"] = tok->eos_id();
    if (tok->pad_id() >= 0) options.token_ids["pad_token_id"] = tok->pad_id();
  }
  if (!model_dir.empty()) {
    // The source model's own ids win: they are what its users' code expects.
    if (fs::is_regular_file(fs::path(model_dir) / "config.json", ec)) {
      const std::string path = (fs::path(model_dir) / "config.json").string();
      nlohmann::json config;
      try {
        config = parse_json_bounded(read_input_file(path, "model config", kMaxDeckBytes), path);
      } catch (const nlohmann::json::exception&) {
        // Not JSON: the export keeps the tokenizer's own ids.
      }
      if (config.is_object()) take_token_ids(config, options.token_ids);
    }
    if (fs::is_regular_file(fs::path(model_dir) / "generation_config.json", ec))
      options.copy_files.push_back((fs::path(model_dir) / "generation_config.json").string());
  }
}

}  // namespace

// The fsdp.param_dtype the checkpoint's run computed in (fp32 when its deck does not say).
static std::string run_param_dtype(const CheckpointMeta& meta) {
  const std::map<std::string, std::string> deck = ini_values(meta.deck, "the checkpoint's deck");
  const auto it = deck.find("fsdp.param_dtype");
  return it == deck.end() || it->second.empty() ? "fp32" : it->second;
}

// The model folder `base` (read as `dir`) as the base of the LoRA checkpoint at `path` (its model lora_cfg):
// the model of the checkpoint's shape, and, same shape not being the same weights, the weights its adapters
// were trained on when the checkpoint keeps their checksum (as resume and generate compare it). Errors start
// with `what` and end with `why`.
static void check_lora_base(HfModelDir& dir, const std::string& base, const CheckpointMeta& meta,
                            const ModelConfig& lora_cfg, const std::string& path, const std::string& what,
                            const std::string& why) {
  const std::string diff = model_config_difference(meta.model, dir.config());
  SHARDLM_CHECK(diff.empty(), what, ": ", base, " is not the model the adapters were trained on: ", diff);
  if (meta.base_checksum.empty()) return;
  const std::string sum = lora_base_checksum(dir, lora_cfg, parse_dtype(run_param_dtype(meta)));
  SHARDLM_CHECK(sum == meta.base_checksum, what, ": the adapters of ", path, " were trained on other base weights "
                "(checksum ", meta.base_checksum, ") than those of ", base, " (", sum, "): ", why);
}

// The adapters of the LoRA checkpoint at `path` as a PEFT adapter folder `out`, naming as its base
// `model_dir` (made absolute, as model.dir is) once check_lora_base takes it, else the run's model.dir.
static std::string export_adapter(const std::string& path, const std::string& out, const std::string& model_dir,
                           bool overwrite) {
  std::string base;
  if (!model_dir.empty()) {
    CheckpointReader reader(path);
    reader.require_intact();
    HfModelDir dir(model_dir);
    check_lora_base(dir, model_dir, reader.meta(), checkpoint_lora_model(reader.meta(), path, nullptr), path,
                    "export --adapter --model-dir", "the adapter would name a base it was not trained on");
    base = std::filesystem::absolute(model_dir).lexically_normal().string();
  }
  return export_checkpoint_adapter(path, out, overwrite, base);
}

// A LoRA checkpoint's base model (from `base`) with its adapters merged: each adapted weight
// W + scale B A in fp32, each tensor of a module trained whole (lora.modules_to_save) as the
// checkpoint holds it, the other tensors as the base holds them.
void export_merged(const std::string& path, const std::string& out, const std::string& base_flag,
                   HfExportOptions& options) {
  CheckpointReader reader(path);
  reader.require_intact();
  std::string recorded;
  ModelConfig lora_cfg = checkpoint_lora_model(reader.meta(), path, &recorded);
  const std::string base = base_flag.empty() ? recorded : base_flag;
  SHARDLM_CHECK(!base.empty(), "export --merge: the run trained its adapters on its seeded initialisation (no "
                "model.dir): there is no base model folder to merge them into");
  HfModelDir dir(base);
  check_lora_base(dir, base, reader.meta(), lora_cfg, path, "export --merge",
                  "merged, they would not give the model that was trained");
  std::map<std::string, CheckpointTensor> adapters;
  for (const CheckpointTensor& t : reader.tensors()) adapters[t.name] = t;
  const double scale = lora_cfg.lora.scale();
  ModelConfig cfg = dir.config();
  std::vector<CheckpointTensor> tensors;
  for (size_t u = 0; u < dir.layout().size(); ++u)
    for (const TensorSpec& s : dir.layout()[u].tensors)
      tensors.push_back({dir.layout()[u].name, s.name, s.shape, s.offset, s.numel});
  add_tokenizer_and_generation(reader.meta(), base, options);
  export_hf_model(out, cfg, tensors, [&](const CheckpointTensor& t) {
    size_t unit = 0;
    while (dir.layout()[unit].name != t.unit) ++unit;
    if (const auto saved = adapters.find(t.name); saved != adapters.end()) return reader.read(saved->second);
    std::vector<float> w(t.numel);
    dir.read_unit_slice(unit, t.offset, t.offset + t.numel, w.data());
    const std::string module = t.name.size() > 7 ? t.name.substr(0, t.name.size() - 7) : "";  // less ".weight"
    auto a = adapters.find(module + ".lora_A.weight"), b = adapters.find(module + ".lora_B.weight");
    if (t.name.size() <= 7 || t.name.compare(t.name.size() - 7, 7, ".weight") != 0 || a == adapters.end() ||
        b == adapters.end())
      return w;
    const std::vector<float> A = reader.read(a->second), B = reader.read(b->second);
    const int64_t r = a->second.shape[0], in = a->second.shape[1], outs = b->second.shape[0];
    for (int64_t o = 0; o < outs; ++o)
      for (int64_t k = 0; k < r; ++k) {
        const double bk = scale * B[o * r + k];
        for (int64_t i = 0; i < in; ++i) w[o * in + i] += static_cast<float>(bk * A[k * in + i]);
      }
    return w;
  }, options);
}

int command_export(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  // Empty: not given (dtype: the one the run trained in; max_shard: save_pretrained's 5GB).
  std::string dtype, max_shard, model_dir;
  bool adapter = false, merge = false, overwrite = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (option_value(args, i, "--dtype", dtype) || option_value(args, i, "--max-shard-size", max_shard) ||
        option_value(args, i, "--model-dir", model_dir))
      continue;
    if (args[i] == "--adapter" || args[i] == "--merge" || args[i] == "--overwrite") {
      (args[i] == "--adapter" ? adapter : args[i] == "--merge" ? merge : overwrite) = true;
      continue;
    }
    if (args[i].rfind("--", 0) == 0) {
      log_info(usage_error("export", concat("unknown or incomplete option '", args[i], "'")));
      return 2;
    }
    positional.push_back(args[i]);
  }
  if (const std::string problem = mpi_command_usage_problem("export", args); !problem.empty()) {
    log_info(usage_error("export", problem));
    return 2;
  }
  on_rank0(MPI_COMM_WORLD, [&] {
    HfExportOptions options;
    options.overwrite = overwrite;
    const std::string path = resolve_checkpoint_path(positional[0], "shardlm export CHECKPOINT");
    SHARDLM_CHECK(!adapter || (dtype.empty() && max_shard.empty()), "export: --adapter writes the adapters as the "
                  "run trained them (fp32, one adapter_model.safetensors): --dtype and --max-shard-size apply to a "
                  "whole or merged model");
    // As save_pretrained: the weights in the dtype the run computed in (fsdp.param_dtype), unless told.
    if (dtype.empty() && !adapter) dtype = run_param_dtype(CheckpointReader(path).meta());
    if (dtype.empty()) dtype = "fp32";
    SHARDLM_CHECK(dtype == "fp32" || dtype == "bf16" || dtype == "fp16", "export: --dtype = '", dtype,
                  "': expected bf16, fp16 or fp32");
    options.dtype = parse_dtype(dtype);
    options.max_shard_bytes = parse_size("--max-shard-size", max_shard.empty() ? "5GB" : max_shard);
    SHARDLM_CHECK(!(adapter && merge), "export: --adapter and --merge write different folders: give one");
    check_export_folder(positional[1], overwrite);
    if (adapter) {
      const std::string base = export_adapter(path, positional[1], model_dir, overwrite);
      std::printf("exported the adapters of %s to %s (PEFT adapter of %s)\n", path.c_str(), positional[1].c_str(),
                  base.empty() ? "the run's seeded base" : base.c_str());
      return;
    }
    if (merge) {
      export_merged(path, positional[1], model_dir, options);
      std::printf("exported %s merged into its base to %s (%s)\n", path.c_str(), positional[1].c_str(), dtype.c_str());
      return;
    }
    CheckpointReader reader(path);
    reader.require_intact();
    SHARDLM_CHECK(reader.meta().lora.empty(), "export: ", path, " holds LoRA adapters: pass --adapter (a PEFT adapter "
                  "folder) or --merge (the base with the adapters merged)");
    add_tokenizer_and_generation(reader.meta(), model_dir, options);
    export_hf_model(positional[1], reader.meta().model, reader.tensors(),
                    [&](const CheckpointTensor& t) { return reader.read(t); }, options);
    std::printf("exported %s (step %ld) to %s (%s)\n", path.c_str(), reader.meta().step, positional[1].c_str(),
                dtype.c_str());
  });
  return 0;
}

}  // namespace shardlm

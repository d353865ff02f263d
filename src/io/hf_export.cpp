// export_hf_model: a Hugging Face model directory (config.json, safetensors weights, shard index,
// and the files hf_export_files.cpp writes) for every family of the registry (its layout and config writer).
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "hf_export_files.hpp"
#include "staged_folder.hpp"
#include "shardlm/io.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

// An export's weight files say that shardlm wrote them (the safetensors __metadata__, the index's
// "metadata"): a later export into the folder removes the ones it does not write again only then.
constexpr const char* kWriterKey = "writer";
constexpr const char* kWriter = "shardlm";

using OrderedJson = nlohmann::ordered_json;

// Writes a small text file via PATH.tmp, fsync and a rename (replace_file), like the weights.
void write_text_file(const std::string& path, const std::string& text) { replace_file(path, text, "export file"); }

size_t shape_numel(const CheckpointTensor& t) {
  size_t n = 1;
  for (int64_t d : t.shape) {
    SHARDLM_CHECK(d >= 0, "export: tensor '", t.name, "' has a negative dimension ", d);
    n *= static_cast<size_t>(d);
  }
  return n;
}

// The tensors that go into the files: the layout's, which holds no tied LM head (save_pretrained
// leaves it out too).
std::vector<const CheckpointTensor*> exported_tensors(const std::vector<CheckpointTensor>& tensors) {
  std::vector<const CheckpointTensor*> out;
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    SHARDLM_CHECK(seen.insert(t.name).second, "export: tensor '", t.name, "' is listed twice");
    SHARDLM_CHECK(shape_numel(t) == t.numel, "export: tensor '", t.name, "' has ", t.numel,
                  " elements but its shape holds ", shape_numel(t));
    out.push_back(&t);
  }
  return out;
}

// Splits the tensors, in order, into groups of at most max_bytes (a larger tensor gets a group of its own).
std::vector<std::vector<const CheckpointTensor*>> plan_shards(const std::vector<const CheckpointTensor*>& tensors,
                                                              size_t max_bytes, DType dtype) {
  std::vector<std::vector<const CheckpointTensor*>> shards;
  size_t shard_bytes = 0;
  for (const CheckpointTensor* t : tensors) {
    const size_t bytes = t->numel * dtype_size(dtype);
    if (shards.empty() || (!shards.back().empty() && shard_bytes + bytes > max_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += bytes;
  }
  return shards;
}

std::string shard_file_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

// Fetches one shard's tensors (the only ones held in memory at a time) and writes them.
void write_shard(const std::string& path, const ModelConfig& cfg, const std::vector<const CheckpointTensor*>& shard,
                 const std::function<std::vector<float>(const CheckpointTensor&)>& fetch, DType dtype) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(shard.size());
  for (const CheckpointTensor* t : shard) {
    std::vector<float> values = fetch(*t);
    SHARDLM_CHECK(values.size() == t->numel, "export: tensor '", t->name, "': fetched ", values.size(),
                  " values, expected ", t->numel);
    entries.push_back({hf_tensor_name(cfg, t->name), t->shape, std::move(values), dtype});
  }
  write_safetensors(path, entries, {{kWriterKey, kWriter}});
}

// A weight file's name as save_pretrained writes it: one file, or shards and their index.
bool weight_file_name(const std::string& name) {
  static const std::regex weight_file(R"(model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?)");
  return std::regex_match(name, weight_file);
}

// An earlier export's weight file, by its name and its mark; a file of that name the user put
// there, or one that does not read, is not.
bool earlier_export_weights(const fs::path& file) {
  if (!weight_file_name(file.filename().string())) return false;
  try {
    if (file.extension() == ".json") {
      const nlohmann::json index =
          nlohmann::json::parse(read_input_file(file.string(), "weight index", kMaxDeckBytes), nullptr, false);
      return index.is_object() && index.contains("metadata") && index["metadata"].is_object() &&
             index["metadata"].value(kWriterKey, "") == kWriter;
    }
    const SafetensorsFile weights(file.string());
    const std::map<std::string, std::string>& meta = weights.metadata();
    const auto writer = meta.find(kWriterKey);
    return writer != meta.end() && writer->second == kWriter;
  } catch (const Error&) {
    return false;
  }
}

// The exported weights' bytes in `dtype`: one file up to the largest shard, shards beyond.
size_t weight_bytes(const std::vector<const CheckpointTensor*>& selected, DType dtype) {
  size_t total = 0;
  for (const CheckpointTensor* t : selected) total += t->numel * dtype_size(dtype);
  return total;
}

// The weight files write_export writes: model.safetensors, or the shards and their index.
std::set<std::string> export_weight_files(const std::vector<CheckpointTensor>& tensors, const HfExportOptions& options) {
  const auto selected = exported_tensors(tensors);
  if (weight_bytes(selected, options.dtype) <= options.max_shard_bytes) return {"model.safetensors"};
  const size_t n = plan_shards(selected, options.max_shard_bytes, options.dtype).size();
  std::set<std::string> names{"model.safetensors.index.json"};
  for (size_t i = 0; i < n; ++i) names.insert(shard_file_name(i, n));
  return names;
}

// Weights in DIR that are not an earlier export's and that this export would not replace (another
// layout: a sharded model beside a new model.safetensors, or the reverse) would stay beside the new
// ones, and loaders would pick one of the two: refused, naming the file.
void refuse_foreign_weights(const fs::path& dir, const std::set<std::string>& written) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!weight_file_name(name) || written.count(name) || earlier_export_weights(entry.path())) continue;
    throw Error(concat("export: ", entry.path().string(), " holds weights shardlm did not write, in another layout than "
                       "this export's (", *written.begin(), "): they would stay beside the new ones and a loader "
                       "would pick one of the two; move them away, or give a new folder"));
  }
}

// Writes config.json, the weights and the files of hf_export_files.cpp into the new folder ROOT.
void write_export(const fs::path& root, const ModelConfig& cfg, const std::vector<CheckpointTensor>& tensors,
                  const std::function<std::vector<float>(const CheckpointTensor&)>& fetch,
                  const HfExportOptions& options) {
  const size_t max_shard_bytes = options.max_shard_bytes;
  OrderedJson config = OrderedJson::parse(hf_config_json(cfg));
  for (const auto& [key, id] : options.token_ids) config[key] = id;
  config["torch_dtype"] = torch_dtype_name(options.dtype);
  write_text_file((root / "config.json").string(), config.dump(2) + "\n");

  const auto selected = exported_tensors(tensors);
  const size_t total_bytes = weight_bytes(selected, options.dtype);

  if (total_bytes <= max_shard_bytes) {
    write_shard((root / "model.safetensors").string(), cfg, selected, fetch, options.dtype);
  } else {
    const auto shards = plan_shards(selected, max_shard_bytes, options.dtype);
    OrderedJson index;
    index["metadata"] = {{"total_size", total_bytes}, {kWriterKey, kWriter}};
    nlohmann::json weight_map = nlohmann::json::object();  // sorted by name, as save_pretrained writes it
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string file = shard_file_name(i, shards.size());
      write_shard((root / file).string(), cfg, shards[i], fetch, options.dtype);
      for (const CheckpointTensor* t : shards[i]) weight_map[hf_tensor_name(cfg, t->name)] = file;
    }
    index["weight_map"] = weight_map;
    write_text_file((root / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  write_export_files(root.string(), options, write_text_file);
}

}  // namespace

void check_export_folder(const std::string& dir, bool overwrite) { check_output_folder(dir, "export", overwrite); }

void export_hf_model(const std::string& dir, const ModelConfig& cfg, const std::vector<CheckpointTensor>& tensors,
                     const std::function<std::vector<float>(const CheckpointTensor&)>& fetch,
                     const HfExportOptions& options) {
  // Everything is written into a folder beside DIR and moved in once complete: a failed export
  // leaves DIR as it was. An earlier export's weight files go; other files put beside them stay.
  const fs::path target(dir);
  refuse_foreign_weights(target, export_weight_files(tensors, options));
  write_staged_folder(
      dir, "export", options.overwrite, [&](const std::string& name) { return earlier_export_weights(target / name); },
      [&](const fs::path& staging) { write_export(staging, cfg, tensors, fetch, options); });
}

}  // namespace shardlm

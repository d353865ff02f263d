// HfModelDir: a Hugging Face model directory (config.json + safetensors weights, one file or
// sharded with an index) mapped onto the flat parameter layout; each rank reads only its slices.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "../core/input_file.hpp"
#include "shardlm/io.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path, const std::string& what) {
  return read_input_file(path.string(), what, kMaxDeckBytes);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Weight files of the directory: the ones model.safetensors.index.json names, or model.safetensors.
std::vector<std::string> weight_files(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const std::string what = "model directory " + dir.string();
    nlohmann::json j;
    try {
      j = parse_json_bounded(read_text(index, what), index.string());
    } catch (const nlohmann::json::exception& e) {
      throw Error(concat(index.string(), ": not valid JSON: ", e.what()));
    }
    SHARDLM_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
                  ": expected an object with a 'weight_map' object");
    std::set<std::string> files;
    for (const auto& [name, file] : j["weight_map"].items()) {
      SHARDLM_CHECK(file.is_string(), index.string(), ": weight_map['", name, "'] must be a file name");
      const std::string f = file.get<std::string>();
      SHARDLM_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..", index.string(),
                    ": weight_map['", clip_for_message(name, 100), "'] = '", clip_for_message(f, 100),
                    "' is not a file name in the directory");
      files.insert(f);
    }
    SHARDLM_CHECK(!files.empty(), index.string(), ": weight_map is empty");
    return {files.begin(), files.end()};
  }
  SHARDLM_CHECK(fs::exists(dir / "model.safetensors"), "model directory ", dir.string(),
                " has neither model.safetensors nor model.safetensors.index.json (only safetensors weights are read)");
  return {"model.safetensors"};
}

// Tensors a checkpoint may hold that the layout does not: a tied head, rotary buffers of old exports.
bool ignorable(const ModelConfig& cfg, const std::string& name) {
  const auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (cfg.tied_head() && (name == "lm_head.weight" || name == "transformer.lm_head.weight")) return true;
  const ModelFamily& family = model_family(cfg.arch);
  if (family.hf_ignored_tensor && family.hf_ignored_tensor(cfg, name)) return true;
  return ends_with("rotary_emb.inv_freq");
}

}  // namespace

HfModelDir::HfModelDir(const std::string& dir) : dir_(dir) {
  const fs::path root(dir);
  SHARDLM_CHECK(fs::is_directory(root), "model directory ", dir, " does not exist");
  const fs::path config_path = root / "config.json";
  config_ = model_config_from_hf(read_text(config_path, "model directory " + dir), config_path.string());
  layout_ = model_layout(config_);

  // name -> (file, tensor) over every weight file; a name in two files is an error.
  std::map<std::string, Source> found;
  for (const std::string& name : weight_files(root)) {
    const fs::path path = root / name;
    SHARDLM_CHECK(fs::exists(path), "model directory ", dir, ": weight file ", name, " is missing");
    files_.push_back(std::make_unique<SafetensorsFile>(path.string()));
    for (const SafetensorsTensor& t : files_.back()->tensors()) {
      const auto [it, added] = found.emplace(t.name, Source{files_.size() - 1, &t});
      SHARDLM_CHECK(added, "model directory ", dir, ": tensor '", t.name, "' is in both ",
                    files_[it->second.file]->path(), " and ", path.string());
    }
  }

  std::set<std::string> used;
  for (const UnitLayout& unit : layout_) {
    std::vector<Source> unit_sources;
    for (const TensorSpec& spec : unit.tensors) {
      // Names as save_pretrained writes them, or without the model's prefix (bloom-560m on the hub).
      const std::string full = hf_tensor_name(config_, spec.name);
      auto it = found.find(full);
      if (it == found.end()) it = found.find(spec.name);
      if (it == found.end() && model_family(config_.arch).hf_tensor_aliases)
        for (const std::string& alias : model_family(config_.arch).hf_tensor_aliases(full))
          if (it == found.end()) it = found.find(alias);
      SHARDLM_CHECK(it != found.end(), "model directory ", dir, ": tensor '", full,
                    "' is missing from the weights (does config.json match them?)");
      const SafetensorsTensor& t = *it->second.tensor;
      SHARDLM_CHECK(t.shape == spec.shape, "model directory ", dir, ": tensor '", t.name, "' in ",
                    files_[it->second.file]->path(), " has shape ", shape_text(t.shape), ", config.json implies ",
                    shape_text(spec.shape));
      used.insert(it->first);
      unit_sources.push_back(it->second);
    }
    sources_.push_back(std::move(unit_sources));
  }
  std::vector<std::string> extra;
  for (const auto& [name, source] : found)
    if (!used.count(name) && !ignorable(config_, name)) extra.push_back(name);
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", '" : "'") + extra[i] + "'";
    throw Error(concat("model directory ", dir, ": the weights hold ", extra.size(),
                       " tensor(s) the model config.json describes has no place for: ", list,
                       extra.size() > 5 ? ", ..." : "", " (does config.json match the weights?)"));
  }
}

void HfModelDir::read_unit_slice(size_t unit, size_t begin, size_t end, float* out) {
  SHARDLM_CHECK(unit < layout_.size(), "HfModelDir::read_unit_slice: unit ", unit, " is invalid");
  read_unit_slice(unit, layout_[unit], begin, end, out);
}

void HfModelDir::read_unit_slice(size_t unit, const UnitLayout& as, size_t begin, size_t end, float* out) {
  SHARDLM_CHECK(unit < layout_.size() && begin <= end, "HfModelDir::read_unit_slice: unit ", unit, " range [", begin,
                ", ", end, ") is invalid");
  std::fill(out, out + (end - begin), 0.0f);
  const UnitLayout& u = layout_[unit];
  for (const TensorSpec& spec : as.tensors) {
    const size_t lo = std::max(begin, spec.offset), hi = std::min(end, spec.offset + spec.numel);
    if (lo >= hi) continue;
    size_t i = 0;
    while (i < u.tensors.size() && u.tensors[i].name != spec.name) ++i;
    SHARDLM_CHECK(i < u.tensors.size() && u.tensors[i].shape == spec.shape, "model directory ", dir_, ": unit ", u.name,
                  " has no tensor ", spec.name, " of shape ", shape_text(spec.shape));
    const Source& s = sources_[unit][i];
    float* part = out + (lo - begin);
    files_[s.file]->read(*s.tensor, lo - spec.offset, hi - lo, part);
    // Damaged or diverged weights are named here, not found later as a loss that is not finite.
    const float* bad = std::find_if(part, part + (hi - lo), [](float x) { return !std::isfinite(x); });
    if (bad != part + (hi - lo))
      throw Error(concat(files_[s.file]->path(), ": tensor '", s.tensor->name, "' holds ", *bad, " at element ",
                         lo - spec.offset + static_cast<size_t>(bad - part),
                         " (the weights are damaged or diverged: every value must be finite)"));
  }
}

uint64_t HfModelDir::bytes_read() const {
  uint64_t total = 0;
  for (const auto& f : files_) total += f->bytes_read();
  return total;
}

std::string lora_base_checksum(HfModelDir& dir, const ModelConfig& lora_model, DType param_dtype) {
  const std::vector<UnitLayout> frozen = lora_frozen_layout(lora_model);
  constexpr size_t kChunk = size_t(1) << 24;  // elements read at a time
  std::vector<float> chunk;
  uint64_t sum = 0;
  for (size_t u = 0; u < frozen.size(); ++u)
    for (size_t begin = 0; begin < frozen[u].numel; begin += kChunk) {
      chunk.resize(std::min(frozen[u].numel, begin + kChunk) - begin);
      dir.read_unit_slice(u, frozen[u], begin, begin + chunk.size(), chunk.data());
      if (param_dtype != DType::F32) round_to(param_dtype, chunk.data(), chunk.size());
      for (size_t i = 0; i < chunk.size(); ++i) sum += base_checksum_term(u, begin + i, chunk[i]);
    }
  return hex_digits(sum);
}

}  // namespace shardlm

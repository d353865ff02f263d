// What every family's layout shares: appending tensors to a unit, finding one by name, the checks
// of the shape every family has, the bounds on sizes, cfg.arch's layout, HF tensor names and linear
// modules (from its family's record), and the deterministic counter-based initialisation of any layout.
#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "model_internal.hpp"

namespace shardlm {
namespace {

// Uniform in (0, 1] from the top 53 bits, never 0 so that log() below is finite.
double unit_interval(uint64_t bits) { return 1.0 - static_cast<double>(bits >> 11) * 0x1.0p-53; }

// A standard normal sample that depends only on (seed, unit, index): Box-Muller on two hashed uniforms.
double counter_normal(uint64_t seed, int unit_index, size_t index) {
  const uint64_t key =
      mix64(mix64(mix64(seed) ^ static_cast<uint64_t>(unit_index)) ^ static_cast<uint64_t>(index));
  const double radius = std::sqrt(-2.0 * std::log(unit_interval(mix64(key ^ 1))));
  const double angle = 6.283185307179586 * unit_interval(mix64(key ^ 2));
  return radius * std::cos(angle);
}

// Uniform in [-1, 1) that depends only on (seed, unit, index).
double counter_uniform(uint64_t seed, int unit_index, size_t index) {
  const uint64_t key =
      mix64(mix64(mix64(seed ^ 0x10a0) ^ static_cast<uint64_t>(unit_index)) ^ static_cast<uint64_t>(index));
  return 2.0 * static_cast<double>(key >> 11) * 0x1.0p-53 - 1.0;
}

// Elements [lo, hi) of the unit (lo >= base): out[i - base].
void init_range(const UnitLayout& unit, int unit_index, uint64_t seed, size_t lo, size_t hi, size_t base, float* out) {
  // Padding past the last tensor stays zero.
  for (size_t i = lo; i < hi; ++i) out[i - base] = 0.0f;
  for (const TensorSpec& t : unit.tensors) {
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    for (size_t i = a; i < b; ++i) {
      switch (t.init) {
        case InitKind::Zeros: out[i - base] = 0.0f; break;
        case InitKind::Ones: out[i - base] = 1.0f; break;
        case InitKind::Normal:
          out[i - base] = static_cast<float>(t.init_std * counter_normal(seed, unit_index, t.init_offset + (i - t.offset)));
          break;
        case InitKind::Uniform:
          out[i - base] = static_cast<float>(t.init_std * counter_uniform(seed, unit_index, t.init_offset + (i - t.offset)));
          break;
      }
    }
  }
}

}  // namespace

namespace model_detail {

void add_tensor(UnitLayout& unit, const std::string& name, std::vector<int64_t> shape, InitKind init,
                float init_std) {
  TensorSpec t;
  t.name = name;
  t.numel = 1;
  for (int64_t d : shape) t.numel *= static_cast<size_t>(d);
  t.shape = std::move(shape);
  t.offset = unit.numel;
  t.init_offset = t.offset;
  t.decay = t.shape.size() >= 2;
  t.init = init;
  t.init_std = init_std;
  unit.numel += t.numel;
  unit.tensors.push_back(std::move(t));
}

size_t tensor_offset(const UnitLayout& unit, const std::string& name, const char* who) {
  for (const TensorSpec& t : unit.tensors)
    if (t.name == name) return t.offset;
  throw Error(concat(who, ": unit ", unit.name, " has no tensor ", name));
}

void check_common_shape(const ModelConfig& cfg, const char* family, const char* heads_key, bool own_head_dim) {
  SHARDLM_CHECK(cfg.vocab_size > 0 && cfg.hidden_size > 0 && cfg.num_heads > 0 && cfg.num_layers >= 0, family,
                " config: vocab_size, hidden_size and num_heads must be positive and num_layers >= 0 (got ",
                cfg.vocab_size, ", ", cfg.hidden_size, ", ", cfg.num_heads, ", ", cfg.num_layers, ")");
  SHARDLM_CHECK(cfg.head_size >= 0 && (own_head_dim || cfg.head_size == 0), family, " config: head_dim ",
                cfg.head_size, " is not supported (", own_head_dim ? ">= 0" : "hidden_size / heads only", ")");
  if (cfg.head_size > 0) return;  // the family's own head dimension: q is heads x head_dim wide
  SHARDLM_CHECK(cfg.hidden_size % cfg.num_heads == 0, family, " config: hidden_size ", cfg.hidden_size,
                " is not a multiple of ", heads_key, " ", cfg.num_heads);
}

}  // namespace model_detail

void init_unit_slice(const UnitLayout& unit, int unit_index, uint64_t seed, size_t begin, size_t end,
                     float* out) {
  SHARDLM_CHECK(begin <= end, "init_unit_slice: begin ", begin, " > end ", end, " in unit ", unit.name);
  // Each element depends only on (seed, unit, index), so threads over chunks give the same values;
  // a 7B model's slices would take minutes on one core.
  constexpr size_t kChunk = size_t{1} << 22;
  const size_t n = end - begin;
  const unsigned threads =
      static_cast<unsigned>(std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), 16, (n + kChunk - 1) / kChunk}));
  if (threads <= 1) return init_range(unit, unit_index, seed, begin, end, begin, out);
  std::vector<std::thread> pool;
  const size_t per = (n + threads - 1) / threads;
  for (unsigned k = 0; k < threads; ++k) {
    const size_t lo = begin + std::min(n, k * per), hi = begin + std::min(n, (k + 1) * per);
    pool.emplace_back(init_range, std::cref(unit), unit_index, seed, lo, hi, begin, out);
  }
  for (std::thread& t : pool) t.join();
}

// ---- cfg.arch's family's layout, HF names and linear modules ----

bool ModelConfig::tied_head() const { return model_family(arch).head_always_tied || tie_word_embeddings; }

float ModelConfig::attention_scale() const {
  return static_cast<float>(1.0 / std::sqrt(attention_scalar()));
}

// Sizes beyond any real model's are refused before a layout is built: a wrapped or mistyped size
// (1e9 layers) would otherwise allocate until the process is killed.
constexpr int64_t kMaxLayers = 4096, kMaxHidden = 1 << 17, kMaxVocab = 1 << 24, kMaxHeads = 4096;

std::vector<UnitLayout> model_layout(const ModelConfig& cfg) {
  auto bound = [](const char* key, int64_t value, int64_t limit) {
    SHARDLM_CHECK(value <= limit, "model.", key, " = ", value, ": more than shardlm takes (at most ", limit, ")");
  };
  bound("num_layers", cfg.num_layers, kMaxLayers);
  bound("hidden_size", cfg.hidden_size, kMaxHidden);
  bound("vocab_size", cfg.vocab_size, kMaxVocab);
  bound("num_heads", cfg.num_heads, kMaxHeads);
  bound("intermediate_size", cfg.intermediate_size, 8 * kMaxHidden);
  return model_family(cfg.arch).layout(cfg);
}

std::string hf_tensor_name(const ModelConfig& cfg, const std::string& name) {
  return model_family(cfg.arch).hf_tensor_name(name);
}

std::vector<LinearModule> linear_modules(const ModelConfig& cfg) { return model_family(cfg.arch).linear_modules(cfg); }

}  // namespace shardlm

// Shared by test_checkpoint and checkpoint_fault_main: a tiny BLOOM whose units are sliced as FSDP
// slices them, with parameters and moments that are known functions of the global element index.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "shardlm/io.hpp"
#include "shardlm/model.hpp"

namespace ckpt_test {

inline shardlm::ModelConfig tiny_bloom(int hidden = 8, int layers = 2) {
  shardlm::ModelConfig cfg;
  cfg.vocab_size = 50;
  cfg.hidden_size = hidden;
  cfg.num_layers = layers;
  cfg.num_heads = 2;
  cfg.layer_norm_eps = 1e-5f;
  cfg.init_std = 0.02f;
  return cfg;
}

// Value of element `index` of vector v (0 param, then the optimizer's: 1 exp_avg, 2 exp_avg_sq,
// 3 and on any further one) of unit `unit`.
inline float known_value(int v, size_t unit, size_t index) {
  const float base = static_cast<float>(index % 1000) * 0.001f + static_cast<float>(unit) * 0.125f;
  if (v > 2) return base * static_cast<float>(v) - 1.0f;
  return v == 0 ? base - 0.5f : v == 1 ? -base * 0.25f : base * base + 1e-6f;
}

// The optimizer vectors the trainer stores today (AdamW's moments).
inline std::vector<std::string> adamw_vectors() { return {"exp_avg", "exp_avg_sq"}; }

// One rank's slices of every unit. Shard groups are `group` consecutive ranks; the rank owns
// slice (rank % group) of the padded length; the first group's ranks are the primaries.
struct Sharded {
  std::vector<shardlm::UnitLayout> layouts;
  std::vector<std::vector<std::vector<float>>> vectors;  // [param, then each optimizer vector][unit]
  std::vector<shardlm::UnitState> units;
};

inline Sharded make_sharded(const shardlm::ModelConfig& cfg, int group, int rank, bool fill,
                            const std::vector<std::string>& optimizer = adamw_vectors()) {
  Sharded s;
  s.layouts = shardlm::model_layout(cfg);
  const size_t n = s.layouts.size();
  s.vectors.assign(1 + optimizer.size(), std::vector<std::vector<float>>(n));
  for (size_t u = 0; u < n; ++u) {
    const size_t numel = s.layouts[u].numel;
    const size_t shard = (numel + group - 1) / group;  // padded length / group
    const size_t begin = std::min(numel, static_cast<size_t>(rank % group) * shard);
    const size_t count = std::min(numel, begin + shard) - begin;
    for (size_t v = 0; v < s.vectors.size(); ++v) {
      s.vectors[v][u].assign(shard, 0.0f);
      if (fill)
        for (size_t i = 0; i < count; ++i) s.vectors[v][u][i] = known_value(static_cast<int>(v), u, begin + i);
    }
    shardlm::UnitState st;
    st.layout = &s.layouts[u];
    st.numel = numel;
    st.begin = begin;
    st.count = count;
    st.primary = rank / group == 0;
    st.param = s.vectors[0][u].data();
    for (size_t k = 0; k < optimizer.size(); ++k) st.optimizer.push_back({optimizer[k], s.vectors[1 + k][u].data()});
    s.units.push_back(st);
  }
  return s;
}

// Elements of this rank's slices that differ from the known values (0 when all match).
inline size_t count_wrong(const Sharded& s) {
  size_t wrong = 0;
  for (size_t u = 0; u < s.units.size(); ++u)
    for (size_t v = 0; v < s.vectors.size(); ++v)
      for (size_t i = 0; i < s.units[u].count; ++i)
        wrong += s.vectors[v][u][i] != known_value(static_cast<int>(v), u, s.units[u].begin + i);
  return wrong;
}

inline shardlm::CheckpointMeta tiny_meta(const shardlm::ModelConfig& cfg, long step, int world) {
  shardlm::CheckpointMeta m;
  m.step = step;
  m.epoch = 2;
  m.epoch_step = 7;
  m.seed = 0xfedcba9876543210ULL;
  m.optimizer_steps = step + 3;
  m.lr_schedule = "linear";
  m.base_lr = 3e-3;
  m.warmup_steps = 5;
  m.total_steps = 100;
  m.loss_scale = 65536.0;
  m.world_size = world;
  m.shard_group_size = world;
  m.strategy = "FULL_SHARD";
  m.model = cfg;
  m.deck = "[model]\nhidden_size = 8\n\n[train]\nlr = 0.003\n";
  m.version = "0.1.0";
  m.tokenizer_hash = "1f0e2d3c4b5a6978";
  return m;
}

}  // namespace ckpt_test

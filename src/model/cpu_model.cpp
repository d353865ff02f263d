// make_cpu_model: the CPU forward/backward of the architecture a ModelConfig names; the pieces
// the BLOOM and Llama code share (model_internal.hpp).
#include <algorithm>
#include <cmath>

#include "model_internal.hpp"

namespace shardlm {

namespace model_detail {

void add_tensor(UnitLayout& unit, const std::string& name, std::vector<int64_t> shape, InitKind init,
                float init_std) {
  TensorSpec t;
  t.name = name;
  t.numel = 1;
  for (int64_t d : shape) t.numel *= static_cast<size_t>(d);
  t.shape = std::move(shape);
  t.offset = unit.numel;
  t.decay = t.shape.size() >= 2;
  t.init = init;
  t.init_std = init_std;
  unit.numel += t.numel;
  unit.tensors.push_back(std::move(t));
}

double cross_entropy_rows(float* logits, int rows, int V, const int32_t* targets, const int32_t* positions,
                          float grad_scale, bool backward) {
  double loss = 0.0;
  for (int r = 0; r < rows; ++r) {
    float* row = logits + static_cast<size_t>(r) * V;
    const int32_t target = targets[positions[r]];
    // Stable log-sum-exp: shift by the row maximum, sum the exponentials in double.
    const float max_logit = *std::max_element(row, row + V);
    double total = 0.0;
    for (int v = 0; v < V; ++v) total += std::exp(row[v] - max_logit);
    loss += max_logit + std::log(total) - row[target];
    if (!backward) continue;
    const float inv_total = static_cast<float>(1.0 / total);
    for (int v = 0; v < V; ++v) row[v] = grad_scale * std::exp(row[v] - max_logit) * inv_total;
    row[target] -= grad_scale;
  }
  return loss;
}

}  // namespace model_detail

std::unique_ptr<CpuModel> make_cpu_model(const ModelConfig& cfg, int max_batch, int max_seq) {
  if (cfg.is_llama()) return std::make_unique<LlamaCpu>(cfg, max_batch, max_seq);
  SHARDLM_CHECK(cfg.arch == "bloom", "model.arch = '", cfg.arch, "' is not supported (bloom or llama)");
  return std::make_unique<BloomCpu>(cfg, max_batch, max_seq);
}

}  // namespace shardlm

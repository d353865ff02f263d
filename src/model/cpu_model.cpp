// make_cpu_model: the CPU forward/backward of the architecture a ModelConfig names.
#include "shardlm/model.hpp"

namespace shardlm {

std::unique_ptr<CpuModel> make_cpu_model(const ModelConfig& cfg, int max_batch, int max_seq) {
  if (cfg.is_llama()) return std::make_unique<LlamaCpu>(cfg, max_batch, max_seq);
  SHARDLM_CHECK(cfg.arch == "bloom", "model.arch = '", cfg.arch, "' is not supported (bloom or llama)");
  return std::make_unique<BloomCpu>(cfg, max_batch, max_seq);
}

}  // namespace shardlm

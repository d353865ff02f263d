// LoRA's device buffers in a CUDA model (CudaLoraBlocks, cuda_lora.hpp), in bytes: plain C++ (no CUDA
// headers), so that the families' *_cuda_sizes and `shardlm plan` count them in builds without CUDA.
#pragma once

#include <algorithm>
#include <cstddef>

#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

namespace shardlm::cuda {

struct LoraCudaSizes {
  size_t modules = 0;  // targeted linear layers per block
  size_t slice = 0;    // one layer's [max_tokens, r] in the compute dtype, rounded up to 256 bytes
  // With lora.dropout > 0: [max_tokens, widest adapted input] in the compute dtype (rounded up to 256
  // bytes), a layer's dropout(x), or its LoRA input gradient before the mask; 0 without dropout.
  size_t dropped = 0;
  // Per saved block: each targeted layer's x A^T, kept for its backward.
  size_t xa() const { return modules * slice; }
  // Scratch shared by the blocks: each layer's d(x A^T), from its parameter gradients to its input
  // gradient; and dropout's.
  size_t dxa() const { return modules * slice; }
  size_t scratch() const { return dxa() + dropped; }
};

// Nothing when cfg's LoRA is off or there are no blocks.
inline LoraCudaSizes lora_cuda_sizes(const ModelConfig& cfg, DType dt, size_t max_tokens) {
  LoraCudaSizes s;
  if (!cfg.lora.enabled() || cfg.num_layers == 0) return s;
  size_t widest = 0;
  for (const LinearModule& m : linear_modules(cfg))
    if (cfg.lora.targets(m.name)) s.modules += 1, widest = std::max(widest, static_cast<size_t>(m.in));
  s.slice = (max_tokens * static_cast<size_t>(cfg.lora.r) * dtype_size(dt) + 255) / 256 * 256;
  if (cfg.lora.dropout > 0) s.dropped = (max_tokens * widest * dtype_size(dt) + 255) / 256 * 256;
  return s;
}

}  // namespace shardlm::cuda

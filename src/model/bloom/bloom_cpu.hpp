// BloomCpu: BLOOM's CpuModel, fp32 on the CPU (ALiBi attention, LayerNorms with biases, GELU MLP,
// LM head tied to the word embeddings), and the bytes it holds for `shardlm plan`.
#pragma once

#include <cstddef>
#include <memory>

#include "shardlm/model.hpp"

namespace shardlm {

// BloomCpu(cfg, max_batch, max_seq): the CpuModel the registry's make_cpu builds.
std::unique_ptr<CpuModel> make_bloom_cpu(const ModelConfig& cfg, int max_batch, int max_seq);

// BloomCpu(cfg, max_batch, max_seq).activation_bytes() without building it.
size_t bloom_cpu_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq);

}  // namespace shardlm

// The registry record of a family built on Llama's decoder layer (Llama itself, Qwen2, Qwen3): the fields
// that follow from the layer and its options, and the family's names and config.json mapping.
#pragma once

#include <string>

#include "llama_cpu.hpp"
#include "llama_cuda_sizes.hpp"
#include "llama_layout.hpp"
#include "shardlm/model.hpp"
#ifdef SHARDLM_HAVE_CUDA
#include "cuda/llama_cuda.hpp"
#endif

namespace shardlm {

// `Block` is a template argument because the record holds plain function pointers. `sliding_window`:
// the family's attention may keep the last keys only (ModelFamily::sliding_window).
template <const LlamaBlock& Block>
ModelFamily llama_style_family(const std::string& name, const std::string& hf_architecture,
                               const std::string& hf_block_class, ModelConfig (*config_from_hf)(const HfConfigReader&),
                               void (*config_to_hf)(const ModelConfig&, OrderedJson&), bool sliding_window = false) {
  ModelFamily f;
  f.name = name;
  f.hf_model_types = {name};
  f.hf_architecture = hf_architecture;
  f.hf_block_class = hf_block_class;
  f.rotary = true;
  f.grouped_query = true;
  f.sliding_window = sliding_window;
  f.keeps_fp8_weights = true;
  f.embedding_table = "embed_tokens.weight";
  f.layout = [](const ModelConfig& cfg) { return llama_layout(cfg, Block); };
  f.linear_modules = llama_linear_modules;
  f.hf_tensor_name = llama_hf_tensor_name;
  f.config_from_hf = config_from_hf;
  f.config_to_hf = config_to_hf;
  f.make_cpu = [](const ModelConfig& cfg, int max_batch, int max_seq) {
    return make_llama_cpu(cfg, max_batch, max_seq, Block);
  };
  f.cpu_activation_bytes = [](const ModelConfig& cfg, int max_batch, int max_seq) {
    return llama_cpu_activation_bytes(cfg, max_batch, max_seq, Block);
  };
  f.cuda_memory = [](const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool checkpointing) {
    return cuda::llama_cuda_memory(cfg, dt, max_batch, max_seq, checkpointing, Block.qk_norm, Block.sandwich_norms);
  };
#ifdef SHARDLM_HAVE_CUDA
  f.make_cuda = [](const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool checkpointing) {
    return cuda::make_llama_cuda(cfg, dt, max_batch, max_seq, checkpointing, Block);
  };
#endif
  return f;
}

}  // namespace shardlm

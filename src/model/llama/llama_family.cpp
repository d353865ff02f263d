// The Llama family's record for the registry: LlamaForCausalLM's config.json keys, its Hugging Face
// tensor names ("model." + layout name, lm_head.weight as is), its CPU and CUDA models and sizes.
#include "llama_cpu.hpp"
#include "llama_cuda_sizes.hpp"
#include "llama_hf_config.hpp"
#include "llama_layout.hpp"
#include "shardlm/model.hpp"
#ifdef SHARDLM_HAVE_CUDA
#include "cuda/llama_cuda.hpp"
#endif

namespace shardlm {
namespace {

ModelConfig llama_from_hf(const HfConfigReader& r) {
  ModelConfig c = read_llama_style_config(r);
  SHARDLM_CHECK(!r.get_or<bool>({"attention_bias"}, false) && !r.get_or<bool>({"mlp_bias"}, false), r.source(),
                ": attention_bias / mlp_bias = true are not supported");
  SHARDLM_CHECK(r.get_or<int>({"pretraining_tp"}, 1) == 1, r.source(), ": pretraining_tp other than 1 is not supported");
  return c;
}

void llama_to_hf(const ModelConfig& cfg, OrderedJson& c) {
  write_llama_style_config(cfg, c);
  c["attention_bias"] = false;
  c["mlp_bias"] = false;
  c["initializer_range"] = shortest_decimal(cfg.init_std);
}

}  // namespace

ModelFamily llama_family() {
  ModelFamily f;
  f.name = "llama";
  f.hf_model_types = {"llama"};
  f.hf_architecture = "LlamaForCausalLM";
  f.rotary = true;
  f.grouped_query = true;
  f.layout = [](const ModelConfig& cfg) { return llama_layout(cfg, LlamaBlock{}); };
  f.hf_tensor_name = llama_hf_tensor_name;
  f.config_from_hf = llama_from_hf;
  f.config_to_hf = llama_to_hf;
  f.make_cpu = [](const ModelConfig& cfg, int max_batch, int max_seq) {
    return make_llama_cpu(cfg, max_batch, max_seq, LlamaBlock{});
  };
  f.cpu_activation_bytes = llama_cpu_activation_bytes;
  f.cuda_memory = cuda::llama_cuda_memory;
#ifdef SHARDLM_HAVE_CUDA
  f.make_cuda = [](const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool checkpointing) {
    return cuda::make_llama_cuda(cfg, dt, max_batch, max_seq, checkpointing, LlamaBlock{});
  };
#endif
  return f;
}

}  // namespace shardlm

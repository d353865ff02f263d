// The BLOOM family's record for the registry: BloomForCausalLM's config.json keys, its Hugging Face
// tensor names ("transformer." + layout name), its CPU and CUDA models and their sizes.
#include "../hf_config_reader.hpp"
#include "bloom_cpu.hpp"
#include "bloom_cuda_sizes.hpp"
#include "bloom_layout.hpp"
#include "shardlm/model.hpp"
#ifdef SHARDLM_HAVE_CUDA
#include "cuda/bloom_cuda.hpp"
#endif

namespace shardlm {
namespace {

ModelConfig bloom_from_hf(const HfConfigReader& r) {
  ModelConfig c;
  c.vocab_size = r.get<int>({"vocab_size"});
  c.hidden_size = r.get<int>({"hidden_size", "n_embed"});
  c.num_layers = r.get<int>({"n_layer", "num_hidden_layers"});
  c.num_heads = r.get<int>({"n_head", "num_attention_heads"});
  c.layer_norm_eps = r.positive_or({"layer_norm_epsilon"}, 1e-5f);
  c.init_std = r.get_or<float>({"initializer_range"}, 0.02f);
  SHARDLM_CHECK(!r.get_or<bool>({"apply_residual_connection_post_layernorm"}, false), r.source(),
                ": apply_residual_connection_post_layernorm = true is not supported");
  return c;
}

void bloom_to_hf(const ModelConfig& cfg, OrderedJson& c) {
  c["vocab_size"] = cfg.vocab_size;
  c["hidden_size"] = cfg.hidden_size;
  c["n_layer"] = cfg.num_layers;
  c["n_head"] = cfg.num_heads;
  c["layer_norm_epsilon"] = shortest_decimal(cfg.layer_norm_eps);
  c["initializer_range"] = shortest_decimal(cfg.init_std);
  c["apply_residual_connection_post_layernorm"] = false;
  c["hidden_dropout"] = 0.0;
  c["attention_dropout"] = 0.0;
  c["tie_word_embeddings"] = true;
  c["pretraining_tp"] = 1;
  c["slow_but_exact"] = false;
}

}  // namespace

ModelFamily bloom_family() {
  ModelFamily f;
  f.name = "bloom";
  f.hf_model_types = {"bloom"};
  f.hf_architecture = "BloomForCausalLM";
  f.hf_block_class = "BloomBlock";
  f.head_always_tied = true;
  f.embedding_table = "word_embeddings.weight";
  f.embedding_extras = {"word_embeddings_layernorm.weight", "word_embeddings_layernorm.bias"};
  f.layout = bloom_layout;
  f.linear_modules = bloom_linear_modules;
  f.hf_tensor_name = [](const std::string& name) { return "transformer." + name; };
  f.config_from_hf = bloom_from_hf;
  f.config_to_hf = bloom_to_hf;
  f.make_cpu = make_bloom_cpu;
  f.cpu_activation_bytes = bloom_cpu_activation_bytes;
  f.cuda_memory = [](const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool checkpointing) {
    const cuda::BloomCudaSizes s =
        cuda::bloom_cuda_sizes(cfg, dt, max_batch, max_seq, checkpointing, plans_fused_attention(cfg, dt));
    return ModelMemory{s.activations(), s.extra(), s.head_workspace};
  };
#ifdef SHARDLM_HAVE_CUDA
  f.make_cuda = cuda::make_bloom_cuda;
#endif
  return f;
}

}  // namespace shardlm

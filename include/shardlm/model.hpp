// model: the BLOOM architecture, its parameter layout per FSDP unit, and forward/backward per unit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/core.hpp"

namespace shardlm {

struct BloomConfig {
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  float layer_norm_eps = 1e-5f;
  float init_std = 0.02f;

  int head_dim() const { return hidden_size / num_heads; }
};

enum class InitKind { Normal, Zeros, Ones };

// One tensor inside a unit's flat parameter. Names follow the Hugging Face BLOOM state dict
// without the "transformer." prefix; shapes are PyTorch's ([out, in] for linear weights).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in elements, inside the unit's flat parameter
  size_t numel = 0;
  bool decay = true;  // AdamW weight decay applies (false for biases and norms)
  InitKind init = InitKind::Normal;
  float init_std = 0.02f;  // standard deviation of a Normal init (BloomConfig::init_std)
};

// An FSDP unit: unit 0 is the root (embeddings, embedding LayerNorm, final LayerNorm; the LM head
// is tied to the embeddings), unit 1 + i is transformer block i.
struct UnitLayout {
  std::string name;  // "root" or "h.<i>"
  std::vector<TensorSpec> tensors;
  size_t numel = 0;
};

std::vector<UnitLayout> bloom_layout(const BloomConfig& cfg);

// Deterministic initial value of element `index` of unit `unit`'s flat parameter: the same on
// every rank and every world size, so each rank fills only the slice it owns.
void bloom_init_slice(const UnitLayout& unit, int unit_index, uint64_t seed, size_t begin, size_t end,
                      float* out);

// BLOOM's ALiBi slopes for `num_heads` heads (as transformers' build_alibi_tensor).
std::vector<float> alibi_slopes(int num_heads);

// Forward and backward of each unit, fp32, on the CPU backend. The object owns the activations
// saved for backward, sized up front for at most `max_batch` sequences of `max_seq` tokens.
// Parameters are passed as the unit's full flat fp32 parameter (layout from bloom_layout);
// parameter gradients are accumulated (+=) into a flat buffer of the same layout.
// Targets are the token each position must predict, or -1 where no loss is taken.
class BloomCpu {
 public:
  BloomCpu(const BloomConfig& cfg, int max_batch, int max_seq);
  ~BloomCpu();
  BloomCpu(const BloomCpu&) = delete;
  BloomCpu& operator=(const BloomCpu&) = delete;

  const BloomConfig& config() const { return cfg_; }

  // h0[B*T, H] = LayerNorm(word_embeddings[tokens]).
  void embed_forward(const float* root, const int32_t* tokens, int B, int T, float* h0);
  // h_out = block(h_in); saves what block_backward(layer) needs.
  void block_forward(int layer, const float* params, const float* h_in, float* h_out, int B, int T);
  // Final LayerNorm, tied LM head and cross-entropy. Returns the sum of the per-token losses over
  // positions with a target and stores their number in *count. When dh is non-null it also runs
  // the backward of d(grad_scale * sum)/d(.): dh[B*T, H] is written, droot accumulated.
  // Never holds more than a chunk of tokens' logits at a time.
  double head_loss(const float* root, const float* h, const int32_t* targets, int B, int T,
                   int64_t* count, float grad_scale, float* dh, float* droot);
  // dh_in = d/dh_in given dh_out; dparams += d/dparams. Uses the activations of block_forward.
  void block_backward(int layer, const float* params, const float* dh_out, float* dh_in,
                      float* dparams, int B, int T);
  // droot += d/d(root) of the embedding path given dh0; uses the activations of embed_forward.
  void embed_backward(const float* root, const int32_t* tokens, const float* dh0, float* droot,
                      int B, int T);

  // Bytes of saved activations and workspaces this object holds.
  size_t activation_bytes() const;

 private:
  struct Impl;
  BloomConfig cfg_;
  Impl* impl_;
};

}  // namespace shardlm

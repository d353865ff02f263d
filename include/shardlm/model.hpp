// model: the BLOOM and Llama architectures, their parameter layouts per FSDP unit, and forward/backward per unit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/device.hpp"

namespace shardlm {

// Llama 3.1's rope_scaling ("rope_type": "llama3"): low frequencies slowed by `factor`, high ones
// kept, a smooth blend between (transformers' _compute_llama3_parameters). factor 0 = none.
struct RopeScaling {
  float factor = 0;
  float low_freq_factor = 1;
  float high_freq_factor = 4;
  int original_max_position_embeddings = 8192;
};

// The model's shape. `arch` picks the family: "bloom" (ALiBi, LayerNorm with biases, GELU MLP, LM
// head tied to the embeddings) or "llama" (RMSNorm, rotary embeddings, grouped-query attention,
// SwiGLU MLP, no biases, LM head tied or not). Fields of the other family are ignored.
struct ModelConfig {
  std::string arch = "bloom";
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  float layer_norm_eps = 1e-5f;  // BLOOM
  float init_std = 0.02f;
  // Llama
  int num_kv_heads = 0;        // 0 = num_heads (no grouping)
  int intermediate_size = 0;   // SwiGLU width; 0 = 4 * hidden_size
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  int max_position_embeddings = 4096;

  bool is_llama() const { return arch == "llama"; }
  int head_dim() const { return hidden_size / num_heads; }
  int kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int ffn_size() const { return intermediate_size > 0 ? intermediate_size : 4 * hidden_size; }
  // The LM head is the embedding matrix (always for BLOOM).
  bool tied_head() const { return !is_llama() || tie_word_embeddings; }
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
  float init_std = 0.02f;  // standard deviation of a Normal init (ModelConfig::init_std)
};

// An FSDP unit: unit 0 is the root (embeddings, final norm, the LM head when untied; BLOOM's
// embedding LayerNorm), unit 1 + i is transformer block i.
struct UnitLayout {
  std::string name;  // "root", then "h.<i>" (BLOOM) or "layers.<i>" (Llama)
  std::vector<TensorSpec> tensors;
  size_t numel = 0;
};

std::vector<UnitLayout> bloom_layout(const ModelConfig& cfg);
std::vector<UnitLayout> llama_layout(const ModelConfig& cfg);
// The layout of cfg.arch; Error naming the architecture when it is not bloom or llama.
std::vector<UnitLayout> model_layout(const ModelConfig& cfg);
// The Hugging Face state-dict name of a layout tensor ("transformer." + name for BLOOM, "model." +
// name for Llama except lm_head.weight).
std::string hf_tensor_name(const ModelConfig& cfg, const std::string& name);

// Deterministic initial value of element `index` of unit `unit`'s flat parameter: the same on
// every rank and every world size, so each rank fills only the slice it owns.
void init_unit_slice(const UnitLayout& unit, int unit_index, uint64_t seed, size_t begin, size_t end,
                      float* out);

// BLOOM's ALiBi slopes for `num_heads` heads (as transformers' build_alibi_tensor).
std::vector<float> alibi_slopes(int num_heads);

// Reads a Hugging Face config.json (model_type bloom or llama); `source` names it in errors.
// Unsupported architectures and options get an Error naming the key.
ModelConfig model_config_from_hf(const std::string& json_text, const std::string& source);
// The config.json transformers loads for this model (BloomForCausalLM or LlamaForCausalLM);
// model_config_from_hf reads it back to the same ModelConfig.
std::string hf_config_json(const ModelConfig& cfg);

// Llama's rotary inverse frequencies for head dimension `head_dim`, rope_scaling applied.
std::vector<float> rope_inv_freq(const ModelConfig& cfg);

// ---- what the FSDP engine runs, on either backend ----

// A model as the FSDP engine (src/fsdp) drives it, the same on both backends: forward and backward
// of each FSDP unit on stream `s` (nullptr and synchronous on the CPU), activations in buffers
// sized up front for micro-batches of up to max_batch x max_seq tokens, hidden states held inside.
// `params` is a unit's gathered flat parameter (layout of model_layout) in compute_dtype();
// parameter gradients are fp32 in the same layout, accumulated (+=). Token ids, targets and the
// decode arrays live in the backend's memory (host memory on the CPU backend).
class UnitModel {
 public:
  virtual ~UnitModel() = default;
  virtual const ModelConfig& config() const = 0;
  virtual DType compute_dtype() const = 0;

  // h_0 from the token ids [B*T].
  virtual void embed_forward(const void* root, const int32_t* tokens, int B, int T, Stream s) = 0;
  // h_{l+1} = block_l(h_l).
  virtual void block_forward(int layer, const void* params, int B, int T, Stream s) = 0;
  // Final norm, LM head and cross-entropy on h_L (targets -1: no loss there); the sum of the token
  // losses is added to the model's loss sum (reset_loss, loss_sum). With backward, the gradient of
  // grad_scale * sum flows to the gradient of h_L and into droot (fp32, +=).
  virtual void head(const void* root, const int32_t* targets, int B, int T, float grad_scale, bool backward,
                    float* droot, Stream s) = 0;
  // The gradient of h_l from that of h_{l+1}; dparams += the block's parameter gradient.
  virtual void block_backward(int layer, const void* params, float* dparams, int B, int T, Stream s) = 0;
  // droot += the embedding path's gradient given the gradient of h_0.
  virtual void embed_backward(const void* root, const int32_t* tokens, float* droot, int B, int T, Stream s) = 0;
  virtual void reset_loss(Stream s) = 0;
  // The loss sum since reset_loss (waits for the stream's work).
  virtual double loss_sum(Stream s) = 0;

  // Bytes of the buffers counted as activations in the run's memory records.
  virtual size_t activation_bytes() const = 0;

  // ---- greedy decoding with a key/value cache ----
  // The cache of `slots` sequences of up to `max_len` positions and the scratch of steps of up to
  // `max_rows` rows, alive from decode_allocate to decode_free.
  virtual void decode_allocate(int slots, int max_len, int max_rows) = 0;
  virtual void decode_free() = 0;
  // The step's hidden states from n token ids.
  virtual void decode_embed(const void* root, const int32_t* tokens, int n, Stream s) = 0;
  // Block `layer` on the step's n rows: row r's key and value are cached at (slots[r], positions[r])
  // and it attends to its slot's positions 0..positions[r] (rows of one slot in position order).
  virtual void decode_block(int layer, const void* params, const int32_t* slots, const int32_t* positions, int n,
                            Stream s) = 0;
  // next[i] = argmax of the logits of step row rows[i], i < m (the lowest id on ties).
  virtual void decode_head_argmax(const void* root, const int32_t* rows, int m, int32_t* next, Stream s) = 0;
};

// The UnitModel of cfg.arch on `backend`, computing in compute_dtype, for micro-batches of up to
// max_batch x max_seq tokens; with activation_checkpointing (CUDA) each block's activations are
// recomputed for its backward.
std::unique_ptr<UnitModel> make_unit_model(const ModelConfig& cfg, BackendKind backend, DType compute_dtype,
                                           int max_batch, int max_seq, bool activation_checkpointing);

// Forward and backward of each unit, fp32, on the CPU backend. The object owns the activations
// saved for backward, sized up front for at most `max_batch` sequences of `max_seq` tokens.
// Parameters are passed as the unit's full flat fp32 parameter (layout from model_layout);
// parameter gradients are accumulated (+=) into a flat buffer of the same layout.
// Targets are the token each position must predict, or -1 where no loss is taken.
class CpuModel {
 public:
  virtual ~CpuModel() = default;
  virtual const ModelConfig& config() const = 0;

  // h0[B*T, H] = the embedded tokens (BLOOM: then LayerNorm).
  virtual void embed_forward(const float* root, const int32_t* tokens, int B, int T, float* h0) = 0;
  // h_out = block(h_in); saves what block_backward(layer) needs.
  virtual void block_forward(int layer, const float* params, const float* h_in, float* h_out, int B, int T) = 0;
  // Final norm, LM head and cross-entropy. Returns the sum of the per-token losses over positions
  // with a target and stores their number in *count. When dh is non-null it also runs the
  // backward of d(grad_scale * sum)/d(.): dh[B*T, H] is written, droot accumulated.
  // Never holds more than a chunk of tokens' logits at a time.
  virtual double head_loss(const float* root, const float* h, const int32_t* targets, int B, int T,
                           int64_t* count, float grad_scale, float* dh, float* droot) = 0;
  // dh_in = d/dh_in given dh_out; dparams += d/dparams. Uses the activations of block_forward.
  virtual void block_backward(int layer, const float* params, const float* dh_out, float* dh_in,
                              float* dparams, int B, int T) = 0;
  // droot += d/d(root) of the embedding path given dh0; uses the activations of embed_forward.
  virtual void embed_backward(const float* root, const int32_t* tokens, const float* dh0, float* droot,
                              int B, int T) = 0;
  // Logits of the last position of each sequence, [B, V], for greedy decoding.
  virtual void head_logits(const float* root, const float* h, int B, int T, float* logits) = 0;

  // ---- greedy decoding with a key/value cache ----
  // Sizes the cache for `slots` sequences of up to `max_len` positions in every layer, and the
  // scratch of block_decode calls of up to `max_rows` rows. Training buffers are untouched.
  virtual void decode_begin(int slots, int max_len, int max_rows) = 0;
  // h_out[n, H] = block(h_in) for n rows, row r being the token at position positions[r] of the
  // sequence in cache slot slots[r]: its key and value are cached, then it attends to its slot's
  // positions 0..positions[r] (rows of one slot in position order; earlier ones cached before).
  virtual void block_decode(int layer, const float* params, const float* h_in, float* h_out, int n,
                            const int* slots, const int* positions) = 0;
  virtual void decode_end() = 0;  // frees the cache and its scratch

  // Bytes of saved activations and workspaces this object holds.
  virtual size_t activation_bytes() const = 0;
};

// The CPU model of cfg.arch.
std::unique_ptr<CpuModel> make_cpu_model(const ModelConfig& cfg, int max_batch, int max_seq);
// The activation_bytes() the CPU model of cfg.arch would hold for max_batch x max_seq, without
// building it (`shardlm plan`); Error naming the architecture when this build has no CPU model of it.
size_t cpu_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq);
// The same for LlamaCpu (cpu_activation_bytes dispatches to it).
size_t llama_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq);

class BloomCpu final : public CpuModel {
 public:
  BloomCpu(const ModelConfig& cfg, int max_batch, int max_seq);
  ~BloomCpu() override;
  BloomCpu(const BloomCpu&) = delete;
  BloomCpu& operator=(const BloomCpu&) = delete;

  const ModelConfig& config() const override { return cfg_; }
  void embed_forward(const float* root, const int32_t* tokens, int B, int T, float* h0) override;
  void block_forward(int layer, const float* params, const float* h_in, float* h_out, int B, int T) override;
  double head_loss(const float* root, const float* h, const int32_t* targets, int B, int T, int64_t* count,
                   float grad_scale, float* dh, float* droot) override;
  void block_backward(int layer, const float* params, const float* dh_out, float* dh_in, float* dparams, int B,
                      int T) override;
  void embed_backward(const float* root, const int32_t* tokens, const float* dh0, float* droot, int B,
                      int T) override;
  void head_logits(const float* root, const float* h, int B, int T, float* logits) override;
  void decode_begin(int slots, int max_len, int max_rows) override;
  void block_decode(int layer, const float* params, const float* h_in, float* h_out, int n, const int* slots,
                    const int* positions) override;
  void decode_end() override;
  size_t activation_bytes() const override;

 private:
  struct Impl;
  ModelConfig cfg_;
  Impl* impl_;
};

// Llama (transformers' LlamaForCausalLM): RMSNorm, rotary embeddings, grouped-query attention,
// SwiGLU MLP, no biases; the LM head is lm_head.weight, or embed_tokens.weight when tied.
class LlamaCpu final : public CpuModel {
 public:
  LlamaCpu(const ModelConfig& cfg, int max_batch, int max_seq);
  ~LlamaCpu() override;
  LlamaCpu(const LlamaCpu&) = delete;
  LlamaCpu& operator=(const LlamaCpu&) = delete;

  const ModelConfig& config() const override { return cfg_; }
  void embed_forward(const float* root, const int32_t* tokens, int B, int T, float* h0) override;
  void block_forward(int layer, const float* params, const float* h_in, float* h_out, int B, int T) override;
  double head_loss(const float* root, const float* h, const int32_t* targets, int B, int T, int64_t* count,
                   float grad_scale, float* dh, float* droot) override;
  void block_backward(int layer, const float* params, const float* dh_out, float* dh_in, float* dparams, int B,
                      int T) override;
  void embed_backward(const float* root, const int32_t* tokens, const float* dh0, float* droot, int B,
                      int T) override;
  void head_logits(const float* root, const float* h, int B, int T, float* logits) override;
  void decode_begin(int slots, int max_len, int max_rows) override;
  void block_decode(int layer, const float* params, const float* h_in, float* h_out, int n, const int* slots,
                    const int* positions) override;
  void decode_end() override;
  size_t activation_bytes() const override;

 private:
  struct Impl;
  ModelConfig cfg_;
  Impl* impl_;
};

}  // namespace shardlm

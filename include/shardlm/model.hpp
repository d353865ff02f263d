// model: the model families (a registry of them, one folder each under src/model), their
// parameter layouts per FSDP unit, and the models the engines drive on each backend.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
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

// LongRoPE (Phi-3's rope_type "longrope", transformers' _compute_longrope_parameters): the rotary frequency i
// is 1 / (ext_i * theta^(2i / rotary_dim)), ext the long factors in a forward whose positions reach past
// original_max_position_embeddings (its largest position + 1 above it) and the short ones otherwise, and cos
// and sin are multiplied by attention_factor. Off when short_factor is empty.
struct LongRope {
  std::vector<float> short_factor, long_factor;  // [rotary_dim / 2] each
  int original_max_position_embeddings = 0;
  // 0: transformers' default from factor = max_position_embeddings / original_max_position_embeddings,
  // sqrt(1 + ln(factor) / ln(original)) (1 where factor <= 1).
  float attention_factor = 0;
  bool enabled() const { return !short_factor.empty(); }
};

// How the CUDA backend runs attention (model.attention): Auto takes cuDNN's fused flash attention
// where it can run (cuDNN built in, a GPU of compute capability 8.0+, a 16-bit compute dtype, a head
// dimension cuDNN takes) and the native kernels elsewhere; Cudnn requires the fused path; Native
// never uses it. The CPU backend has one attention and ignores it.
enum class AttentionImpl { Auto, Cudnn, Native };

// LoRA (the deck's [lora] section), as PEFT does it: each targeted linear layer of every block computes
// W x + scale * B (A dropout(x)) with A [r, in] and B [out, r] trainable and W (and every other base
// weight) frozen. Init Kaiming: A Kaiming-uniform (bound 1 / sqrt(in), PEFT's init_lora_weights = True),
// B zero; Gaussian: A normal with standard deviation 1 / r, B zero. Off when r == 0.
enum class LoraInit { Kaiming, Gaussian };
struct LoraConfig {
  int r = 0;
  double alpha = 8;
  double dropout = 0;  // of each adapted layer's input, in training forwards only (UnitModel::set_dropout)
  // The family's module names (LinearModule::name), in the family's order ("all-linear" expanded).
  std::vector<std::string> target_modules;
  // Whole modules of the root unit trained beside the adapters (PEFT's modules_to_save), by their
  // SavableModule::name, in layout order.
  std::vector<std::string> modules_to_save;
  bool use_rslora = false;                   // scale alpha / sqrt(r) instead of alpha / r
  LoraInit init = LoraInit::Kaiming;

  bool enabled() const { return r > 0; }
  double scale() const;
  bool targets(const std::string& module) const;
};

// A linear layer of a block that LoRA can adapt: its Hugging Face module name ("q_proj",
// "query_key_value"), its path inside the block ("self_attn.q_proj"), its input and output widths.
struct LinearModule {
  std::string name;
  std::string path;
  int64_t in = 0, out = 0;
};

// The CUDA LM head's logits rows at once when model.head_chunk_tokens is 0, and with fsdp.cpu_offload
// (model_for_engine in fsdp.hpp).
constexpr int kDefaultHeadChunkTokens = 2048;
constexpr int kOffloadHeadChunkTokens = 512;

// The model's shape. `arch` names the family (model_families(): "bloom", "llama", ...); fields a
// family does not use are ignored.
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
  int head_size = 0;           // the attention heads' dimension (config.json head_dim); 0 = hidden_size / num_heads
  // Sliding-window attention (Mistral's config.json sliding_window): a query at position i attends keys
  // j with i - sliding_window < j <= i, as transformers' sliding_window_overlay; 0 = every earlier key.
  int sliding_window = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  // Per-layer attention (Gemma 3's local / global layers): with a pattern N > 0 the layers i with (i + 1) % N
  // == 0 are global (every earlier key, rope_theta), the others local (sliding_window, rope_local_theta);
  // 0 = every layer alike (sliding_window on each). layer_sliding_window / layer_rope_table below.
  int sliding_window_pattern = 0;
  float rope_local_theta = 0;  // the local layers' rotary base, unscaled; 0 = the global table on every layer
  float rope_linear_factor = 0;  // rope_type linear on the global table: inv_freq / factor; 0 = none
  float query_pre_attn_scalar = 0;  // attention scores scaled by its inverse square root; 0 = head_dim
  // Partial rotary (Phi-3's partial_rotary_factor): only the first int(head_dim * factor) dimensions of
  // each head rotate (rotate_half within them); the rest pass through. 1 = all.
  double partial_rotary_factor = 1.0;
  LongRope longrope;
  bool tie_word_embeddings = false;
  int max_position_embeddings = 4096;
  AttentionImpl attention = AttentionImpl::Auto;  // not part of the shape: how the CUDA backend runs it
  bool packed = false;  // not part of the shape: training rows may hold several samples (data.packing)
  // Not part of the shape: the CUDA LM head's logits rows at once (model.head_chunk_tokens; 0: the
  // family's default, 2048). Its fp32 logits chunk is tokens x vocab x 4 bytes of workspace.
  int head_chunk_tokens = 0;
  LoraConfig lora;      // not part of the shape: adapters trained over frozen base weights
  // Not part of the shape: the base folder is the family's multimodal model, whose text model this is (Gemma 3's
  // Gemma3ForConditionalGeneration, config.json model_type gemma3). transformers builds that model from the
  // folder, so PEFT names the adapters after its module paths (peft_base_name). hf_config_json writes the text
  // model: a checkpoint's model config does not keep it (its adapter config's names do).
  bool hf_multimodal = false;
  // Not part of the shape: the CUDA blocks' linear layers run their GEMMs in FP8 (E4M3, per-tensor
  // current scaling; model.fp8_linear); everything else stays in the compute dtype.
  bool fp8_linear = false;
  // Not part of the shape: with fp8_linear, each such layer's E4M3 transposed weight is kept from its
  // forward to its backward (one byte a weight; with LoRA both copies, all run: model.fp8_keep_weights)
  // instead of made again there.
  bool fp8_keep_weights = false;

  int head_dim() const { return head_size > 0 ? head_size : hidden_size / num_heads; }
  int kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int ffn_size() const { return intermediate_size > 0 ? intermediate_size : 4 * hidden_size; }
  // Whether layer `layer` is a local (sliding-window) one: every layer without a pattern.
  bool layer_is_local(int layer) const {
    return sliding_window_pattern <= 0 || (layer + 1) % sliding_window_pattern != 0;
  }
  // Layer `layer`'s sliding window (0: none) and rotary table (0: rope_theta's, 1: rope_local_theta's).
  int layer_sliding_window(int layer) const { return layer_is_local(layer) ? sliding_window : 0; }
  int layer_rope_table(int layer) const { return rope_local_theta > 0 && layer_is_local(layer) ? 1 : 0; }
  int rope_tables() const { return rope_local_theta > 0 ? 2 : 1; }
  // The attention scores' scale: attention_scalar()^-1/2, where that is query_pre_attn_scalar, or head_dim for 0.
  float attention_scale() const;
  double attention_scalar() const { return query_pre_attn_scalar > 0 ? query_pre_attn_scalar : head_dim(); }
  // The leading dimensions of each head that rotate (partial_rotary_factor; transformers truncates).
  int rotary_dim() const { return static_cast<int>(head_dim() * partial_rotary_factor); }
  // The LM head is the embedding matrix (always for a family whose head is always tied, as BLOOM's).
  bool tied_head() const;
  // The LM head's chunk for micro-batches of at most `tokens` tokens (model.head_chunk_tokens).
  int head_chunk(size_t tokens) const {
    const size_t chunk = head_chunk_tokens > 0 ? static_cast<size_t>(head_chunk_tokens) : kDefaultHeadChunkTokens;
    return static_cast<int>(chunk < tokens ? chunk : tokens);
  }
};

enum class InitKind { Normal, Zeros, Ones, Uniform };

// One tensor inside a unit's flat parameter. Names follow the family's Hugging Face state dict
// without its prefix (hf_tensor_name adds it); shapes are PyTorch's ([out, in] for linear weights).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in elements, inside the unit's flat parameter
  size_t numel = 0;
  bool decay = true;  // AdamW weight decay applies (false for biases and norms)
  InitKind init = InitKind::Normal;
  float init_std = 0.02f;  // standard deviation of a Normal init (ModelConfig::init_std); a Uniform one's bound
  // The element index its initial values are drawn at: its offset where it was first laid out, kept
  // when LoRA moves it to another layout (lora_layout's saved modules), so it starts the same.
  size_t init_offset = 0;
};

// An FSDP unit: unit 0 is the root (embeddings, final norm, the LM head when untied; BLOOM's
// embedding LayerNorm), unit 1 + i is transformer block i.
struct UnitLayout {
  std::string name;  // "root", then the family's block names ("h.<i>" for BLOOM, "layers.<i>" for Llama)
  std::vector<TensorSpec> tensors;
  size_t numel = 0;
};

// The layout of cfg.arch's family; Error naming the known architectures when there is none.
std::vector<UnitLayout> model_layout(const ModelConfig& cfg);
// The Hugging Face state-dict name of a layout tensor ("transformer." + name for BLOOM, "model." +
// name for Llama except lm_head.weight).
std::string hf_tensor_name(const ModelConfig& cfg, const std::string& name);

// The linear layers of one block of cfg.arch's family that LoRA can adapt, in the family's order.
std::vector<LinearModule> linear_modules(const ModelConfig& cfg);
// What LoRA trains, one unit per model_layout unit: the root holds the tensors of the modules of
// cfg.lora.modules_to_save (model_layout's root tensors, whole, in its order); each block, for each
// targeted module in the family's order, "<block>.<path>.lora_A.weight" [r, in] (init as
// cfg.lora.init) then "<block>.<path>.lora_B.weight" [out, r] (zeros). Every unit empty when LoRA is off.
std::vector<UnitLayout> lora_layout(const ModelConfig& cfg);
// What LoRA holds frozen: model_layout without lora_layout's root tensors (the rest keep their order).
std::vector<UnitLayout> lora_frozen_layout(const ModelConfig& cfg);
// The LoRA base checksum (CheckpointMeta::base_checksum) is the sum, mod 2^64, of one term per element
// of the frozen base: element `index` of unit `unit` of lora_frozen_layout, its value as the model
// reads it (rounded to fsdp.param_dtype). Any world size and strategy sum the same terms.
inline uint64_t base_checksum_term(size_t unit, size_t index, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return mix64(mix64((static_cast<uint64_t>(unit) << 40) ^ index) ^ bits);
}
// The name of a layout tensor in the model transformers builds from the base folder, which PEFT wraps and names
// adapters after: hf_tensor_name, or for a multimodal base (ModelConfig::hf_multimodal) the family's name of it
// there (Gemma 3: model.language_model.layers.0.self_attn.q_proj.weight; lm_head.weight stays).
std::string peft_base_name(const ModelConfig& cfg, const std::string& name);
// PEFT's name of an adapter tensor in adapter_model.safetensors: "base_model.model." + peft_base_name.
std::string peft_tensor_name(const ModelConfig& cfg, const std::string& name);

// A module lora.modules_to_save can train whole: one of the root unit's (the blocks' are not: see
// docs/lora.md), the embedding when the LM head is not tied to it.
struct SavableModule {
  // How modules_to_save names it: the shortest end of its path that PEFT's rule (peft_saves) matches
  // to it alone ("embed_tokens", "lm_head", "model.norm"; BLOOM "word_embeddings_layernorm", "ln_f").
  std::string name;
  std::string path;    // its Hugging Face module path ("model.norm"; a multimodal base's as peft_base_name names it)
  std::string prefix;  // its tensors' names in the root's layout less ".weight" / ".bias" ("norm")
};
std::vector<SavableModule> lora_savable_modules(const ModelConfig& cfg);
// Every module path of the Hugging Face model that holds parameters, and their parents ("model",
// "model.layers.0", ...), as transformers' named_modules lists them (a tied LM head included; a multimodal
// base's as peft_base_name names them, its vision tower left out).
std::vector<std::string> hf_module_paths(const ModelConfig& cfg);
// PEFT's modules_to_save rule (peft.utils.other._set_trainable): `entry` selects every module whose
// path ends with it, as a string ("norm" selects "model.norm" and each block's "input_layernorm").
bool peft_saves(const std::string& path, const std::string& entry);

// Deterministic initial value of element `index` of unit `unit`'s flat parameter: the same on
// every rank and every world size, so each rank fills only the slice it owns.
void init_unit_slice(const UnitLayout& unit, int unit_index, uint64_t seed, size_t begin, size_t end,
                      float* out);

// Why cuDNN's fused attention cannot take this model's attention in compute dtype dt ("" when the
// shape allows it; the GPU and the library are checked when the model starts).
std::string fused_attention_refusal(const ModelConfig& cfg, DType dt);
// Whether the CUDA model will run attention through cuDNN, as far as this build and the shape tell:
// what `shardlm plan` and the memory sizes of the CUDA models assume.
bool plans_fused_attention(const ModelConfig& cfg, DType dt);

// BLOOM's positions: ALiBi slopes for `num_heads` heads (as transformers' build_alibi_tensor).
std::vector<float> alibi_slopes(int num_heads);

// Reads a Hugging Face config.json (a model_type of a registered family); `source` names it in
// errors. Unsupported architectures and options get an Error naming the key.
ModelConfig model_config_from_hf(const std::string& json_text, const std::string& source);
// The config.json transformers loads for this model (the family's *ForCausalLM);
// model_config_from_hf reads it back to the same ModelConfig.
std::string hf_config_json(const ModelConfig& cfg);

// Rotary inverse frequencies for head dimension `head_dim` (cfg.rope_theta, rope_scaling applied):
// the positions of the Llama-style families. [rotary_dim / 2]; with LongRoPE the short factors' (`long_factors`:
// the long factors').
std::vector<float> rope_inv_freq(const ModelConfig& cfg, bool long_factors = false);
// The inverse frequencies of rotary table `table` (ModelConfig::layer_rope_table): 0 is rope_inv_freq's with
// rope_linear_factor applied (LongRoPE's long factors with `long_factors`), 1 the local layers' (rope_local_theta,
// unscaled; `long_factors` does not apply).
std::vector<float> rope_inv_freq(const ModelConfig& cfg, int table, bool long_factors = false);
// What cos and sin are multiplied by: LongRoPE's attention factor, else 1.
float rope_attention_factor(const ModelConfig& cfg);
// Whether a forward whose largest position is `max_position` uses LongRoPE's long factors.
inline bool rope_uses_long(const ModelConfig& cfg, long long max_position) {
  return cfg.longrope.enabled() && max_position + 1 > cfg.longrope.original_max_position_embeddings;
}
// A decoding step's largest position among the rows of row r's sequence (its slot): what the forward of
// that sequence alone (transformers' generate, one prompt) decides LongRoPE's factors by.
inline int rope_step_max_position(const int* slots, const int* positions, int n, int r) {
  int max_position = positions[r];
  for (int i = 0; i < n; ++i)
    if (slots[i] == slots[r] && positions[i] > max_position) max_position = positions[i];
  return max_position;
}

// ---- what the FSDP engine runs, on either backend ----

// A unit's parameters as a model reads them: `base` in the layout of model_layout (with LoRA,
// lora_frozen_layout), `adapter` in that of lora_layout (null without LoRA). A plain pointer converts
// to base-only parameters.
template <class T>
struct UnitParamsOf {
  const T* base = nullptr;
  const T* adapter = nullptr;
  UnitParamsOf(const T* b = nullptr, const T* a = nullptr) : base(b), adapter(a) {}  // NOLINT: implicit
};
// A unit's parameter gradients (fp32, accumulated with +=) in the same two layouts: `base` null when the
// base weights are frozen (LoRA: their gradients are never formed), `adapter` null without LoRA.
struct UnitGrads {
  float* base = nullptr;
  float* adapter = nullptr;
  // A block's base gradient holds nothing yet (UnitModel::writes_fresh_block_grads): the backward writes every
  // element of the unit's layout instead of adding to it, whatever the memory holds (its padding aside).
  bool fresh = false;
  UnitGrads(float* b = nullptr, float* a = nullptr) : base(b), adapter(a) {}  // NOLINT: implicit
  // The beta of a GEMM that forms a base gradient: 0 writes it (fresh), 1 adds to it.
  float gemm_beta() const { return fresh ? 0.0f : 1.0f; }
  // Where the base tensor at `offset` accumulates, or null when the base is frozen.
  float* base_at(size_t offset) const { return base ? base + offset : nullptr; }
};
using UnitParams = UnitParamsOf<void>;
using CpuParams = UnitParamsOf<float>;

// A model as the FSDP engine (src/fsdp) drives it, the same on both backends: forward and backward
// of each FSDP unit on stream `s` (nullptr and synchronous on the CPU), activations in buffers
// sized up front for micro-batches of up to max_batch x max_seq tokens, hidden states held inside.
// `params` is a unit's gathered flat parameters (UnitParams) in compute_dtype(); parameter gradients
// are fp32 in the same layouts (UnitGrads), accumulated (+=). With LoRA the root's `base` is in
// lora_frozen_layout's root and its `adapter` in lora_layout's (the modules of modules_to_save), each
// root tensor read from the one that holds it. Token ids, targets and the decode arrays live in the
// backend's memory (host memory on the CPU backend).
class UnitModel {
 public:
  virtual ~UnitModel() = default;
  virtual const ModelConfig& config() const = 0;
  virtual DType compute_dtype() const = 0;

  // Packed rows (data.packing): for each of the next micro-batch's B*T positions, where its sample
  // starts in its row (MicroBatch::starts, in the memory the tokens are in), or null for one sample
  // per row. A position attends only to its own sample, at position t - starts[t]; the forward and
  // backward of the blocks read it until the next call.
  virtual void set_sample_starts(const int32_t* starts) = 0;
  // LoRA dropout (lora.dropout > 0): the next forwards, and the backwards and recomputations that follow
  // them, are a training micro-batch's, each adapted layer's input dropped with masks drawn from `seed`
  // (the micro-step's, dropout_micro_step_seed); nullopt (the state after construction): evaluation, no
  // dropout. Greedy decoding never drops. Nothing changes without LoRA dropout.
  virtual void set_dropout(std::optional<uint64_t> seed) = 0;
  // h_0 from the token ids [B*T].
  virtual void embed_forward(UnitParams root, const int32_t* tokens, int B, int T, Stream s) = 0;
  // h_{l+1} = block_l(h_l).
  virtual void block_forward(int layer, UnitParams params, int B, int T, Stream s) = 0;
  // Final norm, LM head and cross-entropy on h_L (targets -1: no loss there); the sum of the token
  // losses is added to the model's loss sum (reset_loss, loss_sum). With backward, the gradient of
  // grad_scale * sum flows to the gradient of h_L and into droot's trained tensors (fp32, +=).
  virtual void head(UnitParams root, const int32_t* targets, int B, int T, float grad_scale, bool backward,
                    UnitGrads droot, Stream s) = 0;
  // The gradient of h_l from that of h_{l+1}; grads += the block's parameter gradients.
  virtual void block_backward(int layer, UnitParams params, UnitGrads grads, int B, int T, Stream s) = 0;
  // droot += the embedding path's gradient given the gradient of h_0 (nothing to do when none of its
  // tensors is trained).
  virtual void embed_backward(UnitParams root, const int32_t* tokens, UnitGrads droot, int B, int T, Stream s) = 0;
  virtual void reset_loss(Stream s) = 0;
  // The loss sum since reset_loss (waits for the stream's work).
  virtual double loss_sum(Stream s) = 0;

  // Bytes of the buffers counted as activations in the run's memory records.
  virtual size_t activation_bytes() const = 0;
  // How attention runs, for the run's log and summary: on the CPU "cpu"; on the GPU
  // "cudnn (cuDNN 9.19.0 fused flash attention)" or "native (...why not cuDNN...)".
  virtual std::string attention_description() const = 0;
  // Micro-batch lengths run best as multiples of this (1: any): cuDNN's fused attention builds
  // plans per shape, so the trainer pads micro-batches up to a multiple (make_micro_batch).
  virtual int length_multiple() const = 0;
  // model.fp8_linear: which GEMMs run in FP8 and which stay 16-bit, for the run's log; empty without FP8.
  virtual std::string fp8_description() const { return ""; }
  // LoRA's frozen base weights were written (loaded): copies made from them (model.fp8_keep_weights) are stale.
  virtual void frozen_weights_changed() {}
  // The head's scratch: the loss's logits chunk (and decoding's), head_scratch_bytes() of the activations,
  // which head() and decode_head() overwrite and nothing reads after they return. Between those calls its
  // holder may keep buffers of its own there (the engine's block gradients). share_head_scratch grows it
  // to at least `bytes` (freeing the old before allocating the new) and says where it is; null, and 0
  // bytes, where the model has none to share.
  virtual size_t head_scratch_bytes() const { return 0; }
  virtual void* share_head_scratch(size_t /*bytes*/) { return nullptr; }
  // The same with memory its holder lends (the engine's NCCL window, which its reductions read): the model
  // frees its own scratch first (so the two never coexist), then keeps allocate(n) as it, n the larger of
  // `bytes` and head_scratch_bytes(), or its own again where allocate gives null; says where it is. A model
  // that takes no lent memory shares its own (share_head_scratch, allocate not called).
  using LendScratch = std::function<std::unique_ptr<DeviceMemory>(size_t)>;
  virtual void* lend_head_scratch(size_t bytes, const LendScratch& /*allocate*/) { return share_head_scratch(bytes); }
  // A block's backward in two parts: first the MLP, whose parameters are the unit's flat elements from
  // backward_tail_begin() on (its input norm, gate|up, down; the engine splits only without LoRA), then the
  // attention. block_backward calls the hook of set_backward_tail_hook between the two (on the host, as it
  // queues its work on the stream: what it queues there follows the MLP's gradients), so that their
  // reduction can start while the attention's backward runs. 0 (the default): not split, the hook is never
  // called. An empty hook: none.
  virtual size_t backward_tail_begin() const { return 0; }
  virtual void set_backward_tail_hook(std::function<void()> /*hook*/) {}
  // block_backward honours UnitGrads::fresh: its projections' weight gradients written (no zeroed buffer read and
  // added to) and the rest of the unit's elements zeroed before the kernels that add to them, so the engine need
  // not zero the gradient buffers itself (FsdpEngine: the slices under zero_grad on one rank, each block buffer
  // after its reduction). Without it the engine zeroes them and fresh is never set.
  virtual bool writes_fresh_block_grads() const { return false; }

  // ---- greedy decoding with a key/value cache ----
  // The cache of `slots` sequences of up to `max_len` positions and the scratch of steps of up to
  // `max_rows` rows, alive from decode_allocate to decode_free.
  virtual void decode_allocate(int slots, int max_len, int max_rows) = 0;
  virtual void decode_free() = 0;
  // The step's hidden states from n token ids.
  virtual void decode_embed(UnitParams root, const int32_t* tokens, int n, Stream s) = 0;
  // Block `layer` on the step's n rows: row r's key and value are cached at (slots[r], positions[r])
  // and it attends to its slot's positions 0..positions[r] (rows of one slot in position order).
  virtual void decode_block(int layer, UnitParams params, const int32_t* slots, const int32_t* positions, int n,
                            Stream s) = 0;
  // The head on step rows rows[i], i < m: with `next`, next[i] = the argmax of row i's logits (the lowest
  // id on ties); with `logits`, its fp32 logits at logits[i * vocab_size] (sampling). Either may be null.
  virtual void decode_head(UnitParams root, const int32_t* rows, int m, int32_t* next, float* logits, Stream s) = 0;
};

// Forward and backward of each unit, fp32, on the CPU backend. The object owns the activations
// saved for backward, sized up front for at most `max_batch` sequences of `max_seq` tokens.
// Parameters are passed as the unit's full flat fp32 parameters (CpuParams, as UnitModel's);
// parameter gradients are accumulated (+=) into flat buffers of the same layouts (UnitGrads).
// Targets are the token each position must predict, or -1 where no loss is taken.
class CpuModel {
 public:
  virtual ~CpuModel() = default;
  virtual const ModelConfig& config() const = 0;

  // h0[B*T, H] = the embedded tokens (BLOOM: then LayerNorm).
  virtual void embed_forward(CpuParams root, const int32_t* tokens, int B, int T, float* h0) = 0;
  // UnitModel::set_sample_starts (host memory): packed rows, or null for one sample per row.
  virtual void set_sample_starts(const int32_t* starts) = 0;
  // UnitModel::set_dropout: training forwards with LoRA dropout masks of `seed`, or evaluation (nullopt).
  virtual void set_dropout(std::optional<uint64_t> seed) = 0;
  // h_out = block(h_in); saves what block_backward(layer) needs.
  virtual void block_forward(int layer, CpuParams params, const float* h_in, float* h_out, int B, int T) = 0;
  // Final norm, LM head and cross-entropy. Returns the sum of the per-token losses over positions
  // with a target and stores their number in *count. When dh is non-null it also runs the
  // backward of d(grad_scale * sum)/d(.): dh[B*T, H] is written, droot's trained tensors accumulated.
  // Never holds more than a chunk of tokens' logits at a time.
  virtual double head_loss(CpuParams root, const float* h, const int32_t* targets, int B, int T,
                           int64_t* count, float grad_scale, float* dh, UnitGrads droot) = 0;
  // dh_in = d/dh_in given dh_out; grads += d/dparams. Uses the activations of block_forward.
  virtual void block_backward(int layer, CpuParams params, const float* dh_out, float* dh_in, UnitGrads grads,
                              int B, int T) = 0;
  // droot += d/d(root) of the embedding path given dh0; uses the activations of embed_forward.
  virtual void embed_backward(CpuParams root, const int32_t* tokens, const float* dh0, UnitGrads droot,
                              int B, int T) = 0;
  // Logits of the last position of each sequence, [B, V], for greedy decoding.
  virtual void head_logits(CpuParams root, const float* h, int B, int T, float* logits) = 0;

  // ---- greedy decoding with a key/value cache ----
  // Sizes the cache for `slots` sequences of up to `max_len` positions in every layer, and the
  // scratch of block_decode calls of up to `max_rows` rows. Training buffers are untouched.
  virtual void decode_begin(int slots, int max_len, int max_rows) = 0;
  // h_out[n, H] = block(h_in) for n rows, row r being the token at position positions[r] of the
  // sequence in cache slot slots[r]: its key and value are cached, then it attends to its slot's
  // positions 0..positions[r] (rows of one slot in position order; earlier ones cached before).
  virtual void block_decode(int layer, CpuParams params, const float* h_in, float* h_out, int n,
                            const int* slots, const int* positions) = 0;
  virtual void decode_end() = 0;  // frees the cache and its scratch

  // Bytes of saved activations and workspaces this object holds.
  virtual size_t activation_bytes() const = 0;
  // UnitModel::head_scratch_bytes and share_head_scratch: head_loss's logits chunk (of activation_bytes).
  virtual size_t head_scratch_bytes() const { return 0; }
  virtual float* share_head_scratch(size_t /*bytes*/) { return nullptr; }
  // UnitModel::backward_tail_begin and set_backward_tail_hook (the hook called between block_backward's parts).
  virtual size_t backward_tail_begin() const { return 0; }
  virtual void set_backward_tail_hook(std::function<void()> /*hook*/) {}
};

// The CPU model of cfg.arch.
std::unique_ptr<CpuModel> make_cpu_model(const ModelConfig& cfg, int max_batch, int max_seq);
// The activation_bytes() the CPU model of cfg.arch would hold for max_batch x max_seq, without
// building it (`shardlm plan`); Error naming the architecture when no family has that name.
size_t cpu_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq);

// ---- the UnitModel of a run ----

// The bytes a model holds for micro-batches of up to max_batch x max_seq tokens: what its
// activation_bytes() reports, and what it holds beside them that the run's records do not count
// as activations (the plan adds it to the device total as model_extra).
struct ModelMemory {
  size_t activations = 0;
  size_t extra = 0;
  size_t head_scratch = 0;  // of the activations: UnitModel::head_scratch_bytes()
};

// The model the FSDP engine drives: cfg.arch's family on `backend`, computing in compute_dtype
// (F32 on the CPU backend, whose gathers are unpacked to fp32), buffers for micro-batches of up to
// max_batch x max_seq tokens; with activation_checkpointing (CUDA) each block's activations are
// recomputed for its backward. Error naming what is missing (family, backend in this build, dtype).
std::unique_ptr<UnitModel> make_unit_model(const ModelConfig& cfg, BackendKind backend, DType compute_dtype,
                                           int max_batch, int max_seq, bool activation_checkpointing);
// What make_unit_model's model of the same arguments holds, without building it (`shardlm plan`):
// .activations equals its activation_bytes().
ModelMemory unit_model_memory(const ModelConfig& cfg, BackendKind backend, DType compute_dtype, int max_batch,
                              int max_seq, bool activation_checkpointing);

// ---- the registry of model families ----

class HfConfigReader;  // src/model/hf_config_reader.hpp: config.json keys with errors naming them
namespace cuda {
class CudaModel;  // src/model/cuda/cuda_model.hpp
}

// Everything shardlm asks of an architecture, in one record per family (src/model/<family>/), listed
// once in src/model/registry.cpp. Callers branch on these properties, never on the name.
struct ModelFamily {
  std::string name;                         // model.arch
  std::vector<std::string> hf_model_types;  // config.json model_type values it reads; the first is written
  // model_type values its config_from_hf reads only to refuse with the reason (Gemma 3: gemma2); not listed as
  // supported
  std::vector<std::string> hf_refused_model_types;
  std::string hf_architecture;              // config.json "architectures" entry it writes
  std::string hf_block_class;               // transformers' decoder layer (Accelerate's fsdp_transformer_layer_cls_to_wrap)
  bool rotary = false;            // rotary positions: the head dimension must be even
  bool grouped_query = false;     // model.num_kv_heads, model.intermediate_size and model.head_dim apply
  bool head_always_tied = false;  // the LM head is the embedding matrix whatever tie_word_embeddings says
  bool sliding_window = false;    // model.sliding_window applies (its attention may keep the last keys only)
  bool keeps_fp8_weights = false; // model.fp8_keep_weights applies (its CUDA blocks keep the E4M3 weights)
  // model.sliding_window_pattern, rope_local_theta, rope_linear_factor and query_pre_attn_scalar apply (Gemma 3)
  bool local_global_layers = false;
  // Partial rotary and LongRoPE apply (model.partial_rotary_factor, model.longrope_*; Phi-3's config.json keys).
  bool rotary_options = false;
  // The root tensor the token ids index ([vocab, hidden]: the embedding's backward adds only to the rows
  // of a micro-batch's tokens) and the root tensors that backward writes besides it (BLOOM's embedding
  // LayerNorm). The FSDP engine reduces the rest of the root's gradient as soon as the head's backward
  // is done, and these rows and tensors at the end (FsdpBufferPlan::root_split). Empty: one reduction.
  std::string embedding_table;
  std::vector<std::string> embedding_extras;

  std::vector<UnitLayout> (*layout)(const ModelConfig&) = nullptr;  // also validates the config
  std::vector<LinearModule> (*linear_modules)(const ModelConfig&) = nullptr;  // a block's, for LoRA
  std::string (*hf_tensor_name)(const std::string& layout_name) = nullptr;
  // Loading only (null: none): other names a checkpoint may give the tensor hf_tensor_name names, tried after
  // it (Gemma 3's multimodal checkpoints keep the text model under language_model.model.*), and the tensors
  // of a checkpoint the model has no place for that are skipped (their vision tower).
  std::vector<std::string> (*hf_tensor_aliases)(const std::string& hf_name) = nullptr;
  bool (*hf_ignored_tensor)(const ModelConfig&, const std::string& hf_name) = nullptr;
  // The name hf_tensor_name's tensor has in the family's multimodal model as transformers 5 builds it (Gemma 3:
  // model.layers.* -> model.language_model.layers.*), for a base with ModelConfig::hf_multimodal; null: none.
  std::string (*hf_multimodal_name)(const std::string& hf_name) = nullptr;
  // config.json: the family's keys (arch, architectures and model_type are set by the registry).
  ModelConfig (*config_from_hf)(const HfConfigReader&) = nullptr;
  void (*config_to_hf)(const ModelConfig&, nlohmann::ordered_json&) = nullptr;
  std::unique_ptr<CpuModel> (*make_cpu)(const ModelConfig&, int max_batch, int max_seq) = nullptr;
  size_t (*cpu_activation_bytes)(const ModelConfig&, int max_batch, int max_seq) = nullptr;
  // The CUDA model's buffers, plain C++ so that plan works in builds without CUDA.
  ModelMemory (*cuda_memory)(const ModelConfig&, DType, int max_batch, int max_seq, bool checkpointing) = nullptr;
  // Null in builds without the CUDA backend.
  std::unique_ptr<cuda::CudaModel> (*make_cuda)(const ModelConfig&, DType, int max_batch, int max_seq,
                                                bool checkpointing) = nullptr;
};

// Every registered family, in registration order.
const std::vector<const ModelFamily*>& model_families();
// The family named `arch`; Error "model.arch = '...' is not supported (bloom, llama, ...)".
const ModelFamily& model_family(const std::string& arch);
// The family that reads config.json model_type `type` (or refuses it with its reason); Error naming `source` and
// the supported types.
const ModelFamily& model_family_of_hf_type(const std::string& type, const std::string& source);
// The registered names, for deck choices and messages.
std::vector<std::string> model_family_names();
// Every family's hf_block_class in registration order, and the same comma-separated for messages.
std::vector<std::string> hf_block_classes();
std::string hf_block_class_names();

}  // namespace shardlm

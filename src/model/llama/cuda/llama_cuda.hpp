// The Llama model on the GPU: forward and backward of each FSDP unit on one stream, activations in
// the compute dtype in buffers planned up front (llama_cuda_sizes.hpp; no allocation in the step),
// parameter gradients in fp32; and greedy decoding with a key/value cache. The options of
// LlamaBlock: Qwen2's q/k/v biases ride on the fused q|k|v GEMM's bias epilogue; Qwen3's per-head q/k
// RMSNorms are the RMSNorm kernels over rows of head_dim (tokens x heads rows), before rotary. LoRA's terms add onto
// the projections' columns (before rotary for q and k). Mirrors LlamaCpu (src/model/llama/llama_cpu.cpp),
// which is its reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "../llama_cuda_sizes.hpp"
#include "../llama_layout.hpp"
#include "../../root_tensors.hpp"
#include "cuda_model_base.hpp"
#include "device_memory.hpp"
#include "shardlm/model.hpp"

namespace shardlm::cuda {

struct MatMul;

class LlamaCuda final : public CudaModelBase {
 public:
  // Buffers for micro-batches of up to max_batch x max_seq tokens. With activation_checkpointing
  // only each block's input is kept; its other activations are recomputed before its backward.
  LlamaCuda(const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool activation_checkpointing,
            const LlamaBlock& block);

  // h_0 = embed_tokens[tokens]; `tokens` is device memory [B*T].
  void embed_forward(UnitParams root, const int32_t* tokens, int B, int T, cudaStream_t s) override;
  void block_forward(int layer, UnitParams params, int B, int T, cudaStream_t s) override;
  // Final RMSNorm, the LM head (lm_head.weight, or embed_tokens.weight when tied) and cross-entropy.
  void head(UnitParams root, const int32_t* targets, int B, int T, float grad_scale, bool backward,
            float* loss_sum, long long* count, UnitGrads droot, cudaStream_t s) override;
  void block_backward(int layer, UnitParams params, UnitGrads grads, int B, int T, cudaStream_t s) override;
  void embed_backward(UnitParams root, const int32_t* tokens, UnitGrads droot, int B, int T, cudaStream_t s) override;

  // Every device buffer of training (llama_cuda_sizes(...).total()); the decoding buffers are not.
  size_t activation_bytes() const override;
  size_t backward_tail_begin() const override { return tail_begin_; }

  // ---- greedy decoding with a key/value cache (llama_decode.cpp) ----
  // The cache of `slots` sequences of up to `max_len` positions (kv heads only) and the scratch of
  // steps of up to `max_rows` rows; they exist from decode_allocate to decode_free only.
  void decode_allocate(int slots, int max_len, int max_rows) override;
  void decode_free() override;
  // The step's hidden states: embed_tokens[tokens] for n rows (tokens in device memory).
  void decode_embed(UnitParams root, const int32_t* tokens, int n, cudaStream_t s) override;
  // Block `layer` on the step's n rows: rotary at each row's position, row r's key and value cached
  // at (slots[r], positions[r]), attention over its slot's positions 0..positions[r] (device arrays,
  // checked by the caller).
  void decode_block(int layer, UnitParams params, const int32_t* slots, const int32_t* positions, int n,
                    cudaStream_t s) override;
  // next[i] = argmax of the logits (final RMSNorm, the LM head) of step row rows[i], i < m (device arrays).
  void decode_head(UnitParams root, const int32_t* rows, int m, int32_t* next, float* logits,
                   cudaStream_t s) override;

 private:
  struct Saved {  // one block's activations kept for its backward
    DeviceBuffer<float> rstd1, rstd2, lse;  // lse: the attention softmax's, [B, heads, T]
    DeviceBuffer<char> qkv, context, h2, gate_up;
    DeviceBuffer<char> qk_raw;        // LlamaBlock::qk_norm: q then k before their norms, [N, q] and [N, k]
    DeviceBuffer<float> qk_rstd;      // their 1/rms per head, [N heads] then [N kv_heads]
    // LlamaBlock::sandwich_norms: o_proj's and down_proj's outputs before their norms, and the norms' 1/rms.
    DeviceBuffer<char> attn_out, mlp_out;
    DeviceBuffer<float> rstd3, rstd4;
  };
  // The block's forward into sv and h_{layer+1}; `recompute` (activation checkpointing's backward)
  // leaves out what the backward does not read: the block's output h_{layer+1}, already kept, and
  // the last linear layer that makes it (its LoRA's x A^T is still formed).
  void forward_into(int layer, UnitParams params, Saved& sv, int B, int T, cudaStream_t s, bool recompute = false);
  Saved& saved(int layer) { return checkpointing_ ? saved_[0] : saved_[layer]; }
  // Layer `layer`'s projection p's FP8 amax slot (MatMul::projection): its backward reuses its forward's amaxes.
  static int fp8_slot(int layer, LlamaFp8Slot p) { return layer * kFp8SlotsPerBlock + p; }

  // Where the root's tensors are (in the base, or in the trainable root of lora.modules_to_save), and
  // the element offsets of a block's in its flat layout (the same for every block), looked up once.
  // q|k|v and gate|up are adjacent, so each pair of GEMMs is one.
  struct RootTensors {
    model_detail::RootTensor embeddings, norm, head;
  };
  struct BlockOffsets {
    size_t input_norm, qkv, qkv_bias, o, post_norm, gate_up, down;  // qkv_bias: with qkv_bias_ only
    size_t q_norm, k_norm;                                            // with qk_norm_ only
    size_t attn_out_norm, mlp_out_norm;                               // with sandwich_ only
  };
  RootTensors root_{};
  BlockOffsets block_{};
  size_t tail_begin_ = 0;  // llama_backward_tail_begin
  // The block's projections (LlamaProjection); lora_slots_ maps them to LoRA's module indices (lora_).
  enum Module { kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj };
  std::vector<LlamaLoraSlot> lora_slots_;
  // The LoRA calls onto adjacent projections' output columns given as (projection, first column), in order:
  // (module, first column) once per module, a fused module's (Phi-3's qkv_proj) over all its projections.
  std::vector<std::pair<int, int>> lora_columns(std::initializer_list<std::pair<Module, int>> projections) const;
  // Partial rotary and LongRoPE (ModelConfig::rotary_dim, longrope): the frequencies a training forward of
  // T positions rotates by, and the rotation's options.
  // Layer `layer`'s (its ModelConfig::layer_rope_table; LongRoPE's long factors apply to table 0 only).
  const float* rope_freq(int layer, int T) const;
  // The long factors' frequencies of layer `layer`'s table: null without LongRoPE or on a local table.
  const float* long_inv_freq(int layer) const;
  int rotary_dim_ = 0;
  float rope_scale_ = 1;

  bool qkv_bias_ = false;  // LlamaBlock::qkv_bias
  bool qk_norm_ = false;   // LlamaBlock::qk_norm
  bool sandwich_ = false;  // LlamaBlock::sandwich_norms
  bool geglu_ = false;     // LlamaBlock::gelu_tanh: GeGLU instead of SwiGLU
  float norm_offset_ = 0;  // LlamaBlock::unit_offset_norms: every RMSNorm's weight is 1 + weight
  float embed_scale_ = 1;  // LlamaBlock::scaled_embeddings: sqrt(hidden_size) rounded to the compute dtype
  // The gated MLP activation of gate|up rows (SwiGLU or GeGLU) and its backward; with `amax_bits` the amax of what
  // it writes, for the FP8 GEMM that reads it next, and with `act_out` the backward also writes the forward's output
  // (it may be dout: swiglu.hpp).
  void gated_forward(const void* gate_up, void* out, int n, cudaStream_t s, unsigned* amax_bits = nullptr) const;
  void gated_backward(const void* dout, const void* gate_up, void* dgate_up, int n, cudaStream_t s,
                      unsigned* amax_bits = nullptr, void* act_out = nullptr) const;
  // block_backward's down_proj and the activation under it, from d(down_proj's output) `dmlp`: down_proj's weight
  // and LoRA gradients, d(gate|up) into dgate_up_ (its amax into dgate_up_amax, when not null); wide_ is scratch.
  void down_backward(int layer, UnitParams params, UnitGrads grads, const Saved& sv, const char* dmlp, int B, int T,
                     const MatMul& down_mm, unsigned* dgate_up_amax, cudaStream_t s);
  // Layer `layer`'s rotary table (ModelConfig::layer_rope_table) in inv_freq_, and its attention scale (0: the
  // kernels' 1 / sqrt(head_dim)).
  const float* inv_freq(int layer) const;
  float attention_scale() const { return cfg_.query_pre_attn_scalar > 0 ? cfg_.attention_scale() : 0.0f; }
  // Sandwich norms: y = base + RMSNorm(out), the norm's input `out` kept and its 1/rms in rstd; norm_ is scratch.
  void add_normed(const char* base, const char* out, const char* weight, float* rstd, char* y, int n,
                  cudaStream_t s);
  // The per-head q and k RMSNorms of q|k|v rows (stride QKV) in place, keeping the raw heads in raw and
  // their 1/rms in rstd (rows x heads each, q's then k's); work: [n, q] of scratch.
  void qk_norm_forward(char* qkv, int n, const char* q_weight, const char* k_weight, char* raw, float* rstd, char* work,
                       cudaStream_t s) const;
  // Their backward in place on d(q|k|v)'s q and k columns; the weights' gradients added into dq_weight,
  // dk_weight (null: frozen); work: 2 x [n, q] of scratch.
  void qk_norm_backward(char* dqkv, int n, const char* q_weight, const char* k_weight, const char* raw,
                        const float* rstd, float* dq_weight, float* dk_weight, char* work, cudaStream_t s) const;
  int qw_, kvw_, ffn_;  // widths: query heads, key (= value) heads, SwiGLU
  LlamaCudaSizes sizes_;  // of attention_'s choice (its native kernels: gqa_attention_*)
  // ModelConfig::rope_tables() tables of rotary_dim / 2, one after the other; with LongRoPE then the long factors'
  // of table 0.
  DeviceBuffer<float> inv_freq_;
  DeviceBuffer<float> final_rstd_;  // the final RMSNorm's 1/rms
  std::vector<Saved> saved_;
  // Scratch: a norm's output; the gradient into a norm or the context; the hidden-state gradient
  // (updated in place through each block); SiLU(gate) * up and its gradient; d(q|k|v); d(gate|up).
  DeviceBuffer<char> norm_, grad_, dh_, wide_, dqkv_, dgate_up_;
  DeviceBuffer<char> qk_work_;  // LlamaBlock::qk_norm's scratch (sizes_.qk_work)

  struct DecodeBuffers {  // between decode_allocate and decode_free, beside the cache
    // [max_rows, H | H | H | q|k|v | heads d | 2F | F] in dt: hidden states, mid-block residual,
    // a norm's output, projections, attention context, gate|up, SiLU(gate) * up.
    DeviceBuffer<char> hidden, h2, norm, qkv, ctx, gate_up, wide;
    DeviceBuffer<char> out;  // LlamaBlock::sandwich_norms: [max_rows, H], o_proj's or down_proj's output
    DeviceBuffer<float> rstd;  // [max_rows], RMSNorm statistics (unused after)
    // LlamaBlock::qk_norm: q|k before their norms and the normed heads, [max_rows, q] x 3; their 1/rms.
    DeviceBuffer<char> qk;
    DeviceBuffer<float> qk_rstd;
  };
  DecodeBuffers decode_;
};

// The CudaModel of the Llama-style families' registry records.
std::unique_ptr<CudaModel> make_llama_cuda(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                           bool activation_checkpointing, const LlamaBlock& block);

}  // namespace shardlm::cuda

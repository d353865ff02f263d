// The device buffers of LlamaCuda, in bytes, from the model and the micro-batch shape: LlamaCuda
// allocates exactly these and `shardlm plan` adds them up (the family's cuda_memory). Plain C++
// (no CUDA headers), so the CPU-only build plans Llama on the CUDA backend too.
#pragma once

#include <algorithm>
#include <cstddef>

#include "../../device/cuda/workspace_sizes.hpp"
#include "../cuda/cuda_lora_sizes.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

namespace shardlm::cuda {

// model.fp8_linear: a block's linear layers, each with an amax slot per block (Fp8Scratch::saved_amax) that
// its forward fills and its backward reads; slot layer * kFp8SlotsPerBlock + projection.
enum LlamaFp8Slot { kFp8Qkv, kFp8O, kFp8GateUp, kFp8Down, kFp8SlotsPerBlock };

struct LlamaCudaSizes {
  size_t saved_blocks = 0;  // blocks whose activations are kept at once (1 with checkpointing)
  // Kept from forward to backward: hidden states h_0 .. h_L, the final norm's 1/rms, the rotary
  // inverse frequencies.
  size_t hidden = 0, final_rstd = 0, inv_freq = 0;
  // Per saved block: both norms' 1/rms, q|k|v after rotary, the softmax's per-row log-sum-exp
  // (the probabilities are recomputed from it in backward, on either attention path), attention
  // context, the mid-block residual h2, gate|up projections.
  size_t rstd = 0, qkv = 0, lse = 0, context = 0, h2 = 0, gate_up = 0;
  // With LlamaBlock::qk_norm (Qwen3), per saved block: q|k before their per-head RMSNorms, as [N, q] then
  // [N, k] rows, and the norms' 1/rms per head; scratch: q or k normed, or their gradient in and out, 2 x [N, q].
  size_t qk_raw = 0, qk_rstd = 0, qk_work = 0;
  // With LlamaBlock::sandwich_norms (Gemma 3), per saved block: o_proj's and down_proj's outputs before the
  // norms on them ([N, H] each) and those norms' 1/rms.
  size_t sandwich_out = 0, sandwich_rstd = 0;
  // Scratch shared by the blocks: a norm's output, the gradient flowing into a norm or the
  // context, the hidden-state gradient, SiLU(gate) * up and its gradient, d(q|k|v), d(gate|up).
  size_t norm = 0, grad = 0, dh = 0, wide = 0, dqkv = 0, dgate_up = 0;
  // attention_workspace: the native kernels' T x T scratch, or cuDNN's fused attention's
  // (cudnn_attention_workspace_bytes).
  size_t attention_workspace = 0, head_workspace = 0;
  int head_chunk = 0;
  // LoRA (lora_cuda_sizes): per saved block the targeted layers' x A^T; scratch: their gradients, dropout's.
  size_t lora_xa = 0, lora_scratch = 0;
  // model.fp8_linear: the E4M3 copies of the largest A and B operand of the block's GEMMs (fp8_gemm.hpp),
  // and every block's amax slots.
  Fp8ScratchSize fp8;

  size_t per_block() const {
    return 2 * rstd + qkv + lse + context + h2 + gate_up + qk_raw + qk_rstd + 2 * (sandwich_out + sandwich_rstd) +
           lora_xa;
  }
  size_t total() const {
    return hidden + final_rstd + inv_freq + saved_blocks * per_block() + norm + grad + dh + wide + dqkv + dgate_up + qk_work +
           attention_workspace + head_workspace + lora_scratch + fp8.bytes();
  }
};

inline LlamaCudaSizes llama_cuda_sizes(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                       bool activation_checkpointing, bool fused_attention, bool qk_norm = false,
                                       bool sandwich_norms = false) {
  const size_t es = dtype_size(dt), f32 = sizeof(float);
  const size_t B = static_cast<size_t>(std::max(max_batch, 0)), T = static_cast<size_t>(std::max(max_seq, 0));
  const size_t N = B * T, H = cfg.hidden_size, L = cfg.num_layers, F = cfg.ffn_size();
  const size_t d = cfg.head_dim(), QW = cfg.num_heads * d, KVW = static_cast<size_t>(cfg.kv_heads()) * d;
  LlamaCudaSizes s;
  s.saved_blocks = activation_checkpointing ? std::min<size_t>(L, 1) : L;
  s.hidden = (L + 1) * N * H * es;
  s.final_rstd = N * f32;
  // One table per ModelConfig::rope_tables of rotary_dim / 2, then with LongRoPE the long factors' of table 0.
  s.inv_freq = (cfg.rope_tables() + (cfg.longrope.enabled() ? 1 : 0)) * static_cast<size_t>(cfg.rotary_dim() / 2) * f32;
  s.rstd = N * f32;
  s.qkv = N * (QW + 2 * KVW) * es;
  s.lse = B * cfg.num_heads * T * f32;
  s.context = N * QW * es;
  s.h2 = N * H * es;
  s.gate_up = N * 2 * F * es;
  if (qk_norm && L > 0) {
    s.qk_raw = N * (QW + KVW) * es;
    s.qk_rstd = N * (cfg.num_heads + cfg.kv_heads()) * f32;
    s.qk_work = 2 * N * QW * es;
  }
  if (sandwich_norms && L > 0) {
    s.sandwich_out = N * H * es;
    s.sandwich_rstd = N * f32;
  }
  s.norm = N * H * es;
  s.grad = N * std::max(H, QW) * es;
  s.dh = N * H * es;
  if (L > 0) {
    s.wide = N * F * es;
    s.dqkv = N * (QW + 2 * KVW) * es;
    s.dgate_up = N * 2 * F * es;
    s.attention_workspace =
        fused_attention
            ? cudnn_attention_workspace_bytes(max_batch, max_seq, cfg.num_heads, cfg.kv_heads(), static_cast<int>(d),
                                              cfg.packed)
            : gqa_attention_workspace_bytes(max_seq, cfg.num_heads, cfg.kv_heads(), d, dt);
  }
  if (cfg.fp8_linear && L > 0) {
    // forward x W^T, dgrad dy W (W transposed) and wgrad dy^T x (dy and x transposed) of q|k|v, o, gate|up, down
    const size_t QKV = QW + 2 * KVW;
    s.fp8 = {N * std::max({2 * F, QKV, H, QW}), std::max(H * std::max({QKV, 2 * F, QW}), N * std::max({F, H, QW})),
             L * kFp8SlotsPerBlock, {}};
    if (cfg.fp8_keep_weights) {  // each slot's weight, in LlamaFp8Slot order; LoRA's are frozen
      for (size_t layer = 0; layer < L; ++layer) s.fp8.kept.insert(s.fp8.kept.end(), {QKV * H, H * QW, 2 * F * H, H * F});
      s.fp8.frozen = cfg.lora.enabled();
    }
  }
  s.head_chunk = cfg.head_chunk(N);
  s.head_workspace = lm_head_workspace_bytes(s.head_chunk, cfg.vocab_size, dt);
  const LoraCudaSizes lora = lora_cuda_sizes(cfg, dt, N);
  s.lora_xa = lora.xa(), s.lora_scratch = lora.scratch();
  return s;
}

// The Llama-style families' cuda_memory: LlamaCuda counts every buffer it holds as activations
// (the attention path plans_fused_attention assumes).
inline ModelMemory llama_cuda_memory(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                     bool activation_checkpointing, bool qk_norm, bool sandwich_norms = false) {
  const LlamaCudaSizes s = llama_cuda_sizes(cfg, dt, max_batch, max_seq, activation_checkpointing,
                                            plans_fused_attention(cfg, dt), qk_norm, sandwich_norms);
  return ModelMemory{s.total(), 0, s.head_workspace};
}

}  // namespace shardlm::cuda

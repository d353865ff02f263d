// BloomCuda's buffers in bytes (bloom_cuda_sizes): what BloomCuda allocates and the family's
// cuda_memory reports to `shardlm plan`, in plain C++ for builds without CUDA.
#pragma once

#include <algorithm>
#include <cstddef>

#include "../../device/cuda/workspace_sizes.hpp"
#include "../cuda/cuda_lora_sizes.hpp"
#include "shardlm/model.hpp"

namespace shardlm::cuda {

struct BloomCudaSizes {
  size_t saved_blocks = 0;  // blocks whose activations are kept at once (1 with checkpointing)
  // Kept from forward to backward: hidden states h_0 .. h_L; the embedding's and the final
  // LayerNorm's outputs (each `norm_out`) and their fp32 mean and 1/std (each `row_stats`).
  size_t hidden = 0, norm_out = 0, row_stats = 0;
  size_t slopes = 0;  // ALiBi's, fp32 per head
  // Per saved block: both LayerNorms' outputs and statistics, fused qkv, attention probabilities
  // ([B, heads, T, T] in dt; with cuDNN's fused attention only each row's fp32 log-sum-exp,
  // [B, heads, T]), context, the mid-block residual h2, the MLP's pre-GELU and GELU outputs.
  size_t ln = 0, qkv = 0, probs = 0, context = 0, h2 = 0, wide = 0;
  // Backward scratch: two hidden-state gradients, then d(LayerNorm out), d(qkv), d(context),
  // d(h2), d(pre-GELU).
  size_t dh = 0, dln = 0, dqkv = 0, dctx = 0, dh2 = 0, dpre = 0;
  // The native kernels' scratch, or cuDNN's fused attention's (cudnn_attention_workspace_bytes).
  size_t attention_workspace = 0, head_workspace = 0;
  int head_chunk = 0;
  // LoRA (lora_cuda_sizes): per saved block the targeted layers' x A^T; scratch: their gradients, dropout's.
  size_t lora_xa = 0, lora_scratch = 0;
  // model.fp8_linear: the E4M3 copies of the largest A and B operand of the block's GEMMs (fp8_gemm.hpp).
  Fp8ScratchSize fp8;

  size_t per_block() const { return 2 * ln + qkv + probs + context + h2 + 2 * wide + 4 * row_stats + lora_xa; }
  // What BloomCuda::activation_bytes() reports.
  size_t activations() const {
    return hidden + 2 * norm_out + saved_blocks * per_block() + 2 * dh + dln + dqkv + dctx + dh2 + dpre +
           attention_workspace + head_workspace + lora_scratch + fp8.bytes();
  }
  // What it holds beside them: the embedding's and final LayerNorm's statistics, the slopes.
  size_t extra() const { return 4 * row_stats + slopes; }
};

inline BloomCudaSizes bloom_cuda_sizes(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                       bool activation_checkpointing, bool fused_attention) {
  const size_t es = dtype_size(dt), f32 = sizeof(float);
  const size_t B = static_cast<size_t>(std::max(max_batch, 0)), T = static_cast<size_t>(std::max(max_seq, 0));
  const size_t N = B * T, H = cfg.hidden_size, L = cfg.num_layers, heads = cfg.num_heads;
  BloomCudaSizes s;
  s.saved_blocks = activation_checkpointing ? 1 : L;
  s.hidden = (L + 1) * N * H * es;
  s.norm_out = N * H * es;
  s.row_stats = N * f32;
  s.slopes = heads * f32;
  s.ln = N * H * es;
  s.qkv = N * 3 * H * es;
  s.probs = fused_attention ? B * heads * T * f32 : B * heads * T * T * es;
  s.context = N * H * es;
  s.h2 = N * H * es;
  s.wide = N * 4 * H * es;
  s.dh = s.dln = s.dctx = s.dh2 = N * H * es;
  s.dqkv = N * 3 * H * es;
  s.dpre = N * 4 * H * es;
  const int d = cfg.head_dim();
  s.attention_workspace =
      fused_attention ? cudnn_attention_workspace_bytes(max_batch, max_seq, cfg.num_heads, cfg.num_heads, d, cfg.packed)
                      : alibi_attention_workspace_bytes(max_batch, max_seq, cfg.num_heads, d, dt);
  // FP8: the [4H, H] MLP weights and the wide activations bound every operand.
  if (cfg.fp8_linear && L > 0) s.fp8 = {N * 4 * H, std::max(4 * H * H, N * 4 * H), 0, {}};
  s.head_chunk = cfg.head_chunk(N);
  s.head_workspace = lm_head_workspace_bytes(s.head_chunk, cfg.vocab_size, dt);
  const LoraCudaSizes lora = lora_cuda_sizes(cfg, dt, N);
  s.lora_xa = lora.xa(), s.lora_scratch = lora.scratch();
  return s;
}

}  // namespace shardlm::cuda

// The BLOOM model on the GPU: forward and backward of each FSDP unit on one stream, activations
// in the compute dtype in buffers planned up front (bloom_cuda_sizes.hpp; no allocation in the
// step), parameter gradients in fp32. Mirrors BloomCpu (src/model/bloom/bloom_cpu.cpp), its reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "../../root_tensors.hpp"
#include "../bloom_cuda_sizes.hpp"
#include "../bloom_layout.hpp"
#include "cuda_model_base.hpp"
#include "device_memory.hpp"
#include "shardlm/model.hpp"

namespace shardlm::cuda {

class BloomCuda final : public CudaModelBase {
 public:
  // Buffers for micro-batches of up to max_batch x max_seq tokens. With activation_checkpointing
  // only each block's input is kept; its other activations are recomputed before its backward.
  BloomCuda(const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool activation_checkpointing);

  // h_0 = LayerNorm(word_embeddings[tokens]); `tokens` is device memory [B*T].
  void embed_forward(UnitParams root, const int32_t* tokens, int B, int T, cudaStream_t s) override;
  void block_forward(int layer, UnitParams params, int B, int T, cudaStream_t s) override;
  // Final LayerNorm, tied LM head and cross-entropy on h_L.
  void head(UnitParams root, const int32_t* targets, int B, int T, float grad_scale, bool backward, float* loss_sum,
            long long* count, UnitGrads droot, cudaStream_t s) override;
  void block_backward(int layer, UnitParams params, UnitGrads grads, int B, int T, cudaStream_t s) override;
  void embed_backward(UnitParams root, const int32_t* tokens, UnitGrads droot, int B, int T, cudaStream_t s) override;

  size_t activation_bytes() const override;

  // ---- greedy decoding with a key/value cache (bloom_decode.cpp) ----
  // The cache of `slots` sequences of up to `max_len` positions and the scratch of steps of up to
  // `max_rows` rows; they exist from decode_allocate to decode_free only (never in a training step).
  void decode_allocate(int slots, int max_len, int max_rows) override;
  void decode_free() override;
  // The step's hidden states: LayerNorm(word_embeddings[tokens]) for n rows (tokens in device memory).
  void decode_embed(UnitParams root, const int32_t* tokens, int n, cudaStream_t s) override;
  void decode_block(int layer, UnitParams params, const int32_t* slots, const int32_t* positions, int n,
                    cudaStream_t s) override;
  // next[i] = argmax of the logits (final LayerNorm, tied head) of step row rows[i], i < m (device arrays).
  void decode_head(UnitParams root, const int32_t* rows, int m, int32_t* next, float* logits,
                   cudaStream_t s) override;

 private:
  struct Saved {  // one block's activations kept for its backward
    DeviceBuffer<char> ln1, qkv, probs, ctx, h2, ln2, pre, act;  // probs: the fused path's fp32 lse instead
    DeviceBuffer<float> mean1, rstd1, mean2, rstd2;
  };
  // The block's forward into sv and h_{layer+1}; `recompute` (activation checkpointing's backward)
  // leaves out what the backward does not read: the block's output h_{layer+1}, already kept, and
  // the last linear layer that makes it (its LoRA's x A^T is still formed).
  void forward_into(int layer, UnitParams params, Saved& sv, int B, int T, cudaStream_t s, bool recompute = false);
  Saved& saved(int layer) { return checkpointing_ ? saved_[0] : saved_[layer]; }
  // Element offsets of the tensors in the root's and in a block's flat layout (the same for every
  // block), looked up once.
  // Where the root's tensors are: in the base, or in the trainable root of lora.modules_to_save.
  struct RootTensors {
    model_detail::RootTensor embeddings, embed_norm_weight, embed_norm_bias, final_norm_weight, final_norm_bias;
  };
  RootTensors root_{};
  BloomBlockOffsets block_{};
  // The block's linear layers in bloom_linear_modules' order: LoRA's module indices (lora_). An adapted
  // dense_h_to_4h or dense_4h_to_h runs GELU (or its backward) apart from the GEMM, its LoRA term between.
  enum Module { kQueryKeyValue, kDense, kDenseHTo4H, kDense4HToH };
  void* at(DeviceBuffer<char>& b, size_t elements) { return b.data() + elements * dsize_; }

  BloomCudaSizes sizes_;  // of attention_'s choice (its native kernels: alibi_attention_*)
  DeviceBuffer<float> slopes_;
  DeviceBuffer<char> emb_, lnf_;                  // embedding output, final LayerNorm output
  DeviceBuffer<float> emb_mean_, emb_rstd_, lnf_mean_, lnf_rstd_;
  std::vector<Saved> saved_;
  // Backward scratch: gradients flowing between ops, ping-pong gradient of the hidden state.
  DeviceBuffer<char> dh_[2], dln_, dqkv_, dctx_, dh2_, dpre_;
  int dcur_ = 0;  // which dh_ holds the current hidden-state gradient

  struct DecodeBuffers {  // between decode_allocate and decode_free, beside the cache
    DeviceBuffer<char> hidden, h2, ln, qkv, ctx, wide;  // [max_rows, H | 3H | 4H] in dt
    DeviceBuffer<float> mean, rstd;                    // [max_rows], LayerNorm statistics (unused after)
  };
  DecodeBuffers decode_;
};

// The registry's make_cuda for BLOOM.
std::unique_ptr<CudaModel> make_bloom_cuda(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                           bool activation_checkpointing);

}  // namespace shardlm::cuda

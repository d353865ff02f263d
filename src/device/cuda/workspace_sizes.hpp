// The scratch the CUDA kernels need, in bytes, as plain C++ (no CUDA headers): the model code
// allocates these and `shardlm plan` adds them up, also in builds without the CUDA backend.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// Workspace pieces start on 256-byte boundaries (what cuBLASLt and vector loads like).
inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// alibi_attention_forward/backward (alibi_attention.cu): fp32 scores of every head of one sequence, and for a
// 16-bit dt the probabilities' gradient in dt.
inline size_t alibi_attention_workspace_bytes(int B, int T, int heads, int head_dim, DType dt) {
  const size_t scores = static_cast<size_t>(heads) * T * T;
  return align256(scores * sizeof(float)) + (dt == DType::F32 ? 0 : align256(scores * dtype_size(dt)));
}

// gqa_attention_forward/backward (gqa_attention.cu), one sequence at a time: fp32 scores of
// every head (then the probabilities' gradient), the probabilities in dt (then the scores'
// gradient), and the fp32 sums of the key and value gradients over the query heads sharing them.
inline size_t gqa_attention_workspace_bytes(int T, int heads, int kv_heads, int head_dim, DType dt) {
  const size_t scores = static_cast<size_t>(heads) * T * T;
  const size_t kv_grads = static_cast<size_t>(T) * 2 * kv_heads * head_dim;
  return align256(scores * sizeof(float)) + align256(scores * dtype_size(dt)) + align256(kv_grads * sizeof(float));
}

// CudnnAttention::backward (cudnn_attention.cpp), beside cuDNN's own workspace: the row sums of
// dctx * ctx and the fp32 accumulator of the query gradient.
inline size_t cudnn_attention_own_bytes(int B, int T, int heads, int head_dim) {
  const size_t rows = static_cast<size_t>(B) * heads * T;
  return align256(rows * sizeof(float)) + align256(rows * head_dim * sizeof(float));
}

// All the fused calls need: the above and cuDNN's engine workspace, which its fused backward
// reports as 256 bytes, plus one fp32 [B, heads, T, head_dim] tensor when key/value heads are
// grouped (cuDNN 9.19 on an H100, for every shape measured: docs/history/performance-log.md). The models take
// cuDNN's own figure instead where it is larger (their start-up check then says the plan was short).
// Packed rows on the fused path: the [B, 1, T, T] mask (packed_attention_bias) in the 16-bit dtype,
// held at the start of the attention workspace.
inline size_t packed_attention_bias_bytes(int B, int T) {
  return align256(static_cast<size_t>(B) * T * T * 2);
}

// With `packed` (data.packing) the packed rows' mask comes first.
inline size_t cudnn_attention_workspace_bytes(int B, int T, int heads, int kv_heads, int head_dim,
                                              bool packed = false) {
  const size_t rows = static_cast<size_t>(B) * heads * T;
  const size_t grouped = kv_heads != heads ? rows * head_dim * sizeof(float) : 0;
  return (packed ? packed_attention_bias_bytes(B, T) : 0) + cudnn_attention_own_bytes(B, T, heads, head_dim) +
         align256(grouped + 256);
}

// lm_head_loss (lm_head.cu): fp32 logits, per-row losses and target flags of `chunk` rows.
inline size_t lm_head_workspace_bytes(int chunk, int V, DType dt) {
  const size_t rows = static_cast<size_t>(std::max(chunk, 0));
  return align256(rows * static_cast<size_t>(V) * sizeof(float)) + align256(rows * sizeof(float)) +
         align256(rows * sizeof(int));
}

// cuBLASLt's FP8 GEMM takes scale pointers on 16-byte boundaries only.
constexpr size_t kFp8ScaleAlignment = 16;
// ... and M, N and K that are multiples of this only (fp8_gemm_fits; the start-up note, fp8_linear_note).
constexpr int kFp8SizeMultiple = 16;

// run_fp8_gemm's scratch (fp8_gemm.hpp, Fp8Scratch): the E4M3 copies of A operands of up to
// a_elements (twice: a linear layer's output gradient is kept in both layouts for its two backward
// GEMMs) and B operands of up to b_elements, then two fp32 inverse scales 16 bytes apart, two amax
// words, and two amax words per slot (a linear layer's input and weight, kept from its forward for its
// backward).
inline size_t fp8_scratch_bytes(size_t a_elements, size_t b_elements, size_t slots = 0) {
  return 2 * align256(a_elements) + align256(b_elements) + align256(2 * kFp8ScaleAlignment) +
         align256(2 * sizeof(unsigned)) + align256(2 * slots * sizeof(unsigned));
}

// A model's FP8 scratch (model.fp8_linear): its largest A and B operands, in elements, and its amax slots
// (one per block and projection whose backward reuses its forward's amaxes); empty without FP8.
// With model.fp8_keep_weights, `kept` has one entry per slot: the elements of that linear layer's weight,
// whose E4M3 transpose its forward writes and its backward reads (one byte each, then an inverse scale
// per slot, kFp8ScaleAlignment apart); empty: the backward quantizes the weight again. `frozen` (LoRA's
// base weights, which never change): each slot keeps the forward's copy too, for the whole run.
struct Fp8ScratchSize {
  size_t a = 0, b = 0, slots = 0;
  std::vector<size_t> kept;
  bool frozen = false;
  size_t kept_bytes() const {
    if (kept.empty()) return 0;
    size_t n = align256(kept.size() * kFp8ScaleAlignment);
    for (size_t k : kept) n += (frozen ? 2 : 1) * align256(k);
    return n;
  }
  size_t bytes() const { return a == 0 && b == 0 ? 0 : fp8_scratch_bytes(a, b, slots) + kept_bytes(); }
};

}  // namespace shardlm::cuda

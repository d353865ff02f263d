// Causal softmax attention with ALiBi over a head-interleaved fused QKV projection (alibi_attention.cu;
// BLOOM's attention), the probabilities kept for backward.
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gemm.hpp"
#include "workspace_sizes.hpp"
#include "shardlm/core.hpp"

namespace shardlm::cuda {

// qkv is [B*T, 3H] laid out per head as [q(d), k(d), v(d)] (transformers' BloomAttention view
// [B, T, heads, 3, d]); ctx is [B*T, H] with heads concatenated. Scores are
// (q . k) / sqrt(d) + slope_h * j for key position j <= query position i (BLOOM's alibi), softmax in
// fp32. `probs` ([B, heads, T, T], dt) keeps the softmax for backward; `workspace` is scratch of
// alibi_attention_workspace_bytes() (workspace_sizes.hpp). Batched cuBLASLt GEMMs and a softmax kernel.
// `starts` (device [B*T], or null): packed rows, position t attends to keys starts[t] .. t of its row
// (probs are 0 for the others, so the backward needs no more).
void alibi_attention_forward(Gemm& gemm, const void* qkv, void* ctx, void* probs, const float* slopes, int B, int T,
                             int heads, int head_dim, DType dt, void* workspace, cudaStream_t stream,
                             const int32_t* starts = nullptr);
// dqkv = d/dqkv given dctx (written, not accumulated).
void alibi_attention_backward(Gemm& gemm, const void* dctx, const void* qkv, const void* probs, void* dqkv,
                              const float* slopes, int B, int T, int heads, int head_dim, DType dt, void* workspace,
                              cudaStream_t stream);

}  // namespace shardlm::cuda

// Causal softmax attention with grouped-query heads over q, k, v projections side by side
// (gqa_attention.cu; the Llama-style families' attention), only each row's log-sum-exp kept for backward.
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

// qkv is [B*T, (heads + 2 kv_heads) d]: each row the query heads, then the key heads, then the
// value heads (q_proj, k_proj, v_proj outputs side by side, rotary already applied to q and k);
// query head n reads key/value head n / (heads / kv_heads). ctx is [B*T, heads d]. Scores are
// (q . k) / sqrt(d) for key position j <= query position i, softmax in fp32; only each row's
// log-sum-exp `lse` (fp32, [B, heads, T]) is kept for backward, which recomputes the scores and
// the probabilities p = exp(s - lse) one sequence at a time (the forward's context uses the same p).
// Batched cuBLASLt GEMMs, one call per sequence and query head of a group (batched over the kv
// heads), around softmax kernels. `workspace` is scratch of gqa_attention_workspace_bytes(T, ...)
// (workspace_sizes.hpp); nothing in it outlives a call.
// `starts` (device [B*T], or null): packed rows, position t attends to keys starts[t] .. t of its row.
// `window` (> 0, ModelConfig::sliding_window): only keys j > t - window as well; 0: no window.
// `scale` (> 0): the scores' scale instead of 1 / sqrt(d) (Gemma's query_pre_attn_scalar^-1/2).
void gqa_attention_forward(Gemm& gemm, const void* qkv, void* ctx, float* lse, int B, int T, int heads, int kv_heads,
                           int head_dim, DType dt, void* workspace, cudaStream_t stream, const int32_t* starts = nullptr,
                           int window = 0, float scale = 0);
// dqkv (same layout as qkv) written from dctx, qkv and the forward's lse; the key and value
// gradients are summed over the query heads of their group in fp32 before they are rounded to dt.
void gqa_attention_backward(Gemm& gemm, const void* dctx, const void* qkv, const float* lse, void* dqkv, int B, int T,
                            int heads, int kv_heads, int head_dim, DType dt, void* workspace, cudaStream_t stream,
                            const int32_t* starts = nullptr, int window = 0, float scale = 0);

}  // namespace shardlm::cuda

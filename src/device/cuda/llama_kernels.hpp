// CUDA kernels of the Llama block (RMSNorm, rotary embeddings, SwiGLU, causal grouped-query
// attention), as host-callable launchers; the conventions of kernels.hpp hold: device pointers,
// asynchronous on `stream`, `dt` the dtype of activations and gathered parameters, arithmetic and
// reductions in fp32, parameter gradients fp32 and accumulated (+=). LlamaCpu
// (src/model/llama/llama_cpu.cpp) is the reference for each.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gemm.hpp"
#include "workspace_sizes.hpp"
#include "shardlm/core.hpp"

namespace shardlm::cuda {

// ---- RMSNorm -----------------------------------------------------------------------------------

// y = x * rstd * weight over rows of H, rstd = 1 / sqrt(mean(x^2) + eps); saves rstd (fp32, [n]).
void rmsnorm_forward(const void* x, const void* weight, void* y, float* rstd, int n, int H, float eps, DType dt,
                     cudaStream_t stream);
// dx (+)= rstd * (g - xhat * mean(g * xhat)) with g = dy * weight, xhat = x * rstd (dx += when
// accumulate_dx, which adds the residual branch's gradient); dweight += sum_rows(dy * xhat) in fp32
// (null: a frozen weight, dx only).
void rmsnorm_backward(const void* dy, const void* x, const void* weight, const float* rstd, void* dx, float* dweight,
                      int n, int H, bool accumulate_dx, DType dt, cudaStream_t stream);

// ---- rotary embeddings -------------------------------------------------------------------------

// Rotates `heads` heads of head_dim at the start of each of the n rows of x (row stride ld, row r
// at position r % T) by the angles pos * inv_freq[i] (inv_freq: fp32 [head_dim / 2], rope_inv_freq
// uploaded), in transformers' rotate_half convention: element i pairs with i + head_dim / 2.
// `inverse` applies the transposed rotation: the backward of the forward one. In place.
// With `starts` (device [n], packed rows) row r sits at position r % T - starts[r] instead.
void rotary_apply(void* x, int n, int T, int heads, int head_dim, int ld, const float* inv_freq, bool inverse,
                  DType dt, cudaStream_t stream, const int32_t* starts = nullptr);
// The forward rotation of rows at their own positions (device [n], >= 0): greedy decoding, where a
// step's rows belong to many sequences.
void rotary_apply_at(void* x, int n, const int32_t* positions, int heads, int head_dim, int ld,
                     const float* inv_freq, DType dt, cudaStream_t stream);

// ---- SwiGLU ------------------------------------------------------------------------------------

// gate_up is [n, 2F]: each row the gate projection (F), then the up projection (F).
// out[n, F] = silu(gate) * up with silu(g) = g * sigmoid(g).
void swiglu_forward(const void* gate_up, void* out, int n, int F, DType dt, cudaStream_t stream);
// dgate_up[n, 2F] from dout[n, F]: d(up) = dout * silu(gate), d(gate) = dout * up * silu'(gate).
void swiglu_backward(const void* dout, const void* gate_up, void* dgate_up, int n, int F, DType dt,
                     cudaStream_t stream);

// ---- causal grouped-query attention ------------------------------------------------------------
// qkv is [B*T, (heads + 2 kv_heads) d]: each row the query heads, then the key heads, then the
// value heads (q_proj, k_proj, v_proj outputs side by side, rotary already applied to q and k);
// query head n reads key/value head n / (heads / kv_heads). ctx is [B*T, heads d]. Scores are
// (q . k) / sqrt(d) for key position j <= query position i, softmax in fp32; only each row's
// log-sum-exp `lse` (fp32, [B, heads, T]) is kept for backward, which recomputes the scores and
// the probabilities p = exp(s - lse) one sequence at a time (the forward's context uses the same p).
// Batched cuBLASLt GEMMs, one call per sequence and query head of a group (batched over the kv
// heads), around softmax kernels. `workspace` is scratch of llama_attention_workspace_bytes(T, ...)
// (workspace_sizes.hpp); nothing in it outlives a call.
// `starts` (device [B*T], or null): packed rows, position t attends to keys starts[t] .. t of its row.
// `window` (> 0, ModelConfig::sliding_window): only keys j > t - window as well; 0: no window.
void llama_attention_forward(Gemm& gemm, const void* qkv, void* ctx, float* lse, int B, int T, int heads,
                             int kv_heads, int head_dim, DType dt, void* workspace, cudaStream_t stream,
                             const int32_t* starts = nullptr, int window = 0);
// dqkv (same layout as qkv) written from dctx, qkv and the forward's lse; the key and value
// gradients are summed over the query heads of their group in fp32 before they are rounded to dt.
void llama_attention_backward(Gemm& gemm, const void* dctx, const void* qkv, const float* lse, void* dqkv, int B,
                              int T, int heads, int kv_heads, int head_dim, DType dt, void* workspace,
                              cudaStream_t stream, const int32_t* starts = nullptr, int window = 0);

}  // namespace shardlm::cuda

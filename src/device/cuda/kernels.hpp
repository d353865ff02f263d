// CUDA kernels of the BLOOM block, LoRA dropout, the optimizer, the casts and greedy decoding (BLOOM's
// and Llama's), as host-callable launchers.
// Every pointer is device memory; every launcher is asynchronous on `stream` and checks the launch.
// `dt` is the dtype of activations and gathered parameters (F32, BF16 or F16); arithmetic and
// every reduction are in fp32; parameter gradients are fp32 (accumulated with +=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../dropout_mask.hpp"
#include "gemm.hpp"
#include "shardlm/core.hpp"
#include "shardlm/device.hpp"
#include "workspace_sizes.hpp"

namespace shardlm::cuda {

// ---- embedding -------------------------------------------------------------------------------

// out[i, :] = table[tokens[i], :] for i < n; table is [V, H] in dt. Token ids outside [0, V) are
// clamped to 0 (the data module never produces them; this keeps a bad id from reading out of bounds).
void embedding_forward(const int32_t* tokens, const void* table, void* out, int n, int H, int V, DType dt,
                       cudaStream_t stream);
// dtable[tokens[i], :] += dout[i, :] (fp32, atomic: repeated tokens add up).
void embedding_backward(const int32_t* tokens, const void* dout, float* dtable, int n, int H, int V, DType dt,
                        cudaStream_t stream);

// ---- token rows (Backend::rows_*: the embedding's part of the root's gradient reduction) ----------

void rows_mark_first(const int32_t* ids, size_t m, int32_t* first, size_t rows, cudaStream_t stream);
void rows_pack(const float* table, size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows,
               void* out, DType out_dt, cudaStream_t stream);
void rows_unpack_add(const void* in, DType in_dt, size_t width, const int32_t* ids, const int32_t* first, size_t m,
                     size_t rows, float* slice, long long pos, size_t count, cudaStream_t stream);
void rows_zero(float* table, size_t width, const int32_t* ids, size_t m, size_t rows, cudaStream_t stream);

// ---- LayerNorm -------------------------------------------------------------------------------

// y = (x - mean) * rstd * gamma + beta over rows of H; saves mean and rstd (fp32, [n]) for backward.
void layernorm_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean, float* rstd,
                       int n, int H, float eps, DType dt, cudaStream_t stream);
// dx = LN backward (dx += when accumulate_dx, which adds the residual branch's gradient);
// dgamma += sum_rows(dy * xhat), dbeta += sum_rows(dy) in fp32; both null: frozen, dx only.
void layernorm_backward(const void* dy, const void* x, const void* gamma, const float* mean, const float* rstd,
                        void* dx, float* dgamma, float* dbeta, int n, int H, bool accumulate_dx, DType dt,
                        cudaStream_t stream);

// ---- element-wise ----------------------------------------------------------------------------

// BLOOM's GELU (tanh approximation): y = 0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x^2))).
void gelu_forward(const void* x, void* y, size_t n, DType dt, cudaStream_t stream);
// dx = dy * gelu'(x).
void gelu_backward(const void* dy, const void* x, void* dx, size_t n, DType dt, cudaStream_t stream);
// out = a + b (out may alias a or b).
void add(const void* a, const void* b, void* out, size_t n, DType dt, cudaStream_t stream);
// dbias[c] += sum over rows r < n of dy[r, c], fp32.
void bias_grad(const void* dy, float* dbias, int n, int cols, DType dt, cudaStream_t stream);
// out[i] = (out_dt) in[i]; in and out may be any of F32, BF16, F16 (round to nearest even).
void cast(const void* in, DType in_dt, void* out, DType out_dt, size_t n, cudaStream_t stream);
// x[i] *= factor (fp32).
void scale(float* x, size_t n, float factor, cudaStream_t stream);
// x[i] += y[i], y in y_dt (F32, BF16 or F16; 16-bit values widen exactly), one fp32 add.
void accumulate(float* x, const void* y, DType y_dt, size_t n, cudaStream_t stream);

// ---- LoRA dropout (lora_dropout.cu) ----------------------------------------------------------------

// out[r, c] = mask.factor(r / seq, r % seq, c) * x[r, c] over dense rows of `cols` (rows a multiple of
// seq): a layer's dropout(x); with accumulate out[r, c] += that, its LoRA input gradient into dx. fp32
// arithmetic, out rounded once to dt; the same values as the CPU models' apply_lora_dropout.
void lora_dropout(const void* x, void* out, int rows, int seq, int cols, const DropoutMask& mask, bool accumulate,
                  DType dt, cudaStream_t stream);

// ---- reductions for the optimizer step --------------------------------------------------------

// *out += sum of x[i]^2 over i < n, in double (fp32 partial sums per block, one atomic per block).
void sum_squares(const float* x, size_t n, double* out, cudaStream_t stream);
// *flag = 1 if any x[i] is inf or NaN (never cleared here).
void check_finite(const void* x, size_t n, DType dt, int* flag, cudaStream_t stream);

// ---- AdamW -----------------------------------------------------------------------------------

struct AdamWArgs {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0;     // 0 for ranges without decay
  float bias_correction1 = 1; // 1 - beta1^t
  float bias_correction2 = 1; // 1 - beta2^t
  float grad_scale = 1;       // grads are multiplied by this first (clipping, loss-scale unscale)
};
// Decoupled weight decay, as torch.optim.AdamW: p -= lr * wd * p; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= lr * (m / bc1) / (sqrt(v / bc2) + eps).
// When param_out is non-null it also writes the updated parameter cast to out_dt (the
// compute-dtype copy that the next all-gather sends), saving a separate cast pass.
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                const AdamWArgs& args, void* param_out, DType out_dt, cudaStream_t stream);
// Backend::adamw_8bit on one range (adamw_8bit.cu): the same bits as host_adamw_8bit.
void adamw_8bit_step(const AdamW8bitRange& r, const AdamWHyper& h, cudaStream_t stream);

// ---- attention (BLOOM: fused QKV, head-interleaved; ALiBi; causal) -----------------------------
// qkv is [B*T, 3H] laid out per head as [q(d), k(d), v(d)] (transformers' BloomAttention view
// [B, T, heads, 3, d]); ctx is [B*T, H] with heads concatenated. Scores are
// (q . k) / sqrt(d) + slope_h * j for key position j <= query position i (BLOOM's alibi), softmax in
// fp32. `probs` ([B, heads, T, T], dt) keeps the softmax for backward; `workspace` is scratch of
// attention_workspace_bytes() (workspace_sizes.hpp). Batched cuBLASLt GEMMs and a softmax kernel.
// `starts` (device [B*T], or null): packed rows, position t attends to keys starts[t] .. t of its row
// (probs are 0 for the others, so the backward needs no more).
void attention_forward(Gemm& gemm, const void* qkv, void* ctx, void* probs, const float* slopes, int B, int T, int heads,
                       int head_dim, DType dt, void* workspace, cudaStream_t stream, const int32_t* starts = nullptr);
// The [B, 1, T, T] additive mask (bf16/fp16) of packed rows for cuDNN's fused attention
// (packed_bias.cu): 0 where key j is in query i's sample (j >= starts[b, i]) and, with a sliding window
// (window > 0), inside it (j > i - window), a huge negative value elsewhere; `starts` is device [B*T].
void packed_attention_bias(const int32_t* starts, int B, int T, int window, void* bias, DType dt, cudaStream_t stream);
// dqkv = d/dqkv given dctx (written, not accumulated).
void attention_backward(Gemm& gemm, const void* dctx, const void* qkv, const void* probs, void* dqkv, const float* slopes,
                        int B, int T, int heads, int head_dim, DType dt, void* workspace, cudaStream_t stream);

// ---- LM head + cross-entropy, fused and chunked --------------------------------------------------
// Logits = h @ table^T ([n, V], tied embeddings) are never held for more than `chunk` rows at once.
// Returns nothing; writes the per-chunk loss sums into loss_sum (fp32 device scalar, +=) and the
// count of positions with a target (targets >= 0) into *count (int64 device scalar, +=).
// When dh is non-null: dh[n, H] = d(grad_scale * sum loss)/dh (written), dtable += (fp32; null: a
// frozen table, no weight gradient GEMM).
// `workspace` holds lm_head_workspace_bytes(chunk, V, dt) (workspace_sizes.hpp).
void lm_head_loss(Gemm& gemm, const void* h, const void* table, const int32_t* targets, int n, int H, int V, int chunk,
                  float grad_scale, float* loss_sum, long long* count, void* dh, float* dtable, DType dt,
                  void* workspace, cudaStream_t stream);

// ---- greedy decoding with a key/value cache (decode_attention.cu, decode_head.cu) ----------------
// Row r of a step is the token at position positions[r] of the sequence in cache slot slots[r]. A
// layer's cache holds keys and values as [slots, kv_heads, max_len, head_dim] in dt; ctx is
// [n, heads head_dim]. Slots and positions must be in range (checked by the caller).

// Where a row of the step's fused q|k|v projection holds its heads: query head h at h * head_stride,
// key head g at k_offset + g * head_stride, value head g at v_offset + g * head_stride, rows
// row_stride elements apart. Query head h reads key/value head h / (heads / kv_heads).
struct DecodeQkv {
  int heads = 0, kv_heads = 0, head_dim = 0;
  int row_stride = 0, head_stride = 0, k_offset = 0, v_offset = 0;
};
// BLOOM's fused projection (attention_forward's layout): each head's q, k, v side by side, [n, 3 heads d].
inline DecodeQkv interleaved_qkv(int heads, int head_dim) {
  return DecodeQkv{heads, heads, head_dim, 3 * heads * head_dim, 3 * head_dim, head_dim, 2 * head_dim};
}
// Llama's q_proj, k_proj, v_proj outputs side by side (llama_attention_forward's layout),
// [n, (heads + 2 kv_heads) d].
inline DecodeQkv grouped_qkv(int heads, int kv_heads, int head_dim) {
  const int qw = heads * head_dim, kvw = kv_heads * head_dim;
  return DecodeQkv{heads, kv_heads, head_dim, qw + 2 * kvw, head_dim, qw, qw + kvw};
}

// keys/values[slots[r], g, positions[r], :] = row r's key / value of kv head g.
void kv_cache_write(const void* qkv, const DecodeQkv& layout, const int32_t* slots, const int32_t* positions, int n,
                    int max_len, void* keys, void* values, DType dt, cudaStream_t stream);
// ctx of row r, query head h = sum_j softmax_j(q.k_j / sqrt(d) + slopes[h] * j) v_j over the slot's
// cached positions j <= positions[r] of kv head h / (heads / kv_heads) (written by kv_cache_write
// first, this step's rows included); fp32 softmax. slopes: ALiBi's per-head fp32 slopes, or null
// for none (Llama). head_dim <= 256. window > 0 (a sliding window, Mistral): only positions j >
// positions[r] - window.
void decode_attention(const void* qkv, const DecodeQkv& layout, const void* keys, const void* values,
                      const int32_t* slots, const int32_t* positions, int n, const float* slopes, void* ctx,
                      int max_len, DType dt, cudaStream_t stream, int window = 0);
// dst[i, :] = src[rows[i], :] for i < m (rows of H elements in dt).
void gather_rows(const void* src, const int32_t* rows, int m, int H, void* dst, DType dt, cudaStream_t stream);
// out[r] = the index of the largest of x[r, 0..cols) (fp32, row stride cols); the lowest index wins
// ties; NaN never wins (a row of NaN only gives 0).
void argmax_rows(const float* x, int rows, int cols, int32_t* out, cudaStream_t stream);
// The decoding head on m rows of x [m, H] over a [V, H] table (both in dt): logits[i, v] = x[i, :] .
// table[v, :] in fp32. With `logits_out` ([m, V], device) they are written there in one GEMM; else they
// go `chunk` rows at a time through the workspace [chunk, V]. With `next`, next[i] = argmax_v of row i.
void decode_head_rows(Gemm& gemm, const void* x, int m, int H, const void* table, int V, int chunk, float* workspace,
                      int32_t* next, float* logits_out, DType dt, cudaStream_t stream);

}  // namespace shardlm::cuda

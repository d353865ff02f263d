// Attention of greedy-decoding steps over a key/value cache, and the cache's writes (decode_attention.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// Row r of a step is the token at position positions[r] of the sequence in cache slot slots[r]. A
// layer's cache holds keys and values as [slots, kv_heads, max_len, head_dim] in dt; ctx is
// [n, heads head_dim]. Slots and positions must be in range (checked by the caller).

// Where a row of the step's fused q|k|v projection holds its heads: query head h at h * head_stride,
// key head g at k_offset + g * head_stride, value head g at v_offset + g * head_stride, rows
// row_stride elements apart. Query head h reads key/value head h / (heads / kv_heads).
struct DecodeQkv {
  int heads = 0, kv_heads = 0, head_dim = 0;
  int row_stride = 0, head_stride = 0, k_offset = 0, v_offset = 0;
  float scale = 0;  // the scores' scale (Gemma's query_pre_attn_scalar^-1/2); 0: 1 / sqrt(head_dim)
};
// BLOOM's fused projection (alibi_attention_forward's layout): each head's q, k, v side by side, [n, 3 heads d].
inline DecodeQkv interleaved_qkv(int heads, int head_dim) {
  return DecodeQkv{heads, heads, head_dim, 3 * heads * head_dim, 3 * head_dim, head_dim, 2 * head_dim};
}
// Llama's q_proj, k_proj, v_proj outputs side by side (gqa_attention_forward's layout),
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

}  // namespace shardlm::cuda

// Private to src/model: causal multi-head attention on the CPU, fp32, as the families share it:
// grouped-query heads (Llama) or one key/value head per query head (BLOOM), optional ALiBi slopes, an
// optional sliding window (Mistral),
// q, k and v read from strided rows (separate projections, or BLOOM's head-interleaved fused qkv);
// and the key/value cache of greedy decoding with the attention of one cached row.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace shardlm::model_detail {

// Where the heads of q, k and v sit: row t of sequence b starts at (b * seq + t) * q_ld in q
// (kv_ld in k and v), head n at n * head_stride within it; query head n reads key/value head
// n / (heads / kv_heads). The context is [rows, heads * head_dim], heads side by side.
struct AttentionShape {
  int batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int q_ld = 0, kv_ld = 0, head_stride = 0;
  const float* slopes = nullptr;  // ALiBi: score += slopes[n] * key position; null for none
  // Packed rows: position t of sequence b attends to keys starts[b * seq + t] .. t only; null: 0 .. t.
  const int32_t* starts = nullptr;
  // Sliding window (ModelConfig::sliding_window): keys after t - window only (within the sample); 0: none.
  int window = 0;
  float scale = 0;  // the scores' scale (ModelConfig::attention_scale); 0: 1 / sqrt(head_dim)

  float score_scale() const { return scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }

  int kv_head_of(int n) const { return n / (heads / kv_heads); }
  // The first key position t of sequence b attends to: its sample's start, or the window's, the later.
  int first_key(int b, int t) const {
    const int start = starts ? starts[static_cast<size_t>(b) * seq + t] : 0;
    return window_start(start, t, window);
  }
  // The first key of position t given its sample's start and a window (0: none): i - window < j.
  static int window_start(int start, int t, int window) {
    return window > 0 && t - window + 1 > start ? t - window + 1 : start;
  }
  size_t q_at(int b, int n) const {
    return static_cast<size_t>(b) * seq * q_ld + static_cast<size_t>(n) * head_stride;
  }
  size_t kv_at(int b, int g) const {
    return static_cast<size_t>(b) * seq * kv_ld + static_cast<size_t>(g) * head_stride;
  }
  size_t context_at(int b, int n) const {
    return static_cast<size_t>(b) * seq * heads * head_dim + static_cast<size_t>(n) * head_dim;
  }
  size_t probs_at(int b, int n) const { return (static_cast<size_t>(b) * heads + n) * static_cast<size_t>(seq) * seq; }
};

// probs[b, n] = softmax_j(q_i.k_j / sqrt(d) + slope_n * j) over first_key(b, i) <= j <= i ([B, heads,
// T, T], zero elsewhere); context[b, :, head n] = probs V.
void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* probs,
                       float* context);
// dq (overwritten), dk and dv (overwritten; summed over the query heads sharing each kv head), in
// the layouts of q, k and v, from dcontext through P V, the softmax and the scaled Q K^T.
// dscores is [T, T] of scratch.
void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* probs,
                        const float* dcontext, float* dscores, float* dq, float* dk, float* dv);

// Keys and values of every layer for `slots` sequences of up to `max_len` positions, laid out
// [layer][slot][kv_head][position][head_dim] so one head's keys are contiguous.
class KvCache {
 public:
  void reset(int layers, int slots, int max_len, int kv_heads, int head_dim);
  void clear();  // frees the memory
  int slots() const { return slots_; }
  int max_len() const { return max_len_; }
  size_t bytes() const { return (keys_.size() + values_.size()) * sizeof(float); }
  // Errors naming `who` when a row's slot or position is outside the cache.
  void check_rows(const char* who, int layer, int n, const int* slots, const int* positions) const;
  float* key(int layer, int slot, int head, int pos) { return keys_.data() + at(layer, slot, head, pos); }
  float* value(int layer, int slot, int head, int pos) { return values_.data() + at(layer, slot, head, pos); }

 private:
  size_t at(int layer, int slot, int head, int pos) const {
    return (((static_cast<size_t>(layer) * slots_ + slot) * kv_heads_ + head) * max_len_ + pos) * head_dim_;
  }
  int layers_ = 0, slots_ = 0, max_len_ = 0, kv_heads_ = 0, head_dim_ = 0;
  std::vector<float> keys_, values_;
};

// Greedy decoding's attention for n rows (q, k, v in the layout of `s` with batch n and seq 1):
// row r's key and value are cached at (slots[r], positions[r]) of `layer` first, for every row,
// so a prompt's rows see each other; then each query head attends to its slot's positions
// 0..positions[r] (the last s.window of them with a sliding window). context is [n, heads * head_dim]; scores holds max_len floats of scratch.
void cached_attention_rows(KvCache& cache, int layer, const AttentionShape& s, const float* q, const float* k,
                           const float* v, int n, const int* slots, const int* positions, float* scores,
                           float* context);

}  // namespace shardlm::model_detail

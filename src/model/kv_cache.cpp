// The key/value cache of greedy decoding and the attention of cached rows (cpu_attention.hpp).
#include <algorithm>
#include <cmath>

#include "cpu_attention.hpp"
#include "shardlm/core.hpp"

namespace shardlm::model_detail {

void KvCache::reset(int layers, int slots, int max_len, int kv_heads, int head_dim) {
  SHARDLM_CHECK(layers >= 0 && slots >= 0 && max_len >= 0 && kv_heads > 0 && head_dim > 0,
                "KvCache: bad shape (layers ", layers, ", slots ", slots, ", max_len ", max_len, ")");
  layers_ = layers, slots_ = slots, max_len_ = max_len, kv_heads_ = kv_heads, head_dim_ = head_dim;
  const size_t n = static_cast<size_t>(layers) * slots * kv_heads * max_len * head_dim;
  keys_.assign(n, 0.0f);
  values_.assign(n, 0.0f);
}

void KvCache::clear() {
  layers_ = slots_ = max_len_ = 0;
  std::vector<float>().swap(keys_);
  std::vector<float>().swap(values_);
}

void KvCache::check_rows(const char* who, int layer, int n, const int* slots, const int* positions) const {
  SHARDLM_CHECK(slots_ > 0 || n == 0, who, ": no key/value cache (decode_begin was not called)");
  SHARDLM_CHECK(layer >= 0 && layer < layers_, who, ": layer ", layer, " out of range [0, ", layers_, ")");
  for (int r = 0; r < n; ++r)
    SHARDLM_CHECK(slots[r] >= 0 && slots[r] < slots_ && positions[r] >= 0 && positions[r] < max_len_, who, ": row ",
                  r, " (slot ", slots[r], ", position ", positions[r], ") is outside the cache (", slots_,
                  " slots of ", max_len_, " positions)");
}

namespace {

// One query head of one row attending to its slot's cached positions first..pos of kv head `head`:
// context = softmax_j(scale * q.k_j + slope * j) V, the softmax in fp32 over a max-shifted row.
void cached_attention_head(KvCache& cache, int layer, int slot, int head, int first, int pos, const float* q,
                           int head_dim, float slope, float scale, float* scores, float* context) {
  const float* keys = cache.key(layer, slot, head, 0);
  const float* values = cache.value(layer, slot, head, 0);
  float max_score = -INFINITY;
  for (int j = first; j <= pos; ++j) {
    const float* k = keys + static_cast<size_t>(j) * head_dim;
    float dot = 0.0f;
    for (int c = 0; c < head_dim; ++c) dot += q[c] * k[c];
    scores[j] = scale * dot + slope * static_cast<float>(j);
    max_score = std::max(max_score, scores[j]);
  }
  float total = 0.0f;
  for (int j = first; j <= pos; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    total += scores[j];
  }
  const float inv_total = 1.0f / total;
  std::fill(context, context + head_dim, 0.0f);
  for (int j = first; j <= pos; ++j) {
    const float p = scores[j] * inv_total;
    const float* v = values + static_cast<size_t>(j) * head_dim;
    for (int c = 0; c < head_dim; ++c) context[c] += p * v[c];
  }
}

}  // namespace

void cached_attention_rows(KvCache& cache, int layer, const AttentionShape& s, const float* q, const float* k,
                           const float* v, int n, const int* slots, const int* positions, float* scores,
                           float* context) {
  const int d = s.head_dim;
  for (int r = 0; r < n; ++r)
    for (int g = 0; g < s.kv_heads; ++g) {
      const size_t at = static_cast<size_t>(r) * s.kv_ld + static_cast<size_t>(g) * s.head_stride;
      std::copy(k + at, k + at + d, cache.key(layer, slots[r], g, positions[r]));
      std::copy(v + at, v + at + d, cache.value(layer, slots[r], g, positions[r]));
    }
  for (int r = 0; r < n; ++r)
    for (int h = 0; h < s.heads; ++h)
      cached_attention_head(cache, layer, slots[r], s.kv_head_of(h),
                            AttentionShape::window_start(0, positions[r], s.window), positions[r],
                            q + static_cast<size_t>(r) * s.q_ld + static_cast<size_t>(h) * s.head_stride, d,
                            s.slopes ? s.slopes[h] : 0.0f, s.score_scale(), scores,
                            context + static_cast<size_t>(r) * s.heads * d + static_cast<size_t>(h) * d);
}

}  // namespace shardlm::model_detail

// Private to src/model: pieces the BLOOM and Llama code share (layout building, the LM head's
// cross-entropy over a chunk of logits rows, the key/value cache of greedy decoding).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardlm/model.hpp"

namespace shardlm::model_detail {

// Appends a tensor at the end of the unit's flat parameter. Only matrices (linear and embedding
// weights) decay; biases and norm parameters do not.
void add_tensor(UnitLayout& unit, const std::string& name, std::vector<int64_t> shape, InitKind init,
                float init_std);

// Cross-entropy of `rows` rows of logits [rows, V]; row r's target is targets[positions[r]].
// Returns the sum of the rows' losses. With `backward`, each row is replaced in place by
// d(grad_scale * CE)/d(logits) = grad_scale * (softmax - one_hot(target)).
double cross_entropy_rows(float* logits, int rows, int V, const int32_t* targets, const int32_t* positions,
                          float grad_scale, bool backward);

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

// One query head of one row attending to its slot's cached positions 0..pos of kv head `head`:
// context = softmax_j(scale * q.k_j + slope * j) V, the softmax in fp32 over a max-shifted row
// (slope 0 without ALiBi). `scores` holds pos + 1 floats.
void cached_attention_head(KvCache& cache, int layer, int slot, int head, int pos, const float* q, int head_dim,
                           float slope, float* scores, float* context);

}  // namespace shardlm::model_detail

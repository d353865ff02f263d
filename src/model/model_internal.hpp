// Private to src/model: pieces the BLOOM and Llama code share (layout building, the LM head's
// cross-entropy over a chunk of logits rows).
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

}  // namespace shardlm::model_detail

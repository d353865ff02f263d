// Private to src/model: what every family's layout shares (appending tensors to a unit, finding
// one by name, the shape checks all families make).
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

// The offset of tensor `name` in `unit`; Error naming `who` when there is none.
size_t tensor_offset(const UnitLayout& unit, const std::string& name, const char* who);

// Positive sizes, heads dividing hidden_size (or, where the family has its own head dimension
// (own_head_dim), a positive head_dim; a head_dim is refused elsewhere); errors say "<family> config: ..."
// and name heads_key.
void check_common_shape(const ModelConfig& cfg, const char* family, const char* heads_key, bool own_head_dim = false);

}  // namespace shardlm::model_detail

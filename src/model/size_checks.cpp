// The size checks both backends' model bases make (size_checks.hpp).
#include "size_checks.hpp"

#include "shardlm/core.hpp"

namespace shardlm::model_detail {

void check_built_sizes(const char* name, int max_batch, int max_seq) {
  SHARDLM_CHECK(max_batch >= 0 && max_seq >= 0, name, ": negative max_batch ", max_batch, " or max_seq ", max_seq);
}

void check_batch_shape(const char* name, const char* what, int B, int T, int max_batch, int max_seq) {
  SHARDLM_CHECK(B >= 0 && T >= 0 && B <= max_batch && T <= max_seq, name, "::", what, ": batch ", B, " x seq ", T,
                " exceeds the sizes it was built for (", max_batch, " x ", max_seq, ")");
}

void check_layer_index(const char* name, const char* what, int layer, int num_layers) {
  SHARDLM_CHECK(layer >= 0 && layer < num_layers, name, "::", what, ": layer ", layer, " out of range [0, ",
                num_layers, ")");
}

}  // namespace shardlm::model_detail

// Private to src/model: the checks every model (CPU or CUDA) makes against the sizes it was built
// for; errors are prefixed "<name>::<what>" as the models name themselves ("LlamaCuda::block_forward").
#pragma once

namespace shardlm::model_detail {

// At construction: max_batch and max_seq are not negative.
void check_built_sizes(const char* name, int max_batch, int max_seq);
// B x T within the max_batch x max_seq built for.
void check_batch_shape(const char* name, const char* what, int B, int T, int max_batch, int max_seq);
// layer in [0, num_layers).
void check_layer_index(const char* name, const char* what, int layer, int num_layers);

}  // namespace shardlm::model_detail

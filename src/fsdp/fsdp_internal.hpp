// Internal pieces of the fsdp module shared between its source files.
#pragma once

#include "shardlm/fsdp.hpp"

namespace shardlm {

FlatParameter make_flat_parameter(const UnitLayout& layout, int unit_index, int shard_rank,
                                  int shard_size, uint64_t seed);

}  // namespace shardlm

// The sharding strategies: their names (PyTorch's spelling, parsed case-insensitively), which of
// them reshard after the forward, and the one mapping from a strategy and the node layout to the
// shard and replicate groups (MPI groups, NCCL groups, `plan` and comm-test all take it from here).
#include <cctype>

#include "shardlm/dist.hpp"

namespace shardlm {

const char* strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard: return "FULL_SHARD";
    case ShardingStrategy::ShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::HybridShard: return "HYBRID_SHARD";
    case ShardingStrategy::HybridShardZero2: return "HYBRID_SHARD_ZERO2";
    case ShardingStrategy::NoShard: return "NO_SHARD";
  }
  return "?";
}

const std::vector<ShardingStrategy>& all_strategies() {
  static const std::vector<ShardingStrategy> all = {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                                                    ShardingStrategy::HybridShard, ShardingStrategy::HybridShardZero2,
                                                    ShardingStrategy::NoShard};
  return all;
}

ShardingStrategy parse_strategy(const std::string& s) {
  // Accept "full_shard" and "full-shard" too: users copy names from PyTorch docs and CLIs alike.
  std::string u;
  for (char c : s) u += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  // PyTorch spells the ZeRO-2 hybrid with a leading underscore (a private member of its enum).
  if (u == "_HYBRID_SHARD_ZERO2") u.erase(0, 1);
  std::string valid;
  for (ShardingStrategy k : all_strategies()) {
    if (u == strategy_name(k)) return k;
    valid += concat(valid.empty() ? "" : ", ", strategy_name(k));
  }
  throw Error(concat("unknown sharding strategy '", s, "' (valid: ", valid, ")"));
}

bool reshards_after_forward(ShardingStrategy s) {
  return s == ShardingStrategy::FullShard || s == ShardingStrategy::HybridShard;
}

GroupLayout group_layout(ShardingStrategy strategy, const Topology& topo) {
  const int rank = topo.world_rank, world = topo.world_size;
  switch (strategy) {
    case ShardingStrategy::FullShard:
    case ShardingStrategy::ShardGradOp: return {world, 0, rank, 1, rank, 0};
    case ShardingStrategy::HybridShard:
    case ShardingStrategy::HybridShardZero2:
      SHARDLM_CHECK(topo.min_node_ranks == topo.max_node_ranks, "fsdp.strategy = ", strategy_name(strategy),
                    " shards over each node's ranks, and the nodes run unequal numbers of them (",
                    topo.min_node_ranks, " to ", topo.max_node_ranks,
                    "): start the same number of ranks on every node, or set dist.ranks_per_node");
      return {topo.local_size, topo.node, topo.local_rank, topo.num_nodes, topo.local_rank, topo.node};
    case ShardingStrategy::NoShard: return {1, rank, 0, world, 0, rank};
  }
  throw Error("group_layout: unknown sharding strategy");
}

}  // namespace shardlm

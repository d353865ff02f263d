// FSDP sharding strategy names: the canonical PyTorch spelling and a case-insensitive parser.
#include <cctype>

#include "shardlm/config.hpp"

namespace shardlm {

const char* strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard: return "FULL_SHARD";
    case ShardingStrategy::ShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::HybridShard: return "HYBRID_SHARD";
    case ShardingStrategy::NoShard: return "NO_SHARD";
  }
  return "?";
}

ShardingStrategy parse_strategy(const std::string& s) {
  // Accept "full_shard" and "full-shard" too: users copy names from PyTorch docs and CLIs alike.
  std::string u;
  for (char c : s) u += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (ShardingStrategy k : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                             ShardingStrategy::HybridShard, ShardingStrategy::NoShard}) {
    if (u == strategy_name(k)) return k;
  }
  throw Error(concat("unknown sharding strategy '", s,
                     "' (valid: FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, NO_SHARD)"));
}

}  // namespace shardlm

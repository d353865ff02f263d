// Describing a unit's flat parameter: padding, this rank's slice, its no-decay ranges.
#include <algorithm>

#include "shardlm/fsdp.hpp"

namespace shardlm {

UnitState slice_state(const FlatParameter& f, bool primary, float* param) {
  UnitState s;
  s.layout = f.layout;
  s.numel = f.numel;
  s.begin = std::min(f.shard_begin, f.numel);
  s.count = std::min(f.shard_begin + f.shard_numel, f.numel) - s.begin;
  s.primary = primary;
  s.param = param;
  return s;
}

FlatParameter make_flat_parameter(const UnitLayout& layout, int shard_rank, int shard_size) {
  FlatParameter p;
  p.layout = &layout;
  p.numel = layout.numel;
  p.padded_numel = shard_numel_of(layout.numel, shard_size) * shard_size;
  p.shard_numel = p.padded_numel / shard_size;
  p.shard_begin = static_cast<size_t>(shard_rank) * p.shard_numel;
  const size_t lo = p.shard_begin, hi = p.shard_begin + p.shard_numel;
  for (const TensorSpec& t : layout.tensors) {
    if (t.decay) continue;
    size_t b = std::max(lo, t.offset), e = std::min(hi, t.offset + t.numel);
    if (b >= e) continue;
    // Adjacent no-decay tensors (a norm's weight and bias) merge into one range.
    if (!p.no_decay.empty() && p.no_decay.back().second == b - lo)
      p.no_decay.back().second = e - lo;
    else
      p.no_decay.emplace_back(b - lo, e - lo);
  }
  return p;
}

}  // namespace shardlm

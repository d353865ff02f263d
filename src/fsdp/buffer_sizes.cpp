// The sizes of FsdpModel's buffers, as a pure function shared by FsdpModel and `shardlm plan`.
#include <algorithm>

#include "shardlm/fsdp.hpp"

namespace shardlm {

size_t shard_numel_of(size_t numel, int shard_size) {
  SHARDLM_CHECK(shard_size >= 1, "shard group size must be >= 1 (got ", shard_size, ")");
  return (numel + shard_size - 1) / shard_size;
}

FsdpBufferSizes fsdp_buffer_sizes(const std::vector<UnitLayout>& layout, const FsdpOptions& opt, int shard_size,
                                  int hidden_size, int max_batch, int max_seq) {
  SHARDLM_CHECK(!layout.empty(), "fsdp_buffer_sizes: a layout without a root unit");
  auto padded = [&](size_t u) { return shard_numel_of(layout[u].numel, shard_size) * shard_size; };
  // Every block has the same layout: block 0 stands for all of them.
  const size_t layers = layout.size() - 1;
  const size_t root_padded = padded(0), block_padded = layers > 0 ? padded(1) : 0;
  FsdpBufferSizes s;
  // One fp32 rank: the master slice is the full parameter and nothing is gathered.
  s.alias_master = shard_size == 1 && opt.param_dtype == DType::F32;
  if (!s.alias_master) {
    s.root_full = root_padded;
    s.block_full = block_padded;
    s.block_full_copies = block_padded == 0 ? 0 : reshards_after_forward(opt.strategy) ? 1 : layers;
  }
  s.root_grad_full = root_padded;
  s.block_grad_full = block_padded;
  s.grad_slice_tmp = std::max(root_padded, block_padded) / shard_size;
  if (opt.param_dtype != DType::F32 || opt.reduce_dtype != DType::F32)
    s.staging16 = std::max(root_padded, block_padded);
  s.hidden = static_cast<size_t>(max_batch) * max_seq * hidden_size;
  return s;
}

}  // namespace shardlm

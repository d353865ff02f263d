// One rank's memory per strategy and backend, for `shardlm plan`: the CPU backend from the same
// sizing functions FsdpModel allocates with; the CUDA backend from the allocations of CudaEngine
// (mirrored here), which checks at start-up that it allocated exactly this; the model's own
// buffers on either backend from its family (unit_model_memory).
#include <algorithm>

#include "shardlm/fsdp.hpp"
#include "shardlm/model.hpp"

namespace shardlm {
namespace {

struct UnitSizes {
  size_t root_padded = 0, block_padded = 0, max_padded = 0, max_shard = 0, layers = 0;
  std::vector<size_t> shard;  // per unit
  size_t model_params = 0;
};

UnitSizes unit_sizes(const std::vector<UnitLayout>& layout, int shard_size) {
  UnitSizes u;
  for (const UnitLayout& l : layout) {
    u.shard.push_back(shard_numel_of(l.numel, shard_size));
    u.model_params += l.numel;
  }
  u.layers = layout.size() - 1;
  u.root_padded = u.shard[0] * shard_size;
  u.block_padded = u.layers > 0 ? u.shard[1] * shard_size : 0;
  u.max_padded = std::max(u.root_padded, u.block_padded);
  u.max_shard = u.max_padded / shard_size;
  return u;
}

RankMemoryPlan plan_cpu(const MemoryPlanSpec& spec, const std::vector<UnitLayout>& layout, int shard_size) {
  const UnitSizes u = unit_sizes(layout, shard_size);
  RankMemoryPlan p;
  for (size_t n : u.shard) {
    p.record.master_shard += n * sizeof(float);
    p.record.grad_shard += n * sizeof(float);
    p.optimizer += 2 * n * sizeof(float);  // AdamW's two moments
  }
  p.record.model_params = u.model_params;
  const FsdpBufferSizes b = fsdp_buffer_sizes(layout, {spec.strategy, spec.param_dtype, spec.reduce_dtype},
                                              shard_size, spec.model.hidden_size, spec.micro_batch, spec.max_seq);
  p.record.full_params = (b.root_full + b.block_full * b.block_full_copies) * sizeof(float);
  p.record.full_grads = (b.root_grad_full + b.block_grad_full) * sizeof(float);
  p.record.comm_staging = b.grad_slice_tmp * sizeof(float) + 2 * b.staging16 * sizeof(uint16_t);
  // The model with the hidden states between units (b.hidden each, four of them).
  p.record.activations = unit_model_memory(spec.model, BackendKind::Cpu, DType::F32, spec.micro_batch, spec.max_seq,
                                           spec.activation_checkpointing)
                             .activations;
  return p;
}

RankMemoryPlan plan_cuda(const MemoryPlanSpec& spec, const std::vector<UnitLayout>& layout, int shard_size) {
  SHARDLM_CHECK(spec.reduce_dtype == DType::F32 || spec.reduce_dtype == spec.param_dtype, "fsdp.reduce_dtype = ",
                dtype_name(spec.reduce_dtype), ": the CUDA backend reduces in fp32 or in fsdp.param_dtype");
  const UnitSizes u = unit_sizes(layout, shard_size);
  const size_t dsize = dtype_size(spec.param_dtype);
  const bool f32 = spec.param_dtype == DType::F32;
  RankMemoryPlan p;
  for (size_t n : u.shard) {
    p.record.grad_shard += n * 4;
    // Host: the FlatParameter's master and grad slices (checkpoint staging or, offloaded, the master).
    p.host_bytes += 2 * n * 4;
    if (spec.cpu_offload) {
      p.record.master_shard += n * dsize;  // the compute-dtype slice the gathers send
      p.host_optimizer += 2 * n * 4;
      p.host_bytes += 3 * n * 4;  // AdamW's moments and the gradient slice copied down each step
    } else {
      // Sharded, the gathers cast the master into their own buffer: no 16-bit copy of the slice.
      p.record.master_shard += n * 4 + (f32 || shard_size > 1 ? 0 : n * dsize);
      p.optimizer += 2 * n * 4;
      p.host_bytes += 2 * n * 4;  // checkpoint staging of the moments
    }
  }
  p.record.model_params = u.model_params;
  // One rank: the slices are the full parameters and nothing is gathered.
  if (shard_size > 1) {
    const size_t copies =
        spec.strategy == ShardingStrategy::FullShard
            ? std::min<size_t>(static_cast<size_t>(std::max(1, spec.limit_all_gathers)), u.layers)
            : u.layers;
    p.record.full_params = u.root_padded * dsize + copies * u.block_padded * dsize;
  }
  // A single rank (no shards, no replicas) accumulates straight into its gradient slices.
  if (shard_size > 1 || spec.world_size > 1) {
    p.record.full_grads = u.root_padded * 4 + (u.block_padded > 0 ? 2 * u.block_padded * 4 : 0);
    p.record.comm_staging = u.max_shard * 4;
    if (spec.reduce_dtype != DType::F32) p.record.comm_staging += (u.max_padded + u.max_shard) * dsize;
  }
  const size_t N = static_cast<size_t>(spec.micro_batch) * spec.max_seq;
  const ModelMemory model = unit_model_memory(spec.model, BackendKind::Cuda, spec.param_dtype, spec.micro_batch,
                                             spec.max_seq, spec.activation_checkpointing);
  p.record.activations = model.activations;
  p.model_extra = model.extra;
  p.io_buffers = 2 * N * 4 + 4 + 8 + 8;  // tokens, targets; loss, count, norm
  return p;
}

}  // namespace

int plan_shard_size(const MemoryPlanSpec& spec) {
  SHARDLM_CHECK(spec.world_size >= 1, "ranks must be >= 1 (got ", spec.world_size, ")");
  const int node = spec.ranks_per_node > 0 ? spec.ranks_per_node : spec.world_size;
  SHARDLM_CHECK(spec.world_size % node == 0, "ranks per node ", node, " does not divide the ", spec.world_size,
                " ranks");
  switch (spec.strategy) {
    case ShardingStrategy::FullShard:
    case ShardingStrategy::ShardGradOp: return spec.world_size;
    case ShardingStrategy::NoShard: return 1;
    case ShardingStrategy::HybridShard: return node;
  }
  return spec.world_size;
}

RankMemoryPlan plan_rank_memory(const MemoryPlanSpec& spec) {
  SHARDLM_CHECK(spec.micro_batch >= 0 && spec.max_seq >= 1, "plan: micro-batch ", spec.micro_batch,
                " and sequence length ", spec.max_seq, " must be >= 0 and >= 1");
  const std::vector<UnitLayout> layout = model_layout(spec.model);
  const int shard = plan_shard_size(spec);
  RankMemoryPlan p;
  if (spec.backend == "cpu")
    p = plan_cpu(spec, layout, shard);
  else if (spec.backend == "cuda")
    p = plan_cuda(spec, layout, shard);
  else
    throw Error(concat("run.backend = '", spec.backend, "': plan knows cpu and cuda"));
  p.shard_size = shard;
  p.replicate_size = spec.world_size / shard;
  return p;
}

}  // namespace shardlm

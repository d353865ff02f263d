// One rank's memory per strategy and backend, for `shardlm plan`: the engine's buffers from
// fsdp_buffer_plan, the same plan FsdpEngine allocates with; the model's buffers from its family
// (unit_model_memory); the engine checks at start-up that it allocated exactly this.
#include <algorithm>

#include "shardlm/fsdp.hpp"

namespace shardlm {
namespace {

// The engine's buffers, from the same plan FsdpEngine allocates with, and the model's own (hidden
// states, saved activations, workspaces) as its family sizes them.
RankMemoryPlan plan_backend(const MemoryPlanSpec& spec, const EngineLayouts& layouts, int shard_size) {
  const bool cuda = spec.backend == BackendKind::Cuda;
  const DType compute = cuda ? spec.fsdp.param_dtype : DType::F32;  // Backend::compute_dtype
  FsdpOptions opt = spec.fsdp;
  // The copy-engine exchange needs the shard group on one host (NCCL's windows).
  const int node = spec.ranks_per_node > 0 ? spec.ranks_per_node : spec.world_size;
  if (shard_size > node) opt.copy_engine_reductions = false;
  const ModelMemory model = unit_model_memory(model_for_engine(spec.model, spec.fsdp), spec.backend, compute,
                                              spec.micro_batch, spec.max_seq, spec.activation_checkpointing);
  const FsdpBufferPlan b = engine_buffer_plan(layouts, spec.model, opt, shard_size, spec.world_size / shard_size,
                                              /*asynchronous=*/cuda, compute,
                                              static_cast<size_t>(spec.micro_batch) * spec.max_seq, model.head_scratch);
  const size_t csize = dtype_size(compute);
  RankMemoryPlan p;
  // LoRA's frozen base: its slices in the compute dtype, nothing else.
  for (const UnitLayout& l : layouts.frozen) {
    p.record.model_params += l.numel;
    p.record.master_shard += shard_numel_of(l.numel, shard_size) * csize;
  }
  for (const UnitLayout& l : layouts.trainable) {
    const size_t n = shard_numel_of(l.numel, shard_size);
    const size_t state = optimizer_state_bytes(spec.fsdp.optimizer, n);  // train.optim's, as it allocates
    p.record.model_params += l.numel;
    p.record.trainable_params += l.numel;
    if (b.grad_slices) p.record.grad_shard += n * 4;
    if (b.compute_slice) p.record.master_shard += n * csize;
    if (spec.fsdp.cpu_offload) {
      // Host: the fp32 master, the fp32 gradient the reduced slices are summed into, the optimizer's state
      // (in fsdp.offload_dir's mapped files when set).
      if (spec.fsdp.moments_in_files()) {
        p.offload_file_bytes += state;
        p.host_bytes += 2 * n * 4;
      } else {
        p.host_optimizer += state;
        p.host_bytes += 2 * n * 4 + state;
      }
    } else {
      p.record.master_shard += n * 4;
      p.optimizer += state;
      // Checkpoint staging of the master and the moments as fp32 (a quantised optimizer's only while a
      // checkpoint is written or read).
      if (cuda) p.host_bytes += 3 * n * 4;
    }
  }
  // Offloaded, the root's resident master and moments (fsdp.offload_resident_gib) on the device.
  p.record.master_shard += b.offload_resident * 4;
  p.optimizer += b.offload_resident * (kRootStateBytes - sizeof(float));  // AdamW's moments (no other optimizer)
  // Offloaded: the pinned landing buffers of the reduced slices and the upload staging (two of each).
  p.host_bytes += 2 * (b.offload_landing + b.offload_stage);
  // With root_in_slices the root's allocation (its gathered copy, the head's gradient buffer) lies in the first blocks'
  // gradient slices, one allocation of slices each 256-byte aligned: counted there.
  const bool own_root = !b.root_in_slices;
  if (!own_root) p.record.grad_shard += b.layers * (b.slice_stride - b.block_padded / shard_size * sizeof(float));
  p.record.full_params = ((b.alias || !own_root ? 0 : b.root_padded) + b.block_copies * b.block_padded) * csize;
  if (!layouts.frozen.empty() && !b.frozen_alias)
    p.record.full_params += (b.frozen_root_padded + b.frozen_block_copies * b.frozen_block_padded) * csize;
  p.record.full_grads = b.grad_buffers * b.block_padded * 4;
  // (The gathered table's bytes in the head's gradient buffer are counted under the parameters.)
  if (own_root) p.record.full_grads += b.root_grad_numel() * 4 - b.root_overlap;
  p.record.comm_staging = b.grad_slice * 4 + b.stage_full + b.stage_slice + 2 * b.offload_slice + 2 * b.offload_stream +
                          b.offload_squares + b.root_split_bytes + b.exchange_bytes;
  // The block-gradient buffers in the head's scratch: what they share is counted under the gradients.
  if (b.grads_in_head_scratch) p.shared_head_scratch = std::min(model.head_scratch, b.grad_buffers * b.block_padded * 4);
  p.exchange_bytes = b.exchange_bytes;
  p.record.activations = model.activations - p.shared_head_scratch;
  p.model_extra = model.extra;
  // The CUDA engine's device copies of a micro-batch's token and target ids (and with data.packing its
  // rows' sample starts), the model's loss and target count, the gradient norm's sum (the CPU reads the
  // host's arrays in place).
  const size_t id_arrays = spec.model.packed ? 3 : 2;
  if (cuda) p.io_buffers = id_arrays * static_cast<size_t>(spec.micro_batch) * spec.max_seq * 4 + 4 + 8 + 8;
  return p;
}

}  // namespace

int plan_shard_size(const MemoryPlanSpec& spec) {
  SHARDLM_CHECK(spec.world_size >= 1, "ranks must be >= 1 (got ", spec.world_size, ")");
  // Only the hybrid strategies' shard group is a node (the others' sizes hold on unequal real nodes too).
  const bool hybrid =
      spec.fsdp.strategy == ShardingStrategy::HybridShard || spec.fsdp.strategy == ShardingStrategy::HybridShardZero2;
  const int node = hybrid && spec.ranks_per_node > 0 ? spec.ranks_per_node : spec.world_size;
  SHARDLM_CHECK(spec.world_size % node == 0, "ranks per node ", node, " does not divide the ", spec.world_size,
                " ranks");
  return group_layout(spec.fsdp.strategy, consecutive_nodes(spec.world_size, node)).shard_size;
}

RankMemoryPlan plan_rank_memory(const MemoryPlanSpec& spec) {
  SHARDLM_CHECK(spec.micro_batch >= 0 && spec.max_seq >= 1, "plan: micro-batch ", spec.micro_batch,
                " and sequence length ", spec.max_seq, " must be >= 0 and >= 1");
  const int shard = plan_shard_size(spec);
  RankMemoryPlan p = plan_backend(spec, engine_layouts(spec.model), shard);
  p.shard_size = shard;
  p.replicate_size = spec.world_size / shard;
  p.ranks_per_node = spec.ranks_per_node > 0 ? spec.ranks_per_node : spec.world_size;
  return p;
}

}  // namespace shardlm

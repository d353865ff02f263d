// One rank's memory per strategy and backend, for `shardlm plan`: the engine's buffers from
// fsdp_buffer_plan, the same plan FsdpEngine allocates with; the model's buffers from the sizing
// functions of each model (BloomCuda's mirrored here), which the engine checks at start-up.
#include <algorithm>

#include "../device/cuda/llama_cuda_sizes.hpp"
#include "shardlm/fsdp.hpp"

namespace shardlm {
namespace {

// Logits of at most this many tokens exist at once in BloomCuda's LM head (bloom_cuda.cpp).
constexpr size_t kCudaHeadChunkTokens = 2048;
// cuBLASLt wants 256-byte aligned workspace pieces (dtype_cuda.cuh's align256).
size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The engine's buffers on one rank, from the same plan FsdpEngine allocates with.
RankMemoryPlan plan_engine(const MemoryPlanSpec& spec, const std::vector<UnitLayout>& layout, int shard_size) {
  const bool cuda = spec.backend == BackendKind::Cuda;
  FsdpOptions opt;
  opt.strategy = spec.strategy;
  opt.param_dtype = spec.param_dtype;
  opt.reduce_dtype = spec.reduce_dtype;
  opt.cpu_offload = spec.cpu_offload;
  opt.limit_all_gathers = spec.limit_all_gathers;
  const DType compute = cuda ? spec.param_dtype : DType::F32;
  const FsdpBufferPlan b =
      fsdp_buffer_plan(layout, opt, shard_size, spec.world_size / shard_size, /*asynchronous=*/cuda, compute);
  const size_t csize = dtype_size(compute);
  RankMemoryPlan p;
  for (const UnitLayout& l : layout) {
    const size_t n = shard_numel_of(l.numel, shard_size);
    p.record.model_params += l.numel;
    p.record.grad_shard += n * 4;
    if (b.compute_slice) p.record.master_shard += n * csize;
    if (spec.cpu_offload) {
      // Host: the fp32 master, the gradient slice copied down each step, AdamW's moments.
      p.host_optimizer += 2 * n * 4;
      p.host_bytes += 4 * n * 4;
    } else {
      p.record.master_shard += n * 4;
      p.optimizer += 2 * n * 4;
      if (cuda) p.host_bytes += 3 * n * 4;  // checkpoint staging of the master and the moments
    }
  }
  p.record.full_params = ((b.alias ? 0 : b.root_padded) + b.block_copies * b.block_padded) * csize;
  p.record.full_grads = ((b.direct_grads ? 0 : b.root_padded) + b.grad_buffers * b.block_padded) * 4;
  p.record.comm_staging = b.grad_slice * 4 + b.stage_full + b.stage_slice;
  return p;
}

RankMemoryPlan plan_cpu(const MemoryPlanSpec& spec, const std::vector<UnitLayout>& layout, int shard_size) {
  RankMemoryPlan p = plan_engine(spec, layout, shard_size);
  // The model's saved activations and its four hidden-state buffers (two states, two gradients).
  const size_t hidden = static_cast<size_t>(spec.micro_batch) * spec.max_seq * spec.model.hidden_size;
  p.record.activations = cpu_activation_bytes(spec.model, spec.micro_batch, spec.max_seq) + 4 * hidden * sizeof(float);
  return p;
}

// BloomCuda::activation_bytes(): hidden states, per-block saved activations (one block's with
// activation checkpointing), backward scratch and the attention and LM-head workspaces.
size_t bloom_cuda_activation_bytes(const ModelConfig& cfg, size_t dsize, int max_batch, int max_seq, bool checkpointing,
                                   DType dt) {
  const size_t N = static_cast<size_t>(max_batch) * max_seq, H = cfg.hidden_size, L = cfg.num_layers;
  const size_t heads = cfg.num_heads, T = max_seq;
  size_t bytes = (L + 1) * N * H * dsize + 2 * N * H * dsize;  // h_0..h_L, embedding and final-norm outputs
  const size_t saved = N * H * dsize * (1 + 3 + 1 + 1 + 1 + 4 + 4) + max_batch * heads * T * T * dsize + 4 * N * 4;
  bytes += (checkpointing ? 1 : L) * saved;
  bytes += N * H * dsize * (2 + 1 + 3 + 1 + 1 + 4);  // dh (2), dln, dqkv, dctx, dh2, dpre
  const size_t scores = heads * T * T;               // attention_workspace_bytes (attention.cu)
  bytes += align256(scores * sizeof(float)) + (dt == DType::F32 ? 0 : align256(scores * dsize));
  const size_t chunk = std::min(kCudaHeadChunkTokens, N);  // lm_head_workspace_bytes (lm_head.cu)
  bytes += align256(chunk * cfg.vocab_size * sizeof(float)) + align256(chunk * sizeof(float)) +
           align256(chunk * sizeof(int));
  return bytes;
}

RankMemoryPlan plan_cuda(const MemoryPlanSpec& spec, const std::vector<UnitLayout>& layout, int shard_size) {
  RankMemoryPlan p = plan_engine(spec, layout, shard_size);
  const size_t dsize = dtype_size(spec.param_dtype);
  const size_t N = static_cast<size_t>(spec.micro_batch) * spec.max_seq;
  if (spec.model.is_llama()) {
    // LlamaCuda counts every buffer it holds as activations.
    p.record.activations = cuda::llama_cuda_sizes(spec.model, spec.param_dtype, spec.micro_batch, spec.max_seq,
                                                  spec.activation_checkpointing)
                               .total();
  } else {
    p.record.activations = bloom_cuda_activation_bytes(spec.model, dsize, spec.micro_batch, spec.max_seq,
                                                       spec.activation_checkpointing, spec.param_dtype);
    // BloomCuda's embedding and final LayerNorm statistics, ALiBi slopes.
    p.model_extra = 4 * N * 4 + static_cast<size_t>(spec.model.num_heads) * 4;
  }
  p.io_buffers = 2 * N * 4 + 4 + 8 + 8;  // tokens, targets; loss, count, norm
  return p;
}

}  // namespace

int plan_shard_size(const MemoryPlanSpec& spec) {
  SHARDLM_CHECK(spec.world_size >= 1, "ranks must be >= 1 (got ", spec.world_size, ")");
  const int node = spec.ranks_per_node > 0 ? spec.ranks_per_node : spec.world_size;
  SHARDLM_CHECK(spec.world_size % node == 0, "ranks per node ", node, " does not divide the ", spec.world_size,
                " ranks");
  return group_layout(spec.strategy, consecutive_nodes(spec.world_size, node)).shard_size;
}

RankMemoryPlan plan_rank_memory(const MemoryPlanSpec& spec) {
  SHARDLM_CHECK(spec.micro_batch >= 0 && spec.max_seq >= 1, "plan: micro-batch ", spec.micro_batch,
                " and sequence length ", spec.max_seq, " must be >= 0 and >= 1");
  const std::vector<UnitLayout> layout = model_layout(spec.model);
  const int shard = plan_shard_size(spec);
  RankMemoryPlan p;
  if (spec.backend == BackendKind::Cpu)
    p = plan_cpu(spec, layout, shard);
  else
    p = plan_cuda(spec, layout, shard);
  p.shard_size = shard;
  p.replicate_size = spec.world_size / shard;
  return p;
}

}  // namespace shardlm

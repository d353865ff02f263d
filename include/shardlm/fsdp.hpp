// fsdp: flat parameters (one per wrapped unit), sharding strategies and the unshard / reshard /
// reduce schedule of one micro-batch, mixed-precision storage, planned buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/model.hpp"
#include "shardlm/optim.hpp"

namespace shardlm {

// One unit's tensors concatenated and padded to a multiple of the shard group size; this rank
// owns the contiguous slice [shard_begin, shard_begin + shard_numel) as fp32 master and grad.
struct FlatParameter {
  const UnitLayout* layout = nullptr;
  int unit_index = 0;
  size_t numel = 0;
  size_t padded_numel = 0;
  size_t shard_numel = 0;
  size_t shard_begin = 0;
  Buffer<float> master;  // fp32 master slice
  Buffer<float> grad;    // fp32 grad slice, summed over the micro-steps of an optimizer step
  // [begin, end) ranges of the slice, relative to shard_begin, that take no weight decay.
  std::vector<std::pair<size_t, size_t>> no_decay;
};

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  DType param_dtype = DType::F32;   // dtype of the gathered parameters used for compute
  DType reduce_dtype = DType::F32;  // dtype gradients are reduced in
};

// Bytes this rank holds, by role, for the per-rank report and `plan`.
struct FsdpMemory {
  size_t master_shard = 0;      // fp32 master slices
  size_t grad_shard = 0;        // fp32 grad slices
  size_t full_params = 0;       // gathered-parameter buffers
  size_t full_grads = 0;        // unsharded-gradient buffers
  size_t comm_staging = 0;      // 16-bit staging for mixed precision
  size_t activations = 0;       // saved activations and hidden-state buffers
  size_t model_params = 0;      // parameters of the whole model (not per rank), for comparison
};

// Element counts of the buffers FsdpModel allocates beside the flat parameters: a pure function
// of the layout, options, shard-group size and largest micro-batch, so `plan` cannot drift from it.
struct FsdpBufferSizes {
  bool alias_master = false;     // one fp32 rank: the master slice is the full parameter
  size_t root_full = 0;          // gathered root parameters (0 when the master slice is the full parameter)
  size_t block_full = 0;         // one gathered block
  size_t block_full_copies = 0;  // gathered blocks held: 1 (FULL_SHARD) or one per layer
  size_t root_grad_full = 0;
  size_t block_grad_full = 0;
  size_t grad_slice_tmp = 0;     // one reduced slice
  size_t staging16 = 0;          // each of the two 16-bit staging buffers (mixed precision only)
  size_t hidden = 0;             // each of the four hidden-state buffers (two states, two gradients)
};
FsdpBufferSizes fsdp_buffer_sizes(const std::vector<UnitLayout>& layout, const FsdpOptions& opt, int shard_size,
                                  int hidden_size, int max_batch, int max_seq);
// Elements of one rank's slice of a unit of `numel` elements padded to a multiple of shard_size.
size_t shard_numel_of(size_t numel, int shard_size);

// The model (BLOOM or Llama) wrapped unit by unit. The CPU backend runs the schedule synchronously.
class FsdpModel {
 public:
  FsdpModel(const ModelConfig& cfg, const FsdpOptions& opt, ProcessGroups& groups, int max_batch,
            int max_seq, uint64_t seed);
  ~FsdpModel();

  // Forward and backward of one micro-batch: gradients of grad_scale * (sum of token losses)
  // are reduce-scattered into the grad slices (added to what earlier micro-steps left there).
  // Returns this rank's sum of token losses. Every rank must call it the same number of times
  // (an empty micro-batch is allowed and still takes part in the collectives).
  double forward_backward(const MicroBatch& mb, float grad_scale);
  // Forward only: this rank's sum of token losses.
  double forward_loss(const MicroBatch& mb);

  // Greedy decoding with a key/value cache (TrainEngine::decode_begin / decode_step / decode_end):
  // each unit is gathered as in the forward, so every rank of a shard group must call
  // decode_step together, with n = 0 rows when it has nothing to decode.
  void decode_begin(int slots, int max_len, int max_rows);
  void decode_step(const int32_t* tokens, const int* slots, const int* positions, int n, const int* logit_rows,
                   int m, int32_t* next);
  void decode_end();

  void zero_grad();
  double grad_norm();          // global L2 norm of the whole model's gradient, same on every rank
  void scale_grads(float factor);
  void params_updated();       // the master slices changed: gathered copies are stale

  std::vector<FlatParameter>& units() { return units_; }
  std::vector<ParamSlice> param_slices();  // what the optimizer updates
  FsdpMemory memory() const;
  const FsdpOptions& options() const { return opt_; }

 private:
  const float* unshard(size_t unit);   // gathered parameters of `unit`, valid until resharded
  void reshard_after_use(size_t unit);
  void reduce_grad(size_t unit, float* full_grad);

  struct Buffers;
  ModelConfig cfg_;
  FsdpOptions opt_;
  ProcessGroups& groups_;
  std::vector<UnitLayout> layout_;
  std::vector<FlatParameter> units_;
  std::unique_ptr<CpuModel> model_;
  std::unique_ptr<Buffers> buf_;
};

// ---- memory plan (`shardlm plan`): one rank's bytes, from the same sizes the engines allocate ----

// What one rank runs: the model, the backend and the FSDP settings of the deck, the world.
struct MemoryPlanSpec {
  ModelConfig model;
  BackendKind backend = BackendKind::Cpu;
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  DType param_dtype = DType::F32;
  DType reduce_dtype = DType::F32;
  bool cpu_offload = false;               // CUDA backend only
  bool activation_checkpointing = false;  // CUDA backend only
  int limit_all_gathers = 2;              // CUDA backend, FULL_SHARD: gathered block buffers
  int world_size = 1;
  int ranks_per_node = 0;  // 0: every rank on one node
  int micro_batch = 1;
  int max_seq = 1;
};

// One rank's memory. `record` and `optimizer` are what the run writes in its "memory" records;
// device_total() is what it reports as peak memory (the CPU's planned buffers, or the bytes
// cudaMalloc'd through the planned device buffers).
struct RankMemoryPlan {
  int shard_size = 1, replicate_size = 1;
  FsdpMemory record;
  size_t optimizer = 0;       // AdamW moments in the memory that device_total counts
  size_t host_optimizer = 0;  // CUDA offload: AdamW moments in host memory instead
  size_t model_extra = 0;     // CUDA: buffers of the model outside activation_bytes (norm statistics, ALiBi slopes)
  size_t io_buffers = 0;      // CUDA: token and target ids of a micro-batch, loss and norm scalars
  size_t host_bytes = 0;      // CUDA: host memory of the rank (master copy, moments or their staging, grads)

  size_t params() const { return record.master_shard + record.full_params; }
  size_t grads() const { return record.grad_shard + record.full_grads; }
  size_t activations() const { return record.activations + model_extra; }
  size_t buffers() const { return record.comm_staging + io_buffers; }
  size_t device_total() const { return params() + grads() + optimizer + activations() + buffers(); }
};

// The shard-group size of `strategy` for this world (HYBRID_SHARD: the ranks of one node).
int plan_shard_size(const MemoryPlanSpec& spec);
// Error naming the reason when the backend cannot run the model (Llama on CUDA).
RankMemoryPlan plan_rank_memory(const MemoryPlanSpec& spec);
// GPU memory a CUDA rank uses outside its planned buffers: CUDA context, cuBLASLt (handle and its
// 32 MiB workspace) and NCCL; measured on one H100 as nvidia-smi's process total minus the planned
// peak (docs/PERFORMANCE.md: 20.07 - 17.94 GiB and 15.94 - 13.80 GiB).
constexpr size_t kCudaRuntimeOverheadBytes = static_cast<size_t>(2.14 * 1024 * 1024 * 1024);

}  // namespace shardlm

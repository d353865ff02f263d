// fsdp: flat parameters (one per wrapped unit), sharding strategies and the unshard / reshard /
// reduce schedule of one micro-batch, mixed-precision storage, planned buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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

}  // namespace shardlm

// What the training loop drives: the model wrapped for FSDP together with its optimizer, on one
// backend. The CPU engine runs the FSDP schedule synchronously with AdamW on the host; the CUDA
// engine (src/device/cuda) runs it on streams with NCCL and AdamW on the GPU.
#pragma once

#include <memory>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/data.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/fsdp.hpp"
#include "shardlm/io.hpp"

namespace shardlm {

class TrainEngine {
 public:
  virtual ~TrainEngine() = default;
  // One micro-batch's forward and backward; gradients of grad_scale * (sum of token losses) are
  // reduced into the grad slices. Returns this rank's sum of token losses.
  virtual double forward_backward(const MicroBatch& mb, float grad_scale) = 0;
  virtual double forward_loss(const MicroBatch& mb) = 0;
  virtual void zero_grad() = 0;
  virtual double grad_norm() = 0;  // global, the same on every rank
  // Multiplies the gradients by grad_factor (clipping), then one AdamW step at lr.
  virtual void optimizer_step(double lr, float grad_factor) = 0;
  virtual long optimizer_steps() const = 0;
  virtual void set_optimizer_steps(long steps) = 0;
  // This rank's slices (master, both moments) in host memory, for save_checkpoint and
  // load_checkpoint; the views stay valid for the engine's life. A device engine copies its
  // state into them first.
  virtual std::vector<UnitState> checkpoint_state() = 0;
  // load_checkpoint has filled the views of checkpoint_state(): take them in.
  virtual void checkpoint_loaded() = 0;
  virtual FsdpMemory memory() const = 0;
  virtual size_t optimizer_bytes() const = 0;
  // Peak device memory this rank has used (0 on the CPU, where the planned buffers are reported).
  virtual size_t device_peak_bytes() const { return 0; }
  virtual ProcessGroups& groups() = 0;

  // ---- greedy generation with a KV cache (greedy_generate drives these; every rank of the world
  // calls them together, the same number of times) ----
  // Sizes a key/value cache for `slots` sequences of up to `max_len` positions and the scratch of
  // steps of up to `max_rows` rows.
  virtual void decode_begin(int slots, int max_len, int max_rows) = 0;
  // Runs the model on n rows: row r is token tokens[r] at position positions[r] of the sequence in
  // cache slot slots[r]; its key and value are cached, and it attends to its slot's positions
  // 0..positions[r] (rows of one slot come in position order, earlier positions already cached or
  // in this step). For each of the m rows listed in logit_rows, next[i] is the argmax of that row's
  // logits (the lowest id on ties). n may be 0: the rank still takes part in the collectives.
  virtual void decode_step(const int32_t* tokens, const int* slots, const int* positions, int n,
                           const int* logit_rows, int m, int32_t* next) = 0;
  virtual void decode_end() = 0;  // frees the cache
};

// One unit's slice as the checkpoint sees it: [shard_begin, shard_begin + shard_numel) clipped to
// the unit (the padded tail of the last slices holds no parameters), with the host arrays holding it.
UnitState unit_state(const FlatParameter& p, bool primary, float* param, std::vector<StateVector> optimizer);

std::unique_ptr<TrainEngine> make_cpu_engine(const RunConfig& cfg, ProcessGroups groups, int micro);

#ifdef SHARDLM_HAVE_CUDA
// Selects this rank's GPU, builds NCCL groups and the CUDA model (src/device/cuda/cuda_engine.cpp).
std::unique_ptr<TrainEngine> make_cuda_engine(const RunConfig& cfg, MPI_Comm comm, const Topology& topo, int micro);
#endif

}  // namespace shardlm

// optim: AdamW on parameter shards, learning-rate schedules, global-norm clipping factor.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

// One contiguous slice of parameters the optimizer updates in place, with its gradient.
// no_decay lists [begin, end) ranges of the slice (biases, norms) that take no weight decay.
struct ParamSlice {
  float* param = nullptr;
  const float* grad = nullptr;
  size_t numel = 0;
  std::vector<std::pair<size_t, size_t>> no_decay;
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Decoupled weight decay (Loshchilov & Hutter), bias-corrected moments, as torch.optim.AdamW.
class AdamW {
 public:
  AdamW(const std::vector<ParamSlice>& slices, const AdamWOptions& opt);
  // One update of every slice at learning rate lr; the step counter advances by one.
  void step(double lr);
  long steps_taken() const { return step_; }
  void set_steps_taken(long steps) { step_ = steps; }  // when resuming from a checkpoint
  // The moments of slice i, for checkpoints.
  float* exp_avg(size_t i) { return exp_avg_[i].data(); }
  float* exp_avg_sq(size_t i) { return exp_avg_sq_[i].data(); }
  size_t state_bytes() const;  // both moments, fp32
  // Threads step() spreads the element-wise update over (1 by default); the result does not
  // depend on it. CPU offload of the CUDA backend uses the host's cores here.
  void set_threads(int threads) { threads_ = threads > 0 ? threads : 1; }

 private:
  std::vector<ParamSlice> slices_;
  AdamWOptions opt_;
  std::vector<Buffer<float>> exp_avg_;
  std::vector<Buffer<float>> exp_avg_sq_;
  long step_ = 0;
  int threads_ = 1;
};

// Learning rate for optimizer step `step` (0-based) of `total`: linear warmup from 0 over
// `warmup` steps, then constant or linear decay to 0 at `total` (as transformers' schedules).
double scheduled_lr(LrSchedule schedule, double base_lr, long step, long warmup, long total);

// Factor to multiply gradients by so their global norm is at most max_norm (1 when max_norm is 0
// or the norm is already within it), as torch.nn.utils.clip_grad_norm_.
double clip_factor(double grad_norm, double max_norm);

}  // namespace shardlm

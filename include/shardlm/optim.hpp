// optim: the optimizer interface and AdamW on parameter shards (on any backend), learning-rate schedules, global-norm clipping factor.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/core.hpp"
#include "shardlm/device.hpp"

namespace shardlm {

// One contiguous slice of parameters the optimizer updates in place (backend memory), with its
// gradient. no_decay lists [begin, end) ranges of the slice (biases, norms) that take no weight
// decay. When param_out is set, each update also writes the new values there in the optimizer's
// out dtype (the compute-dtype copy the next all-gather sends), in the same pass.
struct ParamSlice {
  float* param = nullptr;
  const float* grad = nullptr;
  size_t numel = 0;
  std::vector<std::pair<size_t, size_t>> no_decay;
  void* param_out = nullptr;
};

// What the FSDP engine asks of an optimizer: one update of every slice, a step count, and its
// per-element state as named fp32 vectors (opaque to the engine and to the checkpoint files).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update at learning rate lr, the gradients multiplied by grad_scale first (clipping).
  virtual void step(double lr, float grad_scale, Stream s) = 0;
  // The same update on slices [first, last) only, with begin_step's hyper-parameters, on stream s: the
  // engine updates the root and the first block ahead of the rest to gather them behind it. Every slice
  // once gives step()'s bits.
  virtual void update_slices(size_t first, size_t last, const AdamWHyper& h, Stream s) = 0;
  // The same update in pieces (CPU offload updates each unit as its gradient is ready): begin_step
  // counts the step and returns its hyper-parameters; update_slice then runs elements [begin, end) of
  // slice i with them, on any thread, writing the new values also to out (when set; element begin at
  // out[0]) in the optimizer's out dtype. Every piece of every slice once gives step()'s bits.
  virtual AdamWHyper begin_step(double lr, float grad_scale) = 0;
  virtual void update_slice(size_t i, size_t begin, size_t end, void* out, const AdamWHyper& h) = 0;
  // The same piece on copies of its arrays, run by `backend` on stream s (CPU offload's root update on
  // the device): param, grad, each state vector (state_names' order) and out hold elements [begin, end)
  // of slice i from their element 0 (out may be null). The arrays the optimizer owns are not touched.
  virtual void update_slice_on(Backend& backend, Stream s, size_t i, size_t begin, size_t end, float* param,
                               const float* grad, const std::vector<float*>& state, void* out, const AdamWHyper& h) = 0;
  virtual long steps_taken() const = 0;
  virtual void set_steps_taken(long steps) = 0;  // when resuming from a checkpoint
  virtual const char* name() const = 0;
  // Names of the state vectors every slice has, in a fixed order ("exp_avg", "exp_avg_sq").
  virtual std::vector<std::string> state_names() const = 0;
  // State vector k of slice i (backend memory, the slice's numel elements).
  virtual float* state(size_t slice, size_t k) = 0;
  virtual size_t state_bytes() const = 0;
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Decoupled weight decay (Loshchilov & Hutter), bias-corrected moments, as torch.optim.AdamW; the
// update runs on `backend` (its moments live there), writing param_out in out_dtype where set.
class AdamW final : public Optimizer {
 public:
  AdamW(Backend& backend, const std::vector<ParamSlice>& slices, const AdamWOptions& opt,
        DType out_dtype = DType::F32);
  void step(double lr, float grad_scale = 1.0f, Stream s = nullptr) override;
  void update_slices(size_t first, size_t last, const AdamWHyper& h, Stream s) override;
  AdamWHyper begin_step(double lr, float grad_scale) override;
  void update_slice(size_t i, size_t begin, size_t end, void* out, const AdamWHyper& h) override;
  void update_slice_on(Backend& backend, Stream s, size_t i, size_t begin, size_t end, float* param, const float* grad,
                       const std::vector<float*>& state, void* out, const AdamWHyper& h) override;
  long steps_taken() const override { return step_; }
  void set_steps_taken(long steps) override { step_ = steps; }
  const char* name() const override { return "adamw"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  float* state(size_t slice, size_t k) override { return (k == 0 ? exp_avg_ : exp_avg_sq_)[slice].as<float>(); }
  size_t state_bytes() const override;
  float* exp_avg(size_t i) { return state(i, 0); }
  float* exp_avg_sq(size_t i) { return state(i, 1); }

 private:
  Backend& backend_;
  AdamWOptions opt_;
  DType out_dtype_;
  std::vector<AdamWRange> ranges_;  // every slice cut at its no-decay ranges, made once
  // Slice i's ranges cut to [begin, end), with the arrays of `at` (element begin at their [0]).
  std::vector<AdamWRange> piece(size_t i, size_t begin, size_t end, const AdamWRange& at, DType out_dtype) const;
  std::vector<size_t> range_offset_;  // of each range in its slice
  std::vector<size_t> slice_ranges_;  // slice i's ranges are [slice_ranges_[i], slice_ranges_[i + 1])
  std::vector<DeviceArray> exp_avg_, exp_avg_sq_;
  long step_ = 0;
};

// The schedules' arguments beside their name (transformers' lr_scheduler_kwargs): num_cycles 0 is
// the schedule's default (cosine and cosine_with_min_lr 0.5, cosine_with_restarts 1).
struct LrScheduleArgs {
  double num_cycles = 0;
  double power = 1.0;       // polynomial
  double lr_end = 1e-7;     // polynomial: the rate at the last step
  double min_lr_ratio = 0;  // cosine_with_min_lr: the floor, as a fraction of base_lr (min_lr_rate)
};
LrScheduleArgs lr_schedule_args(const TrainSection& train);

// Learning rate for optimizer step `step` (0-based) of `total`, with `warmup` warm-up steps, as
// transformers' get_scheduler(name) gives it (src/optim/schedule.cpp; tests/test_schedules.cpp checks
// it against transformers' own values). `constant` ignores the warm-up, as transformers' does.
double scheduled_lr(LrSchedule schedule, double base_lr, long step, long warmup, long total,
                    const LrScheduleArgs& args = {});
// The warm-up steps of a run of `total` steps: warmup_steps when > 0, else ceil(warmup_ratio x total)
// (TrainingArguments.get_warmup_steps).
long resolved_warmup_steps(int warmup_steps, double warmup_ratio, long total);

// Factor to multiply gradients by so their global norm is at most max_norm (1 when max_norm is 0
// or the norm is already within it), as torch.nn.utils.clip_grad_norm_.
double clip_factor(double grad_norm, double max_norm);

}  // namespace shardlm

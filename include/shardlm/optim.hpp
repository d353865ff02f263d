// optim: the optimizer interface, AdamW and 8-bit AdamW on parameter shards (on any backend), learning-rate schedules, global-norm clipping factor, dynamic loss scale.
#pragma once

#include <cstddef>
#include <memory>
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

// What one step's update needs to know, whatever the optimizer: begin_step fills it, the updates of
// that step's pieces take it (each optimizer adds its own constants: betas, eps, decay).
struct StepHyper {
  double lr = 0;
  long step = 1;                 // 1-based count of the update (bias corrections)
  float grad_scale = 1;          // gradients are multiplied by this first (clipping)
  DType out_dtype = DType::F32;  // of the compute-dtype copy an update also writes (ParamSlice::param_out)
};

// What the FSDP engine asks of an optimizer: one update of every slice, a step count, and its state,
// which checkpoints keep as named per-element fp32 vectors (opaque to the engine and to the files)
// whatever the optimizer keeps in memory.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update at learning rate lr, the gradients multiplied by grad_scale first (clipping).
  virtual void step(double lr, float grad_scale, Stream s) = 0;
  // The same update on slices [first, last) only, with begin_step's hyper-parameters, on stream s: the
  // engine updates the root and the first block ahead of the rest to gather them behind it. Every slice
  // once gives step()'s bits.
  virtual void update_slices(size_t first, size_t last, const StepHyper& h, Stream s) = 0;
  // The same update in pieces (CPU offload updates each unit as its gradient is ready): begin_step
  // counts the step and returns its hyper-parameters; update_slice then runs elements [begin, end) of
  // slice i with them, on any thread, writing the new values also to out (when set; element begin at
  // out[0]) in the optimizer's out dtype. Every piece of every slice once gives step()'s bits. Pieces
  // start at a multiple of piece_align() (and end there, or at the slice's end).
  virtual StepHyper begin_step(double lr, float grad_scale) = 0;
  virtual void update_slice(size_t i, size_t begin, size_t end, void* out, const StepHyper& h) = 0;
  virtual size_t piece_align() const { return 1; }
  // The same piece on copies of its arrays, run by `backend` on stream s (CPU offload's root update on
  // the device): param, grad, each state vector (state_names' order) and out hold elements [begin, end)
  // of slice i from their element 0 (out may be null). The arrays the optimizer owns are not touched.
  // Only an optimizer whose state vectors are its memory (state() not null) has it.
  virtual void update_slice_on(Backend& backend, Stream s, size_t i, size_t begin, size_t end, float* param,
                               const float* grad, const std::vector<float*>& state, void* out,
                               const StepHyper& h) = 0;
  virtual long steps_taken() const = 0;
  virtual void set_steps_taken(long steps) = 0;  // when resuming from a checkpoint
  // train.optim's name of the optimizer ("adamw_torch").
  virtual const char* name() const = 0;
  // Names of the fp32 state vectors every slice has, as checkpoints keep them, in a fixed order
  // ("exp_avg", "exp_avg_sq").
  virtual std::vector<std::string> state_names() const = 0;
  // Whether the optimizer keeps its state vectors as fp32 arrays that state() hands out in place.
  virtual bool fp32_state() const = 0;
  // State vector k of slice i (backend memory, the slice's numel elements) when fp32_state(); nullptr
  // when the optimizer keeps it otherwise (quantised): read_state and write_state convert then.
  virtual float* state(size_t slice, size_t k) = 0;
  // State vector k of slice i as fp32 values into host memory (numel elements), and back.
  virtual void read_state(size_t slice, size_t k, float* out) = 0;
  virtual void write_state(size_t slice, size_t k, const float* in) = 0;
  virtual size_t state_bytes() const = 0;
};

// AdamW's hyper-parameters (train.adam_*, train.weight_decay), which every optimizer here takes.
struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// What the AdamW-family optimizers share: the next step's StepHyper (counting `steps`), and AdamW's
// hyper-parameters for one step's updates.
StepHyper count_step(long& steps, double lr, float grad_scale, DType out_dtype);
AdamWHyper adamw_hyper(const AdamWOptions& opt, const StepHyper& step);

// train.optim's optimizer on the slices, its state on `backend`, writing param_out in out_dtype where set.
std::unique_ptr<Optimizer> make_optimizer(Optim optim, Backend& backend, const std::vector<ParamSlice>& slices,
                                          const AdamWOptions& opt, DType out_dtype);
// Bytes of train.optim's state for a slice of numel elements, as the optimizer allocates it (the memory plan's).
size_t optimizer_state_bytes(Optim optim, size_t numel);

// Decoupled weight decay (Loshchilov & Hutter), bias-corrected moments, as torch.optim.AdamW; the
// update runs on `backend` (its moments live there), writing param_out in out_dtype where set.
class AdamW final : public Optimizer {
 public:
  AdamW(Backend& backend, const std::vector<ParamSlice>& slices, const AdamWOptions& opt,
        DType out_dtype = DType::F32);
  void step(double lr, float grad_scale = 1.0f, Stream s = nullptr) override;
  void update_slices(size_t first, size_t last, const StepHyper& h, Stream s) override;
  StepHyper begin_step(double lr, float grad_scale) override;
  void update_slice(size_t i, size_t begin, size_t end, void* out, const StepHyper& h) override;
  void update_slice_on(Backend& backend, Stream s, size_t i, size_t begin, size_t end, float* param, const float* grad,
                       const std::vector<float*>& state, void* out, const StepHyper& h) override;
  long steps_taken() const override { return step_; }
  void set_steps_taken(long steps) override { step_ = steps; }
  const char* name() const override { return optim_name(Optim::AdamWTorch); }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool fp32_state() const override { return true; }
  float* state(size_t slice, size_t k) override { return (k == 0 ? exp_avg_ : exp_avg_sq_)[slice].as<float>(); }
  void read_state(size_t slice, size_t k, float* out) override;
  void write_state(size_t slice, size_t k, const float* in) override;
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
  AdamWHyper hyper(const StepHyper& h) const;
  std::vector<size_t> range_offset_;  // of each range in its slice
  std::vector<size_t> slice_ranges_;  // slice i's ranges are [slice_ranges_[i], slice_ranges_[i + 1])
  std::vector<DeviceArray> exp_avg_, exp_avg_sq_;
  long step_ = 0;
};

// AdamW with block-wise quantised moments (train.optim = adamw_8bit, bitsandbytes' AdamW8bit in
// TrainingArguments): the same update in fp32, the moments kept between steps as one byte per element
// and one fp32 scale per kQuantBlock elements (2 bytes a parameter and a little, against AdamW's 8).
// Blocks are counted from each slice's element 0, inside the rank's shard. Checkpoints keep the
// dequantised fp32 moments under AdamW's names: quantising them again gives back the same codes.
class AdamW8bit final : public Optimizer {
 public:
  AdamW8bit(Backend& backend, const std::vector<ParamSlice>& slices, const AdamWOptions& opt,
            DType out_dtype = DType::F32);
  void step(double lr, float grad_scale = 1.0f, Stream s = nullptr) override;
  void update_slices(size_t first, size_t last, const StepHyper& h, Stream s) override;
  StepHyper begin_step(double lr, float grad_scale) override;
  void update_slice(size_t i, size_t begin, size_t end, void* out, const StepHyper& h) override;
  size_t piece_align() const override { return kQuantBlock; }
  void update_slice_on(Backend& backend, Stream s, size_t i, size_t begin, size_t end, float* param, const float* grad,
                       const std::vector<float*>& state, void* out, const StepHyper& h) override;
  long steps_taken() const override { return step_; }
  void set_steps_taken(long steps) override { step_ = steps; }
  const char* name() const override { return optim_name(Optim::AdamW8bit); }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool fp32_state() const override { return false; }
  float* state(size_t, size_t) override { return nullptr; }
  void read_state(size_t slice, size_t k, float* out) override;
  void write_state(size_t slice, size_t k, const float* in) override;
  size_t state_bytes() const override;
  static size_t bytes_for(size_t numel);  // of one slice's codes and scales

 private:
  struct Slice {
    ParamSlice param;
    DeviceArray exp_avg, exp_avg_sq, exp_avg_scale, exp_avg_sq_scale;  // codes and per-block scales
    std::vector<uint64_t> no_decay;  // the slice's no-decay ranges as [begin, end) pairs (host memory)
  };
  AdamW8bitRange range(size_t i, size_t begin, size_t end, void* out) const;
  AdamWHyper hyper(const StepHyper& h) const;
  Backend& backend_;
  AdamWOptions opt_;
  DType out_dtype_;
  std::vector<Slice> slices_;
  long step_ = 0;
};

// The schedules' arguments beside their name (transformers' lr_scheduler_kwargs): num_cycles 0 is
// the schedule's default (cosine and cosine_with_min_lr 0.5, cosine_with_restarts 1).
struct LrScheduleArgs {
  double num_cycles = 0;
  double power = 1.0;       // polynomial
  double lr_end = 1e-7;     // polynomial: the rate at step `total`, one past the last
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

// A dynamic loss scale (train.loss_scale) under torch.amp.GradScaler's rules: the loss is multiplied by
// `value` before backward and the gradients divided by it, and a step whose gradient overflowed is skipped.
struct DynamicLossScale {
  double value = 1;
  long good_steps = 0;  // steps without overflow since the value last changed
  // After each step: an overflow halves the value, with no floor, as GradScaler (a gradient that overflows
  // at a scale of 1 needs one below it); 2000 good steps in a row (growth_interval) double it.
  void after_step(bool overflow);
};

// Factor to multiply gradients by so their global norm is at most max_norm (1 when max_norm is 0
// or the norm is already within it), as torch.nn.utils.clip_grad_norm_.
double clip_factor(double grad_norm, double max_norm);

}  // namespace shardlm

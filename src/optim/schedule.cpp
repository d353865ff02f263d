// Learning-rate schedules as transformers' get_scheduler defines them (optimization.py's lambdas of
// the base rate), and Trainer's rule for the warm-up steps a warmup_ratio gives.
#include <algorithm>
#include <cmath>

#include "shardlm/optim.hpp"

namespace shardlm {

namespace {

constexpr double kPi = 3.14159265358979323846;

// The fraction of the decay done at `step` after `warmup` steps of `total` (transformers divides by
// max(1, total - warmup)).
double progress(long step, long warmup, long total) {
  return static_cast<double>(step - warmup) / static_cast<double>(std::max(1L, total - warmup));
}

}  // namespace

LrScheduleArgs lr_schedule_args(const TrainSection& train) {
  return {train.lr_num_cycles, train.lr_power, train.lr_end, train.min_lr_ratio};
}

long resolved_warmup_steps(int warmup_steps, double warmup_ratio, long total) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<long>(std::ceil(warmup_ratio * static_cast<double>(total)));
}

double scheduled_lr(LrSchedule schedule, double base_lr, long step, long warmup, long total, const LrScheduleArgs& args) {
  if (schedule == LrSchedule::Constant) return base_lr;  // transformers' constant has no warm-up
  if (step < warmup) return base_lr * static_cast<double>(step) / static_cast<double>(std::max(1L, warmup));
  const double p = progress(step, warmup, total);
  switch (schedule) {
    case LrSchedule::ConstantWithWarmup:
      return base_lr;
    case LrSchedule::Linear:
      return base_lr * std::max(0.0, static_cast<double>(total - step) / static_cast<double>(std::max(1L, total - warmup)));
    case LrSchedule::Cosine: {
      const double cycles = args.num_cycles > 0 ? args.num_cycles : 0.5;
      return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * p)));
    }
    case LrSchedule::CosineWithMinLr: {
      const double cycles = args.num_cycles > 0 ? args.num_cycles : 0.5;
      const double f = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * p));
      return base_lr * std::max(0.0, f * (1.0 - args.min_lr_ratio) + args.min_lr_ratio);
    }
    case LrSchedule::CosineWithRestarts: {
      if (p >= 1.0) return 0.0;
      const double cycles = args.num_cycles > 0 ? args.num_cycles : 1.0;
      return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(kPi * std::fmod(cycles * p, 1.0))));
    }
    case LrSchedule::Polynomial: {
      if (step > total) return args.lr_end;
      const double decay_steps = static_cast<double>(total - warmup);
      if (decay_steps <= 0) return base_lr;  // transformers divides by zero here; the run has no decay
      const double remaining = 1.0 - static_cast<double>(step - warmup) / decay_steps;
      // transformers returns the rate over base_lr and multiplies it back: the same to rounding.
      return (base_lr - args.lr_end) * std::pow(remaining, args.power) + args.lr_end;
    }
    case LrSchedule::Constant:
      break;
  }
  return base_lr;
}

}  // namespace shardlm

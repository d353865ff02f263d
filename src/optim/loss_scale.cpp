// The dynamic loss scale's update after a step, as torch.amp.GradScaler's update() (_amp_update_scale_).
#include "shardlm/optim.hpp"

namespace shardlm {

namespace {

// Steps without overflow after which the scale doubles (GradScaler's growth_interval).
constexpr long kGrowthInterval = 2000;

}  // namespace

void DynamicLossScale::after_step(bool overflow) {
  if (overflow) {
    value /= 2;  // GradScaler's backoff_factor
    good_steps = 0;
  } else if (++good_steps == kGrowthInterval) {
    value *= 2;  // growth_factor
    good_steps = 0;
  }
}

}  // namespace shardlm

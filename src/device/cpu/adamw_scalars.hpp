// The per-step scalars of the host AdamW updates (host_adamw.cpp, host_adamw_8bit.cpp), derived as the
// CUDA backend derives them: fp32 hyper-parameters, bias corrections rounded to fp32, the step size and
// the square root of the second correction in fp64.
#pragma once

#include <cmath>

#include "shardlm/device.hpp"

namespace shardlm {

struct AdamWScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  float decay;             // 1 - lr * weight_decay
  float step_size;         // lr / bias_correction1
  float sqrt_correction2;  // sqrt(bias_correction2)
  float grad_scale;
};

inline AdamWScalars adamw_scalars(const AdamWHyper& h, double weight_decay) {
  const float lr = static_cast<float>(h.lr);
  const float bias1 = static_cast<float>(1.0 - std::pow(h.beta1, static_cast<double>(h.step)));
  const float bias2 = static_cast<float>(1.0 - std::pow(h.beta2, static_cast<double>(h.step)));
  AdamWScalars s;
  s.beta1 = static_cast<float>(h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta1 = 1.0f - s.beta1;
  s.one_minus_beta2 = 1.0f - s.beta2;
  s.eps = static_cast<float>(h.eps);
  s.decay = static_cast<float>(1.0 - static_cast<double>(lr) * static_cast<float>(weight_decay));
  s.step_size = static_cast<float>(static_cast<double>(lr) / bias1);
  s.sqrt_correction2 = static_cast<float>(std::sqrt(static_cast<double>(bias2)));
  s.grad_scale = h.grad_scale;
  return s;
}

}  // namespace shardlm

// Fused AdamW on an fp32 shard (adamw.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

struct AdamWArgs {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0;     // 0 for ranges without decay
  float bias_correction1 = 1; // 1 - beta1^t
  float bias_correction2 = 1; // 1 - beta2^t
  float grad_scale = 1;       // grads are multiplied by this first (clipping, loss-scale unscale)
};
// Decoupled weight decay, as torch.optim.AdamW: p -= lr * wd * p; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= lr * (m / bc1) / (sqrt(v / bc2) + eps).
// When param_out is non-null it also writes the updated parameter cast to out_dt (the
// compute-dtype copy that the next all-gather sends), saving a separate cast pass.
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                const AdamWArgs& args, void* param_out, DType out_dt, cudaStream_t stream);

}  // namespace shardlm::cuda

// 8-bit AdamW on an fp32 shard, moments in block-wise quantised codes (adamw_8bit.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked.
#pragma once

#include <cuda_runtime_api.h>

#include "shardlm/device.hpp"

namespace shardlm::cuda {

// Backend::adamw_8bit on one range: the same bits as host_adamw_8bit.
void adamw_8bit_step(const AdamW8bitRange& r, const AdamWHyper& h, cudaStream_t stream);

}  // namespace shardlm::cuda

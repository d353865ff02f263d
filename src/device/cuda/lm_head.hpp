// LM head + cross-entropy, fused and chunked over rows (lm_head.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gemm.hpp"
#include "workspace_sizes.hpp"
#include "shardlm/core.hpp"

namespace shardlm::cuda {

// Logits = h @ table^T ([n, V], tied embeddings) are never held for more than `chunk` rows at once.
// Returns nothing; writes the per-chunk loss sums into loss_sum (fp32 device scalar, +=) and the
// count of positions with a target (targets >= 0) into *count (int64 device scalar, +=).
// When dh is non-null: dh[n, H] = d(grad_scale * sum loss)/dh (written), dtable += (fp32; null: a
// frozen table, no weight gradient GEMM).
// `workspace` holds lm_head_workspace_bytes(chunk, V, dt) (workspace_sizes.hpp).
void lm_head_loss(Gemm& gemm, const void* h, const void* table, const int32_t* targets, int n, int H, int V, int chunk,
                  float grad_scale, float* loss_sum, long long* count, void* dh, float* dtable, DType dt,
                  void* workspace, cudaStream_t stream);

}  // namespace shardlm::cuda

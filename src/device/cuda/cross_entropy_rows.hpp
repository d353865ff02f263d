// The cross-entropy of rows of fp32 logits, with their gradient written in place (cross_entropy_rows.cu):
// the row kernel of the LM head (lm_head.cu) and its launcher.
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// Which kernel reads the rows.
//   kTwoPass: one block a row reads the row twice (its softmax state, then the gradient): any GPU, any V.
//   kCluster: a thread-block cluster a row (Hopper and later) holds the row in registers, so each logit is
//             read from memory once; V up to kClusterMaxVocab.
//   kAuto:    kCluster where this GPU and this binary's code for it allow it and V fits, else kTwoPass.
enum class CrossEntropyPath { kAuto, kTwoPass, kCluster };

// The largest V the cluster kernel takes: 8 blocks of 512 threads holding 64 logits each.
constexpr int kClusterMaxVocab = 8 * 512 * 64;

// For each of `rows` rows of logits [rows, V] (fp32, row stride V): row_loss[r] = logsumexp(row) -
// row[targets[r]] and row_has_target[r] = 1 for targets in [0, V); other targets (-1: no target) give
// row_loss 0, row_has_target 0. With `backward`, the row is overwritten by grad_scale * (softmax -
// onehot(target)) in dt, element j at dt-offset j of the row (zeros for a row without a target), so that a
// 16-bit gradient has row stride 2V in its own elements. The per-row results are the same from run to run.
void cross_entropy_rows(float* logits, int rows, int V, const int32_t* targets, float grad_scale, bool backward,
                        float* row_loss, int* row_has_target, DType dt, cudaStream_t stream,
                        CrossEntropyPath path = CrossEntropyPath::kAuto);

// The kernel kAuto runs for V on the current device (kTwoPass or kCluster).
CrossEntropyPath cross_entropy_auto_path(int V);

}  // namespace shardlm::cuda

// Rotary position embeddings applied in place to query and key heads (rotary.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// The rotation's options beyond Llama's: partial rotary (Phi-3: the first rotary_dim dimensions of each head
// rotate, element i pairing with i + rotary_dim / 2, the rest pass through), cos and sin scaled (LongRoPE's
// attention factor), and in decoding LongRoPE's choice of frequencies per row: `long_inv_freq` where the
// largest position of the row's slot among the step's rows + 1 exceeds `original_max` (rope_step_max_position).
struct RotaryOptions {
  int rotary_dim = 0;  // 0: head_dim
  float scale = 1.0f;
  const float* long_inv_freq = nullptr;  // decoding only; null: inv_freq for every row
  const int32_t* slots = nullptr;        // with long_inv_freq: the rows' slots (device [n])
  int original_max = 0;
};

// Rotates `heads` heads of head_dim at the start of each of the n rows of x (row stride ld, row r
// at position r % T) by the angles pos * inv_freq[i] (inv_freq: fp32 [head_dim / 2], rope_inv_freq
// uploaded), in transformers' rotate_half convention: element i pairs with i + head_dim / 2.
// `inverse` applies the transposed rotation: the backward of the forward one. In place.
// With `starts` (device [n], packed rows) row r sits at position r % T - starts[r] instead.
void rotary_apply(void* x, int n, int T, int heads, int head_dim, int ld, const float* inv_freq, bool inverse,
                  DType dt, cudaStream_t stream, const int32_t* starts = nullptr, const RotaryOptions& options = {});
// The forward rotation of rows at their own positions (device [n], >= 0): greedy decoding, where a
// step's rows belong to many sequences.
void rotary_apply_at(void* x, int n, const int32_t* positions, int heads, int head_dim, int ld,
                     const float* inv_freq, DType dt, cudaStream_t stream, const RotaryOptions& options = {});

}  // namespace shardlm::cuda

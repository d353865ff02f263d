// SwiGLU and GeGLU over the fused gate|up projection rows, forward and backward (swiglu.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// gate_up is [n, 2F]: each row the gate projection (F), then the up projection (F).
// `amax_bits`, when not null: one word, zeroed, then given the bits of the amax of what the call writes (out or
// dgate_up, as stored), as fp8_quantize reduces it, for the FP8 GEMM that reads that output next
// (MatMul::fp8_forward_x_amax, fp8_backward_dy_amax): that GEMM's quantization then skips its own pass.
// out[n, F] = silu(gate) * up with silu(g) = g * sigmoid(g).
void swiglu_forward(const void* gate_up, void* out, int n, int F, DType dt, cudaStream_t stream,
                    unsigned* amax_bits = nullptr);
// dgate_up[n, 2F] from dout[n, F]: d(up) = dout * silu(gate), d(gate) = dout * up * silu'(gate).
// `act_out`, when not null: also given the forward's out, the same bits, as the one read of gate|up allows (the
// backward of the linear layer after it needs it too); it may be dout itself, written over as it is read.
void swiglu_backward(const void* dout, const void* gate_up, void* dgate_up, int n, int F, DType dt, cudaStream_t stream,
                     unsigned* amax_bits = nullptr, void* act_out = nullptr);
// GeGLU (Gemma): out = gelu_tanh(gate) * up (GELU's tanh approximation, gelu_pytorch_tanh), and its backward:
// d(up) = dout * gelu_tanh(gate), d(gate) = dout * up * gelu_tanh'(gate).
void geglu_tanh_forward(const void* gate_up, void* out, int n, int F, DType dt, cudaStream_t stream,
                        unsigned* amax_bits = nullptr);
void geglu_tanh_backward(const void* dout, const void* gate_up, void* dgate_up, int n, int F, DType dt,
                         cudaStream_t stream, unsigned* amax_bits = nullptr, void* act_out = nullptr);

}  // namespace shardlm::cuda

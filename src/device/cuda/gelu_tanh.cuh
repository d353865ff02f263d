// GELU in the tanh approximation and its derivative, fp32 on the device: BLOOM's MLP (elementwise.cu) and
// Gemma's GeGLU (swiglu.cu). PyTorch's gelu(approximate='tanh'), transformers' gelu_pytorch_tanh.
#pragma once

namespace shardlm::cuda {

// BLOOM's constants: sqrt(2/pi) and the cubic coefficient (as in bloom_cpu.cpp).
inline constexpr float kGeluScale = 0.79788456f;
inline constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu_inner_tanh(float u) {
  return tanhf(kGeluScale * u * (1.0f + kGeluCubic * u * u));
}

__device__ __forceinline__ float gelu_value(float u) { return 0.5f * u * (1.0f + gelu_inner_tanh(u)); }

__device__ __forceinline__ float gelu_derivative(float u) {
  const float t = gelu_inner_tanh(u);
  const float inner_derivative = kGeluScale * (1.0f + 3.0f * kGeluCubic * u * u);
  return 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * inner_derivative;
}

}  // namespace shardlm::cuda

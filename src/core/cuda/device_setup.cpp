// Set-up writes of device memory that every stream sees when they return (device_setup.hpp).
#include "device_setup.hpp"

#include <cuda_runtime_api.h>

#include "cuda_check.hpp"

namespace shardlm::cuda {

void zero_device_memory(void* p, size_t bytes) {
  if (bytes == 0) return;
  SHARDLM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cudaStreamLegacy));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void copy_to_device_now(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cudaStreamLegacy));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

}  // namespace shardlm::cuda

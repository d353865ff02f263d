// The process's count of device bytes its buffers hold (device_memory_count.hpp): current and peak.
#include "device_memory_count.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda_check.hpp"

namespace shardlm::cuda {

DeviceMemoryStats& device_memory_stats() {
  static DeviceMemoryStats stats;
  return stats;
}

void device_memory_add(ptrdiff_t bytes) {
  DeviceMemoryStats& s = device_memory_stats();
  s.current = static_cast<size_t>(static_cast<ptrdiff_t>(s.current) + bytes);
  s.peak = std::max(s.peak, s.current);
}

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

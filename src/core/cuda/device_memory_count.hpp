// The process's count of the device bytes its buffers hold (DeviceBuffer, NCCL window memory):
// current and peak, what a run reports and compares with `shardlm plan`.
#pragma once

#include <cstddef>

namespace shardlm::cuda {

struct DeviceMemoryStats {
  size_t current = 0;
  size_t peak = 0;
};
DeviceMemoryStats& device_memory_stats();
void device_memory_add(ptrdiff_t bytes);

}  // namespace shardlm::cuda

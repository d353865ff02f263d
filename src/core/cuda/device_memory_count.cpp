// The process's count of device bytes its buffers hold (device_memory_count.hpp): current and peak.
#include "device_memory_count.hpp"

#include <algorithm>

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

}  // namespace shardlm::cuda

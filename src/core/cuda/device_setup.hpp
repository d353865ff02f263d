// Device memory written once at set-up from the host (zeroed, or copied up), finished for every stream when the
// call returns.
#pragma once

#include <cstddef>

namespace shardlm::cuda {

// Zeroes `bytes` of device memory at `p` and returns once they are zero. cudaMemset alone is asynchronous to
// the host and runs on the legacy default stream, which the backend's non-blocking streams never wait for: a
// copy queued on one of them right after it (a unit's initial values) could land first and be wiped, as two
// ranks sharing one GPU showed for LoRA's adapters (docs/history/performance-log.md, 2026-12-01).
void zero_device_memory(void* p, size_t bytes);
// Copies `bytes` from host memory at `src` to device memory at `dst` and returns once they are there (cudaMemcpy
// from pageable memory may return before its DMA lands, on the same legacy stream): tables set up once.
void copy_to_device_now(void* dst, const void* src, size_t bytes);

}  // namespace shardlm::cuda

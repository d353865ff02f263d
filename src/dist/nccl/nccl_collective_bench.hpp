// The collective benchmark on NCCL (`shardlm comm-test --backend=cuda`): device buffers, each
// iteration timed between CUDA events on the group's stream, the check run's pattern staged
// through host memory in chunks.
#pragma once

#include <memory>
#include <string>

#include "nccl_communicator.hpp"

namespace shardlm::cuda {

std::unique_ptr<CollectiveBench> make_nccl_collective_bench(NcclCommunicator& group, size_t max_bytes);

// Free memory of the current device (what the bench's buffers may take).
size_t device_free_bytes();
// "GPU 0: NVIDIA H100 80GB HBM3" for the current device; "NCCL 2.28.3" for the library linked.
std::string current_device_text();
std::string nccl_version_text();

}  // namespace shardlm::cuda

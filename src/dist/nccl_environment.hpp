// NCCL's environment defaults that shardlm applies before NCCL starts (NcclCommunicator's first call).
#pragma once

#include <string>
#include <vector>

namespace shardlm {

// NCCL's socket transport (nodes joined by Ethernet without RDMA, or NCCL_NET=Socket) moves each connection
// through NCCL_SOCKET_NTHREADS threads of NCCL_NSOCKS_PERTHREAD sockets each, one of one by default outside
// the clouds NCCL recognises. Sets each to kNcclSocketThreads / kNcclSocketsPerThread where the environment
// leaves it unset (or empty); what a user exports wins. NCCL reads them once per process, when its first
// communicator starts, so this runs before that. Returns the names it set. No effect on NVLink, shared
// memory or InfiniBand connections.
inline constexpr int kNcclSocketThreads = 4;
inline constexpr int kNcclSocketsPerThread = 4;
std::vector<std::string> default_nccl_socket_parallelism();

}  // namespace shardlm

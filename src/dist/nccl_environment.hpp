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

// Ranks sharing a GPU, for development and tests on a host with fewer GPUs than ranks: with
// SHARDLM_SHARE_GPUS=1 in the environment, host rank r runs on GPU r % devices instead of the run
// stopping, and NCCL (which refuses two ranks of one host on one GPU) is told that each rank is a host
// of its own, so their collectives go through its network transport (sockets without InfiniBand), as
// between nodes. Values, schedule and memory per rank are a run's on as many GPUs; its speed is not,
// and the paths that need one host's GPUs peer to peer (copy-engine gathers and exchanges, symmetric
// windows) stay off. Only where the host has fewer GPUs than ranks: with enough, the switch changes
// nothing. docs/cluster.md, "Testing on fewer GPUs than ranks".
bool gpu_sharing_requested();

struct GpuPlacement {
  int device = 0;           // the GPU this rank runs on
  int ranks_on_device = 1;  // the host's ranks on that GPU, this one included
  bool shared = false;      // the host's ranks share its GPUs (more ranks than GPUs): every rank a host to NCCL
};
// Where a rank of `host_ranks` on its host (host rank `host_rank`) runs on `devices` GPUs: one GPU a rank,
// or with `share` and fewer GPUs than ranks, ranks dealt round the GPUs. Throws, naming both counts, where
// the host has fewer GPUs than ranks and `share` is off.
GpuPlacement place_rank_on_gpu(int host_rank, int host_ranks, int devices, bool share, const std::string& host);

// Whether this process's ranks share GPUs: as the placement made by select_device (record_gpu_placement)
// found, and before any, whether sharing was asked for (the safe answer for the peer-to-peer paths).
void record_gpu_placement(const GpuPlacement& p);
bool gpus_shared();

// NCCL_HOSTID = "<host>/rank<world_rank>" (NCCL reads it when its first communicator starts): each rank a
// host of its own to NCCL. Set over whatever the environment held, which would put the ranks back on one.
void nccl_host_per_rank(const std::string& host, int world_rank);

}  // namespace shardlm

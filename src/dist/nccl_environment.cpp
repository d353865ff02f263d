// NCCL's environment defaults that shardlm applies before NCCL starts.
#include "nccl_environment.hpp"

#include <cstdlib>

#include "shardlm/core.hpp"

namespace shardlm {

std::vector<std::string> default_nccl_socket_parallelism() {
  std::vector<std::string> set;
  const auto fill = [&](const char* name, int value) {
    const char* now = std::getenv(name);
    if (now && *now) return;
    setenv(name, std::to_string(value).c_str(), 1);
    set.emplace_back(name);
  };
  // On 2 x H200 with every connection on sockets (bench/scaling.sh --slow-link), 4 x 4 moved HYBRID_SHARD's
  // replica all-reduces 2.1x faster than NCCL's 1 x 1 (docs/PERFORMANCE.md); NCCL allows 64 sockets at most.
  fill("NCCL_SOCKET_NTHREADS", kNcclSocketThreads);
  fill("NCCL_NSOCKS_PERTHREAD", kNcclSocketsPerThread);
  return set;
}

bool gpu_sharing_requested() {
  const char* v = std::getenv("SHARDLM_SHARE_GPUS");
  return v && std::string(v) == "1";
}

GpuPlacement place_rank_on_gpu(int host_rank, int host_ranks, int devices, bool share, const std::string& host) {
  SHARDLM_CHECK(devices > 0 && host_rank >= 0 && host_rank < host_ranks, "place_rank_on_gpu: host rank ", host_rank,
                " of ", host_ranks, " on ", devices, " GPU(s)");
  SHARDLM_CHECK(share || host_ranks <= devices, "host ", host, " runs ", host_ranks, " ranks but has ", devices,
                " GPU(s); start at most one rank per GPU (e.g. srun --ntasks-per-node=", devices,
                "), or, to test on fewer GPUs, export SHARDLM_SHARE_GPUS=1 (docs/cluster.md)");
  GpuPlacement p;
  p.device = host_rank % devices;
  p.ranks_on_device = host_ranks / devices + (p.device < host_ranks % devices ? 1 : 0);
  p.shared = host_ranks > devices;  // (the same answer on every rank of the host, as NCCL's host ids need)
  return p;
}

namespace {
int placed_shared = -1;  // record_gpu_placement's answer; -1: none placed yet
}  // namespace

void record_gpu_placement(const GpuPlacement& p) { placed_shared = p.shared ? 1 : 0; }

bool gpus_shared() { return placed_shared >= 0 ? placed_shared == 1 : gpu_sharing_requested(); }

void nccl_host_per_rank(const std::string& host, int world_rank) {
  setenv("NCCL_HOSTID", (host + "/rank" + std::to_string(world_rank)).c_str(), 1);
}

}  // namespace shardlm

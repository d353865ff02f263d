// NCCL's environment defaults that shardlm applies before NCCL starts.
#include "nccl_environment.hpp"

#include <cstdlib>

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

}  // namespace shardlm

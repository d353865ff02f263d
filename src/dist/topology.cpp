// Node topology of the world (real hosts or emulated nodes) and the FSDP process groups built on it.
#include <vector>

#include "shardlm/dist.hpp"

namespace shardlm {

Topology make_topology(MPI_Comm world, int ranks_per_node) {
  Topology t;
  MPI_Comm_rank(world, &t.world_rank);
  MPI_Comm_size(world, &t.world_size);
  MPI_Comm host;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, t.world_rank, MPI_INFO_NULL, &host);
  MPI_Comm_size(host, &t.host_ranks);
  MPI_Comm_rank(host, &t.host_rank);
  MPI_Comm_free(&host);
  if (ranks_per_node > 0) {
    SHARDLM_CHECK(t.world_size % ranks_per_node == 0, "dist.ranks_per_node = ", ranks_per_node,
                  " does not divide the world size ", t.world_size);
    t.emulated = true;
    t.local_size = ranks_per_node;
    t.local_rank = t.world_rank % ranks_per_node;
    t.node = t.world_rank / ranks_per_node;
    t.num_nodes = t.world_size / ranks_per_node;
    return t;
  }
  MPI_Comm local;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, t.world_rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &t.local_rank);
  MPI_Comm_size(local, &t.local_size);
  // Node ids: number the node leaders (local rank 0) in world order, then share within the node.
  MPI_Comm leaders;
  MPI_Comm_split(world, t.local_rank == 0 ? 0 : MPI_UNDEFINED, t.world_rank, &leaders);
  int ids[2] = {0, 0};
  if (leaders != MPI_COMM_NULL) {
    MPI_Comm_rank(leaders, &ids[0]);
    MPI_Comm_size(leaders, &ids[1]);
    MPI_Comm_free(&leaders);
  }
  MPI_Bcast(ids, 2, MPI_INT, 0, local);
  MPI_Comm_free(&local);
  t.node = ids[0];
  t.num_nodes = ids[1];
  int min_local = 0, max_local = 0;
  MPI_Allreduce(&t.local_size, &min_local, 1, MPI_INT, MPI_MIN, world);
  MPI_Allreduce(&t.local_size, &max_local, 1, MPI_INT, MPI_MAX, world);
  SHARDLM_CHECK(min_local == max_local, "nodes run unequal numbers of ranks (", min_local, " to ",
                max_local, "); start the same number of ranks on every node");
  return t;
}

ProcessGroups make_mpi_process_groups(MPI_Comm world, const Topology& topo, ShardingStrategy strategy) {
  ProcessGroups g;
  // A duplicate: the groups own (and free) their communicators, the caller keeps `world`.
  MPI_Comm world_dup;
  MPI_Comm_dup(world, &world_dup);
  g.world = std::make_unique<MpiCommunicator>(world_dup);
  auto split = [&](int color, int key) {
    MPI_Comm c;
    MPI_Comm_split(world, color, key, &c);
    return std::make_unique<MpiCommunicator>(c);
  };
  switch (strategy) {
    case ShardingStrategy::FullShard:
    case ShardingStrategy::ShardGradOp:
      g.shard = split(0, topo.world_rank);
      g.replicate = std::make_unique<MpiCommunicator>(MPI_COMM_SELF);
      break;
    case ShardingStrategy::NoShard:
      g.shard = std::make_unique<MpiCommunicator>(MPI_COMM_SELF);
      g.replicate = split(0, topo.world_rank);
      break;
    case ShardingStrategy::HybridShard:
      g.shard = split(topo.node, topo.local_rank);
      g.replicate = split(topo.local_rank, topo.node);
      break;
  }
  return g;
}

double mpi_sum(MPI_Comm comm, double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, comm);
  return out;
}

double mpi_max(MPI_Comm comm, double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm);
  return out;
}

void run_collectively(MPI_Comm comm, const std::function<void()>& fn) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string message;
  int failed_rank = INT32_MAX;
  try {
    fn();
  } catch (const std::exception& e) {
    message = e.what();
    failed_rank = rank;
  }
  int first = INT32_MAX;
  MPI_Allreduce(&failed_rank, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == INT32_MAX) return;
  // The lowest failing rank shares its message so every rank reports the same error.
  int len = rank == first ? static_cast<int>(message.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, comm);
  std::vector<char> text(len);
  if (rank == first) std::copy(message.begin(), message.end(), text.begin());
  MPI_Bcast(text.data(), len, MPI_CHAR, first, comm);
  std::string shared(text.begin(), text.end());
  throw AgreedError(first == 0 ? shared : concat("rank ", first, ": ", shared));
}

}  // namespace shardlm

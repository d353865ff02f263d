// Node topology of the world (real hosts or emulated nodes) and the FSDP process groups on MPI.
#include <vector>

#include "shardlm/dist.hpp"

namespace shardlm {

Topology consecutive_nodes(int world_size, int ranks_per_node, int world_rank) {
  SHARDLM_CHECK(ranks_per_node > 0 && world_size % ranks_per_node == 0, "dist.ranks_per_node = ", ranks_per_node,
                " does not divide the world size ", world_size);
  Topology t;
  t.world_rank = world_rank;
  t.world_size = world_size;
  t.emulated = true;
  t.local_size = t.min_node_ranks = t.max_node_ranks = ranks_per_node;
  t.local_rank = world_rank % ranks_per_node;
  t.node = world_rank / ranks_per_node;
  t.num_nodes = world_size / ranks_per_node;
  return t;
}

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
    Topology e = consecutive_nodes(t.world_size, ranks_per_node, t.world_rank);
    e.host_ranks = t.host_ranks;
    e.host_rank = t.host_rank;
    return e;
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
  MPI_Allreduce(&t.local_size, &t.min_node_ranks, 1, MPI_INT, MPI_MIN, world);
  MPI_Allreduce(&t.local_size, &t.max_node_ranks, 1, MPI_INT, MPI_MAX, world);
  return t;
}

ProcessGroups make_mpi_process_groups(MPI_Comm world, const Topology& topo, ShardingStrategy strategy) {
  const GroupLayout layout = group_layout(strategy, topo);
  ProcessGroups g;
  // A duplicate: the groups own (and free) their communicators, the caller keeps `world`.
  MPI_Comm world_dup;
  MPI_Comm_dup(world, &world_dup);
  g.world = std::make_unique<MpiCommunicator>(world_dup);
  // A group of one is MPI_COMM_SELF; the sizes are the same on every rank, so all split or none.
  auto group = [&](int size, int color, int key) {
    if (size == 1) return std::make_unique<MpiCommunicator>(MPI_COMM_SELF);
    MPI_Comm c;
    MPI_Comm_split(world, color, key, &c);
    return std::make_unique<MpiCommunicator>(c);
  };
  g.shard = group(layout.shard_size, layout.shard_color, layout.shard_key);
  g.replicate = group(layout.replicate_size, layout.replicate_color, layout.replicate_key);
  return g;
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

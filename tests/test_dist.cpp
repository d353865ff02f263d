// Tests of dist under mpirun: collectives (fp32 and 16-bit), topology, the strategy-to-groups
// table and the process groups made from it, error agreement, NCCL's socket defaults, ranks sharing GPUs.
#define BOOST_TEST_MODULE test_dist
#include "mpi_fixture.hpp"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "nccl_environment.hpp"
#include "shardlm/dist.hpp"
#include "test_support.hpp"

using namespace shardlm;

BOOST_AUTO_TEST_CASE(fp32_collectives) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int r = world.rank(), n = world.size();
  const size_t count = 5;
  std::vector<float> mine(count), all(count * n);
  for (size_t i = 0; i < count; ++i) mine[i] = float(100 * r + i);
  world.all_gather(mine.data(), all.data(), count, DType::F32);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i) BOOST_TEST(all[q * count + i] == float(100 * q + i));

  // reduce-scatter: element j of the full vector on rank q is q + j; rank r keeps piece r of the sum.
  std::vector<float> full(count * n), piece(count);
  for (size_t j = 0; j < full.size(); ++j) full[j] = float(r + j);
  world.reduce_scatter(full.data(), piece.data(), count, DType::F32, ReduceOp::Sum);
  const float rank_sum = float(n * (n - 1) / 2);
  for (size_t i = 0; i < count; ++i) BOOST_TEST(piece[i] == rank_sum + n * float(r * count + i));

  std::vector<float> v = {float(r), 1.0f};
  world.all_reduce(v.data(), 2, DType::F32, ReduceOp::Sum);
  BOOST_TEST(v[0] == rank_sum);
  BOOST_TEST(v[1] == float(n));
  float mx = float(r);
  world.all_reduce(&mx, 1, DType::F32, ReduceOp::Max);
  BOOST_TEST(mx == float(n - 1));

  std::vector<float> b = {r == n - 1 ? 42.0f : 0.0f};
  world.broadcast(b.data(), 1, DType::F32, n - 1);
  BOOST_TEST(b[0] == 42.0f);

  // all-to-all: run q of rank r's send (element i: 1000 r + 10 q + i) lands at r * count on rank q.
  std::vector<float> send(count * n), recv(count * n, -1.0f);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i) send[q * count + i] = float(1000 * r + 10 * q + i);
  world.all_to_all(send.data(), recv.data(), count, DType::F32);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i) BOOST_TEST(recv[q * count + i] == float(1000 * q + 10 * r + i));
}

// In place, as NCCL allows and the engine uses: all_gather from this rank's piece of the output,
// reduce_scatter into this rank's piece of the input, reduce into the root's own input.
BOOST_AUTO_TEST_CASE(in_place_collectives) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int r = world.rank(), n = world.size();
  const size_t count = 4;
  std::vector<float> all(count * n, -1.0f);
  for (size_t i = 0; i < count; ++i) all[r * count + i] = float(100 * r + i);
  world.all_gather(all.data() + r * count, all.data(), count, DType::F32);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i) BOOST_TEST(all[q * count + i] == float(100 * q + i));

  std::vector<float> full(count * n);
  for (size_t j = 0; j < full.size(); ++j) full[j] = float(r + j);
  world.reduce_scatter(full.data(), full.data() + r * count, count, DType::F32, ReduceOp::Sum);
  const float rank_sum = float(n * (n - 1) / 2);
  for (size_t i = 0; i < count; ++i) BOOST_TEST(full[r * count + i] == rank_sum + n * float(r * count + i));

  for (int root = 0; root < n; ++root) {
    std::vector<float> v = {float(r), float(root)};
    world.reduce(v.data(), v.data(), 2, DType::F32, ReduceOp::Sum, root);
    if (r == root) BOOST_TEST(v[0] == rank_sum);
    if (r == root) BOOST_TEST(v[1] == float(n * root));
  }
}

// Unequal pieces in place, one of them empty (the root's gradient parts, Impl::reduce_range): piece q sums
// into rank q alone; the elements outside every piece, and other ranks' pieces, stay as they were.
BOOST_AUTO_TEST_CASE(reduce_of_unequal_pieces) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int r = world.rank(), n = world.size();
  for (bool hole : {false, true}) {  // every rank's piece, then rank 1's empty
    std::vector<size_t> offsets(n), counts(n);
    size_t end = 2;  // two elements before the first piece
    for (int q = 0; q < n; ++q) offsets[q] = end, counts[q] = hole && q == 1 ? 0 : size_t(3 + 2 * q), end += counts[q];
    std::vector<float> v(end + 1);
    for (size_t j = 0; j < v.size(); ++j) v[j] = float(10 * r + j);
    world.reduce_pieces(v.data(), offsets, counts, DType::F32, ReduceOp::Sum);
    const float rank_sum = float(10 * n * (n - 1) / 2);
    for (size_t j = 0; j < v.size(); ++j) {
      const bool mine = j >= offsets[r] && j < offsets[r] + counts[r];
      BOOST_TEST(v[j] == (mine ? rank_sum + n * float(j) : float(10 * r + j)), "element " << j << " hole " << hole);
    }
  }
  float x = 0;
  BOOST_CHECK_THROW(world.reduce_pieces(&x, {0}, {1, 1}, DType::F32, ReduceOp::Sum), Error);
}

BOOST_AUTO_TEST_CASE(sixteen_bit_reductions) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int r = world.rank(), n = world.size();
  for (DType t : {DType::BF16, DType::F16}) {
    // Small integers are exact in both formats, so the sums are exact.
    std::vector<float> full(3 * n);
    for (size_t j = 0; j < full.size(); ++j) full[j] = float(j + r);
    std::vector<uint16_t> packed(full.size()), piece(3);
    pack16(t, full.data(), packed.data(), full.size());
    world.reduce_scatter(packed.data(), piece.data(), 3, t, ReduceOp::Sum);
    std::vector<float> out(3);
    unpack16(t, piece.data(), out.data(), 3);
    for (int i = 0; i < 3; ++i) BOOST_TEST(out[i] == float(n * (3 * r + i) + n * (n - 1) / 2));
    uint16_t x = t == DType::BF16 ? float_to_bf16(0.5f) : float_to_fp16(0.5f);
    world.all_reduce(&x, 1, t, ReduceOp::Sum);
    BOOST_TEST((t == DType::BF16 ? bf16_to_float(x) : fp16_to_float(x)) == 0.5f * n);
  }
}

BOOST_AUTO_TEST_CASE(real_topology_is_one_host) {
  Topology t = make_topology(MPI_COMM_WORLD, 0);
  BOOST_TEST(t.num_nodes == 1);
  BOOST_TEST(t.node == 0);
  BOOST_TEST(t.local_size == world_size());
  BOOST_TEST(t.local_rank == world_rank());
  BOOST_TEST(!t.emulated);
}

// dist.hpp's table, seen from world rank 6 of 8 ranks on 2 nodes of 4 (node 1, local rank 2).
BOOST_AUTO_TEST_CASE(group_layout_gives_the_documented_table) {
  const Topology t = consecutive_nodes(8, 4, 6);
  BOOST_TEST(t.node == 1);
  BOOST_TEST(t.local_rank == 2);
  BOOST_TEST(t.num_nodes == 2);
  struct Row {
    ShardingStrategy strategy;
    GroupLayout want;  // shard size, colour, key; replicate size, colour, key
  };
  const std::vector<Row> table = {
      {ShardingStrategy::FullShard, {8, 0, 6, 1, 6, 0}},        {ShardingStrategy::ShardGradOp, {8, 0, 6, 1, 6, 0}},
      {ShardingStrategy::HybridShard, {4, 1, 2, 2, 2, 1}},      {ShardingStrategy::HybridShardZero2, {4, 1, 2, 2, 2, 1}},
      {ShardingStrategy::NoShard, {1, 6, 0, 8, 0, 6}},
  };
  BOOST_TEST(table.size() == all_strategies().size());
  for (const Row& row : table) {
    const GroupLayout got = group_layout(row.strategy, t);
    BOOST_TEST_CONTEXT(strategy_name(row.strategy)) {
      BOOST_TEST(got.shard_size == row.want.shard_size);
      BOOST_TEST(got.shard_color == row.want.shard_color);
      BOOST_TEST(got.shard_key == row.want.shard_key);
      BOOST_TEST(got.replicate_size == row.want.replicate_size);
      BOOST_TEST(got.replicate_color == row.want.replicate_color);
      BOOST_TEST(got.replicate_key == row.want.replicate_key);
    }
  }
  BOOST_TEST(contains(error_of([] { consecutive_nodes(8, 3); }), "dist.ranks_per_node = 3"));
  // Unequal real nodes (3 + 2 ranks): the strategies that shard over the world or not at all take them; the
  // hybrid ones, whose shard group is a node, are refused naming the counts.
  Topology uneven = t;
  uneven.world_size = 5, uneven.world_rank = 4, uneven.num_nodes = 2, uneven.node = 1, uneven.local_rank = 1;
  uneven.local_size = 2, uneven.min_node_ranks = 2, uneven.max_node_ranks = 3, uneven.emulated = false;
  BOOST_TEST(group_layout(ShardingStrategy::FullShard, uneven).shard_size == 5);
  BOOST_TEST(group_layout(ShardingStrategy::NoShard, uneven).replicate_size == 5);
  for (ShardingStrategy s : {ShardingStrategy::HybridShard, ShardingStrategy::HybridShardZero2})
    BOOST_TEST(contains(error_of([&] { group_layout(s, uneven); }), "nodes run unequal numbers of them (2 to 3)"));
}

BOOST_AUTO_TEST_CASE(only_full_shard_and_hybrid_shard_reshard_after_forward) {
  for (ShardingStrategy s : all_strategies())
    BOOST_TEST(reshards_after_forward(s) == (s == ShardingStrategy::FullShard || s == ShardingStrategy::HybridShard),
               strategy_name(s));
}

BOOST_AUTO_TEST_CASE(process_groups_per_strategy) {
  const int n = world_size(), r = world_rank();
  const int per_node = n >= 2 ? n / 2 : 1;
  Topology t = make_topology(MPI_COMM_WORLD, per_node);
  BOOST_TEST(t.emulated);
  BOOST_TEST(t.node == r / per_node);
  BOOST_TEST(t.local_rank == r % per_node);
  BOOST_TEST(t.num_nodes == n / per_node);

  ProcessGroups full = make_mpi_process_groups(MPI_COMM_WORLD, t, ShardingStrategy::FullShard);
  BOOST_TEST(full.shard->size() == n);
  BOOST_TEST(full.replicate->size() == 1);
  ProcessGroups none = make_mpi_process_groups(MPI_COMM_WORLD, t, ShardingStrategy::NoShard);
  BOOST_TEST(none.shard->size() == 1);
  BOOST_TEST(none.replicate->size() == n);
  for (ShardingStrategy s : {ShardingStrategy::HybridShard, ShardingStrategy::HybridShardZero2}) {
    BOOST_TEST_CONTEXT(strategy_name(s)) {
      ProcessGroups hybrid = make_mpi_process_groups(MPI_COMM_WORLD, t, s);
      BOOST_TEST(hybrid.shard->size() == per_node);
      BOOST_TEST(hybrid.shard->rank() == r % per_node);
      BOOST_TEST(hybrid.replicate->size() == n / per_node);
      BOOST_TEST(hybrid.replicate->rank() == r / per_node);
      // The replicate group joins the same local rank of every node: sum the world ranks in it.
      float v = float(r);
      hybrid.replicate->all_reduce(&v, 1, DType::F32, ReduceOp::Sum);
      float expect = 0;
      for (int node = 0; node < n / per_node; ++node) expect += float(node * per_node + r % per_node);
      BOOST_TEST(v == expect);
      // The shard group is the ranks of this node: sum the world ranks in it.
      float w = float(r);
      hybrid.shard->all_reduce(&w, 1, DType::F32, ReduceOp::Sum);
      const int first = r / per_node * per_node;
      BOOST_TEST(w == float(per_node * first + per_node * (per_node - 1) / 2));
    }
  }
}

BOOST_AUTO_TEST_CASE(errors_are_agreed_on) {
  const int n = world_size();
  std::string seen;
  try {
    run_collectively(MPI_COMM_WORLD, [&] {
      if (world_rank() == n - 1) throw Error("data file missing");
    });
  } catch (const AgreedError& e) {
    seen = e.what();
  }
  BOOST_TEST(seen == (n - 1 == 0 ? std::string("data file missing") : concat("rank ", n - 1, ": data file missing")));
  BOOST_CHECK_NO_THROW(run_collectively(MPI_COMM_WORLD, [] {}));
  BOOST_TEST(mpi_sum(MPI_COMM_WORLD, 1.5) == 1.5 * n);
  BOOST_TEST(mpi_max(MPI_COMM_WORLD, double(world_rank())) == double(n - 1));
}

// The named environment variables as they were, put back when it goes.
class SavedEnvironment {
 public:
  explicit SavedEnvironment(std::vector<std::string> names) : names_(std::move(names)) {
    for (const std::string& n : names_) {
      const char* v = std::getenv(n.c_str());
      values_.emplace_back(v != nullptr, v ? v : "");
    }
  }
  ~SavedEnvironment() {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (values_[i].first) setenv(names_[i].c_str(), values_[i].second.c_str(), 1);
      else unsetenv(names_[i].c_str());
    }
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::pair<bool, std::string>> values_;
};

BOOST_AUTO_TEST_CASE(nccl_socket_defaults_fill_only_what_is_unset) {
  // (The suite's other cases never start NCCL.)
  const SavedEnvironment saved({"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"});
  unsetenv("NCCL_SOCKET_NTHREADS");
  unsetenv("NCCL_NSOCKS_PERTHREAD");
  BOOST_TEST(default_nccl_socket_parallelism() == (std::vector<std::string>{"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"}),
             boost::test_tools::per_element());
  BOOST_TEST(std::string(std::getenv("NCCL_SOCKET_NTHREADS")) == std::to_string(kNcclSocketThreads));
  BOOST_TEST(std::string(std::getenv("NCCL_NSOCKS_PERTHREAD")) == std::to_string(kNcclSocketsPerThread));
  BOOST_TEST(kNcclSocketThreads * kNcclSocketsPerThread <= 64);  // NCCL's limit
  // A value the user exported wins; an empty one counts as unset.
  setenv("NCCL_SOCKET_NTHREADS", "2", 1);
  setenv("NCCL_NSOCKS_PERTHREAD", "", 1);
  BOOST_TEST(default_nccl_socket_parallelism() == std::vector<std::string>{"NCCL_NSOCKS_PERTHREAD"},
             boost::test_tools::per_element());
  BOOST_TEST(std::string(std::getenv("NCCL_SOCKET_NTHREADS")) == "2");
  BOOST_TEST(std::string(std::getenv("NCCL_NSOCKS_PERTHREAD")) == std::to_string(kNcclSocketsPerThread));
  BOOST_TEST(default_nccl_socket_parallelism().empty());
}

BOOST_AUTO_TEST_CASE(ranks_share_gpus_only_when_asked) {
  // One GPU a rank: the host rank's own; more ranks than GPUs stop the run, naming both counts and the way out.
  BOOST_TEST(place_rank_on_gpu(3, 4, 4, false, "h").device == 3);
  BOOST_TEST(place_rank_on_gpu(3, 4, 4, false, "h").ranks_on_device == 1);
  BOOST_TEST(place_rank_on_gpu(1, 2, 8, false, "h").ranks_on_device == 1);
  const std::string refused = error_of([] { place_rank_on_gpu(1, 2, 1, false, "node7"); });
  BOOST_TEST(refused.find("node7 runs 2 ranks but has 1 GPU(s)") != std::string::npos, refused);
  BOOST_TEST(refused.find("SHARDLM_SHARE_GPUS=1") != std::string::npos, refused);
  // Shared: ranks dealt round the GPUs, each told how many ranks its GPU holds.
  int on[2] = {0, 0};
  for (int r = 0; r < 5; ++r) {
    const GpuPlacement p = place_rank_on_gpu(r, 5, 2, true, "h");
    BOOST_TEST(p.device == r % 2);
    ++on[p.device];
    BOOST_TEST(p.ranks_on_device == (p.device == 0 ? 3 : 2));
    BOOST_TEST(p.shared);  // every rank of the host, those alone on a GPU too (NCCL's host ids agree)
  }
  BOOST_TEST(on[0] == 3);
  BOOST_TEST(place_rank_on_gpu(1, 2, 1, true, "h").ranks_on_device == 2);
  // Sharing allowed, nothing shared: as without the switch (NCCL keeps the host's GPUs peer to peer).
  for (int devices : {2, 8}) {
    const GpuPlacement p = place_rank_on_gpu(1, 2, devices, true, "h");
    BOOST_TEST(p.device == 1);
    BOOST_TEST(p.ranks_on_device == 1);
    BOOST_TEST(!p.shared);
  }
  BOOST_TEST(!place_rank_on_gpu(3, 4, 4, false, "h").shared);

  // The switch and NCCL's host id (the suite never starts NCCL).
  const SavedEnvironment saved({"SHARDLM_SHARE_GPUS", "NCCL_HOSTID"});
  unsetenv("SHARDLM_SHARE_GPUS");
  BOOST_TEST(!gpu_sharing_requested());
  setenv("SHARDLM_SHARE_GPUS", "0", 1);
  BOOST_TEST(!gpu_sharing_requested());
  setenv("SHARDLM_SHARE_GPUS", "1", 1);
  BOOST_TEST(gpu_sharing_requested());
  setenv("NCCL_HOSTID", "one-for-all", 1);  // a value exported for every rank would put them back on one host
  nccl_host_per_rank("node7", 5);
  BOOST_TEST(std::string(std::getenv("NCCL_HOSTID")) == "node7/rank5");
  // Whether the ranks share GPUs, for the peer-to-peer paths: before a placement, whether it was asked; after,
  // what the placement found.
  BOOST_TEST(gpus_shared());
  unsetenv("SHARDLM_SHARE_GPUS");
  BOOST_TEST(!gpus_shared());
  record_gpu_placement(place_rank_on_gpu(0, 2, 1, true, "h"));
  BOOST_TEST(gpus_shared());
  setenv("SHARDLM_SHARE_GPUS", "1", 1);
  record_gpu_placement(place_rank_on_gpu(0, 2, 2, true, "h"));
  BOOST_TEST(!gpus_shared());
}

// NCCL communicators bootstrapped through MPI (GPU machine, under mpirun with 1, 2 and 4 ranks):
// each collective against the values MPI computes, on the world and on the shard and replicate
// groups of every strategy (HYBRID_SHARD on emulated nodes), and a hung peer ends the job with a
// message naming the group instead of hanging.
#define BOOST_TEST_MODULE test_nccl
#include "mpi_fixture.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

#include "cuda_check.hpp"
#include "launch_support.hpp"
#include "nccl_communicator.hpp"

using namespace shardlm;
using shardlm::cuda::NcclCommunicator;

namespace {

struct Gpu {
  Gpu() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) BOOST_FAIL("test_nccl needs a CUDA GPU per rank");
    topo = make_topology(MPI_COMM_WORLD, 0);
    cuda::select_device(topo);
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Gpu() { cudaStreamDestroy(stream); }
  Topology topo;
  cudaStream_t stream = nullptr;
};

Gpu& gpu() {
  static Gpu g;
  return g;
}

struct DeviceFloats {
  explicit DeviceFloats(size_t n) : n(n) { SHARDLM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float))); }
  ~DeviceFloats() { cudaFree(p); }
  void put(const std::vector<float>& v) { SHARDLM_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice)); }
  std::vector<float> get() const {
    std::vector<float> v(n);
    SHARDLM_CUDA_CHECK(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost));
    return v;
  }
  float* p = nullptr;
  size_t n;
};

// Rank r's value at element i: distinct per rank and element, exact in fp32 sums.
float value(int r, size_t i) { return static_cast<float>((r + 1) * 1000 + static_cast<int>(i % 997)); }

// Checks all four collectives of `c` (whose members are the world ranks `members`, in group order).
void check_collectives(NcclCommunicator& c, const std::vector<int>& members) {
  const size_t count = 1031;  // odd, not a multiple of anything
  const int me = members[c.rank()];
  BOOST_TEST_REQUIRE(static_cast<int>(members.size()) == c.size());

  std::vector<float> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = value(me, i);
  DeviceFloats send(count), gathered(count * c.size());
  send.put(mine);
  c.all_gather(send.p, gathered.p, count, DType::F32);
  c.wait();
  std::vector<float> g = gathered.get();
  for (int r = 0; r < c.size(); ++r)
    for (size_t i = 0; i < count; i += 97) BOOST_TEST(g[r * count + i] == value(members[r], i));

  std::vector<float> full(count * c.size());
  for (size_t i = 0; i < full.size(); ++i) full[i] = value(me, i);
  DeviceFloats rs_send(full.size()), rs_recv(count);
  rs_send.put(full);
  c.reduce_scatter(rs_send.p, rs_recv.p, count, DType::F32, ReduceOp::Sum);
  c.wait();
  std::vector<float> piece = rs_recv.get();
  for (size_t i = 0; i < count; i += 89) {
    double want = 0;
    for (int m : members) want += value(m, c.rank() * count + i);
    BOOST_TEST(piece[i] == want);
  }
  // In place, as the engine reduces: into this rank's piece of the input; and a reduce into the root's input.
  rs_send.put(full);
  c.reduce_scatter(rs_send.p, rs_send.p + c.rank() * count, count, DType::F32, ReduceOp::Sum);
  c.wait();
  const std::vector<float> in_place = rs_send.get();
  for (size_t i = 0; i < count; i += 89) BOOST_TEST(in_place[c.rank() * count + i] == piece[i]);
  for (int root = 0; root < c.size(); ++root) {
    send.put(mine);
    c.reduce(send.p, send.p, count, DType::F32, ReduceOp::Sum, root);
    c.wait();
    if (c.rank() != root) continue;
    const std::vector<float> summed = send.get();
    for (size_t i = 0; i < count; i += 83) {
      double want = 0;
      for (int m : members) want += value(m, i);
      BOOST_TEST(summed[i] == want);
    }
  }

  // Unequal pieces in place (Communicator::reduce_pieces, grouped), every rank's, then with rank 1's empty: each
  // into its rank alone, the rest untouched.
  for (bool hole : {false, true}) {
    std::vector<size_t> offsets(c.size()), counts(c.size());
    size_t end = 5;
    for (int q = 0; q < c.size(); ++q) offsets[q] = end, counts[q] = hole && q == 1 ? 0 : 211 + 17 * q, end += counts[q];
    BOOST_TEST_REQUIRE(end <= full.size());
    rs_send.put(full);
    c.reduce_pieces(rs_send.p, offsets, counts, DType::F32, ReduceOp::Sum);
    c.wait();
    const std::vector<float> pieces = rs_send.get();
    for (size_t i = 0; i < full.size(); i += 7) {
      const bool in_mine = i >= offsets[c.rank()] && i < offsets[c.rank()] + counts[c.rank()];
      double want = full[i];
      if (in_mine) {
        want = 0;
        for (int m : members) want += value(m, i);
      }
      BOOST_TEST(pieces[i] == want, "element " << i << (hole ? ", rank 1's piece empty" : ""));
    }
  }

  send.put(mine);
  c.all_reduce(send.p, count, DType::F32, ReduceOp::Max);
  c.wait();
  std::vector<float> mx = send.get();
  int top = 0;
  for (int m : members) top = std::max(top, m);
  for (size_t i = 0; i < count; i += 101) BOOST_TEST(mx[i] == value(top, i));

  send.put(mine);
  c.broadcast(send.p, count, DType::F32, c.size() - 1);
  c.wait();
  std::vector<float> b = send.get();
  for (size_t i = 0; i < count; i += 103) BOOST_TEST(b[i] == value(members.back(), i));
}

std::vector<int> all_ranks() {
  std::vector<int> v(world_size());
  for (int i = 0; i < world_size(); ++i) v[i] = i;
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(world_collectives) {
  NcclCommunicator world(MPI_COMM_WORLD, gpu().stream, 60, "world");
  check_collectives(world, all_ranks());
}

BOOST_AUTO_TEST_CASE(groups_of_each_strategy) {
  const int n = world_size(), r = world_rank();
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::NoShard, ShardingStrategy::HybridShard,
                             ShardingStrategy::HybridShardZero2}) {
    const bool hybrid = s == ShardingStrategy::HybridShard || s == ShardingStrategy::HybridShardZero2;
    const int per_node = (hybrid && n % 2 == 0) ? n / 2 : n;
    Topology topo = make_topology(MPI_COMM_WORLD, per_node);
    ProcessGroups g = cuda::make_nccl_process_groups(MPI_COMM_WORLD, topo, s, gpu().stream, 60);
    std::vector<int> shard, replicate;
    for (int q = 0; q < n; ++q) {
      const bool same_node = q / per_node == r / per_node, same_local = q % per_node == r % per_node;
      if (s == ShardingStrategy::FullShard) {
        shard.push_back(q);
        if (q == r) replicate.push_back(q);
      } else if (s == ShardingStrategy::NoShard) {
        replicate.push_back(q);
        if (q == r) shard.push_back(q);
      } else {
        if (same_node) shard.push_back(q);
        if (same_local) replicate.push_back(q);
      }
    }
    BOOST_TEST_CONTEXT(strategy_name(s)) {
      check_collectives(dynamic_cast<NcclCommunicator&>(*g.shard), shard);
      check_collectives(dynamic_cast<NcclCommunicator&>(*g.replicate), replicate);
    }
  }
}

// connect(): the group's connections made before its first collective. It leaves the stream idle and the
// group's collectives right, twice over (a second connect changes nothing), on a fresh split and on the world;
// the first all-reduce's host time after it is logged (NCCL connects lazily: without connect() that call waits
// for the connection to be set up with the peers; 0.13 s in the first step of a run on two H200).
BOOST_AUTO_TEST_CASE(connect_before_the_first_collective) {
  NcclCommunicator world(MPI_COMM_WORLD, gpu().stream, 60, "world");
  std::unique_ptr<NcclCommunicator> split = world.split(0, world_rank(), "split", gpu().stream);
  for (NcclCommunicator* c : {split.get(), &world}) {
    c->connect();
    c->connect();
    BOOST_TEST(cudaStreamQuery(gpu().stream) == cudaSuccess);
    DeviceFloats x(16);
    x.put(std::vector<float>(16, 1.0f));
    const auto t0 = std::chrono::steady_clock::now();
    c->all_reduce(x.p, 16, DType::F32, ReduceOp::Sum);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    c->wait();
    BOOST_TEST_MESSAGE("first all-reduce after connect(): " << ms << " ms on the host");
    for (float v : x.get()) BOOST_TEST(v == static_cast<float>(world_size()));
    check_collectives(*c, all_ranks());
  }
}

// dist.gather_copy_engine: a group split with the zero-CTA policy hands out symmetric windows (NCCL 2.28+),
// zeroed, and all-gathers between them, in place (this rank's piece inside the receive window, as the
// engine's cast-at-gather does) and out of place, give MPI's values; the windows are released with their
// memory. Without the policy, or with one rank, the group hands out none.
BOOST_AUTO_TEST_CASE(copy_engine_gathers_between_windows) {
  const int n = world_size(), r = world_rank();
  NcclCommunicator world(MPI_COMM_WORLD, gpu().stream, 60, "world");
  auto plain = world.split(0, r, "plain");
  BOOST_TEST(!plain->allocate_window(4096));
  auto ce = world.split(0, r, "copy engine", nullptr, true);
  const bool offered = n > 1 && cuda::copy_engine_gathers_available();
  const size_t count = 1 << 20;  // 4 MiB a rank: large enough for the copy engines to be NCCL's choice
  {
    std::unique_ptr<DeviceMemory> send = ce->allocate_window(count * sizeof(float));
    std::unique_ptr<DeviceMemory> recv = ce->allocate_window(n * count * sizeof(float));
    BOOST_TEST_REQUIRE((send != nullptr) == offered);
    if (!offered) return;
    BOOST_TEST(ce->windows() == 2);
    std::vector<float> host(n * count, 1.0f);
    SHARDLM_CUDA_CHECK(cudaMemcpy(host.data(), recv->data(), host.size() * 4, cudaMemcpyDeviceToHost));
    BOOST_TEST(std::count(host.begin(), host.end(), 0.0f) == static_cast<long>(host.size()));  // zeroed

    std::vector<float> mine(count), want(n * count);
    for (size_t i = 0; i < count; ++i) mine[i] = value(r, i);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) want[q * count + i] = value(q, i);
    // Out of place.
    SHARDLM_CUDA_CHECK(cudaMemcpy(send->data(), mine.data(), count * 4, cudaMemcpyHostToDevice));
    ce->all_gather(send->data(), recv->data(), count, DType::F32);
    ce->wait();
    SHARDLM_CUDA_CHECK(cudaMemcpy(host.data(), recv->data(), host.size() * 4, cudaMemcpyDeviceToHost));
    BOOST_TEST(host == want);
    // In place, the pieces of the last gather overwritten first.
    SHARDLM_CUDA_CHECK(cudaMemset(recv->data(), 0, n * count * 4));
    float* piece = static_cast<float*>(recv->data()) + r * count;
    SHARDLM_CUDA_CHECK(cudaMemcpy(piece, mine.data(), count * 4, cudaMemcpyHostToDevice));
    ce->all_gather(piece, recv->data(), count, DType::F32);
    ce->wait();
    SHARDLM_CUDA_CHECK(cudaMemcpy(host.data(), recv->data(), host.size() * 4, cudaMemcpyDeviceToHost));
    BOOST_TEST(host == want);
  }
  BOOST_TEST(ce->windows() == 0);
}

// dist.symmetric_reductions: a group split with windows hands out symmetric windows, and a reduce-scatter in
// place in one (NCCL's symmetric kernels) gives MPI's sums.
BOOST_AUTO_TEST_CASE(reduce_scatter_in_a_window) {
  const int n = world_size(), r = world_rank();
  NcclCommunicator world(MPI_COMM_WORLD, gpu().stream, 60, "world");
  auto shard = world.split(0, r, "symmetric", nullptr, false, true);
  const size_t count = (1 << 20) + 7;
  std::unique_ptr<DeviceMemory> full = shard->allocate_window(n * count * sizeof(float));
  BOOST_TEST_REQUIRE((full != nullptr) == (n > 1 && cuda::copy_engine_gathers_available()));
  if (!full) return;
  std::vector<float> mine(n * count), want(count, 0.0f), got(count);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = value(r, i);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i) want[i] += value(q, r * count + i);
  SHARDLM_CUDA_CHECK(cudaMemcpy(full->data(), mine.data(), mine.size() * 4, cudaMemcpyHostToDevice));
  float* piece = static_cast<float*>(full->data()) + r * count;
  shard->reduce_scatter(full->data(), piece, count, DType::F32, ReduceOp::Sum);
  shard->wait();
  SHARDLM_CUDA_CHECK(cudaMemcpy(got.data(), piece, count * 4, cudaMemcpyDeviceToHost));
  BOOST_TEST(got == want);
}

// dist.copy_engine_reductions: on a zero-CTA group of two, all-to-alls between windows, the send at different
// offsets on the two ranks (the engine's exchange: rank 1 sends from its piece of rank 0's part, rank 0 from
// count elements before its piece of rank 1's), give MPI's values; twice back to back through one window (a
// 12 MiB piece, on the copy engines, then a short last one). A group without the policy offers no copy engines.
BOOST_AUTO_TEST_CASE(exchange_all_to_all_between_windows) {
  const int n = world_size(), r = world_rank();
  NcclCommunicator world(MPI_COMM_WORLD, gpu().stream, 60, "world");
  BOOST_TEST(!world.split(0, r, "plain", nullptr, false, true)->copy_engines());
  if (n != 2) return;  // (the exchange pairs two ranks)
  auto ce = world.split(0, r, "exchange", nullptr, true);
  BOOST_TEST_REQUIRE(ce->copy_engines() == cuda::copy_engine_gathers_available());
  if (!ce->copy_engines()) return;
  const size_t part = (3u << 20) + 64, piece = 3u << 20, other = 1 - r;
  std::unique_ptr<DeviceMemory> window = ce->allocate_window(2 * piece * sizeof(float));
  std::unique_ptr<DeviceMemory> full = ce->allocate_window(2 * part * sizeof(float));
  BOOST_TEST_REQUIRE((window && full));
  std::vector<float> mine(2 * part);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = value(r, i);
  SHARDLM_CUDA_CHECK(cudaMemcpy(full->data(), mine.data(), mine.size() * 4, cudaMemcpyHostToDevice));
  const float* theirs = static_cast<const float*>(full->data()) + other * part;
  std::vector<float> got_a(2 * piece), got_b(2 * 64);
  for (size_t off : {size_t(0), piece}) {
    const size_t count = std::min(piece, part - off);
    ce->all_to_all(r == 0 ? theirs + off - count : theirs + off, window->data(), count, DType::F32);
    std::vector<float>& got = off == 0 ? got_a : got_b;
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(got.data(), window->data(), got.size() * 4, cudaMemcpyDeviceToHost, ce->stream()));
  }
  ce->wait();
  // At other * count, the other's piece of this rank's part.
  for (size_t i = 0; i < piece; ++i) BOOST_TEST_REQUIRE(got_a[other * piece + i] == value(other, r * part + i));
  for (size_t i = 0; i < 64; ++i) BOOST_TEST_REQUIRE(got_b[other * 64 + i] == value(other, r * part + piece + i));
}

// A rank that never joins a collective: its peer's wait times out and the job ends, naming the
// group and the collective. Driven from the 1-rank run; needs 2 GPUs.
BOOST_AUTO_TEST_CASE(a_hung_peer_ends_the_job_with_a_message) {
  int count = 0;
  cudaGetDeviceCount(&count);
  if (world_size() != 1 || count < 2) {
    BOOST_TEST_MESSAGE("hung-peer case runs from the 1-rank suite on a machine with 2 or more GPUs");
    return;
  }
  const std::string log = std::string(SHARDLM_BINARY_DIR) + "/nccl_hang.log";
  const std::string cmd = clean_launcher_env() + std::string(" timeout 120 " SHARDLM_MPIEXEC " -np 2 " SHARDLM_MPIEXEC_FLAGS " ") +
                          SHARDLM_NCCL_HANG_PROGRAM + " > " + log + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOOST_TEST_INFO(out);
  BOOST_TEST(status != 0);
  BOOST_TEST(WEXITSTATUS(status) != 124);  // ended by the watchdog, not by timeout(1)
  BOOST_TEST(out.find("NCCL group world") != std::string::npos);
  BOOST_TEST(out.find("no progress for") != std::string::npos);
}

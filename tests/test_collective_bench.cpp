// Tests of the collective benchmark behind `shardlm comm-test` (under mpirun on 1, 2 and 4 ranks):
// nccl-tests' bus-bandwidth factors and size conventions, the size sweep, the data pattern against
// collectives simulated on the host, and the MPI bench on the world, intra and inter groups.
#define BOOST_TEST_MODULE test_collective_bench
#include "mpi_fixture.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "shardlm/dist.hpp"

using namespace shardlm;

BOOST_TEST_DONT_PRINT_LOG_VALUE(shardlm::Collective)

namespace {

const Collective kAll[] = {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce,
                           Collective::Broadcast};

// The elements a rank's input holds and its output holds for a per-rank piece of `piece`.
size_t input_count(Collective c, size_t piece, int ranks) {
  return c == Collective::AllGather ? piece : c == Collective::ReduceScatter ? piece * ranks : piece;
}
size_t output_count(Collective c, size_t piece, int ranks) {
  return c == Collective::AllGather ? piece * ranks : piece;
}

// Element i of a buffer of `dtype` as a float, and back (rounding to the dtype).
float get(DType t, const std::vector<uint8_t>& buf, size_t i) {
  if (t == DType::F32) return reinterpret_cast<const float*>(buf.data())[i];
  const uint16_t h = reinterpret_cast<const uint16_t*>(buf.data())[i];
  return t == DType::BF16 ? bf16_to_float(h) : fp16_to_float(h);
}
void put(DType t, std::vector<uint8_t>& buf, size_t i, float v) {
  if (t == DType::F32)
    reinterpret_cast<float*>(buf.data())[i] = v;
  else
    reinterpret_cast<uint16_t*>(buf.data())[i] = t == DType::BF16 ? float_to_bf16(v) : float_to_fp16(v);
}

// What rank `rank` must hold after the collective, computed on the host from every rank's input
// (sums in rank order, rounded to the dtype after each addition, as a ring reduces).
std::vector<uint8_t> simulate(Collective c, DType t, int ranks, int rank, int root, size_t piece) {
  const size_t word = dtype_size(t), in = input_count(c, piece, ranks), out = output_count(c, piece, ranks);
  std::vector<std::vector<uint8_t>> inputs(static_cast<size_t>(ranks), std::vector<uint8_t>(in * word));
  for (int r = 0; r < ranks; ++r) fill_collective_input(c, t, r, ranks, root, 0, inputs[r].data(), in);
  std::vector<uint8_t> result(out * word);
  for (size_t i = 0; i < out; ++i) {
    float v = 0;
    switch (c) {
      case Collective::AllGather: v = get(t, inputs[i / piece], i % piece); break;
      case Collective::Broadcast: v = get(t, inputs[root], i); break;
      case Collective::AllReduce:
      case Collective::ReduceScatter: {
        const size_t at = c == Collective::ReduceScatter ? rank * piece + i : i;
        for (int r = 0; r < ranks; ++r) v = round_to(t, v + get(t, inputs[r], at));
        break;
      }
    }
    put(t, result, i, v);
  }
  return result;
}

}  // namespace

BOOST_AUTO_TEST_CASE(bus_bandwidth_factors_are_nccl_tests) {
  // all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1.
  const double tol = 1e-15;
  BOOST_TEST(bus_bandwidth_factor(Collective::AllReduce, 1) == 0.0);
  BOOST_TEST(bus_bandwidth_factor(Collective::AllReduce, 2) == 1.0, boost::test_tools::tolerance(tol));
  BOOST_TEST(bus_bandwidth_factor(Collective::AllReduce, 4) == 1.5, boost::test_tools::tolerance(tol));
  BOOST_TEST(bus_bandwidth_factor(Collective::AllReduce, 8) == 1.75, boost::test_tools::tolerance(tol));
  BOOST_TEST(bus_bandwidth_factor(Collective::AllGather, 1) == 0.0);
  BOOST_TEST(bus_bandwidth_factor(Collective::AllGather, 4) == 0.75, boost::test_tools::tolerance(tol));
  BOOST_TEST(bus_bandwidth_factor(Collective::ReduceScatter, 2) == 0.5, boost::test_tools::tolerance(tol));
  BOOST_TEST(bus_bandwidth_factor(Collective::ReduceScatter, 3) == 2.0 / 3.0, boost::test_tools::tolerance(tol));
  for (int n : {1, 2, 5, 64}) BOOST_TEST(bus_bandwidth_factor(Collective::Broadcast, n) == 1.0);
}

BOOST_AUTO_TEST_CASE(shapes_count_as_nccl_tests) {
  struct Case {
    Collective collective;
    size_t nominal_bytes;
    int ranks;
    DType dtype;
    size_t bytes, count, piece;
  };
  const Case cases[] = {
      // all_reduce / broadcast: the whole buffer, whole elements.
      {Collective::AllReduce, 8, 4, DType::F32, 8, 2, 2},
      {Collective::Broadcast, 7, 4, DType::BF16, 6, 3, 3},
      // all_gather: the gathered output, rounded down to whole elements per rank; piece per rank.
      {Collective::AllGather, 64, 4, DType::F32, 64, 16, 4},
      {Collective::ReduceScatter, 100, 3, DType::F32, 96, 24, 8},
      // Smaller than one element per rank: nothing to run.
      {Collective::AllGather, 8, 4, DType::F32, 0, 0, 0},
      {Collective::AllReduce, 1, 1, DType::F16, 0, 0, 0},
  };
  for (const Case& c : cases) {
    const CollectiveShape s = collective_shape(c.collective, c.nominal_bytes, c.ranks, c.dtype);
    BOOST_TEST_CONTEXT(collective_name(c.collective) << " " << c.nominal_bytes << " bytes on " << c.ranks
                                                     << " ranks in " << dtype_name(c.dtype)) {
      BOOST_TEST(s.bytes == c.bytes);
      BOOST_TEST(s.count == c.count);
      BOOST_TEST(s.piece == c.piece);
    }
  }
}

BOOST_AUTO_TEST_CASE(sweep_multiplies_up_to_max) {
  const std::vector<size_t> all = sweep_sizes(8, size_t{1} << 30, 2);
  BOOST_TEST(all.size() == 28u);  // 2^3 .. 2^30
  BOOST_TEST(all.front() == 8u);
  BOOST_TEST(all.back() == size_t{1} << 30);
  BOOST_TEST(sweep_sizes(8, 100, 3) == (std::vector<size_t>{8, 24, 72}), boost::test_tools::per_element());
  BOOST_TEST(sweep_sizes(5, 5, 2) == std::vector<size_t>{5}, boost::test_tools::per_element());
  const std::vector<size_t> huge = sweep_sizes(1, std::numeric_limits<size_t>::max(), 2);  // no overflow
  BOOST_TEST(huge.size() == 64u);
  BOOST_CHECK_THROW(sweep_sizes(16, 8, 2), Error);
  BOOST_CHECK_THROW(sweep_sizes(8, 16, 1), Error);
}

BOOST_AUTO_TEST_CASE(collective_names_parse) {
  BOOST_TEST(parse_collective("all_reduce") == Collective::AllReduce);
  BOOST_TEST(parse_collective("all-gather") == Collective::AllGather);
  BOOST_TEST(parse_collective("ReduceScatter") == Collective::ReduceScatter);
  BOOST_TEST(parse_collective("broadcast") == Collective::Broadcast);
  for (Collective c : kAll) BOOST_TEST(parse_collective(collective_name(c)) == c);
  try {
    parse_collective("alltoall");
    BOOST_FAIL("alltoall parsed");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("all_gather, reduce_scatter, all_reduce or broadcast") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(median_of_odd_and_even_counts) {
  BOOST_TEST(median({5, 1, 3}) == 3.0);
  BOOST_TEST(median({4, 1, 3, 2}) == 2.5);
  BOOST_TEST(median({7}) == 7.0);
}

// The pattern's expected results are what the collectives produce, for exact and inexact sums.
BOOST_AUTO_TEST_CASE(pattern_verifies_simulated_collectives) {
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (int ranks : {1, 2, 3, 5, 30})  // 30 ranks: bf16 sums reach 465, beyond its exact integers
      for (Collective c : kAll) {
        const size_t piece = 517;  // not a multiple of the pattern's moduli
        const int root = ranks - 1;
        BOOST_TEST_CONTEXT(collective_name(c) << " " << dtype_name(t) << " on " << ranks << " ranks") {
          for (int rank : {0, ranks - 1}) {
            std::vector<uint8_t> got = simulate(c, t, ranks, rank, root, piece);
            const size_t out = output_count(c, piece, ranks), word = dtype_size(t);
            BOOST_TEST(count_collective_wrong(c, t, rank, ranks, root, piece, 0, got.data(), out) == 0u);
            // Checked in chunks at offsets, as the NCCL bench does through its staging buffer.
            size_t chunked = 0;
            for (size_t at = 0; at < out; at += 100)
              chunked += count_collective_wrong(c, t, rank, ranks, root, piece, at, got.data() + at * word,
                                                std::min<size_t>(100, out - at));
            BOOST_TEST(chunked == 0u);
            // A wrong element, a missing rank's contribution and an unwritten output are caught.
            put(t, got, out / 2, get(t, got, out / 2) + 64.0f);
            BOOST_TEST(count_collective_wrong(c, t, rank, ranks, root, piece, 0, got.data(), out) == 1u);
            std::vector<uint8_t> poison(out * word, 0xff);
            BOOST_TEST(count_collective_wrong(c, t, rank, ranks, root, piece, 0, poison.data(), out) == out);
          }
        }
      }
}

BOOST_AUTO_TEST_CASE(pattern_depends_on_rank_and_index) {
  // A reduction that dropped one rank, or an all-gather that swapped two pieces, must not pass.
  const int ranks = 4;
  const size_t piece = 64;
  std::vector<float> dropped(piece, 0.0f), input(piece);
  for (int r = 0; r < ranks - 1; ++r) {  // the last rank's contribution is missing
    fill_collective_input(Collective::AllReduce, DType::F32, r, ranks, 0, 0, input.data(), piece);
    for (size_t i = 0; i < piece; ++i) dropped[i] += input[i];
  }
  size_t last_rank_sent = 0;  // the elements where the missing rank's value was not 0
  for (size_t i = 0; i < piece; ++i) last_rank_sent += (i + ranks - 1) % (ranks + 1) != 0;
  BOOST_TEST(count_collective_wrong(Collective::AllReduce, DType::F32, 0, ranks, 0, piece, 0, dropped.data(), piece) ==
             last_rank_sent);
  std::vector<uint8_t> got = simulate(Collective::AllGather, DType::F32, ranks, 0, 0, piece);
  std::vector<uint8_t> swapped = got;
  std::copy(got.begin(), got.begin() + piece * 4, swapped.begin() + piece * 4);
  std::copy(got.begin() + piece * 4, got.begin() + 2 * piece * 4, swapped.begin());
  BOOST_TEST(count_collective_wrong(Collective::AllGather, DType::F32, 0, ranks, 0, piece, 0, swapped.data(),
                                    piece * ranks) == 2 * piece);
}

// The MPI bench on the world and on HYBRID_SHARD's intra and inter groups (emulated nodes of 2).
BOOST_AUTO_TEST_CASE(mpi_bench_runs_every_collective_correctly) {
  const int n = world_size();
  const Topology topo = make_topology(MPI_COMM_WORLD, n % 2 == 0 ? 2 : 0);
  ProcessGroups groups = make_mpi_process_groups(MPI_COMM_WORLD, topo, ShardingStrategy::HybridShard);
  for (Communicator* group : {groups.world.get(), groups.shard.get(), groups.replicate.get()}) {
    const size_t max_bytes = 4096;
    auto bench = make_mpi_collective_bench(static_cast<MpiCommunicator&>(*group), max_bytes);
    for (DType t : {DType::F32, DType::BF16})
      for (Collective c : kAll)
        for (size_t bytes : {size_t{64}, size_t{1000}, max_bytes}) {
          const CollectiveShape shape = collective_shape(c, bytes, group->size(), t);
          CollectiveBenchSettings s;
          s.dtype = t;
          s.warmup = 1;
          s.iters = 4;
          s.root = group->size() - 1;
          int progress_calls = 0;
          s.progress = [&](int done, int total) {
            ++progress_calls;
            BOOST_TEST(total == 4);
            BOOST_TEST(done == progress_calls);
          };
          const CollectiveTimes times = bench->run(c, shape, s);
          BOOST_TEST_CONTEXT(collective_name(c) << " " << dtype_name(t) << " " << bytes << " B on a group of "
                                                << group->size()) {
            BOOST_TEST(times.wrong == 0u);
            BOOST_TEST(times.iteration_us.size() == 4u);
            for (double us : times.iteration_us) BOOST_TEST(us > 0.0);
            BOOST_TEST(progress_calls == 4);
          }
        }
    const CollectiveShape too_big = collective_shape(Collective::AllReduce, 2 * max_bytes, group->size(), DType::F32);
    BOOST_CHECK_THROW(bench->run(Collective::AllReduce, too_big, CollectiveBenchSettings{}), Error);
  }
}

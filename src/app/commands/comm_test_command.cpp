// `shardlm comm-test`: all-gather, reduce-scatter, all-reduce and broadcast over a sweep of sizes
// on the world, intra-node and inter-node groups (HYBRID_SHARD's shard and replicate groups), on
// MPI (cpu) or NCCL (cuda), printed as nccl-tests' tables and written as JSON lines.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include "comm_test.hpp"
#include "commands.hpp"
#include "shardlm/dist.hpp"

#ifdef SHARDLM_HAVE_CUDA
#include "cuda_check.hpp"
#include "nccl_collective_bench.hpp"
#endif

namespace shardlm {

namespace {

// Leave this share of the free memory to the MPI/NCCL library and everything else.
constexpr double kUsableMemoryFraction = 0.9;

// One kind of group: its communicator on this rank and the MPI split that forms it.
struct GroupKind {
  std::string name;
  Communicator* comm = nullptr;
  int color = 0;  // this rank's group (its split colour in group_layout's HYBRID_SHARD layout)
  int count = 1;  // groups of this kind
};

std::string host_name() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

// Whether every group of this kind lies inside one host (shared memory), over all ranks.
bool groups_on_one_host(MPI_Comm world, int color) {
  int world_rank = 0;
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm group, host;
  MPI_Comm_split(world, color, world_rank, &group);
  MPI_Comm_split_type(group, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &host);
  int group_size = 0, host_size = 0;
  MPI_Comm_size(group, &group_size);
  MPI_Comm_size(host, &host_size);
  MPI_Comm_free(&host);
  MPI_Comm_free(&group);
  int local = group_size == host_size, all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_LAND, world);
  return all != 0;
}

const char* library_call(const std::string& backend, Collective c) {
  const bool nccl = backend == "cuda";
  switch (c) {
    case Collective::AllGather: return nccl ? "ncclAllGather" : "MPI_Allgather";
    case Collective::ReduceScatter: return nccl ? "ncclReduceScatter" : "MPI_Reduce_scatter_block";
    case Collective::AllReduce: return nccl ? "ncclAllReduce" : "MPI_Allreduce";
    case Collective::Broadcast: return nccl ? "ncclBroadcast" : "MPI_Bcast";
  }
  return "?";
}

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The library picks the algorithm per call ("auto") unless the environment forces one: NCCL_ALGO
// (and NCCL_PROTO), or Open MPI's coll_tuned dynamic rules.
std::string forced_algorithm(const std::string& backend, Collective c) {
  if (backend == "cuda") {
    const std::string algo = env_text("NCCL_ALGO"), proto = env_text("NCCL_PROTO");
    return (algo.empty() ? "auto" : algo) + (proto.empty() ? "" : "/" + proto);
  }
  const char* names[] = {"allgather", "reduce_scatter_block", "allreduce", "bcast"};
  const std::string dynamic = env_text("OMPI_MCA_coll_tuned_use_dynamic_rules");
  const std::string algo =
      env_text(("OMPI_MCA_coll_tuned_" + std::string(names[static_cast<int>(c)]) + "_algorithm").c_str());
  return (dynamic == "1" || dynamic == "true") && !algo.empty() && algo != "0" ? "tuned:" + algo : "auto";
}

std::string mpi_library_text() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, static_cast<size_t>(len));
  const size_t end = s.find_first_of(",\n");
  return end == std::string::npos ? s : s.substr(0, end);
}

// Rank 0 prints one line per rank: where it runs (and its GPU), as nccl-tests does.
void print_placement(const Topology& topo, const std::string& device) {
  char line[320];
  std::snprintf(line, sizeof line, "#  rank %4d  pid %7d  on %-20s node %3d  local rank %3d%s%s", topo.world_rank,
                static_cast<int>(getpid()), host_name().c_str(), topo.node, topo.local_rank,
                device.empty() ? "" : "  ", device.c_str());
  std::vector<char> all(topo.world_rank == 0 ? sizeof line * static_cast<size_t>(topo.world_size) : 0);
  MPI_Gather(line, sizeof line, MPI_CHAR, all.data(), sizeof line, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (topo.world_rank != 0) return;
  for (int r = 0; r < topo.world_size; ++r) std::printf("%s\n", &all[static_cast<size_t>(r) * sizeof line]);
}

// Bytes a rank needs for sizes up to `bytes`: the bench's buffers, and for MPI's reductions one
// temporary of the message size (Open MPI's reduce-scatter and all-reduce allocate about that).
size_t bytes_needed(const CommTestOptions& o, size_t bytes, int smallest_group) {
  bool reduction = false;
  for (Collective c : o.collectives) reduction |= c == Collective::AllReduce || c == Collective::ReduceScatter;
  return collective_bench_buffer_bytes(bytes, smallest_group) + (o.backend == "cpu" && reduction ? bytes : 0);
}

// The sizes to run: the sweep, without the sizes the memory of the ranks cannot hold (an error
// for an explicit --max-bytes, a note for the default).
std::vector<size_t> sizes_that_fit(const CommTestOptions& o, size_t available, int smallest_group,
                                   const std::string& where) {
  std::vector<size_t> sizes = sweep_sizes(o.min_bytes, o.max_bytes, o.step_factor);
  const double usable = kUsableMemoryFraction * static_cast<double>(available);
  unsigned long long fit = 0;
  for (size_t s : sizes)
    if (static_cast<double>(bytes_needed(o, s, smallest_group)) <= usable) fit = s;
  unsigned long long agreed = 0;
  MPI_Allreduce(&fit, &agreed, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  const size_t largest = sizes.back();
  if (agreed >= largest) return sizes;
  const std::string need = concat(format_bytes(bytes_needed(o, largest, smallest_group)), " per rank for ",
                                  format_bytes(largest), " messages, but ", where, " has ",
                                  format_bytes(available), " free");
  SHARDLM_CHECK(agreed > 0 && !o.max_bytes_given, "--max-bytes=", largest, " needs ", need,
                agreed > 0 ? concat("; lower --max-bytes to ", agreed, " or less") : std::string("; lower --max-bytes"));
  while (sizes.back() > agreed) sizes.pop_back();
  log_info(concat("# note: sizes capped at ", format_bytes(sizes.back()), ": ", need));
  return sizes;
}

// Rank 0 opens the JSON-lines file (its folder made); the others hold a closed stream.
std::ofstream open_jsonl(const CommTestOptions& o, int rank, std::string* path) {
  *path = o.output.empty() ? (std::filesystem::path(o.run_dir) / "comm_test.jsonl").string() : o.output;
  std::ofstream out;
  run_collectively(MPI_COMM_WORLD, [&] {
    if (rank != 0) return;
    const std::filesystem::path parent = std::filesystem::path(*path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    out.open(*path);
    SHARDLM_CHECK(out.good(), "cannot write the comm-test results to ", *path,
                  ec ? concat(" (", ec.message(), ")") : std::string());
  });
  return out;
}

// Rank 0 tells the user about a long size on stderr, at most every few seconds.
std::function<void(int, int)> progress_printer(int rank, const std::string& what) {
  if (rank != 0) return {};
  auto started = std::make_shared<Timer>();
  auto last = std::make_shared<double>(0.0);
  return [=](int done, int total) {
    const double now = started->seconds();
    if (now - *last < 5.0 || done == total) return;
    *last = now;
    std::fprintf(stderr, "# ... %s: %d/%d iterations, %.1f s\n", what.c_str(), done, total, now);
    std::fflush(stderr);
  };
}

// The backend's groups (HYBRID_SHARD's: shard = the ranks of one node, replicate = one rank of each
// node), how to make a bench on one, and what the header says about it.
struct CommBackend {
  ProcessGroups groups;
  std::function<std::unique_ptr<CollectiveBench>(Communicator&, size_t)> make_bench;
  std::string device, library = mpi_library_text(), memory_where = "this host's share";
  size_t available = 0;  // bytes a rank may use
};

#ifdef SHARDLM_HAVE_CUDA
using StreamHandle = cudaStream_t;
#else
using StreamHandle = void*;  // no streams without CUDA
#endif

// `s` (CUDA: the NCCL groups' stream) is created here and must outlive the groups.
CommBackend open_backend(const CommTestOptions& o, const Topology& topo, [[maybe_unused]] StreamHandle& s) {
  CommBackend b;
#ifdef SHARDLM_HAVE_CUDA
  if (o.backend == "cuda") {
    run_collectively(MPI_COMM_WORLD, [&] {
      cuda::select_device(topo);
      SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      b.device = cuda::current_device_text();
      b.available = cuda::device_free_bytes();
    });
    b.groups = cuda::make_nccl_process_groups(MPI_COMM_WORLD, topo, ShardingStrategy::HybridShard, s, o.timeout);
    b.make_bench = [](Communicator& c, size_t max) {
      return cuda::make_nccl_collective_bench(static_cast<cuda::NcclCommunicator&>(c), max);
    };
    b.library += ", " + cuda::nccl_version_text();
    b.memory_where = "the GPU";
  }
#endif
  if (o.backend == "cpu") {
    b.groups = make_mpi_process_groups(MPI_COMM_WORLD, topo, ShardingStrategy::HybridShard);
    b.make_bench = [](Communicator& c, size_t max) {
      return make_mpi_collective_bench(static_cast<MpiCommunicator&>(c), max);
    };
    b.available = host_available_bytes() / static_cast<size_t>(topo.host_ranks);  // the host's ranks share it
  }
  return b;
}

// The groups asked for; a group that is one rank or the whole world (when world runs too) is skipped,
// with why in `skipped`.
std::vector<GroupKind> groups_to_run(const CommTestOptions& o, const Topology& topo, const ProcessGroups& groups,
                                     std::vector<std::pair<std::string, std::string>>& skipped) {
  const int world_size = topo.world_size;
  std::vector<GroupKind> kinds;
  const bool world_selected = std::find(o.groups.begin(), o.groups.end(), "world") != o.groups.end();
  const GroupLayout layout = group_layout(ShardingStrategy::HybridShard, topo);
  for (const std::string& name : o.groups) {
    GroupKind k{name, groups.world.get(), 0, 1};
    if (name == "intra") k = {name, groups.shard.get(), layout.shard_color, world_size / layout.shard_size};
    if (name == "inter") k = {name, groups.replicate.get(), layout.replicate_color, world_size / layout.replicate_size};
    if (name != "world" && k.comm->size() == 1)
      skipped.emplace_back(name, concat("groups of 1 rank (", topo.num_nodes, " node(s) of ", topo.local_size,
                                        " rank(s)); --dist.ranks_per_node=K emulates nodes of K ranks"));
    else if (name != "world" && k.comm->size() == world_size && world_selected)
      skipped.emplace_back(name, "the same ranks as world");
    else
      kinds.push_back(k);
  }
  run_collectively(MPI_COMM_WORLD, [&] {
    std::string why;
    for (const auto& [name, reason] : skipped) why += concat("; ", name, ": ", reason);
    SHARDLM_CHECK(!kinds.empty(), "comm-test: nothing to measure on ", world_size, " rank(s)", why);
  });
  return kinds;
}

// The header lines (and, on rank 0, the setup and skipped records).
void print_header(const CommTestOptions& o, const Topology& topo, const CommBackend& b, const std::vector<size_t>& sizes,
                  int smallest_group, const std::vector<std::pair<std::string, std::string>>& skipped,
                  std::ofstream& jsonl) {
  log_info(concat("# shardlm ", SHARDLM_VERSION, " comm-test: ", topo.world_size, " rank(s), ", topo.num_nodes,
                  topo.emulated ? " emulated node(s)" : " node(s)", " of ", topo.local_size, " rank(s); backend ",
                  o.backend, " (", b.library, ")"));
  log_info(concat("# sizes ", sizes.front(), " to ", sizes.back(), " B by x", o.step_factor, ", dtype ",
                  dtype_name(o.dtype), ", warmup ", o.warmup, ", iters ", o.iters, ", check ",
                  o.check ? "on" : "off", "; buffers ", format_bytes(bytes_needed(o, sizes.back(), smallest_group)),
                  " per rank"));
  log_info("# time: median over the iterations of each rank, the largest over ranks; algbw = size / time;");
  log_info("# busbw = algbw x (all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1)");
  print_placement(topo, b.device);
  for (const auto& [name, why] : skipped) log_info(concat("# group ", name, " skipped: ", why));
  if (topo.world_rank != 0) return;
  jsonl << nlohmann::json{{"type", "comm_test_setup"},   {"version", SHARDLM_VERSION},
                          {"world_size", topo.world_size}, {"nodes", topo.num_nodes},
                          {"ranks_per_node", topo.local_size}, {"emulated_nodes", topo.emulated},
                          {"backend", o.backend},         {"library", b.library},
                          {"dtype", dtype_name(o.dtype)}, {"min_bytes", sizes.front()},
                          {"max_bytes", sizes.back()},    {"step_factor", o.step_factor},
                          {"iters", o.iters},             {"warmup", o.warmup},
                          {"check", o.check}}
               .dump()
        << "\n";
  for (const auto& [name, why] : skipped)
    jsonl << nlohmann::json{{"type", "comm_test_skipped"}, {"group", name}, {"reason", why}}.dump() << "\n";
}

// One collective on one group over every size: its table and records; returns the wrong values.
size_t measure_table(const CommTestOptions& o, int rank, const GroupKind& k, Collective c, bool one_host,
                     const std::vector<size_t>& sizes, CollectiveBench& bench, std::ofstream& jsonl) {
  CommTestTable t;
  t.collective = c;
  t.group = k.name;
  t.group_size = k.comm->size();
  t.group_count = k.count;
  t.backend = o.backend;
  t.call = library_call(o.backend, c);
  t.algo = forced_algorithm(o.backend, c);
  t.transport = t.group_size == 1 ? "self" : !one_host ? "net" : o.backend == "cuda" ? "p2p|shm" : "shm";
  t.dtype = o.dtype;
  if (rank == 0) print_table_start(t);
  std::vector<CommTestRow> rows;
  size_t wrong_total = 0;
  for (size_t nominal : sizes) {
    const CollectiveShape shape = collective_shape(c, nominal, t.group_size, o.dtype);
    if (shape.piece == 0) continue;  // smaller than one element per rank
    CollectiveBenchSettings s;
    s.dtype = o.dtype;
    s.warmup = o.warmup;
    s.iters = o.iters;
    s.check = o.check;
    s.root = t.root;
    s.progress = progress_printer(rank, concat(collective_name(c), " on ", k.name, ", ", shape.bytes, " B"));
    const CollectiveTimes times = bench.run(c, shape, s);
    const double time_us = mpi_max(MPI_COMM_WORLD, median(times.iteration_us));
    const uint64_t wrong = mpi_sum(MPI_COMM_WORLD, static_cast<uint64_t>(times.wrong));
    rows.push_back(make_comm_test_row(t, shape, time_us, wrong));
    wrong_total += wrong;
    if (rank == 0) {
      print_table_row(t, rows.back());
      jsonl << row_json(t, rows.back(), o.iters, o.warmup).dump() << "\n" << std::flush;
    }
  }
  if (rank == 0) {
    print_table_end(t, rows);
    jsonl << table_summary_json(t, rows).dump() << "\n" << std::flush;
  }
  return wrong_total;
}

}  // namespace

int command_comm_test(const std::vector<std::string>& args) {
  int rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  CommTestOptions o;
  run_collectively(MPI_COMM_WORLD, [&] {
    o = parse_comm_test_options(args);
#ifndef SHARDLM_HAVE_CUDA
    SHARDLM_CHECK(o.backend != "cuda", "--backend=cuda: this shardlm was built without the CUDA backend "
                                       "(configure with -DSHARDLM_CUDA=ON on a machine with CUDA and NCCL)");
#endif
  });
  if (o.help) {
    if (rank == 0) std::fputs(command_help("comm-test").c_str(), stdout);
    return 0;
  }
  Topology topo;
  run_collectively(MPI_COMM_WORLD, [&] { topo = make_topology(MPI_COMM_WORLD, o.ranks_per_node); });

  // The NCCL groups' stream; declared first so that it outlives them.
  StreamHandle stream = nullptr;
#ifdef SHARDLM_HAVE_CUDA
  struct StreamGuard {
    cudaStream_t& s;
    ~StreamGuard() {
      if (s) cudaStreamDestroy(s);
    }
  } stream_guard{stream};
#endif
  const CommBackend b = open_backend(o, topo, stream);
  std::vector<std::pair<std::string, std::string>> skipped;
  const std::vector<GroupKind> kinds = groups_to_run(o, topo, b.groups, skipped);
  int smallest_group = world_size;
  for (const GroupKind& k : kinds) smallest_group = std::min(smallest_group, k.comm->size());

  std::vector<size_t> sizes;
  run_collectively(MPI_COMM_WORLD, [&] {
    sizes = sizes_that_fit(o, b.available, smallest_group, b.memory_where);
    const size_t word = dtype_size(o.dtype);
    SHARDLM_CHECK(o.backend != "cpu" || sizes.back() / word <= static_cast<size_t>(INT32_MAX), "--max-bytes=",
                  sizes.back(), " is ", sizes.back() / word, " elements, over MPI's int count limit; lower it");
  });
  std::string jsonl_path;
  std::ofstream jsonl = open_jsonl(o, rank, &jsonl_path);
  print_header(o, topo, b, sizes, smallest_group, skipped, jsonl);

  size_t total_wrong = 0;
  for (const GroupKind& k : kinds) {
    std::unique_ptr<CollectiveBench> bench;
    run_collectively(MPI_COMM_WORLD, [&] { bench = b.make_bench(*k.comm, sizes.back()); });
    const bool one_host = groups_on_one_host(MPI_COMM_WORLD, k.color);
    for (Collective c : o.collectives) total_wrong += measure_table(o, rank, k, c, one_host, sizes, *bench, jsonl);
  }
  log_info(concat("#\n# Wrong values         : ", total_wrong, total_wrong ? " FAILED" : " OK"));
  log_info(concat("# results: ", jsonl_path));
  run_collectively(MPI_COMM_WORLD, [&] {
    SHARDLM_CHECK(total_wrong == 0, "comm-test: ", total_wrong, " wrong values in the collectives' results");
  });
  return 0;
}

}  // namespace shardlm

// bench_checkpoint: write bandwidth of save_checkpoint against a plain sequential write.
//
//   mpirun -np N build/bin/bench_checkpoint [--hidden H] [--layers L] [--vocab V] [--heads A]
//                                           [--reps R] [--dir DIR] [--json]
//                                           [--collective-buffering] [--piece-mib P]
//
// Builds a BLOOM-shaped set of FSDP units, gives each rank its FULL_SHARD slice of every unit
// (ceil(numel / world) elements, clipped) with fp32 master and both AdamW moments, and times R
// repetitions of
//   (a) save_checkpoint(DIR, keep_last 1) by all ranks (collective parallel HDF5), and
//   (b) rank 0 alone writing the same number of bytes to one file (8 MiB write()s, fsync, close)
//       while the others wait at a barrier;
// the files are deleted after each. Both include the fsync, so both measure the disk, not the page
// cache. Rank 0 prints a table per repetition and the medians; --json adds one JSON object.
// --collective-buffering and --piece-mib set the writer's CheckpointWriteOptions.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "shardlm/dist.hpp"
#include "shardlm/io.hpp"
#include "shardlm/model.hpp"

namespace fs = std::filesystem;
using namespace shardlm;

namespace {

struct Options {
  ModelConfig model;
  int reps = 5;
  std::string dir = "/tmp/shardlm_bench_checkpoint";
  bool json = false;
  CheckpointWriteOptions write;
};

const char* kUsage =
    "usage: mpirun -np N bench_checkpoint [--hidden H] [--layers L] [--vocab V] [--heads A]\n"
    "                                     [--reps R] [--dir DIR] [--json]\n"
    "                                     [--collective-buffering] [--piece-mib P]\n";

Options parse(int argc, char** argv) {
  Options o;
  o.model.hidden_size = 768;
  o.model.num_layers = 4;
  o.model.vocab_size = 8192;
  o.model.num_heads = 12;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      SHARDLM_CHECK(i + 1 < argc, a, " needs a value\n", kUsage);
      return argv[++i];
    };
    auto positive = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      SHARDLM_CHECK(end && *end == '\0' && n > 0, a, " = '", v, "': expected a positive integer");
      return static_cast<int>(n);
    };
    if (a == "--hidden") o.model.hidden_size = positive();
    else if (a == "--layers") o.model.num_layers = positive();
    else if (a == "--vocab") o.model.vocab_size = positive();
    else if (a == "--heads") o.model.num_heads = positive();
    else if (a == "--reps") o.reps = positive();
    else if (a == "--dir") o.dir = value();
    else if (a == "--json") o.json = true;
    else if (a == "--collective-buffering") o.write.collective_buffering = true;
    else if (a == "--piece-mib") o.write.piece_bytes = static_cast<size_t>(positive()) << 20;
    else throw Error(concat("unknown argument '", a, "'\n", kUsage));
  }
  return o;
}

// One rank's FULL_SHARD slice of one unit, with its storage: param and AdamW's two moments.
struct Slice {
  std::vector<float> param, exp_avg, exp_avg_sq;
};

// Rank 0 alone: the `bytes` bytes of `data` to `path` in 8 MiB writes, fsync, close. Returns an
// error or "". The data is a payload-sized buffer in memory, as a checkpoint's slices are: writing
// one cache-hot chunk over and over would flatter the plain write.
std::string plain_write(const std::string& path, const std::vector<char>& data) {
  constexpr size_t kChunk = 8u << 20;
  const size_t bytes = data.size();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return concat("cannot create '", path, "': ", std::strerror(errno));
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::write(fd, data.data() + done, std::min(kChunk, bytes - done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return concat("write to '", path, "' failed: ", std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return concat("fsync of '", path, "' failed: ", std::strerror(errno));
  }
  if (::close(fd) != 0) return concat("close of '", path, "' failed: ", std::strerror(errno));
  return "";
}

// Rank 0's file-system steps, as error text for check_on_rank0.
std::string remove_path(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  return ec ? concat("cannot delete '", path, "': ", ec.message()) : "";
}
std::string fresh_dir(const std::string& path) {
  std::string error = remove_path(path);
  std::error_code ec;
  if (error.empty() && !fs::create_directories(path, ec)) error = concat("cannot create '", path, "': ", ec.message());
  return error;
}

double mib_per_s(size_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / (1 << 20) : 0.0; }

// Every rank fails together with rank 0's message (the plain write runs on rank 0 only).
void check_on_rank0(const std::string& error, MPI_Comm comm) {
  int len = static_cast<int>(error.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, comm);
  if (len == 0) return;
  std::vector<char> text(error.begin(), error.end());
  text.resize(static_cast<size_t>(len));
  MPI_Bcast(text.data(), len, MPI_CHAR, 0, comm);
  throw Error(std::string(text.begin(), text.end()));
}

int run(int argc, char** argv) {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const Options opt = parse(argc, argv);

  const std::vector<UnitLayout> layouts = model_layout(opt.model);
  std::vector<Slice> slices(layouts.size());
  std::vector<UnitState> units(layouts.size());
  size_t numel_total = 0;
  for (size_t u = 0; u < layouts.size(); ++u) {
    const size_t numel = layouts[u].numel;
    const size_t per_rank = (numel + world - 1) / world;
    UnitState& s = units[u];
    s.layout = &layouts[u];
    s.numel = numel;
    s.begin = std::min(per_rank * rank, numel);
    s.count = std::min(s.begin + per_rank, numel) - s.begin;
    s.primary = true;
    Slice& d = slices[u];
    d.param.resize(s.count);
    d.exp_avg.resize(s.count);
    d.exp_avg_sq.resize(s.count);
    init_unit_slice(layouts[u], static_cast<int>(u), 42, s.begin, s.begin + s.count, d.param.data());
    for (size_t i = 0; i < s.count; ++i) {
      d.exp_avg[i] = 1e-3f * d.param[i];
      d.exp_avg_sq[i] = 1e-6f * d.param[i] * d.param[i];
    }
    s.param = d.param.data();
    s.optimizer = {{"exp_avg", d.exp_avg.data()}, {"exp_avg_sq", d.exp_avg_sq.data()}};
    numel_total += numel;
  }

  CheckpointMeta meta;
  meta.step = 1;
  meta.seed = 42;
  meta.lr_schedule = "constant";
  meta.world_size = world;
  meta.shard_group_size = world;
  meta.strategy = "FULL_SHARD";
  meta.model = opt.model;
  meta.version = SHARDLM_VERSION;
  meta.deck = "# bench_checkpoint\n";

  const size_t payload = numel_total * (1 + units.front().optimizer.size()) * sizeof(float);
  const std::string ckpt_dir = (fs::path(opt.dir) / "ckpt").string();
  const std::string plain_path = (fs::path(opt.dir) / "plain.bin").string();
  check_on_rank0(rank == 0 ? fresh_dir(opt.dir) : "", comm);
  if (rank == 0) {
    std::printf("bench_checkpoint: BLOOM vocab %d, hidden %d, layers %d, heads %d: %zu parameters, %zu units\n",
                opt.model.vocab_size, opt.model.hidden_size, opt.model.num_layers, opt.model.num_heads, numel_total,
                layouts.size());
    std::printf("%d rank(s), FULL_SHARD slices; payload %.1f MiB (param + exp_avg + exp_avg_sq, fp32); dir %s\n\n",
                world, payload / 1048576.0, opt.dir.c_str());
    std::printf("%4s %12s %10s %12s %10s %12s %8s\n", "rep", "file bytes", "ckpt s", "ckpt MiB/s", "plain s",
                "plain MiB/s", "ratio");
  }

  // The checkpoint's file size, for the plain write's buffer: one untimed checkpoint also warms up
  // MPI-IO, HDF5 and the page cache, as a run's first checkpoint is preceded by training steps.
  size_t file_bytes = save_checkpoint(ckpt_dir, 1, meta, units, comm, opt.write).bytes;
  check_on_rank0(rank == 0 ? remove_path(ckpt_dir) : "", comm);
  std::vector<char> plain_data;
  if (rank == 0) {
    plain_data.resize(file_bytes);
    for (size_t i = 0; i < file_bytes; ++i) plain_data[i] = static_cast<char>(i * 131);  // every page touched
  }

  // (a) the collective checkpoint, timed by the slowest rank from the barrier to its return.
  auto time_checkpoint = [&]() {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    const CheckpointWriteStats stats = save_checkpoint(ckpt_dir, 1, meta, units, comm, opt.write);
    double mine = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    file_bytes = stats.bytes;
    check_on_rank0(rank == 0 ? remove_path(ckpt_dir) : "", comm);
    return slowest;
  };
  // (b) the same number of bytes, written sequentially by rank 0 alone.
  auto time_plain = [&]() {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    const std::string error = rank == 0 ? plain_write(plain_path, plain_data) : "";
    MPI_Barrier(comm);
    const double seconds = MPI_Wtime() - t0;
    check_on_rank0(error.empty() && rank == 0 ? remove_path(plain_path) : error, comm);
    return seconds;
  };

  std::vector<double> ckpt_s(opt.reps), plain_s(opt.reps);
  for (int r = 0; r < opt.reps; ++r) {
    // Alternating which goes first keeps page-cache reuse from favouring either.
    if (r % 2 == 0) {
      ckpt_s[r] = time_checkpoint();
      plain_s[r] = time_plain();
    } else {
      plain_s[r] = time_plain();
      ckpt_s[r] = time_checkpoint();
    }
    if (rank == 0)
      std::printf("%4d %12zu %10.3f %12.1f %10.3f %12.1f %8.2f\n", r + 1, file_bytes, ckpt_s[r],
                  mib_per_s(file_bytes, ckpt_s[r]), plain_s[r], mib_per_s(file_bytes, plain_s[r]),
                  ckpt_s[r] / plain_s[r]);
    std::fflush(stdout);
  }

  const double mc = median(ckpt_s), mp = median(plain_s);
  if (rank == 0) {
    std::printf("%4s %12zu %10.3f %12.1f %10.3f %12.1f %8.2f\n", "med", file_bytes, mc, mib_per_s(file_bytes, mc),
                mp, mib_per_s(file_bytes, mp), mc / mp);
    if (opt.json) {
      auto list = [](const std::vector<double>& v) {
        std::string s;
        for (size_t i = 0; i < v.size(); ++i) s += concat(i ? ", " : "", v[i]);
        return "[" + s + "]";
      };
      std::printf(
          "{\"world_size\": %d, \"vocab_size\": %d, \"hidden_size\": %d, \"num_layers\": %d, \"num_heads\": %d, "
          "\"collective_buffering\": %s, \"piece_bytes\": %zu, "
          "\"parameters\": %zu, \"payload_bytes\": %zu, \"file_bytes\": %zu, \"reps\": %d, "
          "\"checkpoint_seconds\": %s, \"plain_seconds\": %s, \"checkpoint_median_s\": %.6f, "
          "\"plain_median_s\": %.6f, \"checkpoint_mib_per_s\": %.2f, \"plain_mib_per_s\": %.2f, \"ratio\": %.4f}\n",
          world, opt.model.vocab_size, opt.model.hidden_size, opt.model.num_layers, opt.model.num_heads,
          opt.write.collective_buffering ? "true" : "false", opt.write.piece_bytes, numel_total,
          payload, file_bytes, opt.reps, list(ckpt_s).c_str(), list(plain_s).c_str(), mc, mp,
          mib_per_s(file_bytes, mc), mib_per_s(file_bytes, mp), mc / mp);
    }
  }
  check_on_rank0(rank == 0 ? remove_path(opt.dir) : "", comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    // Argument errors and agreed checkpoint errors reach every rank alike: rank 0 reports.
    if (rank == 0) std::fprintf(stderr, "bench_checkpoint: error: %s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}

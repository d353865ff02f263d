// bench_hf_load: time to load a Hugging Face model directory with each rank reading only its
// FULL_SHARD slices, against the world size.
//
//   mpirun -np N build/bin/bench_hf_load [--dir DIR] [--reps R] [--cold] [--json]
//
// Rank 0 first writes, unless DIR already holds it, a BLOOM-560M-shaped model directory (vocab
// 250880, hidden 1024, 24 layers, 16 heads: 559 M parameters) as config.json + one fp32
// model.safetensors (2.24 GB). Each repetition then times, from a barrier to the slowest rank,
// HfModelDir(DIR) (config.json and the header) plus read_unit_slice of the rank's slice of every
// unit. With --cold, rank 0 drops the page cache before each repetition (needs root), so the file
// comes from the disk. Prints each repetition and the median.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardlm/dist.hpp"
#include "shardlm/io.hpp"
#include "shardlm/model.hpp"

namespace fs = std::filesystem;
using namespace shardlm;

namespace {

ModelConfig bloom560m() {
  ModelConfig c;
  c.arch = "bloom";
  c.vocab_size = 250880;
  c.hidden_size = 1024;
  c.num_layers = 24;
  c.num_heads = 16;
  return c;
}

void write_model_dir(const std::string& dir, const ModelConfig& cfg) {
  fs::create_directories(dir);
  std::ofstream(fs::path(dir) / "config.json") << hf_config_json(cfg);
  std::vector<SafetensorsEntry> entries;
  size_t n = 0;
  for (const UnitLayout& u : model_layout(cfg))
    for (const TensorSpec& t : u.tensors) {
      SafetensorsEntry e{hf_tensor_name(cfg, t.name), t.shape, std::vector<float>(t.numel)};
      for (size_t i = 0; i < t.numel; ++i) e.data[i] = static_cast<float>((n + i) % 1000) * 1e-3f;
      n += t.numel;
      entries.push_back(std::move(e));
    }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), entries);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string dir = "/tmp/shardlm_bench_hf";
  int reps = 5;
  bool cold = false, json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--cold") cold = true;
    else if (a == "--json") json = true;
    else {
      if (rank == 0) std::fprintf(stderr, "usage: mpirun -np N bench_hf_load [--dir DIR] [--reps R] [--cold] [--json]\n");
      MPI_Finalize();
      return 2;
    }
  }
  const ModelConfig cfg = bloom560m();
  if (rank == 0 && !fs::exists(fs::path(dir) / "model.safetensors")) {
    std::printf("writing %s (BLOOM-560M shape, fp32)...\n", dir.c_str());
    std::fflush(stdout);
    write_model_dir(dir, cfg);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  const std::vector<UnitLayout> layout = model_layout(cfg);
  std::vector<double> seconds;
  uint64_t mine = 0, most = 0;
  for (int r = 0; r < reps; ++r) {
    if (cold && rank == 0) {
      ::sync();
      std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    HfModelDir model(dir);
    std::vector<float> slice;
    for (size_t u = 0; u < layout.size(); ++u) {
      const size_t numel = layout[u].numel;
      const size_t per = (numel + world - 1) / world;
      const size_t begin = std::min(per * rank, numel), end = std::min(begin + per, numel);
      slice.resize(end - begin);
      model.read_unit_slice(u, begin, end, slice.data());
    }
    double mine_s = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&mine_s, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    mine = model.bytes_read();
    MPI_Allreduce(&mine, &most, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    seconds.push_back(slowest);
    if (rank == 0) std::printf("rep %d: %.3f s (at most %.1f MiB read by one rank)\n", r + 1, slowest, most / 1048576.0);
  }
  if (rank == 0) {
    const double m = median(seconds);
    std::printf("%d rank(s)%s: median %.3f s over %d repetitions; %.1f MiB per rank at most, %.0f MiB/s per rank\n", world,
                cold ? " (cold cache)" : " (warm cache)", m, reps, most / 1048576.0, most / 1048576.0 / m);
    if (json)
      std::printf("{\"ranks\": %d, \"cold\": %s, \"median_s\": %.6f, \"max_rank_bytes\": %llu}\n", world,
                  cold ? "true" : "false", m, static_cast<unsigned long long>(most));
  }
  MPI_Finalize();
  return 0;
}

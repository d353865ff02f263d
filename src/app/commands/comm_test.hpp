// `shardlm comm-test`, shared by its files: the options, the tables it prints and the JSON lines
// it writes (comm_test_options.cpp, comm_test_report.cpp, comm_test_command.cpp).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardlm/dist.hpp"

namespace shardlm {

struct CommTestOptions {
  size_t min_bytes = 8;
  size_t max_bytes = size_t{1} << 30;
  bool max_bytes_given = false;  // an explicit --max-bytes that does not fit memory is an error, the default is capped
  int step_factor = 2;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  std::vector<Collective> collectives{Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce,
                                      Collective::Broadcast};
  std::vector<std::string> groups{"world", "intra", "inter"};
  DType dtype = DType::F32;
  std::string backend = "cpu";
  int ranks_per_node = 0;  // --dist.ranks_per_node: emulated nodes of K ranks, as in the deck
  double timeout = 600;    // --dist.timeout: seconds an NCCL wait may make no progress, as in the deck
  std::string run_dir = "runs/comm-test";
  std::string output;  // JSON lines; empty: RUN_DIR/comm_test.jsonl
  bool help = false;
};

// Throws Error naming the option for an unknown option or a bad value.
CommTestOptions parse_comm_test_options(const std::vector<std::string>& args);
const char* comm_test_usage();
// "8", "64K", "128M", "1G" (binary multiples; a trailing B or iB is allowed); throws Error naming `option`.
size_t parse_byte_count(const std::string& option, const std::string& text);

// One table: one collective on one kind of group (world, intra or inter).
struct CommTestTable {
  Collective collective = Collective::AllReduce;
  std::string group;      // world | intra | inter
  int group_size = 1;     // ranks in each group
  int group_count = 1;    // groups of this kind, measured at the same time
  std::string backend;    // cpu | cuda
  std::string call;       // the library call measured, e.g. MPI_Allreduce
  std::string algo;       // the algorithm forced by the environment, or auto
  std::string transport;  // shm / p2p|shm (inside one host) or net
  DType dtype = DType::F32;
  int root = 0;
};

struct CommTestRow {
  size_t bytes = 0;
  size_t count = 0;
  double time_us = 0;  // median over iterations of each rank, the largest over ranks
  double algbw = 0;    // GB/s: bytes / time
  double busbw = 0;    // GB/s: algbw * bus_bandwidth_factor
  size_t wrong = 0;    // over all ranks
};

CommTestRow make_comm_test_row(const CommTestTable& t, const CollectiveShape& shape, double time_us, size_t wrong);
// nccl-tests' layout: a title, column heads, one line per size, the average bus bandwidth.
void print_table_start(const CommTestTable& t);
void print_table_row(const CommTestTable& t, const CommTestRow& r);
void print_table_end(const CommTestTable& t, const std::vector<CommTestRow>& rows);
nlohmann::json row_json(const CommTestTable& t, const CommTestRow& r, int iters, int warmup);
nlohmann::json table_summary_json(const CommTestTable& t, const std::vector<CommTestRow>& rows);
double average_busbw(const std::vector<CommTestRow>& rows);

}  // namespace shardlm

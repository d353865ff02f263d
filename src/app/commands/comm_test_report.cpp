// What `shardlm comm-test` prints and writes: nccl-tests' table layout and one JSON line per row.
#include <cstdio>

#include "comm_test.hpp"

namespace shardlm {

namespace {

// nccl-tests' names of the element types.
const char* table_type_name(DType t) { return by_dtype(t, "float", "bfloat16", "half"); }

bool is_reduction(Collective c) { return c == Collective::AllReduce || c == Collective::ReduceScatter; }

// nccl-tests prints -1 as the root of collectives that have none.
int table_root(const CommTestTable& t) { return t.collective == Collective::Broadcast ? t.root : -1; }

size_t total_wrong(const std::vector<CommTestRow>& rows) {
  size_t wrong = 0;
  for (const CommTestRow& r : rows) wrong += r.wrong;
  return wrong;
}

// What a table's row records and its summary record both say of it.
nlohmann::json table_json(const char* type, const CommTestTable& t) {
  return {{"type", type},
          {"collective", collective_name(t.collective)},
          {"group", t.group},
          {"group_size", t.group_size},
          {"group_count", t.group_count},
          {"backend", t.backend},
          {"dtype", dtype_name(t.dtype)}};
}

}  // namespace

CommTestRow make_comm_test_row(const CommTestTable& t, const CollectiveShape& shape, double time_us, size_t wrong) {
  CommTestRow r;
  r.bytes = shape.bytes;
  r.count = shape.count;
  r.time_us = time_us;
  r.algbw = time_us > 0 ? static_cast<double>(shape.bytes) / (time_us * 1e3) : 0;  // bytes/us/1e3 = GB/s
  r.busbw = r.algbw * bus_bandwidth_factor(t.collective, t.group_size);
  r.wrong = wrong;
  return r;
}

double average_busbw(const std::vector<CommTestRow>& rows) {
  if (rows.empty()) return 0;
  double sum = 0;
  for (const CommTestRow& r : rows) sum += r.busbw;
  return sum / static_cast<double>(rows.size());
}

void print_table_start(const CommTestTable& t) {
  std::printf("#\n# %s on %s: %d group%s of %d rank%s, %s, %s\n", collective_name(t.collective), t.group.c_str(),
              t.group_count, t.group_count == 1 ? "" : "s", t.group_size, t.group_size == 1 ? "" : "s",
              dtype_name(t.dtype), t.call.c_str());
  std::printf("#\n");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s  %-8s  %s\n", "size", "count", "type", "redop", "root",
              "time", "algbw", "busbw", "#wrong", "algo", "transport");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
              "(GB/s)", "");
  std::fflush(stdout);
}

void print_table_row(const CommTestTable& t, const CommTestRow& r) {
  char time[32];
  std::snprintf(time, sizeof time, r.time_us < 1e5 ? "%.2f" : "%.0f", r.time_us);
  std::printf("  %10zu  %12zu  %8s  %6s  %6d  %9s  %7.2f  %7.2f  %6zu  %-8s  %s\n", r.bytes, r.count,
              table_type_name(t.dtype), is_reduction(t.collective) ? "sum" : "none", table_root(t), time, r.algbw,
              r.busbw, r.wrong, t.algo.c_str(), t.transport.c_str());
  std::fflush(stdout);
}

void print_table_end(const CommTestTable& t, const std::vector<CommTestRow>& rows) {
  std::printf("# Avg bus bandwidth    : %.6g GB/s (%s on %s, %zu sizes, %zu wrong)\n", average_busbw(rows),
              collective_name(t.collective), t.group.c_str(), rows.size(), total_wrong(rows));
  std::fflush(stdout);
}

nlohmann::json row_json(const CommTestTable& t, const CommTestRow& r, int iters, int warmup) {
  nlohmann::json j = table_json("comm_test", t);  // an object: its keys print sorted, however added
  j.update(nlohmann::json{{"call", t.call},
                          {"algo", t.algo},
                          {"transport", t.transport},
                          {"redop", is_reduction(t.collective) ? "sum" : "none"},
                          {"root", table_root(t)},
                          {"size_bytes", r.bytes},
                          {"count", r.count},
                          {"time_us", r.time_us},
                          {"algbw_gbps", r.algbw},
                          {"busbw_gbps", r.busbw},
                          {"bus_factor", bus_bandwidth_factor(t.collective, t.group_size)},
                          {"wrong", r.wrong},
                          {"iters", iters},
                          {"warmup", warmup}});
  return j;
}

nlohmann::json table_summary_json(const CommTestTable& t, const std::vector<CommTestRow>& rows) {
  nlohmann::json j = table_json("comm_test_summary", t);
  j.update(nlohmann::json{{"sizes", rows.size()}, {"avg_busbw_gbps", average_busbw(rows)}, {"wrong", total_wrong(rows)}});
  return j;
}

}  // namespace shardlm

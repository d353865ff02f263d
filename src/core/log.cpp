// Rank-aware logging: info lines from rank 0 on stdout, error lines from any rank on stderr.
#include <cstdio>

#include "shardlm/core.hpp"

namespace shardlm {

namespace {
int g_rank = 0;
}

void set_log_rank(int rank) { g_rank = rank; }

void log_info(const std::string& line) {
  if (g_rank != 0) return;
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void log_error(const std::string& line) {
  std::fprintf(stderr, "shardlm: rank %d: %s\n", g_rank, line.c_str());
  std::fflush(stderr);
}

}  // namespace shardlm

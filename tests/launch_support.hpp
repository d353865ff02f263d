// Running the shardlm executable under mpirun, for the suites CMake registers with
// shardlm_launches_mpi (which defines SHARDLM_MPIEXEC and SHARDLM_MPIEXEC_FLAGS).
#pragma once

#include <chrono>
#include <string>

#include "test_support.hpp"

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// `shardlm ARGS` under mpirun with np ranks, with `env` ("VAR=value ...") before mpirun, stopped
// after limit_s seconds.
inline Outcome run_shardlm(int np, const std::string& args, const std::string& env = "", int limit_s = 120) {
  const std::string cmd = env + " timeout " + std::to_string(limit_s) + " " SHARDLM_MPIEXEC " -np " + std::to_string(np) +
                          " " SHARDLM_MPIEXEC_FLAGS " " SHARDLM_BINARY_DIR "/bin/shardlm " + args + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  Outcome o;
  o.exit_code = run_shell(cmd, o.output);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

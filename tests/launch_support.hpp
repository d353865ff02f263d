// Running the shardlm executable under mpirun, for the suites CMake registers with
// shardlm_launches_mpi (which defines SHARDLM_MPIEXEC and SHARDLM_MPIEXEC_FLAGS).
#pragma once

#include <chrono>
#include <cstring>
#include <string>

#include "test_support.hpp"

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

extern char** environ;

// "env -u VAR ..." removing what the launcher set for this process (its rank, its daemon's URIs), so
// that an mpirun started from a rank starts a job of its own instead of failing at once. Settings a
// user gives the launcher stay: OMPI_ALLOW_RUN_AS_ROOT*, PMIX_PREFIX, PMIX_MCA_* and OMPI_MCA_* other
// than the launcher's own orte/ess/pmix ones (a bundled runtime's component paths live there).
inline std::string clean_launcher_env() {
  std::string prefix = "env";
  auto starts = [](const std::string& s, const char* p) { return s.rfind(p, 0) == 0; };
  for (char** e = environ; *e; ++e) {
    const std::string var(*e, std::strchr(*e, '=') ? std::strchr(*e, '=') - *e : std::strlen(*e));
    bool launcher = false;
    if (starts(var, "PMIX_"))
      launcher = var != "PMIX_PREFIX" && !starts(var, "PMIX_MCA_");
    else if (starts(var, "OMPI_MCA_"))
      launcher = starts(var, "OMPI_MCA_orte_") || starts(var, "OMPI_MCA_ess") || starts(var, "OMPI_MCA_pmix");
    else if (starts(var, "OMPI_"))
      launcher = !starts(var, "OMPI_ALLOW_RUN_AS_ROOT");
    if (launcher) prefix += " -u " + var;
  }
  return prefix;
}

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

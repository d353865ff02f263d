// `shardlm train`: read and check the deck on every rank, agree on errors, then run the loop.
#include <mpi.h>

#include <algorithm>

#include "commands.hpp"
#include "shardlm/config.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/train.hpp"

namespace shardlm {

int command_train(const std::vector<std::string>& args) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (const std::string problem = mpi_command_usage_problem("train", args); !problem.empty()) {
    log_info(usage_error("train", problem));
    return 2;
  }
  RunConfig cfg;
  std::vector<std::string> overrides(args.begin() + 1, args.end());
  // --tiny is run.smoke's short form.
  std::replace(overrides.begin(), overrides.end(), std::string("--tiny"), std::string("--run.smoke=true"));
  run_collectively(MPI_COMM_WORLD, [&] { cfg = load_run_config(args[0], overrides, world); });
  // A preempted run has written its checkpoint: exit 0 so Slurm can requeue it.
  train(cfg, MPI_COMM_WORLD);
  return 0;
}

}  // namespace shardlm

// Preemption: SIGTERM / SIGUSR1 / SIGUSR2 (what Slurm and mpirun send before a time limit) ask the run
// to stop (install_stop_signals, shardlm/train.hpp, installs the handlers).
#pragma once

#include <mpi.h>

#include "shardlm/train.hpp"

namespace shardlm {

// True on every rank when any rank has received a stop signal (collective over comm).
bool stop_requested(MPI_Comm comm);
// The request has been acted on (a checkpoint written): a later run in this process starts without it.
void clear_stop_request();

}  // namespace shardlm

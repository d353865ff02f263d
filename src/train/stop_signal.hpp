// Preemption: SIGTERM / SIGUSR1 (what Slurm sends before the time limit) ask the run to stop.
#pragma once

#include <mpi.h>

namespace shardlm {

// Installs the handlers and clears any earlier request.
void install_stop_signals();
// True on every rank when any rank has received a stop signal (collective over comm).
bool stop_requested(MPI_Comm comm);

}  // namespace shardlm

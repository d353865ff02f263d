// Stop signals: the handler only sets a flag; ranks agree on it at step boundaries.
#include "stop_signal.hpp"

#include <csignal>

namespace shardlm {

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // MPI and file calls in flight continue
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGUSR2, &action, nullptr);  // Open MPI's mpirun forwards SIGUSR1 and SIGUSR2
}

void clear_stop_request() { g_signal = 0; }

bool stop_requested(MPI_Comm comm) {
  return any_rank(comm, g_signal != 0);
}

}  // namespace shardlm

// shardlm: entry point of the SPMD executable. Every rank runs main; errors end the job with one
// message (from rank 0 when all ranks agree on it, else from the failing rank, then MPI_Abort).
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "commands/commands.hpp"
#include "shardlm/core.hpp"

namespace {

const char* kUsage =
    "usage: mpirun -np N shardlm COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  train DECK [--section.key=value ...]   fine-tune the model the input deck describes\n"
    "  inspect CHECKPOINT                     print a checkpoint's step, model, strategy and tensors\n"
    "  export CHECKPOINT DIR                  write it as a Hugging Face model (config.json, safetensors)\n"
    "  report RUN_DIR... [--csv F] [--svg D]  compare runs: Markdown table, CSV, loss and scaling plots\n"
    "  comm-test [OPTIONS]                    collective bandwidth over message sizes (comm-test --help)\n"
    "  plan DECK [--gpu-memory=SIZE ...]      per-rank memory of each strategy, what fits (plan --help)\n"
    "\n"
    "options:\n"
    "  --version   print the version\n"
    "  --help      print this text\n"
    "\n"
    "The input deck and its keys are described in docs/deck.md; checkpoints in docs/checkpoint.md;\n"
    "comm-test in docs/comm-test.md; plan in docs/plan.md.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--version" || args[0] == "version")) {
    std::printf("shardlm %s\n", SHARDLM_VERSION);
    return 0;
  }
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }

  // report only reads files: it runs without MPI, directly or under mpirun -np 1.
  if (args[0] == "report") return shardlm::command_report(std::vector<std::string>(args.begin() + 1, args.end()));
  // plan only sizes buffers: no MPI either.
  if (args[0] == "plan") return shardlm::command_plan(std::vector<std::string>(args.begin() + 1, args.end()));

  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  shardlm::set_log_rank(rank);
  const std::string command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  int code = 0;
  try {
    if (command == "train") {
      code = shardlm::command_train(rest);
    } else if (command == "inspect") {
      code = shardlm::command_inspect(rest);
    } else if (command == "export") {
      code = shardlm::command_export(rest);
    } else if (command == "comm-test") {
      code = shardlm::command_comm_test(rest);
    } else {
      if (rank == 0) std::fprintf(stderr, "shardlm: unknown command '%s'\n\n%s", command.c_str(), kUsage);
      code = 2;
    }
  } catch (const shardlm::AgreedError& e) {
    // Errors raised through run_collectively reach every rank with the same text: rank 0 prints it.
    if (rank == 0) std::fprintf(stderr, "shardlm: error: %s\n", e.what());
    code = 1;
  } catch (const std::exception& e) {
    // Anything else may be one rank's alone: report it from that rank and end the whole job.
    shardlm::log_error(e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}

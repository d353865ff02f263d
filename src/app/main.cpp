// shardlm: entry point of the SPMD executable. Every rank runs main; errors end the job with one
// message (from rank 0 when all ranks agree on it, else from the failing rank, then MPI_Abort).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "commands/commands.hpp"
#include "shardlm/train.hpp"
#include "shardlm/core.hpp"

namespace {

// `shardlm help [COMMAND]`, `shardlm --help`, `shardlm COMMAND ... --help` (or -h): true, and the
// command whose help is asked for ("" for shardlm's own).
bool help_asked(const std::vector<std::string>& args, std::string& command) {
  if (args[0] == "help" || shardlm::is_help_flag(args[0])) {
    command = args.size() > 1 && args[0] == "help" ? args[1] : "";
    return true;
  }
  command = args[0];
  return std::any_of(args.begin() + 1, args.end(), shardlm::is_help_flag);
}

// The last resort for a failed allocation: sizes from decks, configs and tokenizers are checked
// before they are allocated, so this names the command and what the host had left.
std::string out_of_memory(const std::string& command) {
  return "shardlm: error: out of host memory in '" + command + "' (an allocation failed with " +
         shardlm::format_bytes(shardlm::host_available_bytes()) + " available on this node)";
}

// A command that runs without MPI, with the same last resort.
int without_mpi(const std::string& command, int (*run)(const std::vector<std::string>&),
                const std::vector<std::string>& args) {
  try {
    return run(std::vector<std::string>(args.begin() + 1, args.end()));
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s\n", out_of_memory(command).c_str());
    return 1;
  }
}

// A wrong command line before MPI_Init: the launch's first rank prints `message` and fails; the other
// ranks leave quietly with 0, since one failing first would let mpirun kill the job before the first rank
// has printed it.
int refuse_before_mpi(const std::string& message) {
  if (!shardlm::first_rank_of_launch()) return 0;
  std::fputs(message.c_str(), stderr);
  return 2;
}

// Help needs no MPI: it is printed before MPI_Init, by the launch's first rank only.
int print_help(const std::string& command) {
  const std::string text = shardlm::command_help(command);
  if (text.empty()) return refuse_before_mpi("shardlm: unknown command '" + command + "'\n\n" + shardlm::command_help(""));
  if (shardlm::first_rank_of_launch()) std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--version" || args[0] == "version")) {
    std::printf("shardlm %s\n", SHARDLM_VERSION);
    return 0;
  }
  if (args.empty()) return refuse_before_mpi(shardlm::command_help(""));
  if (std::string command; help_asked(args, command)) return print_help(command);

  // report only reads files: it runs without MPI, directly or under mpirun -np 1.
  if (args[0] == "report") return without_mpi(args[0], shardlm::command_report, args);
  // plan only sizes buffers: no MPI either.
  if (args[0] == "plan") return without_mpi(args[0], shardlm::command_plan, args);
  // preprocess only reads the data and the tokenizer: no MPI.
  if (args[0] == "preprocess") return without_mpi(args[0], shardlm::command_preprocess, args);
  // eval scores a predictions file: no MPI.
  if (args[0] == "eval") return without_mpi(args[0], shardlm::command_eval, args);

  // deck-reference and import-accelerate only read and write files: no MPI.
  if (args[0] == "deck-reference") return without_mpi(args[0], shardlm::command_deck_reference, args);
  if (args[0] == "import-accelerate") return without_mpi(args[0], shardlm::command_import_accelerate, args);

  // A wrong command line gets the command's usage before MPI starts (no MPI warnings, one message).
  if (const std::string problem =
          shardlm::mpi_command_usage_problem(args[0], std::vector<std::string>(args.begin() + 1, args.end()));
      !problem.empty())
    return refuse_before_mpi(shardlm::usage_error(args[0], problem));
  // Before anything else of a run: a stop signal during start-up stops it at its first step.
  if (args[0] == "train") shardlm::install_stop_signals();
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
    } else if (command == "generate") {
      code = shardlm::command_generate(rest);
    } else if (command == "comm-test") {
      code = shardlm::command_comm_test(rest);
    } else {
      if (rank == 0)
        std::fprintf(stderr, "shardlm: unknown command '%s'\n\n%s", command.c_str(), shardlm::command_help("").c_str());
      code = 2;
    }
  } catch (const shardlm::AgreedError& e) {
    // Errors raised through run_collectively reach every rank with the same text: rank 0 prints it.
    if (rank == 0) std::fprintf(stderr, "shardlm: error: %s\n", e.what());
    code = 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s (rank %d)\n", out_of_memory(command).c_str(), rank);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    // Anything else may be one rank's alone (a file only rank 0 writes): report it from that rank
    // and end the whole job.
    std::fprintf(stderr, "shardlm: error: %s (rank %d)\n", e.what(), rank);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}

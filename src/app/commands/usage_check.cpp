// The usage checks of the MPI commands, made before MPI_Init: a wrong command line gets the
// command's own usage, not MPI's start-up warnings or an error from every rank.
#include <algorithm>
#include <string>
#include <vector>

#include "comm_test.hpp"
#include "commands.hpp"
#include "shardlm/core.hpp"

namespace shardlm {
namespace {

// The arguments that are not options, skipping the values of `valued` flags ("--dtype bf16").
std::vector<std::string> positional_args(const std::vector<std::string>& args, const std::vector<std::string>& valued) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) != 0) {
      positional.push_back(args[i]);
      continue;
    }
    std::string value;
    for (const std::string& flag : valued)
      if (option_value(args, i, flag, value)) break;
  }
  return positional;
}

}  // namespace

std::string usage_error(const std::string& command, const std::string& problem) {
  // An option parser's message may already name the command.
  const std::string own = command + ": ";
  const std::string what = problem.rfind(own, 0) == 0 ? problem.substr(own.size()) : problem;
  return concat("shardlm ", command, ": ", what, "\n\n", command_help(command));
}

std::string mpi_command_usage_problem(const std::string& command, const std::vector<std::string>& args) {
  if (command == "train") {
    if (args.empty()) return "no deck given: the first argument is the input deck (an .ini file)";
    if (args[0].rfind("--", 0) == 0)
      return concat("the first argument must be the deck, not the option '", args[0], "'");
    return "";
  }
  if (command == "inspect") {  // --verify before or after the checkpoint
    const size_t verify = static_cast<size_t>(std::count(args.begin(), args.end(), std::string("--verify")));
    const size_t given = args.size() - verify;
    for (const std::string& a : args)
      if (a != "--verify" && a.rfind("--", 0) == 0) return concat("unknown option '", a, "'");
    if (verify > 1) return "--verify given twice";
    if (given == 0) return "no checkpoint given";
    if (given > 1) return concat("expected one checkpoint, got ", given, " arguments");
    return "";
  }
  if (command == "export") {
    const size_t n = positional_args(args, {"--dtype", "--max-shard-size", "--model-dir"}).size();
    if (n == 0) return "no checkpoint and output folder given (CHECKPOINT DIR)";
    if (n == 1) return "no output folder given (CHECKPOINT DIR)";
    if (n > 2) return concat("expected CHECKPOINT DIR, got ", n, " arguments");
    return "";
  }
  if (command == "generate") return generate_usage_problem(args);
  if (command == "comm-test") return parse_problem([&] { parse_comm_test_options(args); });
  return "";
}

}  // namespace shardlm

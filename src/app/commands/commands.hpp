// app: the subcommands of the shardlm executable.
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shardlm/core.hpp"

namespace shardlm {

// `shardlm train DECK [--section.key=value ...]`; returns the process exit code.
int command_train(const std::vector<std::string>& args);
// `shardlm inspect CHECKPOINT`: step, model, strategy and a table of tensors with norms.
int command_inspect(const std::vector<std::string>& args);
// `shardlm comm-test [OPTIONS]`: collective bandwidth over message sizes, nccl-tests' tables.
int command_comm_test(const std::vector<std::string>& args);
// `shardlm export CHECKPOINT DIR`: Hugging Face config.json and safetensors weights.
int command_export(const std::vector<std::string>& args);
// `shardlm report RUN_DIR... [--csv FILE] [--svg DIR]`: runs side by side; serial, no MPI.
int command_report(const std::vector<std::string>& args);
// `shardlm eval --predictions FILE DATA`: SQuAD EM / F1 of a predictions file; serial, no MPI.
int command_eval(const std::vector<std::string>& args);
// `shardlm plan DECK [...]`: per-rank memory of each strategy, max micro-batch, a recommendation; serial, no MPI.
int command_plan(const std::vector<std::string>& args);
// `shardlm preprocess DECK [--out FILE] [--limit N] [--eval]`: each sample's text, token ids and loss
// mask as training sees them (JSON lines, or a terminal view marking the trained spans) and a
// summary; serial, no MPI.
int command_preprocess(const std::vector<std::string>& args);
// `shardlm generate MODEL [--prompt TEXT | --prompt-file F | --prompt-ids IDS] [--chat] ...`: a
// checkpoint or model folder continues a prompt, greedy or sampled, streamed to stdout by rank 0.
int command_generate(const std::vector<std::string>& args);
// `shardlm import-accelerate CONFIG.yaml [--training-args ARGS.json] -o DECK`: a deck from an
// Accelerate FSDP config and Hugging Face TrainingArguments; serial, no MPI.
int command_import_accelerate(const std::vector<std::string>& args);

// `shardlm deck-reference [--check] FILE`: FILE's (docs/deck.md's) key tables from the keys' declarations.
int command_deck_reference(const std::vector<std::string>& args);

// `shardlm --help` (command empty) or `shardlm COMMAND --help`: usage, flags and the docs' paths;
// empty for an unknown command.
std::string command_help(const std::string& command);
// What is wrong with the arguments of an MPI command (train, inspect, export, comm-test, generate), found
// before MPI starts so the message is the command's own and not MPI's; empty when they will do.
std::string mpi_command_usage_problem(const std::string& command, const std::vector<std::string>& args);
// What is wrong with generate's arguments; empty when they will do (mpi_command_usage_problem asks it).
std::string generate_usage_problem(const std::vector<std::string>& args);
// What `parse` (an options parser called for its checks) throws as an Error, or "" when it returns.
template <class Parse>
std::string parse_problem(Parse&& parse) {
  try {
    parse();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
// `shardlm COMMAND: problem`, a blank line and the command's usage, for stderr.
std::string usage_error(const std::string& command, const std::string& problem);
// "--help" or "-h".
bool is_help_flag(const std::string& arg);
// A command without MPI that parses its arguments first: no arguments print its help (exit 2); an
// Error from parse(args) is a usage error (exit 2); an Error from run(parsed) is printed as
// "shardlm: error: ..." (exit 1); else run's exit code.
template <class Parse, class Run>
int run_parsed_command(const char* name, const std::vector<std::string>& args, Parse parse, Run run) {
  if (args.empty()) {
    std::fputs(command_help(name).c_str(), stderr);
    return 2;
  }
  decltype(parse(args)) parsed;
  try {
    parsed = parse(args);
  } catch (const Error& e) {
    std::fputs(usage_error(name, e.what()).c_str(), stderr);
    return 2;
  }
  try {
    return run(parsed);
  } catch (const Error& e) {
    std::fprintf(stderr, "shardlm: error: %s\n", e.what());
    return 1;
  }
}
// Whether this process is rank 0 of its launch (mpirun, srun) or was started alone: the one that
// prints help, which needs no MPI.
bool first_rank_of_launch();

// args[i] as `--flag VALUE` (i moves to the value) or `--flag=VALUE`: the value into `out`, true.
// False when args[i] is something else, or the flag comes last without its value.
bool option_value(const std::vector<std::string>& args, size_t& i, const std::string& flag, std::string& out);
// args[i] as a deck key, `--section.key=value` or `--section.key value` (i moves to the value), appended to
// overrides as `--section.key=value`: true. False when args[i] is not one; the space form without a value (last, or
// before another `--` argument) is an Error naming the key. What every command that takes deck keys reads them with.
bool deck_key_argument(const std::vector<std::string>& args, size_t& i, std::vector<std::string>& overrides);
// args[i], which no flag took: a deck key (deck_key_argument) or any word without a leading `--` (the deck's parser
// names it) goes to overrides; another `--` option is an Error naming it.
void take_deck_override(const std::vector<std::string>& args, size_t& i, std::vector<std::string>& overrides);
// The argument a command that takes `DECK [options] [--section.key=value ...]` is reading (plan, preprocess).
struct DeckArgument {
  const std::vector<std::string>& args;
  size_t& i;
  const std::string& arg() const { return args[i]; }
  // option_value, but a flag that comes last without its value is an Error "FLAG needs a value".
  bool value(const std::string& flag, std::string& out);
};
// Reads such arguments: the deck first (an Error if it is missing or an option), then each argument
// offered to `option` (true: it took it, and any value after it), else take_deck_override. The deck.
std::string parse_deck_arguments(const std::vector<std::string>& args, std::vector<std::string>& overrides,
                                 const std::function<bool(DeckArgument&)>& option);
// "80GiB", "40 GB", "16000MiB", "5GB" in bytes (a unit is required); Error naming `flag` otherwise.
size_t parse_size(const std::string& flag, const std::string& text);

}  // namespace shardlm

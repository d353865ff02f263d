// The help texts: `shardlm --help` and `shardlm COMMAND --help` (usage, flags, where the docs are).
// main prints them before MPI starts, so they come from the launch's first rank only.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "comm_test.hpp"
#include "commands.hpp"

namespace shardlm {

namespace {

namespace fs = std::filesystem;

const char* kShardlmUsage =
    "usage: mpirun -np N shardlm COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  train DECK [--section.key=value ...]   fine-tune the model the input deck describes\n"
    "  inspect [--verify] CHECKPOINT          print a checkpoint's step, model, strategy and tensors\n"
    "  export CHECKPOINT DIR                  write it as a Hugging Face model (config.json, safetensors)\n"
    "  report RUN_DIR... [--csv F] [--svg D]  compare runs: Markdown table, CSV, loss and scaling plots\n"
    "  comm-test [OPTIONS]                    collective bandwidth over message sizes\n"
    "  plan DECK [--gpu-memory=SIZE ...]      per-rank memory of each strategy, what fits\n"
    "\n"
    "options:\n"
    "  --version   print the version\n"
    "  -h, --help  print this text; `shardlm COMMAND --help` prints a command's own\n";

const char* kTrainUsage =
    "usage: mpirun -np N shardlm train DECK [--section.key=value ...]\n"
    "\n"
    "Fine-tunes the model the input deck describes (BLOOM, Llama or Qwen2, from scratch or from a\n"
    "Hugging Face model directory) with fully sharded data parallelism over the ranks, and writes\n"
    "the resolved deck, metrics.jsonl and checkpoints into run.dir.\n"
    "\n"
    "  DECK                   an INI input deck, e.g. input/demo.ini (a tiny CPU demo)\n"
    "  --section.key=value    override one key of the deck (also --section.key value), e.g.\n"
    "                         --train.lr=1e-3 --fsdp.strategy=SHARD_GRAD_OP --run.dir=runs/try\n"
    "                         --checkpoint.every=50 --checkpoint.resume=auto --run.backend=cuda\n"
    "  -h, --help             print this text\n"
    "\n"
    "A bad deck or override stops every rank with one message naming the key. SIGUSR1 or SIGTERM\n"
    "writes a checkpoint at the next step and exits 0.\n";

const char* kInspectUsage =
    "usage: [mpirun -np N] shardlm inspect [--verify] CHECKPOINT\n"
    "\n"
    "Prints what a checkpoint holds: format, step and epoch, learning-rate schedule, the strategy and\n"
    "ranks that wrote it, the model, the optimizer state, and each tensor's shape, l2 norm and max |x|.\n"
    "\n"
    "  CHECKPOINT   a .h5 file, or a checkpoint folder (run.dir/checkpoints: its latest)\n"
    "  --verify     instead, read every dataset (parameters and optimizer state) and check its\n"
    "               checksum: exit 0 when intact, 1 naming each damaged dataset\n"
    "  -h, --help   print this text\n";

const char* kExportUsage =
    "usage: [mpirun -np N] shardlm export CHECKPOINT DIR\n"
    "\n"
    "Writes the checkpoint's parameters as a Hugging Face model into DIR: config.json and\n"
    "model.safetensors (above 5 GB, shards with model.safetensors.index.json). The optimizer state\n"
    "is not exported.\n"
    "\n"
    "  CHECKPOINT   a .h5 file, or a checkpoint folder (run.dir/checkpoints: its latest)\n"
    "  DIR          the output folder, created if missing\n"
    "  -h, --help   print this text\n";

const char* kReportUsage =
    "usage: shardlm report RUN_DIR... [--csv FILE] [--svg DIR]\n"
    "\n"
    "Prints a Markdown table of the runs (strategy, ranks, samples/s, speed-up, memory, losses, EM/F1)\n"
    "from each run.dir's metrics.jsonl and deck.resolved.ini. Runs without mpirun.\n"
    "\n"
    "  --csv FILE   also write the table as CSV\n"
    "  --svg DIR    also write DIR/loss.svg (train loss per step) and DIR/scaling.svg (samples/s per\n"
    "               rank count)\n"
    "  -h, --help   print this text\n";

const char* kPlanUsage =
    "usage: shardlm plan DECK [--section.key=value ...] [--gpu-memory=SIZE] [--ranks=N]\n"
    "                    [--ranks-per-node=K] [--json]\n"
    "\n"
    "Per-rank memory of each sharding strategy for the deck's model, micro-batch, max length,\n"
    "dtypes and backend (on CUDA also with CPU offload and activation checkpointing), the largest\n"
    "micro-batch that fits, and the fastest configuration that fits. Runs without mpirun; the deck's\n"
    "model config and tokenizer must exist, its data files need not.\n"
    "\n"
    "  --section.key=value   override one key of the deck, as for train\n"
    "  --gpu-memory=SIZE     memory per rank, e.g. 80GiB, 40GB, 16000MiB (default 80GiB); on the\n"
    "                        CPU backend, the host memory each rank may use\n"
    "  --ranks=N             ranks of the run (default 1)\n"
    "  --ranks-per-node=K    ranks per node, for the HYBRID_SHARD strategies (default dist.ranks_per_node,\n"
    "                        or all)\n"
    "  --json                print the plan as one JSON object\n"
    "  -h, --help            print this text\n";

// The docs: the module's SHARDLM_DOCS, else installed beside the binary (PREFIX/share/doc/shardlm),
// else the source tree's docs/ when the binary is in a build folder of it.
std::string docs_dir() {
  if (const char* env = std::getenv("SHARDLM_DOCS"); env && *env) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path bin = exe.parent_path();
    for (const fs::path& dir : {bin / ".." / "share" / "doc" / "shardlm", bin / ".." / ".." / "docs"})
      if (fs::exists(dir / "deck.md", ec)) return fs::weakly_canonical(dir, ec).string();
  }
  return "the docs/ folder of the shardlm source";
}

// The pages of each command's docs, as "page (what it covers)".
std::string docs_line(const std::string& command) {
  const auto page = [](std::string name, const char* what) { return "  " + name.append(16 - name.size(), ' ') + what + "\n"; };
  const std::string dir = docs_dir();
  std::string s = "\ndocs, in " + dir + ":\n";
  if (command == "train")
    s += page("deck.md", "every deck key, its default and range") + page("checkpoint.md", "checkpoints and resume") +
         page("huggingface.md", "starting from a Hugging Face model directory");
  else if (command == "inspect" || command == "export")
    s += page("checkpoint.md", "the checkpoint format, inspect and export") +
         page("huggingface.md", "the exported folder and transformers");
  else if (command == "report")
    s += page("report.md", "the columns and plots");
  else if (command == "plan")
    s += page("plan.md", "every column, and how the sizes are computed");
  else if (command == "comm-test")
    s += page("comm-test.md", "the columns and the JSON lines");
  else
    s += page("deck.md", "the input deck") + page("checkpoint.md", "checkpoints, inspect and export") +
         page("cluster.md", "the Lmod module and Slurm scripts") + page(fs::exists(fs::path(dir) / "README.md") ? "README.md" : "../README.md", "an overview");
  return s;
}

}  // namespace

bool is_help_flag(const std::string& arg) { return arg == "--help" || arg == "-h"; }

std::string command_help(const std::string& command) {
  const char* usage = command.empty()          ? kShardlmUsage
                      : command == "train"     ? kTrainUsage
                      : command == "inspect"   ? kInspectUsage
                      : command == "export"    ? kExportUsage
                      : command == "report"    ? kReportUsage
                      : command == "plan"      ? kPlanUsage
                      : command == "comm-test" ? comm_test_usage()
                                               : nullptr;
  return usage ? usage + docs_line(command) : std::string();
}

bool first_rank_of_launch() {
  // Open MPI, PMIx, MPICH / Intel MPI, srun: whichever launcher started this process says its rank.
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* rank = std::getenv(name); rank && *rank) return std::string(rank) == "0";
  return true;
}

}  // namespace shardlm

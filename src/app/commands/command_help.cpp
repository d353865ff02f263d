// The help texts: `shardlm --help` and `shardlm COMMAND --help` (usage, flags, where the docs are).
// main prints them before MPI starts, so they come from the launch's first rank only.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

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
    "  export CHECKPOINT DIR                  write it as a Hugging Face model (config, weights, tokenizer)\n"
    "  generate MODEL [--prompt T] [--chat]   continue a prompt or answer a chat turn, streamed\n"
    "  report RUN_DIR... [--csv F] [--svg D]  compare runs: Markdown table, CSV, loss and scaling plots\n"
    "  comm-test [OPTIONS]                    collective bandwidth over message sizes\n"
    "  plan DECK [--gpu-memory=SIZE ...]      per-rank memory of each strategy, what fits\n"
    "  preprocess DECK [--out F] [--limit N]  the samples training will see: text, tokens, loss mask\n"
    "  import-accelerate CONFIG.yaml -o DECK  a deck from an Accelerate FSDP config and TrainingArguments\n"
    "  eval --predictions FILE DATA           SQuAD exact match and F1 of a predictions file\n"
    "  deck-reference [--check] docs/deck.md  write (or check) the reference's key tables from the code\n"
    "\n"
    "options:\n"
    "  --version   print the version\n"
    "  -h, --help  print this text; `shardlm COMMAND --help` prints a command's own\n";

const char* kTrainUsage =
    "usage: mpirun -np N shardlm train DECK [--tiny] [--section.key=value ...]\n"
    "\n"
    "Fine-tunes the model the input deck describes (BLOOM, Llama, Qwen2, Qwen3, Mistral, Gemma 3 or\n"
    "Phi-3, from scratch or from a Hugging Face model directory) with fully sharded data parallelism\n"
    "over the ranks, and writes the resolved deck, metrics.jsonl and checkpoints into run.dir.\n"
    "\n"
    "  DECK                   an INI input deck, e.g. input/demo.ini (a tiny CPU demo)\n"
    "  --section.key=value    override one key of the deck (also --section.key value), e.g.\n"
    "                         --train.lr=1e-3 --fsdp.strategy=SHARD_GRAD_OP --run.dir=runs/try\n"
    "                         --checkpoint.every=50 --checkpoint.resume=auto --run.backend=cuda\n"
    "  --tiny                 a smoke run (--run.smoke=true): the deck's model family at a tiny width\n"
    "                         and 2 layers with random weights, 2 steps of its data (synthetic text\n"
    "                         where its files are missing), into RUN_DIR-smoke; e.g. --run.backend=cpu\n"
    "  -h, --help             print this text\n"
    "\n"
    "A bad deck or override stops every rank with one message naming the key. SIGUSR1, SIGUSR2 or\n"
    "SIGTERM writes a checkpoint at the next step (the first, if it comes during start-up) and exits 0.\n";

const char* kDeckReferenceUsage =
    "usage: shardlm deck-reference [--check] FILE\n"
    "\n"
    "Writes the tables of deck keys in FILE (docs/deck.md), between its marker comments, from the keys'\n"
    "declarations in src/config/keys_*.cpp: type, range, default, backend and meaning.\n"
    "\n"
    "  --check      write nothing; exit 1 when FILE's tables differ from the declarations\n";

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
    "usage: [mpirun -np N] shardlm export CHECKPOINT DIR [--dtype bf16|fp16|fp32] [--max-shard-size SIZE]\n"
    "                                    [--model-dir DIR] [--adapter | --merge] [--overwrite]\n"
    "\n"
    "Writes the checkpoint's parameters as a Hugging Face model into DIR, ready for AutoTokenizer,\n"
    "AutoModelForCausalLM and pipeline(): config.json (token ids, torch_dtype), model.safetensors (over\n"
    "SIZE, shards with model.safetensors.index.json), generation_config.json and the tokenizer's files\n"
    "(copied from the run's source folder, or written for the byte tokenizer). The optimizer state is\n"
    "not exported.\n"
    "\n"
    "  CHECKPOINT            a .h5 file, or a checkpoint folder (run.dir/checkpoints: its latest)\n"
    "  DIR                   the output folder: new or empty (a symbolic link is refused); the files\n"
    "                        are written in DIR.partial, then moved in\n"
    "  --dtype T             the weights' dtype: bf16, fp16 or fp32; default: the dtype the run trained\n"
    "                        in (its fsdp.param_dtype), as save_pretrained keeps the model's dtype\n"
    "  --max-shard-size SIZE the largest weight file, e.g. 5GB (default), 500MB, 2GiB\n"
    "  --model-dir DIR       the folder the tokenizer and generation config are copied from (default:\n"
    "                        the run's model.dir as its checkpoint records it); with --merge, the base;\n"
    "                        with --adapter, the base the adapter names (base_model_name_or_path), once\n"
    "                        checked to be the model and weights the adapters were trained on\n"
    "  --adapter             a LoRA run's checkpoint: write its adapters as a PEFT adapter folder\n"
    "                        (adapter_config.json, adapter_model.safetensors) instead\n"
    "  --merge               a LoRA run's checkpoint: write the base model (--model-dir, else the run's\n"
    "                        model.dir) with the adapters merged, W + scale B A, as full weights\n"
    "  --overwrite           DIR may hold files: each file the export writes replaces the one of its\n"
    "                        name once complete, an earlier export's other weight files (model*.safetensors,\n"
    "                        the index) are then removed, and every other file stays\n"
    "  -h, --help            print this text\n";

const char* kGenerateUsage =
    "usage: [mpirun -np N] shardlm generate MODEL [--adapter DIR] [--prompt TEXT | --prompt-file FILE |\n"
    "                                  --prompt-ids IDS] [--chat [--system TEXT]] [--max-new-tokens N]\n"
    "                                  [--temperature T [--top-k K] [--top-p P] [--seed S]]\n"
    "                                  [--eos-ids IDS] [--output FILE] [--section.key=value ...]\n"
    "\n"
    "Loads the model sharded over the ranks as training holds it and continues one prompt, printing\n"
    "the text to stdout as the tokens come (rank 0; what it loaded and the speed go to stderr). It\n"
    "stops at an end-of-sequence or end-of-turn token, or after --max-new-tokens. The decoding is the\n"
    "SQuAD evaluation's: a key/value cache, one step per token.\n"
    "\n"
    "  MODEL                 a checkpoint (.h5), a checkpoint folder (its latest), a run folder (its\n"
    "                        checkpoints' latest), or a Hugging Face model folder (config.json); a\n"
    "                        checkpoint brings its run's deck: model.dir, tokenizer, chat template, [lora]\n"
    "  --adapter DIR         a PEFT LoRA adapter folder on the model folder MODEL\n"
    "  --prompt TEXT         the prompt; else --prompt-file FILE ('-': standard input), else standard input\n"
    "                        (of a file or standard input, one final newline is dropped)\n"
    "  --prompt-ids IDS      the prompt as token ids, e.g. 1,15,27 (no tokenizer needed; a model folder\n"
    "                        without tokenizer.json takes only these, and prints the answer's ids)\n"
    "  --chat                the prompt is a user turn: rendered with the model's chat template (or\n"
    "                        data.chat_template) and its generation prompt, as apply_chat_template\n"
    "  --system TEXT         with --chat, a system turn before it\n"
    "  --max-new-tokens N    tokens generated at most (default 256)\n"
    "  --temperature T       0 (default): greedy, the most likely token; > 0: sample from softmax(logits / T)\n"
    "  --top-k K             with sampling, only the K most likely tokens (default 50, transformers'; 0: all)\n"
    "  --top-p P             with sampling, then only the most likely tokens whose probabilities reach P\n"
    "                        (default 1)\n"
    "  --seed S              the sampling seed (default 0): the same seed, the same text, on any ranks\n"
    "  --eos-ids IDS         the token ids that end the answer, instead of the tokenizer's EOS, the\n"
    "                        eos_token_id of generation_config.json (else config.json) and, with --chat,\n"
    "                        the end of turn (an id or a text)\n"
    "  --output FILE         also write {\"prompt_ids\", \"generated_ids\", \"text\", \"finish_reason\"} as JSON\n"
    "                        (its folder is checked before the model loads)\n"
    "  --section.key=value   a deck key (also --section.key value) over the checkpoint's deck (or the\n"
    "                        folder's defaults), e.g. --run.backend=cuda --fsdp.param_dtype=bf16\n"
    "                        --data.chat_template=FILE\n"
    "  -h, --help            print this text\n";

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

const char* kEvalUsage =
    "usage: shardlm eval --predictions FILE DATA\n"
    "\n"
    "Scores a SQuAD v1.1 predictions file against the SQuAD file DATA as the official evaluate-v1.1.py\n"
    "does (the same normalisation, Unicode included) and prints its JSON line, {\"exact_match\": ..,\n"
    "\"f1\": ..}, then the same in words. A question without a prediction scores 0 and counts.\n"
    "Runs without mpirun.\n"
    "\n"
    "  --predictions FILE   a JSON object of question id -> predicted answer (the official script's\n"
    "                       input; a run writes one as run.dir/predictions.json)\n"
    "  DATA                 a SQuAD v1.1 JSON file (every question needs its 'id')\n"
    "  -h, --help           print this text\n";

const char* kPlanUsage =
    "usage: shardlm plan DECK [--section.key=value ...] [--gpu-memory=SIZE] [--ranks=N]\n"
    "                    [--host-memory=SIZE] [--ranks-per-node=K] [--json]\n"
    "\n"
    "Per-rank memory of each sharding strategy for the deck's model, micro-batch, max length,\n"
    "dtypes and backend (on CUDA also with CPU offload and activation checkpointing), the largest\n"
    "micro-batch that fits, and the fastest configuration that fits. Runs without mpirun; the deck's\n"
    "model config and tokenizer must exist, its data files need not.\n"
    "\n"
    "  --section.key=value   override one key of the deck, as for train\n"
    "  --gpu-memory=SIZE     memory per rank, e.g. 80GiB, 40GB, 16000MiB (default 80GiB); on the\n"
    "                        CPU backend, the host memory each rank may use\n"
    "  --host-memory=SIZE    CUDA: host memory of a node, which host/node must fit in too (default\n"
    "                        this machine's MemTotal)\n"
    "  --ranks=N             ranks of the run (default 1)\n"
    "  --ranks-per-node=K    ranks per node, for the HYBRID_SHARD strategies (default dist.ranks_per_node,\n"
    "                        or all)\n"
    "  --json                print the plan as one JSON object\n"
    "  -h, --help            print this text\n";

const char* kPreprocessUsage =
    "usage: shardlm preprocess DECK [--section.key=value ...] [--out FILE] [--limit N] [--eval]\n"
    "\n"
    "Shows what training will see without training: each sample of data.train_file as the deck reads\n"
    "it (data.format, the tokenizer, data.max_length; for chat data the rendering by the chat template\n"
    "and the assistant turns that take the loss). Without --out it prints the first samples (3, or\n"
    "--limit) with the trained spans marked (green on a terminal, else between [[ and ]]); a summary\n"
    "line gives the samples, tokens, the share of trained tokens and the samples cut at max_length.\n"
    "Runs without mpirun.\n"
    "\n"
    "  --section.key=value   override one key of the deck, as for train\n"
    "  --out FILE            write one JSON line per sample: {\"text\", \"input_ids\", \"loss_mask\"}\n"
    "                        (loss_mask: 1 where the token takes a loss); the summary goes to stderr\n"
    "  --limit N             only the first N records\n"
    "  --eval                data.eval_file instead of data.train_file\n"
    "  -h, --help            print this text\n";

const char* kImportAccelerateUsage =
    "usage: shardlm import-accelerate CONFIG.yaml [--training-args ARGS.json] -o DECK [--section.key=value ...]\n"
    "\n"
    "Writes an input deck from an Accelerate config file (distributed_type FSDP, or MULTI_GPU / NO as\n"
    "NO_SHARD) and, optionally, Hugging Face TrainingArguments as JSON (TrainingArguments.to_json_string(),\n"
    "or the JSON file a script reads with HfArgumentParser). Every key of both files becomes a comment line\n"
    "in the deck saying where it went; what shardlm does differently or not at all is a warning, on\n"
    "stderr and in the deck. Runs without mpirun.\n"
    "\n"
    "  CONFIG.yaml            the Accelerate config (accelerate launch --config_file CONFIG.yaml)\n"
    "  --training-args FILE   TrainingArguments as a JSON object, or TRL's SFTConfig (its data keys,\n"
    "                         packing, max_length, assistant_only_loss, chat_template_path, become\n"
    "                         [data] keys); without it, Trainer's defaults\n"
    "  -o, --output DECK      the deck to write\n"
    "  --section.key=value    a deck key written as given (also --section.key value), over both files;\n"
    "                         neither file names the model or the data, so give --model.dir=PATH and\n"
    "                         --data.train_file=FILE (relative to the deck's folder), or edit the deck\n"
    "                         afterwards\n"
    "  --key-tables           print the tables of every Accelerate, TrainingArguments and SFTConfig key shardlm\n"
    "                         knows, with the deck key each sets or why none (docs/accelerate.md)\n"
    "  -h, --help             print this text\n"
    "\n"
    "An unknown key of either file or of the deck (with the nearest known one), a malformed file, or a\n"
    "value out of range (each deck key and value is checked as `shardlm train` checks it) is an error, and\n"
    "no deck is written. The files and folders a key names are looked for by `shardlm train`.\n";

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

// The docs pages each command's help names, with what each covers; a command not listed gets kOverview.
struct DocPage {
  const char* page;
  const char* what;
};
const struct {
  std::vector<std::string> commands;
  std::vector<DocPage> pages;
} kCommandDocs[] = {
    {{"train"},
     {{"deck.md", "every deck key, its default and range"},
      {"checkpoint.md", "checkpoints and resume"},
      {"huggingface.md", "starting from a Hugging Face model directory"}}},
    {{"inspect", "export"},
     {{"checkpoint.md", "the checkpoint format, inspect and export"},
      {"huggingface.md", "the exported folder and transformers"}}},
    {{"report"}, {{"report.md", "the columns and plots"}}},
    {{"generate"},
     {{"generate.md", "the models it loads, prompts, chat, sampling and stopping"}, {"data.md", "chat templates"}}},
    {{"eval"}, {{"deck.md", "eval.generate and the scores a run writes (section [eval])"}}},
    {{"plan"}, {{"plan.md", "every column, and how the sizes are computed"}}},
    {{"preprocess"}, {{"data.md", "the data formats, chat templates and which tokens take the loss"}}},
    {{"import-accelerate"},
     {{"accelerate.md", "every Accelerate and TrainingArguments key, what it becomes"}, {"deck.md", "every deck key"}}},
    {{"comm-test"}, {{"comm-test.md", "the columns and the JSON lines"}}},
};
const DocPage kOverview[] = {{"deck.md", "the input deck"},
                             {"checkpoint.md", "checkpoints, inspect and export"},
                             {"cluster.md", "the Lmod module and Slurm scripts"},
                             {"README.md", "an overview"}};  // beside the docs when installed, else ../README.md

// The pages of each command's docs, as "page (what it covers)".
std::string docs_line(const std::string& command) {
  const std::string dir = docs_dir();
  std::string s = "\ndocs, in " + dir + ":\n";
  const auto add = [&](std::string name, const char* what) {
    s += "  " + name.append(16 - name.size(), ' ') + what + "\n";
  };
  for (const auto& entry : kCommandDocs)
    for (const std::string& c : entry.commands)
      if (c == command) {
        for (const DocPage& p : entry.pages) add(p.page, p.what);
        return s;
      }
  for (const DocPage& p : kOverview) {
    const bool readme_above = std::string(p.page) == "README.md" && !fs::exists(fs::path(dir) / "README.md");
    add(readme_above ? "../README.md" : p.page, p.what);
  }
  return s;
}

}  // namespace

bool is_help_flag(const std::string& arg) { return arg == "--help" || arg == "-h"; }

std::string command_help(const std::string& command) {
  const char* usage = command.empty()          ? kShardlmUsage
                      : command == "train"     ? kTrainUsage
                      : command == "inspect"   ? kInspectUsage
                      : command == "export"    ? kExportUsage
                      : command == "generate"  ? kGenerateUsage
                      : command == "report"    ? kReportUsage
                      : command == "plan"      ? kPlanUsage
                      : command == "preprocess" ? kPreprocessUsage
                      : command == "import-accelerate" ? kImportAccelerateUsage
                      : command == "eval"      ? kEvalUsage
                      : command == "deck-reference" ? kDeckReferenceUsage
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

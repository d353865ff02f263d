// app: `shardlm import-accelerate`: an Accelerate FSDP config (YAML) and Hugging Face
// TrainingArguments (JSON) turned into an input deck, each key's origin said in a comment.
#pragma once

#include <string>
#include <vector>

namespace shardlm {

// How a key of Accelerate's config or of TrainingArguments reaches the deck.
enum class ForeignKeyUse {
  Mapped,    // sets deck keys (a warning where shardlm does it differently)
  NoEffect,  // configures PyTorch's or Python's machinery only; what it asks for is what shardlm does
  NotDone,   // shardlm has no counterpart: a warning when the value is not the default
};

// One key shardlm knows. `source`: "accelerate" (the YAML's top level), "fsdp_config" (the YAML's
// fsdp_config block, also TrainingArguments' fsdp_config without the fsdp_ prefix), "training_args" or
// "sft_config" (TRL's SFTConfig: TrainingArguments plus its own keys, read from the same file; a file
// naming one of them is an SFTConfig, whose defaults for learning_rate, logging_steps,
// gradient_checkpointing and bf16 then apply). `default_json`: the value Accelerate, Trainer or TRL
// uses when the key is absent, as JSON. `deck`: the deck keys it sets (Mapped), else why it has no
// counterpart.
struct ForeignKey {
  const char* source;
  const char* name;
  const char* default_json;
  ForeignKeyUse use;
  const char* deck;
};

// Every key of Accelerate's config file (FSDP and the launch keys), of TrainingArguments
// (transformers 4.x and 5.x, deprecated names included) and of TRL's SFTConfig.
const std::vector<ForeignKey>& foreign_keys();
const ForeignKey* find_foreign_key(const std::string& source, const std::string& name);

// The Markdown tables of docs/accelerate.md: one per source, every key with its deck key or why not.
std::string foreign_key_tables();

struct AccelerateImport {
  std::string deck;                   // the deck's text
  std::vector<std::string> warnings;  // "FILE: KEY: what shardlm does differently or not at all"
  int ranks = 1;                      // num_processes: the deck's batch is written for this many ranks
};

// The deck from the Accelerate config `yaml_text` (named `yaml_name` in comments and errors), the
// TrainingArguments `args_json` (empty: none, Trainer's defaults; named `args_name`), and deck keys
// given as "--section.key=value" (model.dir and data.train_file: neither file says them), which are
// written as given. `command_line` goes into the deck's header. Throws Error naming the file and key
// for a malformed file, an unknown key (with the nearest known one) or a value out of range.
AccelerateImport import_accelerate(const std::string& yaml_text, const std::string& yaml_name,
                                   const std::string& args_json, const std::string& args_name,
                                   const std::vector<std::string>& deck_keys, const std::string& command_line);

}  // namespace shardlm

// The model `shardlm generate` talks to: a checkpoint (a file, a checkpoint folder or a run folder),
// or a Hugging Face model folder with an optional PEFT adapter, in an FsdpEngine over the world with
// its weights loaded.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/fsdp.hpp"

namespace shardlm {

struct GenerationModel {
  RunConfig cfg;                       // the checkpoint's deck, or one naming the folder, with the overrides
  std::string checkpoint;              // the checkpoint file read; empty for a model folder
  std::string description;             // what was loaded, in words, for the log
  std::unique_ptr<FsdpEngine> engine;  // micro-batches of one sequence
  // A model folder without tokenizer.json and no data.tokenizer given: token ids in and out. The deck's
  // tokenizer is then the byte tokenizer only because a deck needs one: nothing is encoded or decoded with it.
  bool ids_only = false;
};

// What `path` is: "checkpoint" (a .h5 file, a folder with a `latest` file, or a run folder whose
// checkpoints/ has one: the checkpoint file is returned in *checkpoint) or "model" (a folder with a
// config.json). Error for anything else, naming `path`.
std::string generation_source_kind(const std::string& path, std::string* checkpoint);

// Loads the model at `path` (and `adapter`, a PEFT adapter folder, for a model folder only) with the
// deck overrides ("--section.key=value": the backend, dtypes, the tokenizer, the chat template).
// The deck is the checkpoint's resolved deck (the run's model.dir, tokenizer and [lora]) or one with
// model.dir = path; its data files are not read. `text_prompt`: the prompt is text, which a model folder
// without a tokenizer refuses before its weights are read (ids_only otherwise). Collective; errors end every
// rank with one message.
GenerationModel load_generation_model(const std::string& path, const std::string& adapter,
                                      const std::vector<std::string>& overrides, bool text_prompt, MPI_Comm comm);

}  // namespace shardlm

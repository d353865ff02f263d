// The trainer's side of checkpoints: what a rank owns, the run's metadata, logging the write.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "metrics.hpp"
#include "shardlm/config.hpp"
#include "shardlm/fsdp.hpp"
#include "shardlm/io.hpp"
#include "shardlm/optim.hpp"

namespace shardlm {

// Position of the run for the metadata: `epoch_step` steps done in `epoch`; tokenizer_hash is the
// run's (TrainRun::tokenizer_hash).
CheckpointMeta make_meta(const RunConfig& cfg, const std::string& tokenizer_hash, long step, int epoch,
                         long epoch_step, long total_steps, long optimizer_steps, int world_size,
                         int shard_group_size, double loss_scale);

// Writes a checkpoint and logs its size and write bandwidth; keep_name (DIR/best's file) survives pruning.
CheckpointWriteStats write_checkpoint(const RunConfig& cfg, const CheckpointMeta& meta,
                                      const std::vector<UnitState>& units, MPI_Comm comm, bool echo,
                                      const std::string& keep_name = "");
// The metrics record of a written checkpoint.
nlohmann::json checkpoint_record(long step, const CheckpointWriteStats& stats);

struct PretrainedLoad {
  uint64_t bytes_total = 0;     // bytes of weight data read, all ranks together
  uint64_t bytes_max_rank = 0;  // the most one rank read
  double seconds_mine = 0;
  double seconds = 0;           // slowest rank, from opening the directory to the last slice
};

// Fills the param views of `units` (this rank's slices) from the Hugging Face model directory
// `dir`, reading only the bytes of those slices, and zeroes every optimizer vector. Collective.
PretrainedLoad load_pretrained(const std::string& dir, const std::vector<UnitState>& units, MPI_Comm comm);
// LoRA: the frozen base weights of the engine from the model directory `dir` (frozen_state of `seed`,
// then frozen_loaded). Collective.
PretrainedLoad load_frozen_base(FsdpEngine& engine, const std::string& dir, uint64_t seed, MPI_Comm comm);
// LoRA: the checksum of the frozen base the engine holds, 16 hex digits, the same for any world and
// strategy (a checkpoint keeps it: CheckpointMeta::base_checksum). Collective.
std::string frozen_base_checksum(const FsdpEngine& engine, MPI_Comm comm);
// The adapters of the PEFT adapter folder `dir`, read for the model `model`, into this rank's slices of
// the engine's trainable units (then checkpoint_loaded). Collective: every rank reads the small file.
void load_peft_adapter_slices(FsdpEngine& engine, const std::string& dir, const ModelConfig& model, MPI_Comm comm);

}  // namespace shardlm

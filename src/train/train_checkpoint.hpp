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

// Position of the run for the metadata: `epoch_step` steps done in `epoch`.
CheckpointMeta make_meta(const RunConfig& cfg, long step, int epoch, long epoch_step, long total_steps,
                         long optimizer_steps, int world_size, int shard_group_size, double loss_scale);

// Writes a checkpoint, logs its size and write bandwidth, records it in the metrics.
CheckpointWriteStats write_checkpoint(const RunConfig& cfg, const CheckpointMeta& meta,
                                      const std::vector<UnitState>& units, MPI_Comm comm, bool echo,
                                      MetricsWriter& metrics);

}  // namespace shardlm

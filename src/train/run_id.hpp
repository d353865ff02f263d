// A run's identity: RUN_DIR/run_id, made when a fresh run starts and kept by its resumes. Every
// checkpoint keeps it (CheckpointMeta::run_id), so that resume = auto tells this run's checkpoints
// from another run's left in the same checkpoint.dir.
#pragma once

#include <mpi.h>

#include <string>

namespace shardlm {

std::string run_id_path(const std::string& run_dir);  // RUN_DIR/run_id
// "20261127-221510-3f9a0c12d4e5b678": the UTC time it was made and 64 random bits.
std::string new_run_id();
// The id RUN_DIR/run_id holds, "" when there is none (a run folder made before ids were kept);
// Error naming the file when it cannot be read or holds no id.
std::string read_run_id(const std::string& run_dir);
void write_run_id(const std::string& run_dir, const std::string& id);

}  // namespace shardlm

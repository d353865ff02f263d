// The run's FSDP engine: the backend of run.backend, its process groups, the model of model.arch
// and AdamW, put together from the deck (the engine itself is src/fsdp's FsdpEngine).
#pragma once

#include <functional>
#include <memory>

#include "shardlm/config.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/fsdp.hpp"

namespace shardlm {

// The engine of a run on `topo` for micro-batches of `micro` sequences. Collective over `comm`;
// on the CUDA backend it selects this rank's GPU first. Error when this build lacks the backend.
// `adjust` (tests) changes the engine's options that no deck key sets (FsdpOptions::share_head_scratch).
std::unique_ptr<FsdpEngine> make_engine(const RunConfig& cfg, MPI_Comm comm, const Topology& topo, int micro,
                                        const std::function<void(FsdpOptions&)>& adjust = nullptr);
// The same, after the GPU check (check_gpu_for_run), with every rank ending with the message of a rank
// that cannot build its engine (no GPU, no CUDA in this build, not enough memory).
std::unique_ptr<FsdpEngine> make_engine_collectively(const RunConfig& cfg, MPI_Comm comm, const Topology& topo,
                                                     int micro);

// What `shardlm plan` would plan for this run (the engine checks its allocation against it).
MemoryPlanSpec memory_plan_spec(const RunConfig& cfg, const Topology& topo, int micro);

}  // namespace shardlm

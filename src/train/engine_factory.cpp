// Building the run's FsdpEngine from the deck: backend, process groups, model, optimizer options,
// and the start-up check that the engine allocated what `shardlm plan` predicts.
#include "engine.hpp"

#include "shardlm/device.hpp"
#include "shardlm/model.hpp"
#ifdef SHARDLM_HAVE_CUDA
#include "nccl_communicator.hpp"
#endif

namespace shardlm {
namespace {

AdamWOptions adamw_options(const RunConfig& cfg) {
  return {cfg.train.adam_beta1, cfg.train.adam_beta2, cfg.train.adam_eps, cfg.train.weight_decay};
}

// `shardlm plan` predicts the engine's buffers from memory_plan.cpp: say so when the two disagree.
void check_memory_plan(const RunConfig& cfg, const Topology& topo, int micro, size_t allocated) {
  const size_t planned = plan_rank_memory(memory_plan_spec(cfg, topo, micro)).device_total();
  if (planned != allocated)
    log_info(concat("warning: the ", backend_name(cfg.run.backend), " engine allocated ", allocated,
                    " bytes where `shardlm plan` predicts ", planned, " (src/fsdp/memory_plan.cpp is out of date)"));
}


}  // namespace

MemoryPlanSpec memory_plan_spec(const RunConfig& cfg, const Topology& topo, int micro) {
  MemoryPlanSpec spec;
  spec.model = cfg.model;
  spec.backend = cfg.run.backend;
  spec.fsdp = fsdp_options(cfg.fsdp);
  spec.activation_checkpointing = cfg.fsdp.activation_checkpointing;
  spec.world_size = topo.world_size;
  spec.ranks_per_node = topo.local_size;
  spec.micro_batch = micro;
  spec.max_seq = cfg.data.max_length;
  return spec;
}

std::unique_ptr<FsdpEngine> make_engine(const RunConfig& cfg, MPI_Comm comm, const Topology& topo, int micro) {
  const size_t max_tokens = static_cast<size_t>(micro) * cfg.data.max_length;
  std::unique_ptr<Backend> backend, host_backend;
  ProcessGroups groups;
  BackendKind kind = BackendKind::Cpu;
  if (cfg.run.backend == BackendKind::Cuda) {
#ifdef SHARDLM_HAVE_CUDA
    kind = BackendKind::Cuda;
    cuda::select_device(topo);
    backend = make_cuda_backend();
    groups = cuda::make_nccl_process_groups(comm, topo, cfg.fsdp.strategy,
                                            static_cast<cudaStream_t>(backend->comm_stream()), cfg.dist.timeout);
    // Offloaded, AdamW runs on the host's cores, shared by the ranks on it.
    if (cfg.fsdp.cpu_offload) host_backend = make_cpu_backend(cpu_default_threads(topo.host_ranks));
#else
    throw Error("run.backend = cuda: this shardlm was built without CUDA (configure with -DSHARDLM_CUDA=ON)");
#endif
  } else {
    backend = make_cpu_backend(1);
    groups = make_mpi_process_groups(comm, topo, cfg.fsdp.strategy);
  }
  const size_t before = backend->allocated_bytes();
  const DType compute = backend->compute_dtype(cfg.fsdp.param_dtype);
  std::unique_ptr<UnitModel> model = make_unit_model(cfg.model, kind, compute, micro, cfg.data.max_length,
                                                     cfg.fsdp.activation_checkpointing);
  Backend& be = *backend;
  auto engine = std::make_unique<FsdpEngine>(std::move(backend), std::move(groups), std::move(model),
                                             fsdp_options(cfg.fsdp), adamw_options(cfg), cfg.train.seed, max_tokens,
                                             std::move(host_backend));
  check_memory_plan(cfg, topo, micro, be.allocated_bytes() - before);
  return engine;
}

}  // namespace shardlm

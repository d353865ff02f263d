// Building the run's FsdpEngine from the deck: backend, process groups, model, optimizer options,
// and the start-up check that the engine allocated what `shardlm plan` predicts.
#include "engine.hpp"

#include <algorithm>

#include "gpu_guard.hpp"
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

// The engine's options from the deck, for `world` ranks. On the CPU backend the state is in host memory
// already: fsdp.cpu_offload (and offload_dir, offload_accumulate) change nothing there (docs/deck.md).
FsdpOptions engine_fsdp_options(const RunConfig& cfg, int world) {
  FsdpOptions o = fsdp_options(cfg.fsdp);
  o.optimizer = cfg.train.optim;
  o.accumulation = std::max(1, cfg.grad_accum(world));  // what fsdp.no_sync = auto weighs
  o.copy_engine_reductions = cfg.dist.copy_engine_reductions && cfg.run.backend == BackendKind::Cuda;
  if (cfg.run.backend == BackendKind::Cpu) {
    o.cpu_offload = false;  // and with it offload_dir, offload_accumulate and offload_resident_gib
    o.offload_root_update = OffloadRootUpdate::Host;
  }
  return o;
}

// `shardlm plan` predicts the engine's buffers from memory_plan.cpp: say so when the two disagree.
void check_memory_plan(const RunConfig& cfg, const Topology& topo, int micro, const FsdpEngine& engine, size_t allocated) {
  MemoryPlanSpec spec = memory_plan_spec(cfg, topo, micro);
  spec.fsdp.offload_root_update = engine.options().offload_root_update;  // auto as the engine decided it
  spec.fsdp.share_head_scratch = engine.options().share_head_scratch;    // (tests may turn it off)
  spec.fsdp.table_in_head_grad = engine.options().table_in_head_grad;    // (tests may turn it off)
  spec.fsdp.rows_packed = engine.options().rows_packed;                  // (tests may turn it off)
  spec.fsdp.root_in_grad_slices = engine.options().root_in_grad_slices;  // (tests may turn it on)
  spec.fsdp.copy_engine_reductions = engine.options().copy_engine_reductions;  // where NCCL offered it
  spec.fsdp.exchange_window_bytes = engine.options().exchange_window_bytes;    // (tests may set less)
  const size_t planned = plan_rank_memory(spec).device_total();
  if (planned != allocated)
    log_info(concat("warning: the ", backend_name(cfg.run.backend), " engine allocated ", allocated,
                    " bytes where `shardlm plan` predicts ", planned, " (src/fsdp/memory_plan.cpp is out of date)"));
}


// Before anything of the run is allocated: the plan's bytes per rank against what this rank's GPU
// (or its share of the host) has free, agreed over every rank so that all of them stop together.
// `ranks_on_gpu`: the ranks sharing this rank's GPU (SHARDLM_SHARE_GPUS), each given its part of what is free.
void check_memory_fits(const RunConfig& cfg, const Topology& topo, int micro, const Backend& be, MPI_Comm comm,
                       int ranks_on_gpu) {
  const size_t planned = plan_rank_memory(memory_plan_spec(cfg, topo, micro)).device_total();
  const bool cuda = be.kind() == BackendKind::Cuda;
  size_t available = be.available_bytes();
  if (!cuda) available /= static_cast<size_t>(std::max(topo.host_ranks, 1));  // ranks share a host's memory
  else available /= static_cast<size_t>(std::max(ranks_on_gpu, 1));
  const bool short_here = available > 0 && planned > available;
  const double least_free = mpi_min(comm, static_cast<double>(available));
  if (any_rank(comm, short_here))
    throw AgreedError(concat("the run needs ", format_bytes(planned), " of ", cuda ? "GPU" : "host",
                             " memory per rank (`shardlm plan` with this deck shows where) but a rank has ",
                             format_bytes(static_cast<size_t>(least_free)), " free: lower train.micro_batch_size or ",
                             "data.max_length, shard over more ranks, or turn on fsdp.activation_checkpointing",
                             cuda ? " or fsdp.cpu_offload" : ""));
}

}  // namespace

MemoryPlanSpec memory_plan_spec(const RunConfig& cfg, const Topology& topo, int micro) {
  MemoryPlanSpec spec;
  spec.model = cfg.model;
  spec.backend = cfg.run.backend;
  spec.fsdp = engine_fsdp_options(cfg, topo.world_size);
  spec.activation_checkpointing = cfg.fsdp.activation_checkpointing;
  spec.world_size = topo.world_size;
  spec.ranks_per_node = topo.local_size;
  spec.micro_batch = micro;
  spec.max_seq = cfg.data.max_length;
  return spec;
}

std::unique_ptr<FsdpEngine> make_engine(const RunConfig& cfg, MPI_Comm comm, const Topology& topo, int micro,
                                        const std::function<void(FsdpOptions&)>& adjust) {
  const size_t max_tokens = static_cast<size_t>(micro) * cfg.data.max_length;
  std::unique_ptr<Backend> backend, host_backend;
  ProcessGroups groups;
  BackendKind kind = BackendKind::Cpu;
  int ranks_on_gpu = 1;
  if (cfg.run.backend == BackendKind::Cuda) {
#ifdef SHARDLM_HAVE_CUDA
    kind = BackendKind::Cuda;
    ranks_on_gpu = cuda::select_device(topo).ranks_on_device;
    // Offloaded, the host's cores run AdamW: threads waiting for the GPU sleep rather than spin on one.
    backend = make_cuda_backend(cfg.fsdp.cpu_offload);
    // The second communicators are for the engine's own schedule; CPU offload keeps everything on one stream.
    const bool overlap = cfg.dist.replicate_stream && !cfg.fsdp.cpu_offload;
    const bool gathers = cfg.dist.gather_stream && !cfg.fsdp.cpu_offload;
    // The exchange's communicator only where the plan gives the blocks one (dist.copy_engine_reductions: a
    // shard group on one host, fp32 reductions, block slices small enough).
    const bool exchanges = plan_rank_memory(memory_plan_spec(cfg, topo, micro)).exchange_bytes > 0;
    groups = cuda::make_nccl_process_groups(
        comm, topo, cfg.fsdp.strategy, static_cast<cudaStream_t>(backend->comm_stream()), cfg.dist.timeout,
        overlap ? static_cast<cudaStream_t>(backend->replicate_stream()) : nullptr,
        gathers ? static_cast<cudaStream_t>(backend->gather_stream()) : nullptr, cfg.dist.gather_copy_engine,
        cfg.dist.symmetric_reductions, exchanges);
    // Offloaded, AdamW runs on the host's cores, shared by the ranks on it (its moments in
    // fsdp.offload_dir's mapped files when set).
    if (cfg.fsdp.cpu_offload)
      host_backend = make_cpu_backend(cpu_default_threads(topo.host_ranks), cfg.fsdp.offload_dir);
#else
    throw Error("run.backend = cuda: this shardlm was built without CUDA (configure with -DSHARDLM_CUDA=ON)");
#endif
  } else {
    backend = make_cpu_backend(cpu_default_threads(topo.host_ranks));
    groups = make_mpi_process_groups(comm, topo, cfg.fsdp.strategy);
  }
  check_memory_fits(cfg, topo, micro, *backend, comm, ranks_on_gpu);
  const size_t before = backend->allocated_bytes();
  const DType compute = backend->compute_dtype(cfg.fsdp.param_dtype);
  FsdpOptions fsdp = engine_fsdp_options(cfg, topo.world_size);
  if (adjust) adjust(fsdp);
  std::unique_ptr<UnitModel> model = make_unit_model(model_for_engine(cfg.model, fsdp), kind, compute, micro,
                                                     cfg.data.max_length, cfg.fsdp.activation_checkpointing);
  Backend& be = *backend;
  auto engine = std::make_unique<FsdpEngine>(std::move(backend), std::move(groups), std::move(model), fsdp,
                                             adamw_options(cfg), cfg.train.seed, max_tokens, std::move(host_backend));
  check_memory_plan(cfg, topo, micro, *engine, be.allocated_bytes() - before);
  return engine;
}

std::unique_ptr<FsdpEngine> make_engine_collectively(const RunConfig& cfg, MPI_Comm comm, const Topology& topo,
                                                     int micro) {
  std::unique_ptr<FsdpEngine> engine;
  // Before NCCL starts: a GPU this binary has no kernels for, or bf16 on a GPU without it, stops
  // every rank together with the message.
  run_collectively(comm, [&] { check_gpu_for_run(cfg, topo); });
  run_collectively(comm, [&] { engine = make_engine(cfg, comm, topo, micro); });
  return engine;
}

}  // namespace shardlm

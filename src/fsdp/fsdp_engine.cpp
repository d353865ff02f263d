// FsdpEngine, written once over the Backend interface: its construction (slices, buffers and events of
// the buffer plan), the step's entry points (zero_grad, grad_norm, optimizer_step, the trace), checkpoint
// state and memory. schedule.cpp runs a micro-batch, reductions.cpp reduces its gradients; offload.cpp
// is CPU offload's policy.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "offload.hpp"

namespace shardlm {
namespace {

// Memory another object owns (the model's head scratch), held as a DeviceArray.
class BorrowedMemory final : public DeviceMemory {
 public:
  BorrowedMemory(void* p, size_t n) { data_ = p, bytes_ = n; }
};

}  // namespace

FsdpEngine::Impl::Impl(Backend& backend, std::unique_ptr<UnitModel> m, EngineLayouts layouts, const FsdpOptions& o,
                       const FsdpBufferPlan& p, ProcessGroups& groups, size_t tokens)
    : be(backend), model(std::move(m)), opt(o), plan(p), shard(*groups.shard), replicate(*groups.replicate),
      compute(backend.compute_stream()), comm(backend.comm_stream()),
      host_memory(backend.host_memory()), L(model->config().num_layers), max_tokens(tokens),
      layout(std::move(layouts.trainable)), frozen_layout(std::move(layouts.frozen)), lora(!frozen_layout.empty()),
      tracer(backend, compute, comm) {
  // A synchronous backend gains nothing from gathering ahead.
  if (be.asynchronous()) forward_prefetch = opt.forward_prefetch, backward_prefetch = opt.backward_prefetch;
  // Offloaded, the reductions go through OffloadPolicy::reduce, on comm.
  if (groups.replicate_overlap && !opt.cpu_offload) {
    replicate_overlap = groups.replicate_overlap.get();
    rep = backend.replicate_stream();
    rep_follows = be.make_event();
    rep_done = be.make_event();
    stage_released = be.make_event();
    tracer.set_replicate_stream(rep);
  }
  exchange_group = groups.shard_exchange.get();
  gatherer = &shard;
  gs = comm;
  // Offloaded, the uploads and the gathers that read them are ordered on comm; a staged gather uses stage_full.
  if (groups.shard_gather && !opt.cpu_offload && !plan.staged_gather) {
    gatherer = groups.shard_gather.get();
    gs = backend.gather_stream();
    gather_lane = Lane::Gather;
    tracer.set_gather_stream(gs);
  }
}

FsdpEngine::Impl::~Impl() = default;

namespace {

// fsdp.offload_root_update as the engine runs it: auto measures the host link (into link[]), for a root
// slice of root_shard elements worth it (a synchronous backend has no link to measure); only AdamW updates
// the root on the device.
OffloadRootUpdate resolved_root_update(const FsdpOptions& opt, size_t root_shard, Backend& be, Backend* host,
                                       double link[2]) {
  SHARDLM_CHECK(opt.optimizer == Optim::AdamWTorch || opt.offload_root_update != OffloadRootUpdate::Device,
                "fsdp.offload_root_update = device streams AdamW's fp32 moments; train.optim = ",
                optim_name(opt.optimizer), " updates the root on the host");
  if (!opt.cpu_offload || opt.optimizer != Optim::AdamWTorch) return OffloadRootUpdate::Host;
  if (opt.offload_root_update != OffloadRootUpdate::Auto) return opt.offload_root_update;
  // Resident state needs the update there, whatever the link.
  if (opt.offload_resident_bytes() > 0 && !opt.moments_in_files()) return OffloadRootUpdate::Device;
  if (be.asynchronous() && !opt.moments_in_files() && root_shard >= kOffloadRootMinElements)
    std::tie(link[0], link[1]) = measure_host_link(be, *host);
  return std::min(link[0], link[1]) >= kOffloadRootLinkGBs ? OffloadRootUpdate::Device : OffloadRootUpdate::Host;
}

}  // namespace

FsdpEngine::FsdpEngine(std::unique_ptr<Backend> backend, ProcessGroups groups, std::unique_ptr<UnitModel> model,
                       const FsdpOptions& options, const AdamWOptions& adam, uint64_t seed, size_t max_tokens,
                       std::unique_ptr<Backend> host_backend)
    : backend_(std::move(backend)), host_backend_(std::move(host_backend)), groups_(std::move(groups)) {
  Backend& be = *backend_;
  const int shard_size = groups_.shard->size();
  FsdpOptions opt = options;
  SHARDLM_CHECK(!opt.cpu_offload || (host_backend_ && !be.host_memory()),
                "fsdp.cpu_offload needs a device backend and a host backend for the optimizer");
  SHARDLM_CHECK(opt.offload_root_update != OffloadRootUpdate::Device || !opt.moments_in_files(),
                "fsdp.offload_root_update = device streams the moments from host memory: not with fsdp.offload_dir");
  const DType cdt = be.compute_dtype(opt.param_dtype);
  SHARDLM_CHECK(model->compute_dtype() == cdt, "FsdpEngine: the model computes in ", dtype_name(model->compute_dtype()),
                ", the backend in ", dtype_name(cdt));
  EngineLayouts layouts = engine_layouts(model->config());
  double link[2] = {0, 0};
  // dist.copy_engine_reductions where NCCL offers the exchange (the shard group on one host, 2.28+).
  opt.copy_engine_reductions = opt.copy_engine_reductions && groups_.shard_exchange;
  opt.offload_root_update = resolved_root_update(opt, shard_numel_of(layouts.trainable[0].numel, shard_size), be,
                                                 host_backend_.get(), link);
  plan_ = engine_buffer_plan(layouts, model->config(), opt, shard_size, groups_.replicate->size(), be.asynchronous(),
                             cdt, max_tokens, model->head_scratch_bytes());
  impl_ = std::make_unique<Impl>(be, std::move(model), std::move(layouts), opt, plan_, groups_, max_tokens);
  Impl& m = *impl_;
  // Master and optimizer state where the optimizer runs: the host when offloaded.
  Backend& state_be = opt.cpu_offload ? *host_backend_ : be;
  const bool state_on_host = m.host_memory || opt.cpu_offload;

  const auto pin_host = [this](void* p, size_t bytes) { pin(p, bytes); };
  const std::vector<ParamSlice> slices = m.make_units(state_be, state_on_host, seed, pin_host);
  // Offloaded, the updates write the compute dtype into the upload staging (AdamW::update_slice's out).
  optimizer_ = make_optimizer(opt.optimizer, state_be, slices, adam, opt.param_dtype);

  m.allocate_buffers();
  // (No windows for the exchange: NCCL's reduce-scatters, and no exchange in the plan or the options.)
  if (!m.exchanger) {
    plan_.exchange_numel = plan_.exchange_bytes = 0;
    m.opt.copy_engine_reductions = false;
  }
  if (opt.cpu_offload)
    m.offload = std::make_unique<Impl::OffloadPolicy>(m, *host_backend_, *optimizer_, pin_host, link[0], link[1]);
  m.fresh_grads = opt.fresh_block_grads && m.model->writes_fresh_block_grads() && !opt.cpu_offload && !m.lora;
  if (m.lora) {
    // The base weights start as the model's own initialisation (a pretrained load replaces them).
    frozen_state(seed);
    frozen_loaded();
  }
  refresh_compute_slices();
  be.synchronize(m.compute);
}

std::vector<ParamSlice> FsdpEngine::Impl::make_units(Backend& state_be, bool state_on_host, uint64_t seed,
                                                    const std::function<void(void*, size_t)>& pin_host) {
  const size_t cs = csize();
  std::vector<ParamSlice> slices;
  // A device master is initialised through one host buffer, reused unit by unit (the largest unit's slice)
  // and freed after: no host copy of the whole model is kept (checkpoint_state stages one when it is needed).
  std::vector<float> init_buffer;
  // Gathered into from its start (the root), hence the gathers' memory.
  if (plan.root_in_slices) block_slices = gather_memory(plan.layers * plan.slice_stride, MemKind::Grads);
  for (size_t u = 0; u < layout.size(); ++u) {
    Unit d;
    d.flat = make_flat_parameter(layout[u], shard.rank(), shard.size());
    const size_t n = d.flat.shard_numel;
    d.master = state_be.allocate(n * sizeof(float), MemKind::Params);
    if (plan.root_in_slices && u > 0)
      d.grad = DeviceArray{std::make_unique<BorrowedMemory>(block_slices.as<char>() + (u - 1) * plan.slice_stride,
                                                            n * sizeof(float))};
    else if (plan.grad_slices)
      d.grad = be.allocate(n * sizeof(float), MemKind::Grads);
    if (plan.compute_slice) d.compute = gather_memory(n * cs);
    // Initial values are a pure function of (seed, unit, element): each rank fills only its slice.
    if (state_on_host) {
      init_unit_slice(layout[u], static_cast<int>(u), seed, d.flat.shard_begin, d.flat.shard_begin + n,
                      d.master.as<float>());
    } else {
      if (init_buffer.size() < n) init_buffer.resize(n);
      init_unit_slice(layout[u], static_cast<int>(u), seed, d.flat.shard_begin, d.flat.shard_begin + n,
                      init_buffer.data());
      be.copy(d.master.data(), init_buffer.data(), n * sizeof(float), CopyKind::HostToDevice, compute);
      be.synchronize(compute);  // the buffer is written again by the next unit
    }
    if (lora) {
      d.frozen = make_flat_parameter(frozen_layout[u], shard.rank(), shard.size());
      d.frozen_slice = gather_memory(d.frozen.shard_numel * cs);
    }
    if (opt.cpu_offload) {
      d.host_grad = state_be.allocate(n * sizeof(float), MemKind::Grads);
      // An fp32 reduction lands in it directly in the step's first micro-step (offload.cpp): page-locked.
      // So does the device's fp32 sum with offload_accumulate = device.
      if (opt.reduce_dtype == DType::F32 || opt.offload_accumulate_on_device()) pin_host(d.host_grad.data(), d.host_grad.bytes());
      // An fp32 master goes up itself: page-locked, so the copies run at DMA speed without a bounce buffer.
      if (opt.param_dtype == DType::F32) pin_host(d.master.data(), d.master.bytes());
      slices.push_back({d.master.as<float>(), d.host_grad.as<float>(), n, d.flat.no_decay, nullptr});
    } else {
      // The update also writes the compute-dtype copy of the slice that the next gather sends.
      slices.push_back({d.master.as<float>(), d.grad.as<float>(), n, d.flat.no_decay,
                        plan.compute_slice ? d.compute.data() : nullptr});
    }
    units.push_back(std::move(d));
  }
  return slices;
}

DeviceArray FsdpEngine::Impl::window_or_backend(Communicator* group, size_t bytes, MemKind kind) {
  if (group)
    if (std::unique_ptr<DeviceMemory> window = group->allocate_window(bytes)) return DeviceArray{std::move(window)};
  return be.allocate(bytes, kind);
}

DeviceArray FsdpEngine::Impl::gather_memory(size_t bytes, MemKind kind) {
  // Only where the gathers also send from window memory (a 16-bit slice or piece; not the fp32 master):
  // NCCL's copy engines need both buffers in windows.
  const bool windows = own_gather_stream() && (plan.cast_at_gather || plan.compute_slice);
  return window_or_backend(windows ? gatherer : nullptr, bytes, kind);
}

void FsdpEngine::Impl::allocate_buffers() {
  const size_t cs = csize();
  const size_t root_grad_bytes = plan.root_grad_numel() * sizeof(float);
  if (plan.root_overlap > 0) {
    // The head's gradient buffer from the allocation's start, the gathered root from root_full_offset on: the
    // table's gathered copy lies in the buffer's last root_overlap bytes (FsdpBufferPlan::root_overlap).
    root_shared = plan.root_in_slices
                      ? DeviceArray{std::make_unique<BorrowedMemory>(block_slices.data(), plan.root_shared_bytes())}
                      : gather_memory(plan.root_shared_bytes());
    char* base = static_cast<char*>(root_shared.data());
    root_full = DeviceArray{std::make_unique<BorrowedMemory>(base + plan.root_full_offset, plan.root_padded * cs)};
    root_grad_full = DeviceArray{std::make_unique<BorrowedMemory>(base, root_grad_bytes)};
    table_read = be.make_event();
  } else if (!plan.alias) {
    root_full = gather_memory(plan.root_padded * cs);
  }
  if (!plan.alias)
    for (size_t i = 0; i < plan.block_copies; ++i) block_full.push_back(gather_memory(plan.block_padded * cs));
  if (lora && !plan.frozen_alias) {
    root_frozen_full = gather_memory(plan.frozen_root_padded * cs);
    for (size_t i = 0; i < plan.frozen_block_copies; ++i)
      block_frozen_full.push_back(gather_memory(plan.frozen_block_padded * cs));
  }

  holder.assign(block_full.size(), -1);
  gathered.assign(units.size(), false);
  for (size_t i = 0; i < block_full.size(); ++i) slot_free.push_back(be.make_event());
  for (size_t i = 0; i < units.size(); ++i) unit_gathered.push_back(be.make_event());
  if (!plan.direct_grads && plan.root_overlap == 0) root_grad_full = be.allocate(root_grad_bytes, MemKind::Grads);
  const size_t grad_bytes = plan.block_padded * sizeof(float);
  // The copy-engine exchange (dist.copy_engine_reductions): its window, else NCCL's reduce-scatters (every rank
  // alike: window allocation is agreed).
  if (plan.exchange_numel > 0)
    if (std::unique_ptr<DeviceMemory> w = exchange_group->allocate_window(plan.exchange_bytes)) {
      exchange_window = DeviceArray{std::move(w)};
      exchanger = exchange_group;
    }
  // The block gradients are reduce-scattered in place: in the shard group's window memory where it has some
  // (dist.symmetric_reductions; the exchange group's with the exchange, whose all-to-alls send from them),
  // lent to the model as its head scratch when they share it.
  Communicator* grads_group = exchanger ? exchanger : &shard;
  char* scratch = nullptr;
  if (plan.grads_in_head_scratch)
    scratch = static_cast<char*>(model->lend_head_scratch(
        plan.grad_buffers * grad_bytes, [grads_group](size_t n) { return grads_group->allocate_window(n); }));
  if (scratch) {
    grads_borrowed = plan.grad_buffers * grad_bytes;
    head_shared = std::min(model->head_scratch_bytes(), grads_borrowed);
    head_done = be.make_event();
  }
  for (size_t i = 0; i < plan.grad_buffers; ++i)
    block_grad_full.push_back(scratch ? DeviceArray{std::make_unique<BorrowedMemory>(scratch + i * grad_bytes, grad_bytes)}
                                      : window_or_backend(grads_group, grad_bytes, MemKind::Grads));
  // The exchange sends from the block gradients: its window and every gradient buffer (or the lent scratch)
  // windows of its group, else NCCL's reduce-scatters (the model kept its own scratch, or a window failed).
  const int grad_windows = scratch ? 1 : static_cast<int>(plan.grad_buffers);
  if (exchanger && exchanger->windows() != 1 + grad_windows) exchanger = nullptr, exchange_window = DeviceArray{};
  // Zeroed after each reduction from here on (Impl::zero_on_comm), or written whole (fresh_grads).
  for (DeviceArray& g : block_grad_full) be.zero(g.data(), g.bytes(), compute);
  grad_buffer_empty.assign(block_grad_full.size(), 1);
  grad_fresh.assign(units.size(), 0);
  local_pending.assign(units.size(), 0);
  replicate_pending.assign(units.size(), 0);
  for (size_t i = 0; i < std::max<size_t>(plan.grad_buffers, 1); ++i) {
    grad_ready.push_back(be.make_event());
    grad_reduced.push_back(be.make_event());
    grad_reduced.back()->record(comm);
  }
  root_grad_ready = be.make_event();
  root_zeroed = be.make_event();
  tail_ready = be.make_event();
  if (const RootSplit& rs = plan.root_split; rs.on) {
    split_ids = be.allocate(rs.token_capacity * sizeof(int32_t), MemKind::Comm);
    split_ids_shard = be.allocate(rs.shard_ids * sizeof(int32_t), MemKind::Comm);
    if (replicate.size() > 1) split_ids_all = be.allocate(rs.id_capacity * sizeof(int32_t), MemKind::Comm);
    split_first = be.allocate(rs.table_rows * sizeof(int32_t), MemKind::Comm);
    be.zero(split_first.data(), split_first.bytes(), comm);
    split_packed = be.allocate(rs.packed_numel() * dtype_size(opt.reduce_dtype), MemKind::Comm);
    if (rs.rows_packed) split_slots = be.allocate(rs.token_capacity * sizeof(int32_t), MemKind::Comm);
    head_reduced = be.make_event();
  }
  params_written = be.make_event();
  reductions_done = be.make_event();
  grad_slice = be.allocate(plan.grad_slice * sizeof(float), MemKind::Comm);
  stage_full = be.allocate(plan.stage_full, MemKind::Comm);
  stage_slice = be.allocate(plan.stage_slice, MemKind::Comm);
  if (!host_memory) {
    tokens = be.allocate(max_tokens * sizeof(int32_t), MemKind::Other);
    targets = be.allocate(max_tokens * sizeof(int32_t), MemKind::Other);
    if (model->config().packed) starts = be.allocate(max_tokens * sizeof(int32_t), MemKind::Other);
    norm = be.allocate(sizeof(double), MemKind::Other);
  }
}

FsdpEngine::~FsdpEngine() {
  if (impl_) {
    // The worker's tasks use the engine's arrays: they finish (or are skipped after an error) first.
    if (impl_->offload) impl_->offload->stop_worker();
    for (Stream s : impl_->streams()) backend_->synchronize(s);
    if (impl_->offload) impl_->offload->synchronize_copies();
  }
  for (void* p : pinned_) backend_->unpin_host(p);
}

void FsdpEngine::pin(void* p, size_t bytes) {
  if (bytes == 0) return;
  backend_->pin_host(p, bytes);
  pinned_.push_back(p);
}

double FsdpEngine::forward_backward(const MicroBatch& mb, float grad_scale, uint64_t dropout_seed, LossRead read) {
  impl_->model->set_dropout(dropout_seed);
  return impl_->run(mb, grad_scale, true, read == LossRead::now);
}
double FsdpEngine::forward_loss(const MicroBatch& mb) {
  SHARDLM_CHECK(!impl_->loss_held, "forward_loss between an optimizer step's micro-steps with their loss unread");
  impl_->model->set_dropout(std::nullopt);
  return impl_->run(mb, 0.0f, false);
}

void FsdpEngine::zero_grad() {
  Impl& m = *impl_;
  m.drop_pending();
  m.loss_held = false;
  if (m.offload) return m.offload->zero_grad();
  if (m.plan.direct_grads) {  // the backward adds into the slices themselves; the blocks' first writes them (fresh)
    for (size_t u = 0; u < m.units.size(); ++u) {
      if (m.fresh_grads && u > 0) m.grad_fresh[u] = 1;
      else backend_->zero(m.units[u].grad.data(), m.units[u].grad.bytes(), m.compute);
    }
    return;
  }
  // No pass over the slices: each unit's first reduction writes its slice (Impl::add_to_grad).
  std::fill(m.grad_fresh.begin(), m.grad_fresh.end(), 1);
  m.slices_hold_grads = false;
}

double FsdpEngine::grad_norm() {
  Impl& m = *impl_;
  m.reduce_pending();
  m.finish_reductions();
  double local = 0.0;
  if (m.offload) {
    local = m.offload->sum_squares();
  } else if (m.squares_taken) {  // the last micro-step summed them as the reductions landed
    backend_->copy(&local, m.norm.data(), sizeof(double), CopyKind::DeviceToHost, m.compute);
    backend_->synchronize(m.compute);
  } else {
    m.settle_fresh_grads(m.compute);
    double* sum = m.host_memory ? &local : m.norm.as<double>();
    const int span = m.tracer.mark_begin("gradient norm", -1, Impl::Lane::Compute);
    if (!m.host_memory) backend_->zero(sum, sizeof(double), m.compute);
    for (Unit& d : m.units) backend_->sum_squares(d.grad.as<float>(), d.flat.shard_numel, sum, m.compute);
    m.tracer.mark_end(span);
    if (!m.host_memory) backend_->copy(&local, sum, sizeof(double), CopyKind::DeviceToHost, m.compute);
    backend_->synchronize(m.compute);
  }
  // Slices partition the model within a shard group; replicas hold identical slices.
  return std::sqrt(groups_.shard->host_sum(local));
}

void FsdpEngine::optimizer_step(double lr, float grad_factor) {
  Impl& m = *impl_;
  if (!optimizer_->fp32_state())
    for (Unit& d : m.units) std::vector<std::vector<float>>().swap(d.host_state);  // a checkpoint's staging
  m.reduce_pending();
  m.finish_reductions();
  if (m.offload) {
    m.offload->optimizer_step(lr, grad_factor);
    m.params_updated();
    return;
  }
  m.settle_fresh_grads(m.compute);
  // The trace tools (bench/trace_summary.py) know AdamW's span by this name.
  const char* what = m.opt.optimizer == Optim::AdamWTorch ? "optimizer (AdamW)" : "optimizer (AdamW 8-bit)";
  const int span = m.tracer.mark_begin(what, -1, Impl::Lane::Compute);
  m.update_and_gather_ahead(*optimizer_, optimizer_->begin_step(lr, grad_factor));
  m.tracer.mark_end(span);
}

void FsdpEngine::trace_begin() {
  impl_->idle();  // the step starts on idle streams, so that its spans are its own (this drains the pipeline once)
  impl_->tracer.begin();
}

StepTrace FsdpEngine::trace_end() {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.tracer.tracing(), "FsdpEngine::trace_end without trace_begin");
  // The step ends when every stream has done its part: communication, and offloaded the host's
  // updates and their uploads.
  std::vector<Stream> others = m.streams();
  others.erase(others.begin());  // (compute: the tracer's own)
  if (m.offload) {
    m.offload->drain_worker();
    const std::vector<Stream> copies = m.offload->copy_streams();
    others.insert(others.end(), copies.begin(), copies.end());
  }
  return m.tracer.end(others);
}

// The compute-dtype slices from the fp32 masters (after init, a checkpoint load).
void FsdpEngine::refresh_compute_slices() {
  Impl& m = *impl_;
  if (!plan_.compute_slice) return;
  if (m.offload) return m.offload->refresh_compute_slices();  // up through the worker's upload path
  for (Unit& d : m.units)
    backend_->cast(d.master.data(), DType::F32, d.compute.data(), plan_.compute_dtype, d.flat.shard_numel, m.compute);
}

// A quantised optimizer's state (Optimizer::state null) as fp32 vectors in host staging, made for the
// checkpoint and released at the next step or load (8 bytes an element while it lasts).
std::vector<float*> FsdpEngine::quantised_state_views(size_t u) {
  Unit& d = impl_->units[u];
  const size_t k = optimizer_->state_names().size();
  d.host_state.assign(k, std::vector<float>(d.flat.shard_numel, 0.0f));
  std::vector<float*> views;
  for (size_t i = 0; i < k; ++i) {
    optimizer_->read_state(u, i, d.host_state[i].data());
    views.push_back(d.host_state[i].data());
  }
  return views;
}

std::vector<UnitState> FsdpEngine::checkpoint_state() {
  Impl& m = *impl_;
  m.idle();  // offloaded, the worker updates and uploads the host state: the views are handed out after
  if (m.offload) m.offload->checkpoint_state();
  std::vector<UnitState> states;
  const bool primary = groups_.replicate->rank() == 0;
  const std::vector<std::string> names = optimizer_->state_names();
  for (size_t u = 0; u < m.units.size(); ++u) {
    Unit& d = m.units[u];
    float* param = d.master.as<float>();
    std::vector<float*> state;
    for (size_t k = 0; k < names.size(); ++k) state.push_back(optimizer_->state(u, k));
    if (m.state_staged()) {
      // Device memory: copied into the host staging the views point at, made at the first checkpoint (or
      // load) and kept for the next (12 bytes an element with AdamW: `plan`'s host/rank).
      if (d.host_master.empty()) d.host_master.resize(d.flat.shard_numel);
      if (optimizer_->fp32_state() && d.host_state.size() != names.size())
        d.host_state.assign(names.size(), std::vector<float>(d.flat.shard_numel));
      backend_->copy(d.host_master.data(), param, d.master.bytes(), CopyKind::DeviceToHost, m.compute);
      for (size_t k = 0; k < state.size() && state[k]; ++k)
        backend_->copy(d.host_state[k].data(), state[k], d.master.bytes(), CopyKind::DeviceToHost, m.compute);
      param = d.host_master.data();
      for (size_t k = 0; k < state.size() && state[k]; ++k) state[k] = d.host_state[k].data();
    }
    if (!optimizer_->fp32_state()) state = quantised_state_views(u);
    UnitState s = slice_state(d.flat, primary, param);
    for (size_t k = 0; k < state.size(); ++k) s.optimizer.push_back({names[k], state[k]});
    states.push_back(s);
  }
  backend_->synchronize(m.compute);
  return states;
}

void FsdpEngine::checkpoint_loaded() {
  Impl& m = *impl_;
  if (m.offload) m.offload->checkpoint_loaded();
  for (size_t u = 0; u < m.units.size(); ++u) {
    Unit& d = m.units[u];
    if (!optimizer_->fp32_state()) {
      // A quantised optimizer takes its state from the fp32 staging back (quantising again).
      for (size_t k = 0; k < d.host_state.size(); ++k) optimizer_->write_state(u, k, d.host_state[k].data());
      d.host_state.clear();
    }
    if (!m.state_staged()) continue;  // the loaded host arrays are the state
    backend_->copy(d.master.data(), d.host_master.data(), d.master.bytes(), CopyKind::HostToDevice, m.compute);
    for (size_t k = 0; k < d.host_state.size(); ++k)
      backend_->copy(optimizer_->state(u, k), d.host_state[k].data(), d.master.bytes(), CopyKind::HostToDevice,
                     m.compute);
  }
  refresh_compute_slices();
  m.params_updated();
  backend_->synchronize(m.compute);
}

FsdpMemory FsdpEngine::memory() const {
  const Impl& m = *impl_;
  FsdpMemory r;
  for (const Unit& d : m.units) {
    // An offloaded master is host memory: only its compute copy is on the device.
    r.master_shard += (m.offload ? 0 : d.master.bytes()) + d.compute.bytes() + d.frozen_slice.bytes();
    r.grad_shard += m.plan.root_in_slices && &d != &m.units[0] ? 0 : d.grad.bytes();
    r.model_params += d.flat.numel + d.frozen.numel;
    r.trainable_params += d.flat.numel;
  }
  if (m.offload) r.master_shard += m.offload->resident_master_bytes();  // the root's resident master
  // The root's allocation (its gathered copy and the head's gradient buffer) lying in the blocks' gradient slices
  // (plan.root_in_slices) is counted there, once.
  const bool own_root = !m.plan.root_in_slices;
  if (!own_root) r.grad_shard += m.block_slices.bytes();
  r.full_params = (own_root ? m.root_full.bytes() : 0) + m.root_frozen_full.bytes();
  for (const DeviceArray& b : m.block_full) r.full_params += b.bytes();
  for (const DeviceArray& b : m.block_frozen_full) r.full_params += b.bytes();
  // (The bytes the gathered root shares with the head's gradient buffer count as parameters.)
  r.full_grads = own_root ? m.root_grad_full.bytes() - m.plan.root_overlap : 0;
  for (const DeviceArray& b : m.block_grad_full) r.full_grads += b.bytes();
  r.comm_staging = m.grad_slice.bytes() + m.stage_full.bytes() + m.stage_slice.bytes() + m.split_ids.bytes() +
                   m.split_ids_shard.bytes() + m.split_ids_all.bytes() + m.split_first.bytes() +
                   m.split_packed.bytes() + m.split_slots.bytes() + m.exchange_window.bytes() +
                   (m.offload ? m.offload->staging_bytes() : 0);
  r.activations = m.model->activation_bytes() - m.grads_borrowed;  // counted once, as gradients
  return r;
}

size_t FsdpEngine::optimizer_bytes() const {
  return impl_->offload ? impl_->offload->resident_state_bytes() : optimizer_->state_bytes();
}

const FsdpOptions& FsdpEngine::options() const { return impl_->opt; }

std::string FsdpEngine::offload_description() const {
  return impl_->offload ? impl_->offload->description() : "";
}

size_t FsdpEngine::num_units() const { return impl_->units.size(); }
bool FsdpEngine::lora() const { return impl_->lora; }
const FlatParameter& FsdpEngine::unit(size_t u) const { return impl_->units.at(u).flat; }

std::vector<float> FsdpEngine::grad_slice(size_t u) {
  Impl& m = *impl_;
  m.reduce_pending();
  m.finish_reductions();
  const Unit& d = m.units.at(u);
  std::vector<float> out(d.flat.shard_numel);
  if (m.offload) {
    m.offload->grad_slice(u, out);
    return out;
  }
  m.settle_fresh_grads(m.compute);
  backend_->copy(out.data(), d.grad.data(), d.grad.bytes(), CopyKind::DeviceToHost, m.compute);
  backend_->synchronize(m.compute);
  return out;
}

size_t FsdpEngine::device_peak_bytes() const {
  return backend_->host_memory() ? 0 : backend_->peak_bytes();
}

std::string FsdpEngine::attention_description() const { return impl_->model->attention_description(); }
int FsdpEngine::length_multiple() const { return impl_->model->length_multiple(); }
std::string FsdpEngine::fp8_description() const { return impl_->model->fp8_description(); }

}  // namespace shardlm

// CPU offload's schedule (fsdp.cpu_offload), OffloadPolicy's methods: the fp32 master, the fp32
// gradient and AdamW's moments live in host memory; the device keeps the compute-dtype slices the
// gathers send and no fp32 per-parameter state. Per unit, as soon as its reduction is done:
//
//   comm    reduce-scatter / all-reduce in the reduce dtype into slice[b] (or, one fp32 shard, in the
//           full gradient itself); record `reduced`
//   down    wait `reduced`; copy into pinned landing[b] (the step's first fp32 reduction: into the
//           page-locked host gradient itself, its sum of squares taken on comm first in the step's
//           last micro-step); record copied[b]
//   worker  wait copied[b] (host); sum landing[b] into the host's fp32 gradient (with its sum of
//           squares in the step's last micro-step; landed directly, nothing more); then, when the
//           update is due, AdamW on the unit in chunks, each chunk going up from pinned staging (or
//           from the pinned fp32 master) on the `up` stream; record uploaded[u]
//   comm / compute (next forward)   wait for the upload task (host, ticket), then uploaded[u] (stream)
//
// fsdp.offload_root_update = device (root_updates_on_device): the root's gradient, last reduced and fp32 on the
// device whole (one micro-step, or the device sums), does not go down. Its update runs on the compute
// stream (update_root_on_device) while the worker updates the blocks: chunk c of its pinned master
// and moments goes up into stream_buf[c % 2] (after chunk_home), is updated there by the device's
// AdamW, which also writes the compute slice, and goes back down on `down` (chunk_updated, then
// chunk_home); uploaded[0] follows the last chunk on compute, state_home the last copy down.
//
// fsdp.offload_accumulate = device: before the step's last micro-step, `down` and `worker` do nothing:
// comm adds each reduction into the unit's fp32 slice on the device (grad); the last micro-step adds its
// own and sends that slice down as above, as a direct fp32 landing. device_sums_read (down) orders the
// next step's first write to the slices after that copy.
//
// The update is due at once when the step's lr and gradient factor are known before the backward
// (FsdpEngine::last_micro_step with an update: no clipping, no loss scaling), else at optimizer_step,
// after grad_norm has summed the units' sums of squares: clipping needs the global norm before any
// update. optimizer_step then posts the updates in forward order, so the next forward's first gathers
// wait only for the first units while AdamW on the later ones goes on.
//
// What guards each buffer (b alternates per reduction, s per upload chunk):
//   slice[b]        written by comm, read by down: comm waits copied[b] before reducing into it again.
//   full gradients  read by down when they are the slice: grad_reduced[gs] (and finish_reductions for
//                   the root) are recorded on down, and the compute stream waits them before zeroing.
//   landing[b]      written by down, read by the worker: the main thread waits (host) for the task that
//                   last summed it (landing_read[b]) before queueing the next copy into it.
//   host gradient   the worker alone, in posting order, but for a direct landing (down), queued after
//                   the main thread waited for the unit's last update task (upload_task[u]); the main
//                   thread reads it (grad_norm, grad_slice) only after waiting for the last arrival.
//   stage[s]        the worker alone: it waits staged[s] (host) before writing it again.
//   compute slices  uploads overwrite them after their last readers: early updates run after the
//                   worker saw copied[b], which follows the unit's reduction, which follows its backward
//                   and its gathers; later updates (optimizer_step, checkpoint_loaded, the first upload)
//                   follow params_free, recorded on compute and comm and waited on `up` first.
//   master, moments the worker alone while tasks are queued; checkpoint_state drains the worker first.
//   device sums     (offload_accumulate = device) written by comm; read by down in the last micro-step:
//                   the step's first write waits device_sums_read.
//   squares         written by comm (zeroed, summed) with the reduction; grad_norm reads them after comm.
//   root on device  its gradient (full gradient, slice[b] or device sums) read by compute: comm waits
//                   grad_read before the next step's reductions, compute zeroes the root's after; its host
//                   master and moments written by down: the next chunks up come after on down's order
//                   (chunk_home), a host update of the root waits state_home (state_away).
// Every cross-thread dependency goes through a HostWorker ticket, so the CPU backend (events no-ops,
// copies synchronous) runs the same schedule correctly with the worker as its only concurrency.
#include <cstdio>
#include <cstring>

#include "offload.hpp"

namespace shardlm {

std::pair<double, double> measure_host_link(Backend& device, Backend& host) {
  const size_t bytes = kOffloadLinkProbeBytes;
  DeviceArray on_device = device.allocate(bytes, MemKind::Other);
  DeviceArray on_host = host.allocate(bytes, MemKind::Other);
  device.pin_host(on_host.data(), bytes);
  std::unique_ptr<BackendEvent> from = device.make_timing_event(), to = device.make_timing_event();
  double gbs[2] = {0, 0};
  for (int way = 0; way < 2; ++way) {
    const CopyKind kind = way == 0 ? CopyKind::HostToDevice : CopyKind::DeviceToHost;
    const Stream s = device.copy_stream(kind);
    double best_ms = 0;
    for (int rep = 0; rep < 4; ++rep) {
      from->record(s);
      if (way == 0) device.copy(on_device.data(), on_host.data(), bytes, kind, s);
      else device.copy(on_host.data(), on_device.data(), bytes, kind, s);
      to->record(s);
      device.synchronize(s);
      const double ms = device.elapsed_ms(*from, *to);
      if (rep == 0 || ms < best_ms) best_ms = ms;
    }
    gbs[way] = best_ms > 0 ? static_cast<double>(bytes) / (best_ms * 1e6) : 0.0;
  }
  device.unpin_host(on_host.data());
  return {gbs[0], gbs[1]};
}

FsdpEngine::Impl::OffloadPolicy::OffloadPolicy(Impl& engine, Backend& host, Optimizer& optimizer,
                                               const std::function<void(void*, size_t)>& pin, double link_up_gbs,
                                               double link_down_gbs)
    : m(engine) {
  OffloadState& o = state_;
  Backend& be = m.be;
  o.link_up_gbs = link_up_gbs, o.link_down_gbs = link_down_gbs;
  o.optimizer = &optimizer;
  o.down = be.copy_stream(CopyKind::DeviceToHost);
  o.up = be.copy_stream(CopyKind::HostToDevice);
  m.tracer.set_copy_streams(o.down, o.up);
  o.threads = host.host_threads();
  for (int b = 0; b < 2; ++b) {
    o.slice[b] = be.allocate(m.plan.offload_slice, MemKind::Comm);
    o.landing[b] = host.allocate(m.plan.offload_landing, MemKind::Comm);
    pin(o.landing[b].data(), o.landing[b].bytes());
    o.stage[b] = host.allocate(m.plan.offload_stage, MemKind::Comm);
    pin(o.stage[b].data(), o.stage[b].bytes());
    o.copied[b] = be.make_event();
    o.staged[b] = be.make_event();
    // Recorded once, so the first waits have a point to wait for.
    o.copied[b]->record(o.down);
    o.staged[b]->record(o.up);
  }
  o.reduced = be.make_event();
  o.params_free = be.make_event();
  o.device_sums_read = be.make_event();
  o.device_sums_read->record(o.down);
  for (size_t u = 0; u < m.units.size(); ++u) o.uploaded.push_back(be.make_event());
  o.upload_task.assign(m.units.size(), 0);
  o.sum_squares.assign(m.units.size(), 0.0);
  o.squares = be.allocate(m.plan.offload_squares, MemKind::Comm);
  o.squares_on_device.assign(m.units.size(), 0);
  o.squares_host.assign(m.units.size(), 0.0);
  o.upload_on_device.assign(m.units.size(), 0);
  // The host updates a unit in chunks: each must be whole pieces of the optimizer's (8-bit AdamW's blocks).
  SHARDLM_CHECK(m.plan.offload_chunk == m.plan.max_shard || m.plan.offload_chunk % optimizer.piece_align() == 0,
                "CPU offload: update chunks of ", m.plan.offload_chunk, " elements cut ", optimizer.name(),
                "'s pieces of ", optimizer.piece_align());
  if (root_updates_on_device()) {
    // The root's master and moments are copied up and back chunk by chunk: page-locked.
    Unit& root = m.units[0];
    if (m.opt.param_dtype != DType::F32) pin(root.master.data(), root.master.bytes());
    const size_t k = optimizer.state_names().size(), r = m.plan.offload_resident;
    for (size_t i = 0; i < k; ++i) pin(optimizer.state(0, i), root.master.bytes());
    // kRootStateBytes is AdamW's master and two fp32 moments: the only optimizer the engine updates the root
    // of on the device (FsdpOptions::offload_root_update).
    SHARDLM_CHECK(k == 2 && optimizer.fp32_state(), "the root's update on the device streams AdamW's two fp32 "
                  "moments; ", optimizer.name(), " updates it on the host");
    if (r > 0) {
      o.resident[0] = be.allocate(r * sizeof(float), MemKind::Params);
      for (size_t i = 1; i <= k; ++i) o.resident[i] = be.allocate(r * sizeof(float), MemKind::Optimizer);
      o.resident_updated = be.make_event();
    }
    for (int s = 0; s < 2 && m.plan.offload_stream > 0; ++s) o.stream_buf[s] = be.allocate(m.plan.offload_stream, MemKind::Comm);
    for (int s = 0; s < 2; ++s) {
      o.chunk_updated[s] = be.make_event();
      o.chunk_home[s] = be.make_event();
      o.chunk_home[s]->record(o.down);
    }
    o.state_home = be.make_event();
    o.grad_read = be.make_event();
  }
  o.worker = std::make_unique<HostWorker>([&be] { be.bind_thread(); });
}

void FsdpEngine::Impl::OffloadPolicy::reduce(size_t u, float* full) {
  Unit& d = m.units[u];
  if (d.flat.numel == 0) return;  // nothing trained in it (LoRA's root)
  OffloadState& o = state_;
  const size_t n = d.flat.shard_numel;
  const DType rdt = m.opt.reduce_dtype;
  const int b = o.next;
  o.next ^= 1;
  void* slice = o.slice[b].data();
  bool first = o.micro == 0;
  const bool last = o.last_announced;
  // fsdp.offload_accumulate = device: the micro-steps add up in the unit's fp32 slice on the device
  // (the step's first overwrites it, after the last step's copy out of it); only the step's last
  // micro-step sends it down, once, as one fp32 reduction that overwrites the host gradient. Not for a
  // step of one micro-step, nor after micro-steps the host already summed (no zero_grad since a step
  // of one): those go the host's way.
  const bool on_device = m.opt.offload_accumulate_on_device() && !(first && last) && (first || o.on_device);
  o.copied[b]->wait_on(m.comm);  // the copy out of slice[b] two reductions ago has read it
  if (on_device && first) o.device_sums_read->wait_on(m.comm);
  const int span = m.tracer.mark_begin("reduce unit", static_cast<long>(u), Lane::Comm);
  void* reduced = full;
  if (rdt == DType::F32) {
    if (m.shard.size() > 1) {
      m.shard.reduce_scatter(full, slice, n, DType::F32, ReduceOp::Sum);
      reduced = slice;
    }
  } else if (m.shard.size() > 1) {
    m.be.cast(full, DType::F32, m.stage_full.data(), rdt, d.flat.padded_numel, m.comm);
    m.shard.reduce_scatter(m.stage_full.data(), slice, n, rdt, ReduceOp::Sum);
    reduced = slice;
  } else {
    m.be.cast(full, DType::F32, slice, rdt, n, m.comm);  // one shard: the full gradient is the slice
    reduced = slice;
  }
  if (m.replicate.size() > 1) m.replicate.all_reduce(reduced, n, rdt, ReduceOp::Sum);
  DType landed = rdt;
  if (on_device) {
    float* sum = d.grad.as<float>();
    if (first)
      m.be.cast(reduced, rdt, sum, DType::F32, n, m.comm);
    else
      m.be.accumulate(sum, reduced, rdt, n, m.comm);
    o.on_device = true;
    if (!last) {
      m.tracer.mark_end(span);
      // Nothing goes down: the down stream still orders the reuse of the full gradient (Impl::run).
      o.reduced->record(m.comm);
      o.reduced->wait_on(o.down);
      return;
    }
    reduced = sum, landed = DType::F32, first = true;
  }
  // The step's first fp32 reduction of a unit lands in the (page-locked) host gradient itself, which it
  // overwrites: the host copies nothing, and in the step's last micro-step the device sums its squares.
  const bool direct = first && landed == DType::F32;
  if (last) {
    o.squares_on_device[u] = direct;
    if (direct) {
      double* sq = o.squares.as<double>() + u;
      m.be.zero(sq, sizeof(double), m.comm);
      m.be.sum_squares(static_cast<const float*>(reduced), n, sq, m.comm);
    }
  }
  m.tracer.mark_end(span);  // before the host waits below: the span is the communication stream's work
  o.reduced->record(m.comm);
  o.reduced->wait_on(o.down);
  if (u == 0 && root_updates_on_device() && direct && last) {
    // The root updates on the device from this gradient (update_root_on_device): nothing goes down.
    o.device_grad = static_cast<const float*>(reduced);
    if (o.early) update_root_on_device(*o.early);
    return;
  }
  o.worker->wait(o.landing_read[b]);  // the worker has summed what landing[b] held before
  float* acc = d.host_grad.as<float>();
  // The unit's last update (the task that read the host gradient) is done: the forward waited for it
  // before this backward.
  if (direct && o.upload_task[u]) o.worker->wait(o.upload_task[u]);
  void* landing = direct ? static_cast<void*>(acc) : o.landing[b].data();
  const int down_span = m.tracer.mark_begin("copy down unit", static_cast<long>(u), Lane::Down);
  m.be.copy(landing, reduced, n * dtype_size(landed), CopyKind::DeviceToHost, o.down);
  m.tracer.mark_end(down_span);
  o.copied[b]->record(o.down);
  double* squares = last ? &o.sum_squares[u] : nullptr;
  BackendEvent* copied = o.copied[b].get();
  const int threads = o.threads;
  o.last_arrival = o.landing_read[b] = o.worker->post([=] {
    copied->synchronize();
    if (direct) return;
    const int host_span = m.tracer.mark_begin("sum unit", static_cast<long>(u), Lane::Host);
    host_accumulate_grad(acc, landing, landed, n, first, squares, threads);
    m.tracer.mark_end(host_span);
  });
  if (o.early) post_upload(u, &*o.early);
}

void FsdpEngine::Impl::OffloadPolicy::flush_device_sums() {
  OffloadState& o = state_;
  if (!o.on_device) return;
  // Micro-steps summed on the device without an announced last one: their sums go down now, each
  // overwriting its unit's host gradient (whose readers, the update tasks, are done once drained).
  o.worker->drain();
  o.reduced->record(m.comm);
  o.reduced->wait_on(o.down);
  for (Unit& d : m.units)
    if (d.flat.numel > 0)
      m.be.copy(d.host_grad.data(), d.grad.data(), d.flat.shard_numel * sizeof(float), CopyKind::DeviceToHost, o.down);
  o.device_sums_read->record(o.down);
  m.be.synchronize(o.down);
  o.on_device = false;
  o.sums_valid = false;  // grad_norm sums the host gradients
}

void FsdpEngine::Impl::OffloadPolicy::await_upload(size_t u, Stream s) {
  HostWorker::Ticket& t = state_.upload_task[u];
  char& on_device = state_.upload_on_device[u];
  if (t == 0 && !on_device) return;
  if (t != 0) state_.worker->wait(t);  // the task has queued the upload and recorded uploaded[u]
  state_.uploaded[u]->wait_on(s);
  t = 0, on_device = 0;
}

void FsdpEngine::Impl::OffloadPolicy::update_root_on_device(const StepHyper& h) {
  OffloadState& o = state_;
  Unit& d = m.units[0];
  const float* grad = o.device_grad;
  SHARDLM_CHECK(grad, "FsdpEngine: the root's update on the device without its gradient there");
  const size_t n = d.flat.shard_numel, chunk = m.plan.offload_stream_chunk, csize = dtype_size(m.plan.compute_dtype);
  // The gradient is reduced, and the gathers that read the compute slice are done: both on comm.
  o.reduced->record(m.comm);
  o.reduced->wait_on(m.compute);
  const int span = m.tracer.mark_begin("update unit 0 on the device", -1, Lane::Compute);
  float* master = d.master.as<float>();
  const size_t k = o.optimizer->state_names().size();
  std::vector<float*> host_state, state(k);
  for (size_t i = 0; i < k; ++i) host_state.push_back(o.optimizer->state(0, i));
  char* out = static_cast<char*>(d.compute.data());
  // The resident part (fsdp.offload_resident_gib) is updated where it stays; its first update, or the
  // first after the host's arrays became newer, loads it from them. (A host update of the root, the last
  // writer of those arrays, ran before the forward that led here: that forward waited for it.)
  const size_t r = m.plan.offload_resident;
  if (r > 0) {
    std::vector<float*> resident_state(k);
    for (size_t i = 0; i < k; ++i) resident_state[i] = o.resident[i + 1].as<float>();
    if (!o.resident_loaded) {
      if (o.upload_task[0]) o.worker->wait(o.upload_task[0]);
      m.be.copy(o.resident[0].data(), master, r * sizeof(float), CopyKind::HostToDevice, m.compute);
      for (size_t i = 0; i < k; ++i)
        m.be.copy(resident_state[i], host_state[i], r * sizeof(float), CopyKind::HostToDevice, m.compute);
      o.resident_loaded = true;
    }
    o.optimizer->update_slice_on(m.be, m.compute, 0, 0, r, o.resident[0].as<float>(), grad, resident_state, out, h);
    o.resident_ahead = true;
  }
  int down_span = -1;
  // Chunk c of the rest goes up into buffer c % 2 on the compute stream after that buffer's last chunk
  // went back down, is updated there (writing the compute slice too) and goes back down on `down`.
  for (size_t begin = r, c = 0; begin < n; begin += chunk, ++c) {
    const size_t len = std::min(n, begin + chunk) - begin;
    const int s = static_cast<int>(c % 2);
    float* buf = o.stream_buf[s].as<float>();
    o.chunk_home[s]->wait_on(m.compute);
    m.be.copy(buf, master + begin, len * sizeof(float), CopyKind::HostToDevice, m.compute);
    for (size_t i = 0; i < k; ++i) {
      state[i] = buf + (i + 1) * chunk;
      m.be.copy(state[i], host_state[i] + begin, len * sizeof(float), CopyKind::HostToDevice, m.compute);
    }
    o.optimizer->update_slice_on(m.be, m.compute, 0, begin, begin + len, buf, grad + begin, state, out + begin * csize, h);
    o.chunk_updated[s]->record(m.compute);
    o.chunk_updated[s]->wait_on(o.down);
    if (c == 0) down_span = m.tracer.mark_begin("copy down unit 0's state", -1, Lane::Down);
    m.be.copy(master + begin, buf, len * sizeof(float), CopyKind::DeviceToHost, o.down);
    for (size_t i = 0; i < k; ++i)
      m.be.copy(host_state[i] + begin, state[i], len * sizeof(float), CopyKind::DeviceToHost, o.down);
    o.chunk_home[s]->record(o.down);
  }
  m.tracer.mark_end(span);
  m.tracer.mark_end(down_span);
  o.uploaded[0]->record(m.compute);
  o.upload_on_device[0] = 1;
  if (r > 0) o.resident_updated->record(m.compute);
  o.state_home->record(o.down);
  o.state_away = true;
  // Later writers of the gradient on comm (the next step's reductions) come after these reads.
  o.grad_read->record(m.compute);
  o.grad_read->wait_on(m.comm);
}

void FsdpEngine::Impl::OffloadPolicy::resident_home() {
  OffloadState& o = state_;
  if (!o.resident_ahead) return;
  const size_t r = m.plan.offload_resident, k = o.optimizer->state_names().size();
  o.resident_updated->wait_on(o.down);
  m.be.copy(m.units[0].master.data(), o.resident[0].data(), r * sizeof(float), CopyKind::DeviceToHost, o.down);
  for (size_t i = 0; i < k; ++i)
    m.be.copy(o.optimizer->state(0, i), o.resident[i + 1].data(), r * sizeof(float), CopyKind::DeviceToHost, o.down);
  o.state_home->record(o.down);
  o.state_away = true;
  o.resident_ahead = false;
}

void FsdpEngine::Impl::OffloadPolicy::post_upload(size_t u, const StepHyper* h) {
  Unit& d = m.units[u];
  if (d.flat.numel == 0) return;
  OffloadState& o = state_;
  if (u == 0) {
    resident_home();  // the host reads the root's master (and, updating, its moments) next
    if (h) o.resident_loaded = false;  // and then its arrays are newer than the device's
  }
  const std::optional<StepHyper> hyper = h ? std::optional<StepHyper>(*h) : std::nullopt;
  // The root's state last went through the device: its copies back must have landed first.
  const bool state_away = u == 0 && o.state_away;
  if (state_away) o.state_away = false;
  o.upload_task[u] = o.worker->post([this, u, hyper, state_away] {
    OffloadState& w = state_;
    if (state_away) w.state_home->synchronize();
    const int host_span = m.tracer.mark_begin(hyper ? "update unit" : "pack unit", static_cast<long>(u), Lane::Host);
    int up_span = -1;
    Unit& unit = m.units[u];
    const size_t n = unit.flat.shard_numel, csize = dtype_size(m.plan.compute_dtype);
    const float* master = unit.master.as<float>();
    char* dst = static_cast<char*>(unit.compute.data());
    for (size_t begin = 0; begin < n; begin += m.plan.offload_chunk) {
      const size_t end = std::min(n, begin + m.plan.offload_chunk);
      const void* src = master + begin;
      int s = -1;
      if (csize != sizeof(float)) {
        s = w.next_stage;
        w.next_stage ^= 1;
        w.staged[s]->synchronize();  // the upload that last read stage[s] has finished
        src = w.stage[s].data();
      }
      void* out = s >= 0 ? w.stage[s].data() : nullptr;
      if (hyper)
        w.optimizer->update_slice(u, begin, end, out, *hyper);
      else if (out)
        pack16(m.plan.compute_dtype, master + begin, static_cast<uint16_t*>(out), end - begin);
      if (begin == 0) up_span = m.tracer.mark_begin("copy up unit", static_cast<long>(u), Lane::Up);
      m.be.copy(dst + begin * csize, src, (end - begin) * csize, CopyKind::HostToDevice, w.up);
      if (s >= 0) w.staged[s]->record(w.up);
    }
    m.tracer.mark_end(up_span);
    m.tracer.mark_end(host_span);
    w.uploaded[u]->record(w.up);
  });
}

void FsdpEngine::Impl::OffloadPolicy::uploads_follow_readers() {
  OffloadState& o = state_;
  o.params_free->record(m.compute);
  o.params_free->wait_on(m.comm);
  o.params_free->record(m.comm);
  o.params_free->wait_on(o.up);
}

void FsdpEngine::Impl::OffloadPolicy::micro_step_begins(bool backward) {
  SHARDLM_CHECK(!state_.updated_early,
                "FsdpEngine: a forward after the step's last micro-step updated the parameters: optimizer_step first");
  if (!backward) return;
  state_.sums_valid = false;
  state_.device_grad = nullptr;  // this backward overwrites it
}

void FsdpEngine::Impl::OffloadPolicy::micro_step_ends() {
  OffloadState& o = state_;
  if (o.last_announced && o.on_device) {
    // The sums went down in this micro-step: the next step's first reductions overwrite them after this.
    o.device_sums_read->record(o.down);
    o.on_device = false;
  }
  ++o.micro;
  o.sums_valid = o.last_announced;
  o.updated_early = o.early.has_value();
  o.last_announced = false;
  o.early.reset();
}

// ---- the engine's calls ----

void FsdpEngine::last_micro_step(const std::optional<StepUpdate>& update) {
  impl_->last_announced = true;  // no_sync: this micro-step reduces (schedule.cpp)
  if (impl_->offload) impl_->offload->last_micro_step(update);
}

void FsdpEngine::Impl::OffloadPolicy::last_micro_step(const std::optional<StepUpdate>& update) {
  OffloadState& o = state_;
  SHARDLM_CHECK(!o.updated_early, "FsdpEngine::last_micro_step: the previous step has not been finished");
  o.last_announced = true;
  o.early.reset();
  o.early_values = update;
  if (update) o.early = o.optimizer->begin_step(update->lr, update->grad_factor);
}

void FsdpEngine::Impl::OffloadPolicy::zero_grad() {
  OffloadState& o = state_;
  // The next reductions overwrite the host gradient instead of adding to it.
  SHARDLM_CHECK(!o.updated_early, "FsdpEngine::zero_grad: the step updated early needs its optimizer_step");
  o.micro = 0;
  o.sums_valid = false;
  o.on_device = false;  // sums on the device not sent down are dropped with the rest
  o.device_grad = nullptr;
  std::fill(o.squares_on_device.begin(), o.squares_on_device.end(), 0);
}

double FsdpEngine::Impl::OffloadPolicy::sum_squares() {
  OffloadState& o = state_;
  double local = 0.0;
  flush_device_sums();
  // The host's part: its sums of squares of what landed (none when the device took every unit's).
  bool host_sums = o.micro > 0 && !o.sums_valid;
  for (size_t u = 0; u < m.units.size(); ++u) host_sums |= m.units[u].flat.numel > 0 && !o.squares_on_device[u];
  if (host_sums) o.worker->wait(o.last_arrival);
  if (o.micro > 0 && !o.sums_valid) {
    // Not announced as the step's last micro-step: the sums from the host gradient now.
    for (size_t u = 0; u < m.units.size(); ++u)
      o.sum_squares[u] = host_sum_squares(m.units[u].host_grad.as<float>(), m.units[u].flat.shard_numel, o.threads);
    std::fill(o.squares_on_device.begin(), o.squares_on_device.end(), 0);
    o.sums_valid = true;
  }
  if (std::find(o.squares_on_device.begin(), o.squares_on_device.end(), 1) != o.squares_on_device.end()) {
    // The sums the device took as the reductions went down (after them on comm).
    m.be.copy(o.squares_host.data(), o.squares.data(), o.squares.bytes(), CopyKind::DeviceToHost, m.comm);
    m.be.synchronize(m.comm);
  }
  if (o.micro > 0)
    for (size_t u = 0; u < m.units.size(); ++u) local += o.squares_on_device[u] ? o.squares_host[u] : o.sum_squares[u];
  return local;
}

void FsdpEngine::Impl::OffloadPolicy::optimizer_step(double lr, float grad_factor) {
  OffloadState& o = state_;
  if (o.updated_early) {
    // last_micro_step posted every unit's update as its gradient arrived.
    SHARDLM_CHECK(o.early_values && o.early_values->lr == lr && o.early_values->grad_factor == grad_factor,
                  "FsdpEngine::optimizer_step(", lr, ", ", grad_factor, ") after last_micro_step announced other values");
    o.updated_early = false;
    return;
  }
  flush_device_sums();
  if (o.micro == 0) {
    // No micro-step since zero_grad: a zero gradient.
    std::vector<Unit>* units = &m.units;
    o.worker->post([units] {
      for (Unit& d : *units) std::memset(d.host_grad.data(), 0, d.host_grad.bytes());
    });
  }
  // Host AdamW per unit in forward order, each unit going up when done: the next forward's first
  // gathers wait only for their own units (await_upload).
  uploads_follow_readers();
  const StepHyper h = o.optimizer->begin_step(lr, grad_factor);
  // The root on the device goes last: the worker has the blocks first (queueing the root's chunks
  // can block this thread for as long as the stream's queue is full).
  const bool root_on_device = o.device_grad != nullptr;
  for (size_t u = root_on_device ? 1 : 0; u < m.units.size(); ++u) post_upload(u, &h);
  if (root_on_device) update_root_on_device(h);  // on the device while the host does the blocks
}

void FsdpEngine::Impl::OffloadPolicy::refresh_compute_slices() {
  // The gathers wait for each unit's upload (await_upload).
  uploads_follow_readers();
  for (size_t u = 0; u < m.units.size(); ++u) post_upload(u, nullptr);
}

void FsdpEngine::Impl::OffloadPolicy::grad_slice(size_t u, std::vector<float>& out) {
  OffloadState& o = state_;
  flush_device_sums();
  if (u == 0 && o.device_grad) {
    // The root's gradient stayed on the device for its update there (after the reductions on down).
    m.be.copy(out.data(), o.device_grad, out.size() * sizeof(float), CopyKind::DeviceToHost, o.down);
    m.be.synchronize(o.down);
    return;
  }
  o.worker->wait(o.last_arrival);
  if (o.micro > 0) std::copy_n(m.units[u].host_grad.as<float>(), out.size(), out.begin());
}

Stream FsdpEngine::Impl::OffloadPolicy::follow_reductions() {
  state_.reduced->record(m.comm);
  state_.reduced->wait_on(state_.down);
  return state_.down;
}

void FsdpEngine::Impl::OffloadPolicy::idle() {
  state_.worker->drain();
  synchronize_copies();
}

void FsdpEngine::Impl::OffloadPolicy::synchronize_copies() {
  m.be.synchronize(state_.down);
  m.be.synchronize(state_.up);
}

void FsdpEngine::Impl::OffloadPolicy::checkpoint_state() {
  resident_home();  // the root's resident state, when the device's is newer
  m.be.synchronize(state_.down);
}

void FsdpEngine::Impl::OffloadPolicy::checkpoint_loaded() {
  state_.worker->drain();
  // The loaded host arrays are the root's state now: its next update on the device loads them.
  state_.resident_loaded = state_.resident_ahead = false;
}

size_t FsdpEngine::Impl::OffloadPolicy::staging_bytes() const {
  const OffloadState& o = state_;
  return o.slice[0].bytes() + o.slice[1].bytes() + o.stream_buf[0].bytes() + o.stream_buf[1].bytes() +
         o.squares.bytes();
}

std::string FsdpEngine::Impl::OffloadPolicy::description() const {
  const OffloadState& o = state_;
  const bool on_device = root_updates_on_device();
  const size_t r = m.plan.offload_resident, n = m.units[0].flat.shard_numel;
  std::string where = "the root unit's too";
  if (on_device && r == 0) {
    where = "the root unit's on the GPU, its master and moments streamed over the host link";
  } else if (on_device) {
    char text[200];
    std::snprintf(text, sizeof(text), "the root unit's on the GPU, %.1f%% of its master and moments resident there "
                  "(fsdp.offload_resident_gib: %s)%s", 100.0 * static_cast<double>(r) / static_cast<double>(n),
                  format_bytes(m.plan.offload_resident_bytes()).c_str(), r < n ? ", the rest streamed over the host link" : "");
    where = text;
  }
  if (o.link_up_gbs > 0) {
    char text[160];
    std::snprintf(text, sizeof(text), " (fsdp.offload_root_update = auto: link %.1f GB/s up, %.1f down, %s %.0f)",
                  o.link_up_gbs, o.link_down_gbs, on_device ? "at least" : "under", kOffloadRootLinkGBs);
    where += text;
  }
  return where;
}

}  // namespace shardlm

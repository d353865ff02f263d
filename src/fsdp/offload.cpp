// CPU offload's schedule (fsdp.cpu_offload): the fp32 master, the fp32 gradient and AdamW's moments live
// in host memory; the device keeps the compute-dtype slices the gathers send and no fp32 per-parameter
// state. Per unit, as soon as its reduction is done:
//
//   comm    reduce-scatter / all-reduce in the reduce dtype into slice[b] (or, one fp32 shard, in the
//           full gradient itself); record `reduced`
//   down    wait `reduced`; copy into pinned landing[b] (the step's first fp32 reduction: into the
//           page-locked host gradient itself); record copied[b]
//   worker  wait copied[b] (host); sum landing[b] into the host's fp32 gradient (with its sum of
//           squares in the step's last micro-step; landed directly, only the sum of squares, when
//           the micro-step is also the last); then, when the update is due, AdamW on the unit in
//           chunks, each chunk going up from pinned staging (or from the pinned fp32 master) on the
//           `up` stream; record uploaded[u]
//   comm / compute (next forward)   wait for the upload task (host, ticket), then uploaded[u] (stream)
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
// Every cross-thread dependency goes through a HostWorker ticket, so the CPU backend (events no-ops,
// copies synchronous) runs the same schedule correctly with the worker as its only concurrency.
#include <cstring>

#include "fsdp_engine_impl.hpp"

namespace shardlm {

void FsdpEngine::Impl::reduce_offloaded(size_t u, float* full) {
  Unit& d = units[u];
  if (d.flat.numel == 0) return;  // nothing trained in it (LoRA's root)
  OffloadState& o = offload;
  const size_t n = d.flat.shard_numel;
  const DType rdt = opt.reduce_dtype;
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
  const bool on_device = opt.offload_accumulate_on_device && !(first && last) && (first || o.on_device);
  o.copied[b]->wait_on(comm);  // the copy out of slice[b] two reductions ago has read it
  if (on_device && first) o.device_sums_read->wait_on(comm);
  const int span = mark_begin("reduce unit", static_cast<long>(u), Lane::Comm);
  void* reduced = full;
  if (rdt == DType::F32) {
    if (shard.size() > 1) {
      shard.reduce_scatter(full, slice, n, DType::F32, ReduceOp::Sum);
      reduced = slice;
    }
  } else if (shard.size() > 1) {
    be.cast(full, DType::F32, stage_full.data(), rdt, d.flat.padded_numel, comm);
    shard.reduce_scatter(stage_full.data(), slice, n, rdt, ReduceOp::Sum);
    reduced = slice;
  } else {
    be.cast(full, DType::F32, slice, rdt, n, comm);  // one shard: the full gradient is the slice
    reduced = slice;
  }
  if (replicate.size() > 1) replicate.all_reduce(reduced, n, rdt, ReduceOp::Sum);
  DType landed = rdt;
  if (on_device) {
    float* sum = d.grad.as<float>();
    if (first)
      be.cast(reduced, rdt, sum, DType::F32, n, comm);
    else
      be.accumulate(sum, reduced, rdt, n, comm);
    o.on_device = true;
    if (!last) {
      mark_end(span);
      // Nothing goes down: the down stream still orders the reuse of the full gradient (Impl::run).
      o.reduced->record(comm);
      o.reduced->wait_on(o.down);
      return;
    }
    reduced = sum, landed = DType::F32, first = true;
  }
  mark_end(span);  // before the host waits below: the span is the communication stream's work
  o.reduced->record(comm);
  o.reduced->wait_on(o.down);
  o.worker->wait(o.landing_read[b]);  // the worker has summed what landing[b] held before
  float* acc = d.host_grad.as<float>();
  // The step's first fp32 reduction of a unit lands in the (page-locked) host gradient itself, which it
  // overwrites: the host copies nothing. The unit's last update (the task that read it) is done: the
  // forward waited for it before this backward.
  const bool direct = first && landed == DType::F32;
  if (direct && o.upload_task[u]) o.worker->wait(o.upload_task[u]);
  void* landing = direct ? static_cast<void*>(acc) : o.landing[b].data();
  be.copy(landing, reduced, n * dtype_size(landed), CopyKind::DeviceToHost, o.down);
  o.copied[b]->record(o.down);
  double* squares = last ? &o.sum_squares[u] : nullptr;
  BackendEvent* copied = o.copied[b].get();
  const int threads = o.threads;
  o.last_arrival = o.landing_read[b] = o.worker->post([=] {
    copied->synchronize();
    if (!direct)
      host_accumulate_grad(acc, landing, landed, n, first, squares, threads);
    else if (squares)
      *squares = host_sum_squares(acc, n, threads);
  });
  if (o.early) post_upload(u, &*o.early);
}

void FsdpEngine::Impl::flush_device_sums() {
  OffloadState& o = offload;
  if (!o.on_device) return;
  // Micro-steps summed on the device without an announced last one: their sums go down now, each
  // overwriting its unit's host gradient (whose readers, the update tasks, are done once drained).
  o.worker->drain();
  o.reduced->record(comm);
  o.reduced->wait_on(o.down);
  for (Unit& d : units)
    if (d.flat.numel > 0)
      be.copy(d.host_grad.data(), d.grad.data(), d.flat.shard_numel * sizeof(float), CopyKind::DeviceToHost, o.down);
  o.device_sums_read->record(o.down);
  be.synchronize(o.down);
  o.on_device = false;
  o.sums_valid = false;  // grad_norm sums the host gradients
}

void FsdpEngine::Impl::await_upload(size_t u, Stream s) {
  if (!opt.cpu_offload) return;
  HostWorker::Ticket& t = offload.upload_task[u];
  if (t == 0) return;
  offload.worker->wait(t);  // the task has queued the upload and recorded uploaded[u]
  offload.uploaded[u]->wait_on(s);
  t = 0;
}

void FsdpEngine::Impl::post_upload(size_t u, const AdamWHyper* h) {
  Unit& d = units[u];
  if (d.flat.numel == 0) return;
  OffloadState& o = offload;
  const std::optional<AdamWHyper> hyper = h ? std::optional<AdamWHyper>(*h) : std::nullopt;
  o.upload_task[u] = o.worker->post([this, u, hyper] {
    OffloadState& w = offload;
    Unit& unit = units[u];
    const size_t n = unit.flat.shard_numel, csize = dtype_size(plan.compute_dtype);
    const float* master = unit.master.as<float>();
    char* dst = static_cast<char*>(unit.compute.data());
    for (size_t begin = 0; begin < n; begin += plan.offload_chunk) {
      const size_t end = std::min(n, begin + plan.offload_chunk);
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
        pack16(plan.compute_dtype, master + begin, static_cast<uint16_t*>(out), end - begin);
      be.copy(dst + begin * csize, src, (end - begin) * csize, CopyKind::HostToDevice, w.up);
      if (s >= 0) w.staged[s]->record(w.up);
    }
    w.uploaded[u]->record(w.up);
  });
}

void FsdpEngine::Impl::uploads_follow_readers() {
  OffloadState& o = offload;
  o.params_free->record(compute);
  o.params_free->wait_on(comm);
  o.params_free->record(comm);
  o.params_free->wait_on(o.up);
}

void FsdpEngine::Impl::offload_micro_step_begins(bool backward) {
  SHARDLM_CHECK(!offload.updated_early,
                "FsdpEngine: a forward after the step's last micro-step updated the parameters: optimizer_step first");
  if (!backward) return;
  offload.sums_valid = false;
}

void FsdpEngine::Impl::offload_micro_step_ends() {
  OffloadState& o = offload;
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

// ---- the engine's entry points, offloaded ----

void FsdpEngine::last_micro_step(const std::optional<StepUpdate>& update) {
  Impl& m = *impl_;
  if (!m.opt.cpu_offload) return;
  OffloadState& o = m.offload;
  SHARDLM_CHECK(!o.updated_early, "FsdpEngine::last_micro_step: the previous step has not been finished");
  o.last_announced = true;
  o.early.reset();
  o.early_values = update;
  if (update) o.early = optimizer_->begin_step(update->lr, update->grad_factor);
}

}  // namespace shardlm

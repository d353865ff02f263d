// FsdpEngine's state, shared by the engine's source files: the units' arrays, CPU offload's state and
// the Impl the schedule (schedule.cpp) and offload (offload.cpp) run on.
#pragma once

#include <algorithm>
#include <optional>

#include "host_worker.hpp"
#include "step_trace.hpp"
#include "shardlm/fsdp.hpp"

namespace shardlm {

// One unit's arrays on this rank. The master and the optimizer state live on the backend, or on
// the host with cpu_offload; `host_*` stage them for checkpoints when they are in device memory.
struct FsdpEngine::Unit {
  FlatParameter flat;
  DeviceArray master;    // fp32 master slice (host memory when offloaded)
  DeviceArray grad;      // fp32 gradient slice, summed over the micro-steps of a step (not with cpu_offload)
  DeviceArray compute;   // the slice in the compute dtype, when kept (FsdpBufferPlan::compute_slice)
  DeviceArray host_grad; // cpu_offload: the fp32 gradient slice, summed on the host as the reductions arrive
  std::vector<float> host_master;               // checkpoint staging of a device master
  std::vector<std::vector<float>> host_state;   // checkpoint staging of device optimizer state
  // LoRA: the unit's frozen base weights (EngineLayouts::frozen), this rank's slice in the compute dtype.
  FlatParameter frozen;
  DeviceArray frozen_slice;
};

// CPU offload's buffers, events and host worker; src/fsdp/offload.cpp holds the schedule and says
// which event or ticket guards which buffer.
struct OffloadState {
  std::unique_ptr<HostWorker> worker;
  Optimizer* optimizer = nullptr;
  Stream down = nullptr, up = nullptr;   // the backend's copy streams, device to host and back
  int threads = 1;                       // of the host's element-wise work
  DeviceArray slice[2];                  // device landing of the reduced slices (when the plan has them)
  DeviceArray landing[2];                // pinned host landing of the reduced slices, in the reduce dtype
  DeviceArray stage[2];                  // pinned staging of 16-bit uploads (worker only)
  std::unique_ptr<BackendEvent> reduced;               // comm: a unit's reduction is complete
  std::unique_ptr<BackendEvent> copied[2];             // down: the copy out of slice[b] into landing[b]
  std::unique_ptr<BackendEvent> staged[2];             // up: the upload out of stage[s] (worker only)
  std::unique_ptr<BackendEvent> params_free;           // the slices' last readers before uploads overwrite them
  std::unique_ptr<BackendEvent> device_sums_read;      // down: the copy of the device sums (offload_accumulate = device)
  std::vector<std::unique_ptr<BackendEvent>> uploaded;  // up, per unit: its compute slice is current
  std::vector<HostWorker::Ticket> upload_task;          // per unit: the task queueing its upload (0: none pending)
  HostWorker::Ticket landing_read[2] = {0, 0};          // the task that last summed landing[b]
  HostWorker::Ticket last_arrival = 0;                  // the task summing the latest reduced slice
  std::vector<double> sum_squares;  // per unit, of its gradient (valid with sums_valid), summed on the host
  // A gradient that goes down whole in fp32 in the step's last micro-step has its sum of squares taken
  // on the device (comm) instead: squares[u], with squares_on_device[u]; grad_norm copies them here.
  DeviceArray squares;
  std::vector<char> squares_on_device;
  std::vector<double> squares_host;
  // fsdp.offload_root_update = device (the plan has offload_stream_chunk): the root's update runs on the
  // compute stream, chunk by chunk, its master and moments copied up into stream_buf[c % 2] and back
  // down (down).
  double link_up_gbs = 0, link_down_gbs = 0;          // the host link as auto measured it (0: not measured)
  DeviceArray stream_buf[2];                           // a chunk's master, then each moment
  std::unique_ptr<BackendEvent> chunk_updated[2];      // compute: the chunk in stream_buf[s] is updated
  std::unique_ptr<BackendEvent> chunk_home[2];         // down: it is back in host memory (the buffer is free)
  std::unique_ptr<BackendEvent> state_home;            // down: the root's whole state is back
  std::unique_ptr<BackendEvent> grad_read;             // compute: the update has read the root's gradient
  const float* device_grad = nullptr;  // the root's step gradient, fp32 on the device, when it updates there
  // fsdp.offload_resident_gib: the root's first plan.offload_resident elements of master, then each moment,
  // stay on the device between updates there. Loaded: they are at least as new as the host's arrays (else
  // the host's are newer: at start, after a load or a host update); ahead: newer (the host's are stale
  // until resident_home copies them down).
  DeviceArray resident[3];
  std::unique_ptr<BackendEvent> resident_updated;  // compute: the device's last update of them
  bool resident_loaded = false, resident_ahead = false;
  bool state_away = false;             // the root's state last went through the device: wait state_home first
  std::vector<char> upload_on_device;  // per unit: its compute slice is being written on the device (uploaded[u])
  int next = 0;                     // the landing pair of the next reduction
  int next_stage = 0;               // worker only
  int micro = 0;                    // micro-steps reduced since zero_grad
  bool last_announced = false;      // the next micro-step is its step's last (FsdpEngine::last_micro_step)
  std::optional<AdamWHyper> early;  // and its update, known before its backward
  std::optional<FsdpEngine::StepUpdate> early_values;  // what optimizer_step must then be called with
  bool sums_valid = false;          // sum_squares are of the step's whole gradient
  bool updated_early = false;       // the step's updates are posted; optimizer_step comes next
  bool on_device = false;           // offload_accumulate = device: micro-steps summed on the device, not yet down
};

// The host link's speed up and down in GB/s: the best of four timed copies of kOffloadLinkProbeBytes
// each way between page-locked host memory and the device (fsdp.offload_root_update = auto).
std::pair<double, double> measure_host_link(Backend& device, Backend& host);

struct FsdpEngine::Impl {
  Backend& be;
  std::unique_ptr<UnitModel> model;
  FsdpOptions opt;
  const FsdpBufferPlan& plan;
  Communicator& shard;
  Communicator& replicate;
  Stream compute, comm;
  bool host_memory;  // the backend's memory is host memory: no staging, no copies of the batch
  int L = 0;
  size_t max_tokens = 0;  // of a micro-batch
  bool forward_prefetch = false;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::None;
  std::vector<UnitLayout> layout;         // what is trained (EngineLayouts::trainable)
  std::vector<UnitLayout> frozen_layout;  // LoRA's frozen base (EngineLayouts::frozen), empty without LoRA
  bool lora = false;
  std::vector<Unit> units;

  DeviceArray root_full;
  std::vector<DeviceArray> block_full;
  DeviceArray root_frozen_full;                 // LoRA: gathered frozen units (slots as block_full)
  std::vector<DeviceArray> block_frozen_full;
  std::vector<int> holder;      // per block buffer: the unit whose parameters it holds, or -1
  std::vector<bool> gathered;   // per unit: its gathered parameters are current
  std::vector<std::unique_ptr<BackendEvent>> slot_free, unit_gathered;
  DeviceArray root_grad_full, grad_slice, stage_full, stage_slice;
  std::vector<DeviceArray> block_grad_full;
  std::vector<std::unique_ptr<BackendEvent>> grad_ready, grad_reduced;
  std::unique_ptr<BackendEvent> root_grad_ready, params_written, reductions_done;
  bool root_reduction_pending = false;
  // plan.root_split: this rank's token ids, the shard group's and every rank's (the shard group's when
  // not replicated), the rows' first occurrences, the packed rows; the head's part reduced (comm).
  DeviceArray split_ids, split_ids_shard, split_ids_all, split_first, split_packed;
  std::unique_ptr<BackendEvent> head_reduced;
  // Per unit: its grad slice holds nothing of this step yet (zero_grad sets it instead of zeroing): the
  // first reduction writes the slice rather than adding to it (settle_fresh_grads zeroes the rest).
  std::vector<char> grad_fresh;
  std::unique_ptr<BackendEvent> root_zeroed;  // comm: root_grad_full is zero for this backward
  DeviceArray tokens, targets, norm;  // device copies of the micro-batch; the norm's fp64 sum
  DeviceArray starts;                 // packed rows' sample starts (device copy; data.packing only)

  OffloadState offload;               // cpu_offload only

  // The step timeline's spans (trace_begin .. trace_end); the host worker opens and closes spans too.
  StepTracer tracer;
  using Lane = StepTracer::Lane;

  DeviceArray decode_index;           // tokens, slots, positions, logit rows, next: max_rows each
  std::vector<int32_t> decode_host;
  int decode_slots = 0, decode_max_len = 0, decode_max_rows = 0;

  Impl(Backend& backend, std::unique_ptr<UnitModel> m, EngineLayouts layouts, const FsdpOptions& o,
       const FsdpBufferPlan& p, ProcessGroups& groups, size_t tokens)
      : be(backend), model(std::move(m)), opt(o), plan(p), shard(*groups.shard), replicate(*groups.replicate),
        compute(backend.compute_stream()), comm(backend.comm_stream()),
        host_memory(backend.host_memory()), L(model->config().num_layers), max_tokens(tokens),
        layout(std::move(layouts.trainable)), frozen_layout(std::move(layouts.frozen)), lora(!frozen_layout.empty()),
        tracer(backend, compute, comm) {
    // A synchronous backend gains nothing from gathering ahead.
    if (be.asynchronous()) forward_prefetch = opt.forward_prefetch, backward_prefetch = opt.backward_prefetch;
  }

  size_t csize() const { return dtype_size(plan.compute_dtype); }
  size_t slot(size_t u) const { return plan.reshard ? (u - 1) % block_full.size() : u - 1; }
  // A prefetch queued before this unit's compute must land in another buffer than the one in use.
  bool can_prefetch() const { return !plan.reshard || block_full.size() >= 2; }

  // Where the model reads unit u's gathered trainable parameters.
  const void* full_params(size_t u) const {
    const Unit& d = units[u];
    if (plan.alias) return plan.compute_slice ? d.compute.data() : d.master.data();
    return u == 0 ? root_full.data() : block_full[slot(u)].data();
  }
  // And its gathered frozen base (LoRA).
  const void* full_frozen(size_t u) const {
    if (plan.frozen_alias) return units[u].frozen_slice.data();
    return u == 0 ? root_frozen_full.data() : block_frozen_full[slot(u)].data();
  }
  // What the model reads: the base weights and, with LoRA, the adapters.
  UnitParams unit_params(size_t u) const {
    return lora ? UnitParams{full_frozen(u), full_params(u)} : UnitParams{full_params(u), nullptr};
  }

  // Enqueues unit u's all-gather on the communication stream unless its parameters are current.
  void gather(size_t u);

  // The compute stream may use unit u's parameters from here on; done_with: it has finished with them.
  UnitParams use(size_t u);
  void done_with(size_t u);

  // New slices (an update, a load): every unit is gathered again, after they are written.
  void params_updated();

  // The optimizer's update of every unit with h on the compute stream. The root, then (with forward
  // prefetch) the first block, update first and are gathered on the communication stream while the
  // rest updates, so the next forward finds both in place instead of waiting for their gathers.
  void update_and_gather_ahead(Optimizer& optimizer, const AdamWHyper& h);

  // Where the backward accumulates unit u's full fp32 gradient: the grad slice itself when the
  // gradients are direct, else the root's buffer or block l = u - 1's buffer l % grad_buffers.
  float* full_grad(size_t u) {
    if (plan.direct_grads) return units[u].grad.as<float>();
    return u == 0 ? root_grad_full.as<float>() : block_grad_full[(u - 1) % block_grad_full.size()].as<float>();
  }

  // Reduces unit u's full gradient into its slice on the communication stream: reduce-scatter over
  // the shard group, all-reduce over the replicate group, in reduce_dtype, then add to the slice.
  // (The step timeline's "reduce unit u" span; offloaded, reduce_offloaded marks its own.)
  void reduce(size_t u, float* full);
  void reduce_into_slice(Unit& d, float* full);
  // d's grad slice += its reduced slice (in dt, widened), on comm; the step's first writes it instead.
  void add_to_grad(Unit& d, const void* slice, DType dt);
  // Units whose grad slice no reduction wrote this step (none ran, or a partial one comes next) are
  // zeroed on stream s.
  void settle_fresh_grads(Stream s);
  // The full gradient buffers are zeroed on the communication stream after their reductions have read
  // them (off the compute stream); offloaded, the copies down read them: there the compute stream does it.
  bool zero_on_comm() const { return !opt.cpu_offload && !plan.direct_grads; }

  // Reduces elements [lo, hi) of unit d's full gradient as reduce_into_slice does the whole unit: each
  // rank's part of the range to it over the shard group, then over the replicate group, added to its slice.
  void reduce_range(Unit& d, float* full, size_t lo, size_t hi);

  // plan.root_split, after the head's backward: the range it wrote is reduced now, behind the blocks'
  // backward; every rank's token ids are gathered and the rows they name marked for the embedding's part.
  void reduce_root_head();
  const int32_t* token_ids_all() const {
    return (replicate.size() > 1 ? split_ids_all : split_ids_shard).as<int32_t>();
  }

  // plan.root_split, before the embedding's backward: it must not add to what the head's part reduced.
  void embedding_grad_begins();

  // plan.root_split, after the embedding's backward: the named rows and the embedding's other tensors,
  // packed, all-reduced and added to the slice.
  void reduce_root_embedding();

  // Every stream done and, offloaded, the host worker idle.
  void idle();

  // The compute stream waits for the reductions (and offloaded, for the copies out of their buffers).
  void finish_reductions();
  void finish_root_reduction();

  // One micro-batch: the forward (and, with backward, the backward and its reductions); its loss sum.
  double run(const MicroBatch& mb, float grad_scale, bool backward);

  // ---- CPU offload (offload.cpp) ----
  // Unit u's reduction, its copy down and its sum into the host gradient (and, announced, its update).
  void reduce_offloaded(size_t u, float* full);
  // offload_accumulate = device, no last micro-step announced: the device sums down into the host gradients.
  void flush_device_sums();
  // Stream s waits for unit u's pending upload, if any.
  void await_upload(size_t u, Stream s);
  // Posts unit u's update with h (or, without h, the upload of its master as it is) to the worker.
  void post_upload(size_t u, const AdamWHyper* h);
  // The root's update with h on the device, from offload.device_grad (fsdp.offload_root_update).
  void update_root_on_device(const AdamWHyper& h);
  // The resident part of the root's state back into the host's arrays when the device's is newer (on
  // `down`, then state_home and state_away), before anything on the host reads them.
  void resident_home();
  bool root_updates_on_device() const { return plan.offload_stream_chunk > 0; }
  // Uploads wait for every earlier reader of the compute slices.
  void uploads_follow_readers();
  void offload_micro_step_begins(bool backward);
  void offload_micro_step_ends();
};

}  // namespace shardlm

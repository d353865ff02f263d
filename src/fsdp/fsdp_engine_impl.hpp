// FsdpEngine's state and its schedule (gather, use, reshard, reduce, one micro-batch), shared by
// the engine's source files.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>

#include "host_worker.hpp"
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

  // The step timeline (trace_begin .. trace_end): a span's two timing events, recorded on its stream,
  // or on the host lane (offload's worker) its two times on the host's clock from trace_begin. The
  // worker opens and closes spans too: `marks` is guarded by marks_mutex.
  enum class Lane { Compute, Comm, Down, Up, Host };  // kTraceLanes' order
  static const char* lane_name(Lane l) { return kTraceLanes[static_cast<int>(l)]; }
  struct Mark {
    std::string name;
    Lane lane = Lane::Compute;
    std::unique_ptr<BackendEvent> begin, end;
    double host_begin_ms = 0, host_end_ms = 0;
  };
  std::atomic<bool> tracing{false};
  std::unique_ptr<BackendEvent> trace_origin;
  std::chrono::steady_clock::time_point trace_host_origin;
  std::mutex marks_mutex;
  std::vector<Mark> marks;
  Stream lane_stream(Lane l) const {
    switch (l) {
      case Lane::Comm: return comm;
      case Lane::Down: return offload.down;
      case Lane::Up: return offload.up;
      default: return compute;
    }
  }
  double host_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - trace_host_origin).count();
  }
  // Opens a span "what unit" (what alone for unit < 0) on a lane, returns its index (or -1 when not
  // tracing).
  int mark_begin(const char* what, long unit, Lane lane) {
    if (!tracing) return -1;
    Mark m;
    m.name = unit >= 0 ? concat(what, " ", unit) : std::string(what);
    m.lane = lane;
    if (lane == Lane::Host) {
      m.host_begin_ms = host_ms();
    } else {
      m.begin = be.make_timing_event();
      m.end = be.make_timing_event();
      m.begin->record(lane_stream(lane));
    }
    std::lock_guard<std::mutex> lock(marks_mutex);
    marks.push_back(std::move(m));
    return static_cast<int>(marks.size()) - 1;
  }
  void mark_end(int i) {
    if (i < 0) return;
    std::lock_guard<std::mutex> lock(marks_mutex);
    Mark& m = marks[static_cast<size_t>(i)];
    if (m.lane == Lane::Host) m.host_end_ms = host_ms();
    else m.end->record(lane_stream(m.lane));
  }

  DeviceArray decode_index;           // tokens, slots, positions, logit rows, next: max_rows each
  std::vector<int32_t> decode_host;
  int decode_slots = 0, decode_max_len = 0, decode_max_rows = 0;

  Impl(Backend& backend, std::unique_ptr<UnitModel> m, EngineLayouts layouts, const FsdpOptions& o,
       const FsdpBufferPlan& p, ProcessGroups& groups, size_t tokens)
      : be(backend), model(std::move(m)), opt(o), plan(p), shard(*groups.shard), replicate(*groups.replicate),
        compute(backend.compute_stream()), comm(backend.comm_stream()),
        host_memory(backend.host_memory()), L(model->config().num_layers), max_tokens(tokens),
        layout(std::move(layouts.trainable)), frozen_layout(std::move(layouts.frozen)), lora(!frozen_layout.empty()) {
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
  void gather(size_t u) {
    // (One rank reads its slices in place, the frozen ones too: plan.alias implies plan.frozen_alias.)
    if (plan.alias || gathered[u]) return;
    if (u > 0) {
      const size_t sl = slot(u);
      if (holder[sl] >= 0) gathered[holder[sl]] = false;  // evicted from the shared buffer
      slot_free[sl]->wait_on(comm);  // the buffer's previous block has finished computing
      holder[sl] = static_cast<int>(u);
    }
    await_upload(u, comm);
    const int span = mark_begin("all-gather unit", static_cast<long>(u), Lane::Comm);
    const Unit& d = units[u];
    const size_t n = d.flat.shard_numel;
    char* full = static_cast<char*>(const_cast<void*>(full_params(u)));
    if (plan.staged_gather) {
      // Cast the slice to param_dtype first, so the gather moves 16-bit values; the model reads fp32.
      be.cast(d.master.data(), DType::F32, stage_slice.data(), opt.param_dtype, n, comm);
      shard.all_gather(stage_slice.data(), stage_full.data(), n, opt.param_dtype);
      be.cast(stage_full.data(), opt.param_dtype, full, plan.compute_dtype, d.flat.padded_numel, comm);
    } else if (plan.cast_at_gather) {
      // In place: NCCL reads this rank's part of the receive buffer when send == recv + rank * count.
      char* mine = full + static_cast<size_t>(shard.rank()) * n * csize();
      be.cast(d.master.data(), DType::F32, mine, plan.compute_dtype, n, comm);
      shard.all_gather(mine, full, n, plan.compute_dtype);
    } else {
      shard.all_gather(plan.compute_slice ? d.compute.data() : d.master.data(), full, n, plan.compute_dtype);
    }
    if (lora && !plan.frozen_alias)
      shard.all_gather(d.frozen_slice.data(), const_cast<void*>(full_frozen(u)), d.frozen.shard_numel,
                       plan.compute_dtype);
    mark_end(span);
    unit_gathered[u]->record(comm);
    gathered[u] = true;
  }

  // The compute stream may use unit u's parameters from here on.
  UnitParams use(size_t u) {
    gather(u);
    if (!plan.alias) unit_gathered[u]->wait_on(compute);
    else await_upload(u, compute);  // the model reads the compute slice itself
    return unit_params(u);
  }
  void done_with(size_t u) {
    if (!plan.alias && u > 0) slot_free[slot(u)]->record(compute);
  }

  void params_updated() {
    std::fill(gathered.begin(), gathered.end(), false);
    std::fill(holder.begin(), holder.end(), -1);
    // The new slices must be written before any gather reads them.
    params_written->record(compute);
    params_written->wait_on(comm);
  }

  // The optimizer's update of every unit with h on the compute stream. The root, then (with forward
  // prefetch) the first block, update first and are gathered on the communication stream while the
  // rest updates, so the next forward finds both in place instead of waiting for their gathers.
  void update_and_gather_ahead(Optimizer& optimizer, const AdamWHyper& h) {
    std::fill(gathered.begin(), gathered.end(), false);
    std::fill(holder.begin(), holder.end(), -1);
    size_t ahead = 0;
    if (be.asynchronous() && !plan.alias) ahead = std::min<size_t>(units.size(), forward_prefetch && can_prefetch() ? 2 : 1);
    for (size_t u = 0; u < ahead; ++u) {
      optimizer.update_slices(u, u + 1, h, compute);
      params_written->record(compute);
      params_written->wait_on(comm);
      gather(u);
    }
    optimizer.update_slices(ahead, units.size(), h, compute);
    params_written->record(compute);
    params_written->wait_on(comm);
  }

  // Where the backward accumulates unit u's full fp32 gradient: the grad slice itself when the
  // gradients are direct, else the root's buffer or block l = u - 1's buffer l % grad_buffers.
  float* full_grad(size_t u) {
    if (plan.direct_grads) return units[u].grad.as<float>();
    return u == 0 ? root_grad_full.as<float>() : block_grad_full[(u - 1) % block_grad_full.size()].as<float>();
  }

  // Reduces unit u's full gradient into its slice on the communication stream: reduce-scatter over
  // the shard group, all-reduce over the replicate group, in reduce_dtype, then add to the slice.
  // (The step timeline's "reduce unit u" span; offloaded, reduce_offloaded marks its own.)
  void reduce(size_t u, float* full) {
    if (opt.cpu_offload) return reduce_offloaded(u, full);
    if (plan.direct_grads) return;  // the backward wrote into the slice itself
    Unit& d = units[u];
    if (d.flat.numel == 0) return;  // nothing trained in it (LoRA's root)
    const int span = mark_begin("reduce unit", static_cast<long>(u), Lane::Comm);
    reduce_into_slice(d, full);
    mark_end(span);
  }
  void reduce_into_slice(Unit& d, float* full) {
    const size_t n = d.flat.shard_numel;
    const DType rdt = opt.reduce_dtype;
    if (rdt == DType::F32) {
      float* slice = full;  // one shard: the full gradient is the slice
      if (shard.size() > 1) {
        slice = grad_slice.as<float>();
        shard.reduce_scatter(full, slice, n, DType::F32, ReduceOp::Sum);
      }
      if (replicate.size() > 1) replicate.all_reduce(slice, n, DType::F32, ReduceOp::Sum);
      add_to_grad(d, slice, DType::F32);
      return;
    }
    be.cast(full, DType::F32, stage_full.data(), rdt, d.flat.padded_numel, comm);
    void* slice = stage_full.data();
    if (shard.size() > 1) {
      slice = stage_slice.data();
      shard.reduce_scatter(stage_full.data(), slice, n, rdt, ReduceOp::Sum);
    }
    if (replicate.size() > 1) replicate.all_reduce(slice, n, rdt, ReduceOp::Sum);
    add_to_grad(d, slice, rdt);
  }
  // d's grad slice += its reduced slice (in dt, widened), on comm; the step's first writes it instead.
  void add_to_grad(Unit& d, const void* slice, DType dt) {
    char& fresh = grad_fresh[static_cast<size_t>(&d - units.data())];
    if (fresh) be.cast(slice, dt, d.grad.data(), DType::F32, d.flat.shard_numel, comm);
    else be.accumulate(d.grad.as<float>(), slice, dt, d.flat.shard_numel, comm);
    fresh = 0;
  }
  // Units whose grad slice no reduction wrote this step (none ran, or a partial one comes next) are
  // zeroed on stream s.
  void settle_fresh_grads(Stream s) {
    for (size_t u = 0; u < units.size(); ++u)
      if (grad_fresh[u]) be.zero(units[u].grad.data(), units[u].grad.bytes(), s), grad_fresh[u] = 0;
  }
  // The full gradient buffers are zeroed on the communication stream after their reductions have read
  // them (off the compute stream); offloaded, the copies down read them: there the compute stream does it.
  bool zero_on_comm() const { return !opt.cpu_offload && !plan.direct_grads; }

  // Reduces elements [lo, hi) of unit d's full gradient as reduce_into_slice does the whole unit: each
  // rank's part of the range to it over the shard group, then over the replicate group, added to its slice.
  void reduce_range(Unit& d, float* full, size_t lo, size_t hi) {
    const size_t n = d.flat.shard_numel;
    const int S = shard.size(), me = shard.rank();
    const DType rdt = opt.reduce_dtype;
    const size_t rsize = dtype_size(rdt);
    char* send = reinterpret_cast<char*>(full);
    char* recv = static_cast<char*>(rdt == DType::F32 ? grad_slice.data() : stage_slice.data());
    if (rdt != DType::F32) {
      be.cast(full + lo, DType::F32, stage_full.as<char>() + lo * rsize, rdt, hi - lo, comm);
      send = stage_full.as<char>();
    }
    size_t my_lo = 0, my_hi = 0;
    for (int r = 0; r < S; ++r) {
      const size_t begin = static_cast<size_t>(r) * n, a = std::max(lo, begin), b = std::min(hi, begin + n);
      if (a >= b) continue;
      if (r == me) my_lo = a, my_hi = b;
      if (S > 1) shard.reduce(send + a * rsize, r == me ? recv + (a - begin) * rsize : recv, b - a, rdt, ReduceOp::Sum, r);
    }
    if (my_hi <= my_lo) return;
    const size_t mine = my_lo - static_cast<size_t>(me) * n;
    char* reduced = S > 1 ? recv + mine * rsize : send + my_lo * rsize;
    if (replicate.size() > 1) replicate.all_reduce(reduced, my_hi - my_lo, rdt, ReduceOp::Sum);
    be.accumulate(d.grad.as<float>() + mine, reduced, rdt, my_hi - my_lo, comm);
  }

  // plan.root_split, after the head's backward: the range it wrote is reduced now, behind the blocks'
  // backward; every rank's token ids are gathered and the rows they name marked for the embedding's part.
  void reduce_root_head() {
    const RootSplit& rs = plan.root_split;
    Unit& d = units[0];
    root_grad_ready->record(compute);
    root_grad_ready->wait_on(comm);
    const int span = mark_begin("reduce unit 0 (head)", -1, Lane::Comm);
    if (rs.head_begin == 0 && rs.head_end >= d.flat.numel) {
      reduce_into_slice(d, root_grad_full.as<float>());
    } else {
      if (grad_fresh[0]) be.zero(d.grad.data(), d.grad.bytes(), comm), grad_fresh[0] = 0;  // written in parts
      reduce_range(d, root_grad_full.as<float>(), rs.head_begin, rs.head_end);
    }
    // (int32 ids travel as 4-byte words: a gather copies them bit for bit.)
    shard.all_gather(split_ids.data(), split_ids_shard.data(), rs.token_capacity, DType::F32);
    if (replicate.size() > 1)
      replicate.all_gather(split_ids_shard.data(), split_ids_all.data(), rs.shard_ids, DType::F32);
    be.rows_mark_first(token_ids_all(), rs.id_capacity, split_first.as<int32_t>(), rs.table_rows, comm);
    mark_end(span);
    head_reduced->record(comm);
  }
  const int32_t* token_ids_all() const {
    return (replicate.size() > 1 ? split_ids_all : split_ids_shard).as<int32_t>();
  }

  // plan.root_split, before the embedding's backward: it must not add to what the head's part reduced.
  void embedding_grad_begins() {
    const RootSplit& rs = plan.root_split;
    head_reduced->wait_on(compute);
    if (rs.table_in_head)  // the head's gradient of the named rows went with the head's part
      be.rows_zero(root_grad_full.as<float>() + rs.table_offset, rs.width, token_ids_all(), rs.id_capacity,
                   rs.table_rows, compute);
  }

  // plan.root_split, after the embedding's backward: the named rows and the embedding's other tensors,
  // packed, all-reduced and added to the slice.
  void reduce_root_embedding() {
    const RootSplit& rs = plan.root_split;
    Unit& d = units[0];
    const DType rdt = opt.reduce_dtype;
    const size_t rsize = dtype_size(rdt), extras = rs.extras_end - rs.extras_begin;
    float* full = root_grad_full.as<float>();
    const int32_t* ids = token_ids_all();
    int32_t* first = split_first.as<int32_t>();
    const int span = mark_begin("reduce unit 0 (embedding rows)", -1, Lane::Comm);
    be.rows_pack(full + rs.table_offset, rs.width, ids, first, rs.id_capacity, rs.table_rows, split_packed.data(), rdt,
                 comm);
    char* tail = split_packed.as<char>() + rs.id_capacity * rs.width * rsize;
    if (extras > 0) be.cast(full + rs.extras_begin, DType::F32, tail, rdt, extras, comm);
    if (shard.size() > 1) shard.all_reduce(split_packed.data(), rs.packed_numel(), rdt, ReduceOp::Sum);
    if (replicate.size() > 1) replicate.all_reduce(split_packed.data(), rs.packed_numel(), rdt, ReduceOp::Sum);
    const size_t n = d.flat.shard_numel, begin = static_cast<size_t>(shard.rank()) * n;
    be.rows_unpack_add(split_packed.data(), rdt, rs.width, ids, first, rs.id_capacity, rs.table_rows, d.grad.as<float>(),
                       static_cast<long long>(rs.table_offset) - static_cast<long long>(begin), n, comm);
    const size_t lo = std::max(rs.extras_begin, begin), hi = std::min(rs.extras_end, begin + n);
    if (lo < hi) be.accumulate(d.grad.as<float>() + (lo - begin), tail + (lo - rs.extras_begin) * rsize, rdt, hi - lo, comm);
    be.zero(first, split_first.bytes(), comm);  // for the next micro-step's marks
    mark_end(span);
  }

  // Every stream done and, offloaded, the host worker idle.
  void idle() {
    if (opt.cpu_offload) {
      offload.worker->drain();
      be.synchronize(offload.down);
      be.synchronize(offload.up);
    }
    be.synchronize(compute);
    be.synchronize(comm);
  }

  // The compute stream waits for the reductions (and offloaded, for the copies out of their buffers).
  void finish_reductions() {
    if (opt.cpu_offload) {
      offload.reduced->record(comm);
      offload.reduced->wait_on(offload.down);
      reductions_done->record(offload.down);
    } else {
      reductions_done->record(comm);
    }
    reductions_done->wait_on(compute);
  }
  void finish_root_reduction() {
    if (!root_reduction_pending) return;
    finish_reductions();
    root_reduction_pending = false;
  }

  double run(const MicroBatch& mb, float grad_scale, bool backward) {
    const int B = mb.batch, T = mb.seq;
    const size_t N = static_cast<size_t>(B) * T;
    SHARDLM_CHECK(N <= max_tokens, "micro-batch of ", B, " x ", T, " tokens exceeds the planned ", max_tokens);
    const int32_t* tok = mb.tokens.data();
    const int32_t* tgt = mb.targets.data();
    const bool packed = !mb.starts.empty();
    SHARDLM_CHECK(!packed || model->config().packed, "a packed micro-batch for a model not built for packing");
    const int32_t* starts_in = packed ? mb.starts.data() : nullptr;
    if (opt.cpu_offload) offload_micro_step_begins(backward);
    if (!host_memory) {
      be.copy(tokens.data(), tok, N * sizeof(int32_t), CopyKind::HostToDevice, compute);
      be.copy(targets.data(), tgt, N * sizeof(int32_t), CopyKind::HostToDevice, compute);
      if (packed) be.copy(starts.data(), starts_in, N * sizeof(int32_t), CopyKind::HostToDevice, compute);
      tok = tokens.as<int32_t>(), tgt = targets.as<int32_t>();
      if (packed) starts_in = starts.as<int32_t>();
    }
    model->set_sample_starts(starts_in);
    model->reset_loss(compute);

    const UnitParams root = use(0);
    if (L > 0 && forward_prefetch) gather(1);
    int span = mark_begin("forward unit 0 (embedding)", -1, Lane::Compute);
    if (N > 0) model->embed_forward(root, tok, B, T, compute);
    mark_end(span);
    for (int l = 0; l < L; ++l) {
      const UnitParams p = use(1 + l);
      // Forward prefetch: the next block's gather runs during this one (it needs a buffer of its own).
      if (forward_prefetch && can_prefetch() && l + 1 < L) gather(2 + l);
      // Behind the forward's last gathers, the root's full gradient is zeroed for this backward.
      if (backward && zero_on_comm() && l + 1 == L) {
        be.zero(root_grad_full.data(), root_grad_full.bytes(), comm);
        root_zeroed->record(comm);
      }
      span = mark_begin("forward unit", 1 + l, Lane::Compute);
      if (N > 0) model->block_forward(l, p, B, T, compute);
      mark_end(span);
      done_with(1 + l);
    }
    const bool split = backward && plan.root_split.on;
    if (backward) {
      if (zero_on_comm() && L == 0) {
        be.zero(root_grad_full.data(), root_grad_full.bytes(), comm);
        root_zeroed->record(comm);
      }
      // The previous micro-batch's root reduction reads root_grad_full (and split, the token ids).
      finish_root_reduction();
      if (zero_on_comm()) root_zeroed->wait_on(compute);
      else if (!plan.direct_grads) be.zero(root_grad_full.data(), root_grad_full.bytes(), compute);
      if (split) {
        // This rank's token ids for the embedding's part of the root's reduction (zeros pad: row 0).
        be.zero(split_ids.data(), split_ids.bytes(), compute);
        be.copy(split_ids.data(), mb.tokens.data(), N * sizeof(int32_t), CopyKind::HostToDevice, compute);
      }
      if (L > 0 && backward_prefetch != BackwardPrefetch::None) gather(L);  // the last block (usually still held)
    }
    // With LoRA only the root's saved modules (lora.modules_to_save) form gradients; none without them.
    UnitGrads droot;
    if (backward && !lora) droot.base = full_grad(0);
    if (backward && lora && units[0].flat.numel > 0) droot.adapter = full_grad(0);
    span = mark_begin(backward ? "forward and backward unit 0 (head, loss)" : "forward unit 0 (head, loss)", -1,
                      Lane::Compute);
    if (N > 0) model->head(root, tgt, B, T, grad_scale, backward, droot, compute);
    mark_end(span);
    if (split) reduce_root_head();
    if (backward) {
      for (int l = L - 1; l >= 0; --l) {
        const UnitParams p = use(1 + l);
        // BACKWARD_PRE: the previous block's gather is queued before this block's backward (and its
        // reduce-scatter), so it overlaps this block's compute.
        if (backward_prefetch == BackwardPrefetch::Pre && can_prefetch() && l > 0) gather(l);
        const size_t gs = block_grad_full.empty() ? 0 : l % block_grad_full.size();
        grad_reduced[gs]->wait_on(compute);  // its last reduction has read (and zeroed) the buffer
        if (!plan.direct_grads && !zero_on_comm())
          be.zero(block_grad_full[gs].data(), block_grad_full[gs].bytes(), compute);
        float* grad = full_grad(1 + l);
        span = mark_begin("backward unit", 1 + l, Lane::Compute);
        if (N > 0) model->block_backward(l, p, lora ? UnitGrads{nullptr, grad} : UnitGrads{grad, nullptr}, B, T, compute);
        mark_end(span);
        done_with(1 + l);
        grad_ready[gs]->record(compute);
        grad_ready[gs]->wait_on(comm);
        reduce(1 + l, grad);
        if (zero_on_comm()) be.zero(block_grad_full[gs].data(), block_grad_full[gs].bytes(), comm);
        // Offloaded, the copy down may read the buffer itself (one fp32 shard): its stream says when it is free.
        grad_reduced[gs]->record(opt.cpu_offload ? offload.down : comm);
        // BACKWARD_POST: queued after this block's backward and reduce-scatter; it waits for the
        // buffer this block frees, so it is safe with a single buffer too.
        if (backward_prefetch == BackwardPrefetch::Post && l > 0) gather(l);
      }
      if (split) embedding_grad_begins();
      span = mark_begin("backward unit 0 (embedding)", -1, Lane::Compute);
      if (N > 0) model->embed_backward(root, tok, droot, B, T, compute);
      mark_end(span);
      root_grad_ready->record(compute);
      root_grad_ready->wait_on(comm);
      if (split) reduce_root_embedding();
      else reduce(0, full_grad(0));
      root_reduction_pending = true;
      if (opt.cpu_offload) offload_micro_step_ends();
    }
    return model->loss_sum(compute);
  }

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

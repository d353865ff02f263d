// FsdpEngine's state, shared by the engine's source files: the units' arrays and the Impl that the
// schedule (schedule.cpp, reductions.cpp) runs on, with short helpers; CPU offload's state is in offload.hpp.
#pragma once

#include <algorithm>
#include <functional>

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
  // Checkpoint staging of a device master and its optimizer state: empty until the first checkpoint_state.
  std::vector<float> host_master;
  std::vector<std::vector<float>> host_state;
  // LoRA: the unit's frozen base weights (EngineLayouts::frozen), this rank's slice in the compute dtype.
  FlatParameter frozen;
  DeviceArray frozen_slice;
};

struct FsdpEngine::Impl {
  Backend& be;
  std::unique_ptr<UnitModel> model;
  FsdpOptions opt;
  const FsdpBufferPlan& plan;
  Communicator& shard;
  Communicator& replicate;
  Stream compute, comm;
  // dist.replicate_stream: the replicate group again on a stream of its own, where a block's all-reduce
  // over the replicas and the add to its slice run (hand_to_replicas) while comm goes on with the next
  // unit's collectives. Null without it (then everything is on comm); never with cpu_offload.
  Communicator* replicate_overlap = nullptr;
  Stream rep = nullptr;
  std::unique_ptr<BackendEvent> rep_follows, rep_done, stage_released;
  bool rep_pending = false;  // rep has work that comm does not yet follow (follow_replicas)
  bool stage_held = false;   // rep reads stage_full (a non-fp32 reduction): comm waits before writing it
  // dist.gather_stream: the all-gathers' communicator and stream (the shard group once more, on a stream of
  // its own, so that a gather never queues behind a reduction); else the shard group on comm. Never with
  // cpu_offload or a staged gather (which shares stage_full with the reductions).
  Communicator* gatherer = nullptr;
  Stream gs = nullptr;
  StepTracer::Lane gather_lane = StepTracer::Lane::Comm;
  bool own_gather_stream() const { return gs != comm; }
  // The engine's streams, compute first: communication, the replicas' and the gathers' where they have their own
  // (offload's copy streams are its own: OffloadPolicy::copy_streams).
  std::vector<Stream> streams() const {
    std::vector<Stream> s{compute, comm};
    if (replicate_overlap) s.push_back(rep);
    if (own_gather_stream()) s.push_back(gs);
    return s;
  }
  bool host_memory;  // the backend's memory is host memory: no staging, no copies of the batch
  // The master and optimizer state are device memory: checkpoints go through the units' host staging.
  bool state_staged() const { return !host_memory && !opt.cpu_offload; }
  int L = 0;
  size_t max_tokens = 0;  // of a micro-batch
  bool forward_prefetch = false;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::None;
  std::vector<UnitLayout> layout;         // what is trained (EngineLayouts::trainable)
  std::vector<UnitLayout> frozen_layout;  // LoRA's frozen base (EngineLayouts::frozen), empty without LoRA
  bool lora = false;
  std::vector<Unit> units;

  DeviceArray root_full;
  // plan.root_overlap: the one allocation that root_full and root_grad_full lie in; table_read: compute, the
  // embedding's lookup has read the table (before the gradient buffer is zeroed on comm).
  DeviceArray root_shared;
  // plan.root_in_slices: the blocks' gradient slices, one allocation (root_shared lies in its start), and
  // whether they hold gradients a later step reads (from a reducing backward to the update or zero_grad).
  DeviceArray block_slices;
  bool slices_hold_grads = false;
  std::unique_ptr<BackendEvent> table_read;
  std::vector<DeviceArray> block_full;
  DeviceArray root_frozen_full;                 // LoRA: gathered frozen units (slots as block_full)
  std::vector<DeviceArray> block_frozen_full;
  std::vector<int> holder;      // per block buffer: the unit whose parameters it holds, or -1
  std::vector<bool> gathered;   // per unit: its gathered parameters are current
  std::vector<std::unique_ptr<BackendEvent>> slot_free, unit_gathered;
  DeviceArray root_grad_full, grad_slice, stage_full, stage_slice;
  std::vector<DeviceArray> block_grad_full;
  // dist.copy_engine_reductions (plan.exchange_numel): the shard group's exchange communicator
  // (ProcessGroups::shard_exchange), the one the blocks reduce through (null: NCCL's reduce-scatters), and
  // its window, into which the ranks exchange (pieces of) each other's parts (reduce_by_exchange). The block
  // gradients are then that group's windows.
  Communicator* exchange_group = nullptr;
  Communicator* exchanger = nullptr;
  DeviceArray exchange_window;
  std::vector<std::unique_ptr<BackendEvent>> grad_ready, grad_reduced;
  // plan.grads_in_head_scratch: the block-gradient buffers lie in the model's head scratch, grads_borrowed
  // bytes from its start, of which the head writes the first head_shared; head_wrote: it did since a
  // backward last zeroed them.
  size_t grads_borrowed = 0, head_shared = 0;
  bool head_wrote = false;
  // Before the head (or decoding's) runs on the compute stream: every reduction has read its buffer.
  void head_takes_scratch() {
    if (head_shared == 0) return;
    for (auto& e : grad_reduced) e->wait_on(compute);
    head_wrote = true;
  }
  // Before a backward's first block: what the head left where the gradients accumulate is zeroed (offloaded,
  // each buffer is zeroed before its block's backward anyway), buffer by buffer in the backward's order, on
  // the gather stream when it has its own (each buffer's grad_reduced then says it is zeroed), so that the
  // second buffer's zeroing overlaps the first block's backward.
  void grads_take_scratch_back();
  std::unique_ptr<BackendEvent> head_done;  // compute: the head has written the scratch (with head_shared)
  std::unique_ptr<BackendEvent> root_grad_ready, params_written, reductions_done;
  std::unique_ptr<BackendEvent> tail_ready;  // compute: the first block's MLP gradients are written (split_first_block)
  bool root_reduction_pending = false;
  // plan.root_split: this rank's token ids, the shard group's and every rank's (the shard group's when
  // not replicated), the rows' first occurrences, the packed rows; the head's part reduced (comm).
  DeviceArray split_ids, split_ids_shard, split_ids_all, split_first, split_packed, split_slots;
  std::unique_ptr<BackendEvent> head_reduced;
  // Per unit: its grad slice holds nothing of this step yet (zero_grad sets it instead of zeroing): the
  // first reduction writes the slice rather than adding to it (settle_fresh_grads zeroes the rest). With
  // fresh_grads and direct gradients, the first block backward writes it (UnitGrads::fresh).
  std::vector<char> grad_fresh;
  // fsdp.fresh_block_grads where the model writes a block's gradient whole (UnitModel::writes_fresh_block_grads;
  // not offloaded, not LoRA, whose blocks train adapters): no block-gradient memory is zeroed for it, neither
  // the slices under zero_grad (direct gradients) nor a buffer after its reduction; instead, per buffer, it
  // holds nothing to keep (zeroed, or read by its reduction), so the next block backward into it is fresh.
  bool fresh_grads = false;
  std::vector<char> grad_buffer_empty;
  // Whether block l's backward into gradient buffer gs (or its slice, direct) is fresh.
  bool block_grad_fresh(int l, size_t gs) const {
    if (!fresh_grads) return false;
    return plan.direct_grads ? grad_fresh[1 + static_cast<size_t>(l)] != 0 : grad_buffer_empty[gs] != 0;
  }
  std::unique_ptr<BackendEvent> root_zeroed;  // comm: root_grad_full is zero for this backward
  // fsdp.no_sync (plan.no_sync): whether the next micro-step is announced as its step's last
  // (FsdpEngine::last_micro_step); per unit, what a later micro-step (or reduce_pending) still owes: Full: its
  // full gradient holds micro-steps not reduced; Replicate: its slice holds micro-steps not all-reduced over the
  // replicate group.
  bool last_announced = false;
  std::vector<char> local_pending, replicate_pending;
  DeviceArray tokens, targets, norm;  // device copies of the micro-batch; the norm's fp64 sum
  // The step's last micro-step summed each unit's squares into `norm` on comm as its slice became final
  // (its last reduction landed; on one rank, its backward ended), so grad_norm waits for one copy, not a pass
  // over every slice.
  bool squares_taken = false;
  void take_squares(size_t u, Stream s) {
    be.sum_squares(units[u].grad.as<float>(), units[u].flat.shard_numel, norm.as<double>(), s);
  }
  DeviceArray starts;                 // packed rows' sample starts (device copy; data.packing only)

  class OffloadPolicy;                     // offload.hpp
  std::unique_ptr<OffloadPolicy> offload;  // cpu_offload only

  // The step timeline's spans (trace_begin .. trace_end); the host worker opens and closes spans too.
  StepTracer tracer;
  using Lane = StepTracer::Lane;

  DeviceArray decode_index;           // tokens, slots, positions, logit rows, next: max_rows each
  DeviceArray decode_logits;          // fp32 logits of up to decode_slots rows, made on the first step that asks
  std::vector<int32_t> decode_host;
  int decode_slots = 0, decode_max_len = 0, decode_max_rows = 0;

  // (Defined in fsdp_engine.cpp, where OffloadPolicy is complete.)
  Impl(Backend& backend, std::unique_ptr<UnitModel> m, EngineLayouts layouts, const FsdpOptions& o,
       const FsdpBufferPlan& p, ProcessGroups& groups, size_t tokens);
  ~Impl();

  size_t csize() const { return dtype_size(plan.compute_dtype); }
  // The construction's steps (fsdp_engine.cpp): each unit's flat parameter and slices (master, gradient,
  // compute copy, frozen base), initialised from the seed, with the slices the optimizer updates; then the
  // gathered and gradient buffers, events, the root split's and the staging buffers the plan sizes.
  std::vector<ParamSlice> make_units(Backend& state_be, bool state_on_host, uint64_t seed,
                                     const std::function<void(void*, size_t)>& pin_host);
  void allocate_buffers();
  // A buffer an all-gather sends from or lands in: the gathers' communicator's window memory where it has
  // some and the gathers send 16-bit values (dist.gather_copy_engine: the copy engines move the gather),
  // else the backend's.
  DeviceArray gather_memory(size_t bytes, MemKind kind = MemKind::Params);
  // `group`'s window memory where it has some (null: none asked), else the backend's. The block-gradient
  // buffers come from the shard group's (dist.symmetric_reductions: NCCL's symmetric reduce-scatters), or the
  // exchange group's (dist.copy_engine_reductions).
  DeviceArray window_or_backend(Communicator* group, size_t bytes, MemKind kind);
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
  // This rank's piece of unit u's gathered buffer (what a cast-at-gather writes and its all-gather sends).
  char* own_piece(size_t u) const {
    return static_cast<char*>(const_cast<void*>(full_params(u))) +
           static_cast<size_t>(shard.rank()) * units[u].flat.shard_numel * csize();
  }
  // gather's three parts: what must precede the collective (the buffer's turn, the cast into it), the
  // collectives, what follows them (the event the compute stream waits on).
  void gather_prepare(size_t u);
  void gather_issue(size_t u);
  void gather_finish(size_t u);
  // Without resharding every block has a buffer of its own, so the blocks' gathers need not wait for
  // the forward to reach them: at the first block's forward, those not current go at once, consecutive blocks
  // of at most kGatherGroupBytes together in one group of collectives, so that the host issues one call per
  // group (each gather's host work, 0.1-0.2 ms, exceeds what a small block's gather moves: BLOOM-560M's
  // forward at micro-batch 1 x 512 waited for it). A block larger than that goes alone, as before.
  static constexpr size_t kGatherGroupBytes = size_t{128} << 20;
  // (Never a staged gather: its units share one staging buffer. The CUDA backend computes in the parameters'
  // dtype, so its plans have none.)
  bool gathers_grouped() const {
    return opt.group_block_gathers && !plan.reshard && !plan.alias && !plan.staged_gather && forward_prefetch &&
           !offload && L > 1;
  }
  void gather_blocks_ahead();

  // The compute stream may use unit u's parameters from here on; done_with: it has finished with them.
  UnitParams use(size_t u);
  void done_with(size_t u);

  // New slices (an update, a load): every unit is gathered again, after they are written.
  void params_updated() {
    forget_gathers();
    gathers_follow_compute();
  }
  // Every gathered copy is stale.
  void forget_gathers() {
    std::fill(gathered.begin(), gathered.end(), false);
    std::fill(holder.begin(), holder.end(), -1);
  }
  // Gathers queued from here read what the compute stream has written so far.
  void gathers_follow_compute() {
    params_written->record(compute);
    params_written->wait_on(gs);
  }

  // The optimizer's update of every unit with h on the compute stream. The root, then (with forward
  // prefetch) the first block, update first and are gathered on the communication stream while the
  // rest updates, so the next forward finds both in place instead of waiting for their gathers.
  void update_and_gather_ahead(Optimizer& optimizer, const StepHyper& h);

  // Where the backward accumulates unit u's full fp32 gradient: the grad slice itself when the
  // gradients are direct, else the root's buffer or block l = u - 1's buffer l % grad_buffers.
  float* full_grad(size_t u) {
    if (plan.direct_grads) return units[u].grad.as<float>();
    return u == 0 ? root_grad() : block_grad_full[(u - 1) % block_grad_full.size()].as<float>();
  }
  // The root's full gradient addressed by root offsets: root_grad_full holds it from
  // plan.root_split.grad_from on (the head's part and after), so this points that many elements before.
  float* root_grad() { return elements_before(root_grad_full.as<float>(), plan.root_split.grad_from); }
  // Addressed by root offsets, where the embedding's backward writes the table's rows: the table's own
  // place in root_grad, or with grad_from the buffer's start (the head's part, reduced by then).
  float* table_grad() {
    const RootSplit& rs = plan.root_split;
    return rs.grad_from > 0 ? elements_before(root_grad_full.as<float>(), rs.table_offset) : root_grad();
  }
  static float* elements_before(float* p, size_t n) {
    return reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(p) - n * sizeof(float));
  }

  // Reduces unit u's full gradient into its slice on the communication stream: reduce-scatter over
  // the shard group, all-reduce over the replicate group, in reduce_dtype, then add to the slice.
  // (The step timeline's "reduce unit u" span; offloaded, OffloadPolicy::reduce marks its own.)
  // Returns the stream after whose work the slice is final and the full buffer read: comm, or rep
  // when the all-reduce was handed to the replicate stream.
  Stream reduce(size_t u, float* full);
  Stream reduce_into_slice(Unit& d, float* full);
  // d's grad slice += its reduced slice (in dt, widened), on s; the step's first writes it instead.
  void add_to_grad(Unit& d, const void* slice, DType dt, Stream s);
  // rep takes over from here (what comm has queued so far comes first); comm follows rep's work before
  // what it queues next (everything rep was handed is then done first).
  void hand_to_replicas();
  void follow_replicas();
  // comm is about to write stage_full: rep's all-reduce of a piece of it has finished.
  void stage_for_comm() {
    if (stage_held) stage_released->wait_on(comm), stage_held = false;
  }
  // Units whose grad slice no reduction wrote this step (none ran, or a partial one comes next) are
  // zeroed on stream s.
  void settle_fresh_grads(Stream s);
  // The full gradient buffers are zeroed on the communication stream after their reductions have read
  // them (off the compute stream); offloaded, the copies down read them: there the compute stream does it.
  bool zero_on_comm() const { return !offload && !plan.direct_grads; }
  // zero_on_comm: the root's full gradient zeroed on the communication stream for this backward.
  void zero_root_grad_on_comm() {
    if (plan.root_overlap > 0) table_read->wait_on(comm);
    be.zero(root_grad_full.data(), root_grad_full.bytes(), comm);
    root_zeroed->record(comm);
  }

  // Reduces elements [lo, hi) of unit d's full gradient as reduce_into_slice does the whole unit: each
  // rank's part of the range to it over the shard group, then over the replicate group, added to its slice
  // (zeroed first while it holds nothing of this step: grad_fresh).
  void reduce_range(Unit& d, float* full, size_t lo, size_t hi);
  // The reduce-scatter of a block's full fp32 gradient in place (this rank's part of `full`, n elements,
  // receives the group's sum) on the copy engines. Over two ranks in pieces of plan.exchange_numel elements: an
  // all-to-all moves each rank's piece of the other's part into the other's exchange_window, which adds it to
  // its own. Over more, one all-to-all of the whole gradient, and the peers' parts added in rank order.
  void reduce_by_exchange(float* full, size_t n);

  // plan.root_split, after the head's backward: the range it wrote is reduced now, behind the blocks'
  // backward; every rank's token ids are gathered and the rows they name marked for the embedding's part.
  // squares: the step's last micro-step, which takes the slice's squares as they become final (root_squares).
  void reduce_root_head(bool squares);
  const int32_t* token_ids_all() const {
    return (replicate.size() > 1 ? split_ids_all : split_ids_shard).as<int32_t>();
  }

  // plan.root_split, before the embedding's backward: it must not add to what the head's part reduced.
  void embedding_grad_begins();

  // plan.root_split, after the embedding's backward: the named rows and the embedding's other tensors,
  // packed, all-reduced and added to the slice.
  void reduce_root_embedding(bool squares);
  // plan.root_split, the step's last micro-step: the squares of the root's slice into `norm` (on comm) in two
  // parts, so that the norm waits only for the small one: after the head's part (!after_rows), every element
  // but the named token rows and the embedding's other tensors, which are final then; after the embedding's
  // part (after_rows), those.
  void root_squares(bool after_rows);

  // This micro-step reduces: every one but with no sync in full, where only the step's last does.
  bool reduces() const { return plan.no_sync != NoSync::Full || last_announced; }
  // With no sync for the replicas, this reduction leaves the replicate group's all-reduce for later.
  bool defers_replicate() const { return plan.no_sync == NoSync::Replicate && !last_announced; }
  // The replicate group's all-reduce of unit d's whole grad slice (in the reduce dtype), on comm.
  void all_reduce_replicas(Unit& d);
  // Before the slices are read: what no_sync left unreduced (a step whose last micro-step was not
  // announced) is reduced now, on comm.
  void reduce_pending();
  // A new step: gradients that no step consumed are dropped.
  void drop_pending();

  // Every stream done and, offloaded, the host worker idle.
  void idle();

  // The compute stream waits for the reductions (and offloaded, for the copies out of their buffers).
  void finish_reductions();
  void finish_root_reduction();

  // One micro-batch: the forward (and, with backward, the backward and its reductions); its loss sum.
  // Earlier micro-steps' loss left on the device (LossRead::later): run adds to it instead of zeroing it.
  bool loss_held = false;
  double run(const MicroBatch& mb, float grad_scale, bool backward, bool read_loss = true);
  // run()'s steps (schedule.cpp). What one backward does: reduce (or keep, no sync), split the root's
  // reduction, take the norm's squares as reductions land.
  struct BackwardPlan {
    bool reducing = false, split = false, squares = false;
  };
  // The micro-batch's token ids and targets where the model reads them (copied up unless host memory).
  std::pair<const int32_t*, const int32_t*> upload_batch(const MicroBatch& mb);
  void forward_blocks(int B, int T, bool backward);
  // Before the head's backward: zero the root's gradient, the split's token ids, prefetch the last block.
  void begin_backward(const MicroBatch& mb, const BackwardPlan& bp);
  void backward_blocks(int B, int T, const BackwardPlan& bp);
  // The first block's reduction is the one nothing hides (the backward ends with it). Where the model splits
  // its backward (UnitModel::backward_tail_begin), the block's MLP part [tail, end) is reduced as soon as the
  // model has queued its gradients, beside the block's attention backward, and only [0, tail) after it: the
  // element `tail` where this micro-step does so, else 0. Each part goes as reduce_range does the root's
  // head part: to its owners over the shard group. Only a block reduced over the shard group alone (no
  // replicas, no offload, no LoRA) and on more than one rank.
  size_t split_first_block(const BackwardPlan& bp) const;
  // Part [lo, hi) of unit u's full gradient reduced into its slice (reduce_range), traced as `what` (a literal).
  void reduce_part(size_t u, float* full, size_t lo, size_t hi, const char* what);
  void backward_embedding(const UnitParams& root, const int32_t* tok, const UnitGrads& droot, int B, int T,
                          const BackwardPlan& bp);
};

}  // namespace shardlm

// FsdpEngine's schedule of one micro-batch (Impl::run): each unit gathered before its use and
// resharded after, gathers prefetched ahead, each unit's reduction queued behind its backward (the
// reductions themselves: reductions.cpp), and the update that gathers the first units ahead.
#include <algorithm>

#include "offload.hpp"

namespace shardlm {

void FsdpEngine::Impl::gather(size_t u) {
  // (One rank reads its slices in place, the frozen ones too: plan.alias implies plan.frozen_alias.)
  if (plan.alias || gathered[u]) return;
  if (u == 0 && plan.root_overlap > 0) {
    // The gathered table lies in the head's gradient buffer (plan.root_overlap): the root's reduction has
    // read it and the compute stream is done with the head's part before the gather writes either again.
    SHARDLM_CHECK(!plan.root_in_slices || !slices_hold_grads,
                  "FsdpEngine: the root is gathered into the first blocks' gradient slices (FsdpBufferPlan::root_in_slices), "
                  "which hold this step's gradients until the optimizer step or zero_grad: one micro-step a step with it");
    finish_root_reduction();
    gathers_follow_compute();
  }
  gather_prepare(u);
  const int span = tracer.mark_begin("all-gather unit", static_cast<long>(u), gather_lane);
  gather_issue(u);
  tracer.mark_end(span);
  gather_finish(u);
}

void FsdpEngine::Impl::gather_prepare(size_t u) {
  if (u > 0) {
    const size_t sl = slot(u);
    if (holder[sl] >= 0) gathered[holder[sl]] = false;  // evicted from the shared buffer
    slot_free[sl]->wait_on(gs);  // the buffer's previous block has finished computing
    holder[sl] = static_cast<int>(u);
  }
  if (offload) offload->await_upload(u, gs);
  const Unit& d = units[u];
  const size_t n = d.flat.shard_numel;
  if (plan.staged_gather) {
    // Cast the slice to param_dtype first, so the gather moves 16-bit values; the model reads fp32.
    be.cast(d.master.data(), DType::F32, stage_slice.data(), opt.param_dtype, n, gs);
  } else if (plan.cast_at_gather) {
    // In place: NCCL reads this rank's part of the receive buffer when send == recv + rank * count.
    be.cast(d.master.data(), DType::F32, own_piece(u), plan.compute_dtype, n, gs);
  }
}

void FsdpEngine::Impl::gather_issue(size_t u) {
  const Unit& d = units[u];
  const size_t n = d.flat.shard_numel;
  char* full = static_cast<char*>(const_cast<void*>(full_params(u)));
  if (plan.staged_gather) {
    gatherer->all_gather(stage_slice.data(), stage_full.data(), n, opt.param_dtype);
    be.cast(stage_full.data(), opt.param_dtype, full, plan.compute_dtype, d.flat.padded_numel, gs);
  } else if (plan.cast_at_gather) {
    gatherer->all_gather(own_piece(u), full, n, plan.compute_dtype);
  } else {
    gatherer->all_gather(plan.compute_slice ? d.compute.data() : d.master.data(), full, n, plan.compute_dtype);
  }
  if (lora && !plan.frozen_alias)
    gatherer->all_gather(d.frozen_slice.data(), const_cast<void*>(full_frozen(u)), d.frozen.shard_numel,
                         plan.compute_dtype);
}

void FsdpEngine::Impl::gather_finish(size_t u) {
  unit_gathered[u]->record(gs);
  gathered[u] = true;
}

void FsdpEngine::Impl::gather_blocks_ahead() {
  const size_t unit_bytes = plan.block_padded * csize() + (lora ? plan.frozen_block_padded * csize() : 0);
  const size_t per_group = std::max<size_t>(1, kGatherGroupBytes / std::max<size_t>(1, unit_bytes));
  if (per_group < 2) return;  // large blocks: one at a time, behind the forward, as without grouping
  std::vector<size_t> todo;
  for (size_t u = 1; u <= static_cast<size_t>(L); ++u)
    if (!gathered[u]) todo.push_back(u);
  for (size_t first = 0; first < todo.size(); first += per_group) {
    const size_t last = std::min(todo.size(), first + per_group);
    for (size_t i = first; i < last; ++i) gather_prepare(todo[i]);
    const int span = tracer.mark_begin("all-gather units from", static_cast<long>(todo[first]), gather_lane);
    gatherer->group_begin();
    for (size_t i = first; i < last; ++i) gather_issue(todo[i]);
    gatherer->group_end();
    tracer.mark_end(span);
    for (size_t i = first; i < last; ++i) gather_finish(todo[i]);
  }
}

UnitParams FsdpEngine::Impl::use(size_t u) {
  gather(u);
  if (!plan.alias) unit_gathered[u]->wait_on(compute);
  else if (offload) offload->await_upload(u, compute);  // the model reads the compute slice itself
  return unit_params(u);
}

void FsdpEngine::Impl::done_with(size_t u) {
  if (!plan.alias && u > 0) slot_free[slot(u)]->record(compute);
}

void FsdpEngine::Impl::update_and_gather_ahead(Optimizer& optimizer, const StepHyper& h) {
  forget_gathers();
  // The first blocks' slices the root is gathered into (plan.root_in_slices) are read by their update first.
  const size_t under = plan.root_in_slices ? plan.slices_under_root : 0;
  if (under > 0) optimizer.update_slices(1, 1 + under, h, compute);
  slices_hold_grads = false;
  size_t ahead = 0;
  if (be.asynchronous() && !plan.alias) ahead = std::min<size_t>(units.size(), forward_prefetch && can_prefetch() ? 2 : 1);
  for (size_t u = 0; u < ahead; ++u) {
    if (u == 0 || u > under) optimizer.update_slices(u, u + 1, h, compute);
    gathers_follow_compute();
    gather(u);
  }
  if (under > 0 && ahead == 0) optimizer.update_slices(0, 1, h, compute);  // (the root: not among those ahead)
  optimizer.update_slices(under > 0 ? std::max(ahead, 1 + under) : ahead, units.size(), h, compute);
  gathers_follow_compute();
}

void FsdpEngine::Impl::idle() {
  if (offload) offload->idle();
  for (Stream s : streams()) be.synchronize(s);
}

std::pair<const int32_t*, const int32_t*> FsdpEngine::Impl::upload_batch(const MicroBatch& mb) {
  const size_t N = static_cast<size_t>(mb.batch) * mb.seq;
  const int32_t* tok = mb.tokens.data();
  const int32_t* tgt = mb.targets.data();
  const bool packed = !mb.starts.empty();
  const int32_t* starts_in = packed ? mb.starts.data() : nullptr;
  if (!host_memory) {
    be.copy(tokens.data(), tok, N * sizeof(int32_t), CopyKind::HostToDevice, compute);
    be.copy(targets.data(), tgt, N * sizeof(int32_t), CopyKind::HostToDevice, compute);
    if (packed) be.copy(starts.data(), starts_in, N * sizeof(int32_t), CopyKind::HostToDevice, compute);
    tok = tokens.as<int32_t>(), tgt = targets.as<int32_t>();
    if (packed) starts_in = starts.as<int32_t>();
  }
  model->set_sample_starts(starts_in);
  return {tok, tgt};
}

void FsdpEngine::Impl::forward_blocks(int B, int T, bool backward) {
  const bool any = B > 0 && T > 0;
  if (gathers_grouped()) gather_blocks_ahead();
  for (int l = 0; l < L; ++l) {
    const UnitParams p = use(1 + l);
    // Forward prefetch: the next block's gather runs during this one (it needs a buffer of its own).
    if (forward_prefetch && can_prefetch() && l + 1 < L) gather(2 + l);
    // Behind the forward's last gathers, the root's full gradient is zeroed for this backward (unless it
    // holds earlier micro-steps' gradients, no sync).
    if (backward && zero_on_comm() && !local_pending[0] && l + 1 == L) zero_root_grad_on_comm();
    const int span = tracer.mark_begin("forward unit", 1 + l, Lane::Compute);
    if (any) model->block_forward(l, p, B, T, compute);
    tracer.mark_end(span);
    done_with(1 + l);
  }
}

void FsdpEngine::Impl::begin_backward(const MicroBatch& mb, const BackwardPlan& bp) {
  if (bp.squares) be.zero(norm.data(), sizeof(double), comm);
  const bool zero_root = !local_pending[0];
  if (zero_on_comm() && zero_root && L == 0) zero_root_grad_on_comm();
  // The previous micro-batch's root reduction reads root_grad_full (and split, the token ids).
  finish_root_reduction();
  if (zero_on_comm() && zero_root) root_zeroed->wait_on(compute);
  else if (!zero_on_comm() && !plan.direct_grads) be.zero(root_grad_full.data(), root_grad_full.bytes(), compute);
  if (bp.split) {
    // This rank's token ids for the embedding's part of the root's reduction (zeros pad: row 0).
    be.zero(split_ids.data(), split_ids.bytes(), compute);
    be.copy(split_ids.data(), mb.tokens.data(), static_cast<size_t>(mb.batch) * mb.seq * sizeof(int32_t),
            CopyKind::HostToDevice, compute);
  }
  if (L > 0 && backward_prefetch != BackwardPrefetch::None) gather(L);  // the last block (usually still held)
}

void FsdpEngine::Impl::grads_take_scratch_back() {
  const bool wrote = head_wrote && zero_on_comm();
  head_wrote = false;
  if (!wrote) return;
  const int n = static_cast<int>(block_grad_full.size());
  const size_t each = block_grad_full[0].bytes();
  // A buffer the next block's backward writes whole (fresh_grads, nothing pending in it) keeps what the head
  // left: no zeroing for the backward to wait for (0.5 ms a step on the 8B shape on 2 GPUs).
  auto needs_zeros = [&](size_t i) { return i * each < head_shared && !(fresh_grads && grad_buffer_empty[i]); };
  bool any = false;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) any |= needs_zeros(i);
  if (!any) return;
  const Stream s = own_gather_stream() ? gs : compute;
  if (s != compute) head_done->record(compute), head_done->wait_on(s);
  for (int k = 0; k < n; ++k) {
    const size_t i = static_cast<size_t>(((L - 1 - k) % n + n) % n);  // the buffer of block L - 1 - k
    const size_t begin = i * each, end = std::min(head_shared, begin + each);
    if (!needs_zeros(i)) continue;
    const int span = tracer.mark_begin("zero block gradients (the head's scratch)", -1,
                                       s == compute ? Lane::Compute : gather_lane);
    be.zero(block_grad_full[i].data(), end - begin, s);
    tracer.mark_end(span);
    if (s != compute) grad_reduced[i]->record(s);
  }
}

size_t FsdpEngine::Impl::split_first_block(const BackwardPlan& bp) const {
  if (!opt.split_first_block || !bp.reducing || offload || plan.direct_grads || lora || L == 0 || shard.size() < 2 ||
      replicate.size() > 1)
    return 0;
  const size_t tail = model->backward_tail_begin();
  return tail < units[1].flat.numel ? tail : 0;
}

void FsdpEngine::Impl::backward_blocks(int B, int T, const BackwardPlan& bp) {
  const bool any = B > 0 && T > 0;
  const size_t tail = split_first_block(bp);
  grads_take_scratch_back();
  for (int l = L - 1; l >= 0; --l) {
    const UnitParams p = use(1 + l);
    // BACKWARD_PRE: the previous block's gather is queued before this block's backward (and its
    // reduce-scatter), so it overlaps this block's compute.
    if (backward_prefetch == BackwardPrefetch::Pre && can_prefetch() && l > 0) gather(l);
    const size_t gs = block_grad_full.empty() ? 0 : l % block_grad_full.size();
    // Its last reduction has read (and zeroed) the buffer. Direct gradients share no buffer: each backward writes its
    // own slice, so the previous unit's squares (comm) run beside this backward instead of before it.
    if (!plan.direct_grads) grad_reduced[gs]->wait_on(compute);
    if (!plan.direct_grads && !zero_on_comm()) be.zero(block_grad_full[gs].data(), block_grad_full[gs].bytes(), compute);
    float* grad = full_grad(1 + l);
    UnitGrads grads = lora ? UnitGrads{nullptr, grad} : UnitGrads{grad, nullptr};
    grads.fresh = block_grad_fresh(l, gs);
    // (Every rank splits alike, one without tokens too: its backward queues nothing, and reduces both parts after.)
    const bool split = l == 0 && tail > 0;
    bool tail_reduced = false;
    const auto reduce_tail = [&] {
      reduce_part(1, grad, tail, units[1].flat.padded_numel, "reduce unit 1 (MLP part)");
      tail_reduced = true;
    };
    // The hook holds references to this iteration's locals: set for this block's backward alone.
    struct HookSet {
      UnitModel* model;
      ~HookSet() {
        if (model) model->set_backward_tail_hook({});
      }
    } hook_set{split ? model.get() : nullptr};
    if (split)
      model->set_backward_tail_hook([&] {
        tail_ready->record(compute);
        tail_ready->wait_on(comm);
        reduce_tail();
      });
    const int span = tracer.mark_begin("backward unit", 1 + l, Lane::Compute);
    if (any) model->block_backward(l, p, grads, B, T, compute);
    else if (grads.fresh) be.zero(grad, units[1 + l].flat.padded_numel * sizeof(float), compute);  // nothing written
    tracer.mark_end(span);
    if (fresh_grads) (plan.direct_grads ? grad_fresh[1 + l] : grad_buffer_empty[gs]) = 0;
    done_with(1 + l);
    if (bp.reducing) {
      grad_ready[gs]->record(compute);
      grad_ready[gs]->wait_on(comm);
      if (split && !tail_reduced) reduce_tail();  // a backward that did not call the hook (no tokens)
      if (split) reduce_part(1, grad, 0, tail, "reduce unit 1 (attention part)");
      const Stream done = split ? comm : reduce(1 + l, grad);
      if (bp.squares) take_squares(1 + l, done);
      // Read by its reduction: zeroed for the next block's backward to add to, or left for it to write whole.
      if (zero_on_comm()) {
        if (fresh_grads) grad_buffer_empty[gs] = 1;
        else be.zero(block_grad_full[gs].data(), block_grad_full[gs].bytes(), done);
      }
      // Offloaded, the copy down may read the buffer itself (one fp32 shard): its stream says when it is free.
      grad_reduced[gs]->record(offload ? offload->grad_readers() : done);
    }
    local_pending[1 + l] = !bp.reducing;
    // BACKWARD_POST: queued after this block's backward and reduce-scatter; it waits for the
    // buffer this block frees, so it is safe with a single buffer too.
    if (backward_prefetch == BackwardPrefetch::Post && l > 0) gather(l);
  }
}

void FsdpEngine::Impl::backward_embedding(const UnitParams& root, const int32_t* tok, const UnitGrads& droot, int B,
                                          int T, const BackwardPlan& bp) {
  if (bp.split) embedding_grad_begins();
  const int span = tracer.mark_begin("backward unit 0 (embedding)", -1, Lane::Compute);
  // With the root split's grad_from, the table's rows go where the head's part was (reduced by now), or with
  // rows_packed into their packed rows: each token's row there is its slot, the table's start the packed rows'.
  // (grad_from is never set where a micro-step may leave the root unreduced: split is on here.)
  const RootSplit& rs = plan.root_split;
  const bool packed = bp.split && rs.rows_packed;
  const UnitGrads dtable = packed             ? UnitGrads{elements_before(split_packed.as<float>(), rs.table_offset)}
                           : rs.grad_from > 0 ? UnitGrads{table_grad()}
                                              : droot;
  const int32_t* rows = packed ? split_slots.as<int32_t>() : tok;
  if (B > 0 && T > 0) model->embed_backward(root, rows, dtable, B, T, compute);
  tracer.mark_end(span);
  if (bp.reducing) {
    root_grad_ready->record(compute);
    root_grad_ready->wait_on(comm);
    if (bp.split) reduce_root_embedding(bp.squares);
    else reduce(0, full_grad(0));
    if (bp.squares && !bp.split) take_squares(0, comm);
    squares_taken = bp.squares;
    root_reduction_pending = true;
  }
  local_pending[0] = !bp.reducing;
}

double FsdpEngine::Impl::run(const MicroBatch& mb, float grad_scale, bool backward, bool read_loss) {
  const int B = mb.batch, T = mb.seq;
  const size_t N = static_cast<size_t>(B) * T;
  SHARDLM_CHECK(N <= max_tokens, "micro-batch of ", B, " x ", T, " tokens exceeds the planned ", max_tokens);
  SHARDLM_CHECK(mb.starts.empty() || model->config().packed, "a packed micro-batch for a model not built for packing");
  if (offload) offload->micro_step_begins(backward);
  const auto [tok, tgt] = upload_batch(mb);
  if (!loss_held) model->reset_loss(compute);

  const UnitParams root = use(0);
  if (L > 0 && forward_prefetch) gather(1);
  int span = tracer.mark_begin("forward unit 0 (embedding)", -1, Lane::Compute);
  if (N > 0) model->embed_forward(root, tok, B, T, compute);
  if (plan.root_overlap > 0) table_read->record(compute);
  tracer.mark_end(span);
  forward_blocks(B, T, backward);
  // No sync in full: a micro-step before the step's last reduces nothing, and its gradients stay in the
  // full buffers for the next to add to (local_pending). The step's last micro-step (announced) takes
  // each unit's squares as its reduction lands (a device engine), on one rank (direct gradients) as its
  // backward ends: on the communication stream, beside the next unit's backward.
  BackwardPlan bp;
  bp.reducing = reduces();
  bp.split = backward && plan.root_split.on && bp.reducing;
  bp.squares = backward && bp.reducing && last_announced && !offload && !host_memory;
  if (backward) begin_backward(mb, bp);
  // With LoRA only the root's saved modules (lora.modules_to_save) form gradients; none without them.
  UnitGrads droot;
  if (backward && !lora) droot.base = full_grad(0);
  if (backward && lora && units[0].flat.numel > 0) droot.adapter = full_grad(0);
  span = tracer.mark_begin(backward ? "forward and backward unit 0 (head, loss)" : "forward unit 0 (head, loss)", -1,
                           Lane::Compute);
  if (N > 0) head_takes_scratch(), model->head(root, tgt, B, T, grad_scale, backward, droot, compute);
  tracer.mark_end(span);
  if (bp.split) reduce_root_head(bp.squares);
  if (backward) {
    backward_blocks(B, T, bp);
    backward_embedding(root, tok, droot, B, T, bp);
    if (offload) offload->micro_step_ends();
    // The head's gradient (and the table's) went where the gathered table was: gathered again before its next use.
    if (plan.root_overlap > 0) gathered[0] = false;
    if (bp.reducing) slices_hold_grads = true;
  }
  // Read, the loss costs a wait for the device (the CUDA backend copies it back and synchronizes).
  loss_held = !read_loss;
  return read_loss ? model->loss_sum(compute) : 0.0;
}

}  // namespace shardlm

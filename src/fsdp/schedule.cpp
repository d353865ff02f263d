// FsdpEngine's schedule of one micro-batch (Impl::run): each unit gathered before its use and
// resharded after, gathers prefetched ahead, gradients reduced into the slices behind the backward
// (the root's split in its head and embedding parts), and the update that gathers the first units ahead.
#include <algorithm>

#include "offload.hpp"

namespace shardlm {

void FsdpEngine::Impl::gather(size_t u) {
  // (One rank reads its slices in place, the frozen ones too: plan.alias implies plan.frozen_alias.)
  if (plan.alias || gathered[u]) return;
  if (u > 0) {
    const size_t sl = slot(u);
    if (holder[sl] >= 0) gathered[holder[sl]] = false;  // evicted from the shared buffer
    slot_free[sl]->wait_on(gs);  // the buffer's previous block has finished computing
    holder[sl] = static_cast<int>(u);
  }
  if (offload) offload->await_upload(u, gs);
  const int span = tracer.mark_begin("all-gather unit", static_cast<long>(u), gather_lane);
  const Unit& d = units[u];
  const size_t n = d.flat.shard_numel;
  char* full = static_cast<char*>(const_cast<void*>(full_params(u)));
  if (plan.staged_gather) {
    // Cast the slice to param_dtype first, so the gather moves 16-bit values; the model reads fp32.
    be.cast(d.master.data(), DType::F32, stage_slice.data(), opt.param_dtype, n, gs);
    gatherer->all_gather(stage_slice.data(), stage_full.data(), n, opt.param_dtype);
    be.cast(stage_full.data(), opt.param_dtype, full, plan.compute_dtype, d.flat.padded_numel, gs);
  } else if (plan.cast_at_gather) {
    // In place: NCCL reads this rank's part of the receive buffer when send == recv + rank * count.
    char* mine = full + static_cast<size_t>(shard.rank()) * n * csize();
    be.cast(d.master.data(), DType::F32, mine, plan.compute_dtype, n, gs);
    gatherer->all_gather(mine, full, n, plan.compute_dtype);
  } else {
    gatherer->all_gather(plan.compute_slice ? d.compute.data() : d.master.data(), full, n, plan.compute_dtype);
  }
  if (lora && !plan.frozen_alias)
    gatherer->all_gather(d.frozen_slice.data(), const_cast<void*>(full_frozen(u)), d.frozen.shard_numel,
                         plan.compute_dtype);
  tracer.mark_end(span);
  unit_gathered[u]->record(gs);
  gathered[u] = true;
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
  size_t ahead = 0;
  if (be.asynchronous() && !plan.alias) ahead = std::min<size_t>(units.size(), forward_prefetch && can_prefetch() ? 2 : 1);
  for (size_t u = 0; u < ahead; ++u) {
    optimizer.update_slices(u, u + 1, h, compute);
    gathers_follow_compute();
    gather(u);
  }
  optimizer.update_slices(ahead, units.size(), h, compute);
  gathers_follow_compute();
}

Stream FsdpEngine::Impl::reduce(size_t u, float* full) {
  if (offload) return offload->reduce(u, full), comm;
  if (plan.direct_grads) return comm;  // the backward wrote into the slice itself
  Unit& d = units[u];
  if (d.flat.numel == 0) return comm;  // nothing trained in it (LoRA's root)
  const int span = tracer.mark_begin("reduce unit", static_cast<long>(u), Lane::Comm);
  const Stream done = reduce_into_slice(d, full);
  tracer.mark_end(span);
  return done;
}

Stream FsdpEngine::Impl::reduce_into_slice(Unit& d, float* full) {
  const size_t u = static_cast<size_t>(&d - units.data()), n = d.flat.shard_numel;
  const DType rdt = opt.reduce_dtype;
  // No sync for the replicas: the slice sums the micro-steps, all-reduced once in the step's last. (The
  // root's split parts all-reduce as they go, so its head part does too.)
  const bool replicas = replicate.size() > 1;
  const bool defer = replicas && defers_replicate() && !(u == 0 && plan.root_split.on);
  const bool owed = replicas && replicate_pending[u];
  char* send = reinterpret_cast<char*>(full);
  if (rdt != DType::F32) {
    stage_for_comm();
    be.cast(full, DType::F32, stage_full.data(), rdt, d.flat.padded_numel, comm);
    send = stage_full.as<char>();
  }
  // Reduce-scattered in place: this rank's piece of the full buffer receives the group's sum (the
  // buffer is zeroed, or the root's rewritten, before it is written again), so no slice-sized staging.
  char* slice = send + static_cast<size_t>(shard.rank()) * n * dtype_size(rdt);
  // A block's gradient (a window of the exchange group; fp32, as the plan gives the exchange only then)
  // through the copy engines; the root's through NCCL.
  if (exchanger && u > 0)
    reduce_by_exchange(full, n);
  else if (shard.size() > 1)
    shard.reduce_scatter(send, slice, n, rdt, ReduceOp::Sum);
  const bool all_reduce = replicas && !defer && !owed;
  // A block's all-reduce over the replicas and its add on the replicate stream, while comm goes on to
  // the next unit's gather and reduce-scatter. (The root's reductions stay on comm.)
  if (all_reduce && replicate_overlap && u > 0) {
    hand_to_replicas();
    const int span = tracer.mark_begin("all-reduce unit", static_cast<long>(u), Lane::Replicate);
    replicate_overlap->all_reduce(slice, n, rdt, ReduceOp::Sum);
    add_to_grad(d, slice, rdt, rep);
    tracer.mark_end(span);
    if (rdt != DType::F32) stage_released->record(rep), stage_held = true;
    return rep;
  }
  if (all_reduce) replicate.all_reduce(slice, n, rdt, ReduceOp::Sum);
  add_to_grad(d, slice, rdt, comm);
  if (defer) {
    replicate_pending[u] = 1;
  } else if (owed) {
    all_reduce_replicas(d);
    replicate_pending[u] = 0;
  }
  return comm;
}

void FsdpEngine::Impl::reduce_by_exchange(float* full, size_t n) {
  const size_t me = static_cast<size_t>(exchanger->rank()), other = 1 - me, piece = plan.exchange_numel;
  float* mine = full + me * n;
  const float* theirs = full + other * n;
  float* window = exchange_window.as<float>();
  // Each piece: an all-to-all of two runs of count elements a rank, the run for the other rank being this
  // rank's piece of the other's part: rank 1 sends from that piece (the run after it goes to itself, unused),
  // rank 0 from count elements before it (that run goes to itself, unused). The other's piece of this rank's
  // part lands in the window at other * count and is added to this rank's own, in place (a + b: NCCL's sum
  // of two). The next all-to-all overwrites the window after the add (the same stream). (Only the window's
  // offsets are the same on both ranks; the copy engines read each rank's send where it is.)
  for (size_t off = 0; off < n; off += piece) {
    const size_t count = std::min(piece, n - off);
    const float* send = me == 0 ? theirs + off - count : theirs + off;
    exchanger->all_to_all(send, window, count, DType::F32);
    be.accumulate(mine + off, window + other * count, DType::F32, count, comm);
  }
}

void FsdpEngine::Impl::hand_to_replicas() {
  rep_follows->record(comm);
  rep_follows->wait_on(rep);
  rep_pending = true;
}

void FsdpEngine::Impl::follow_replicas() {
  if (!rep_pending) return;
  rep_done->record(rep);
  rep_done->wait_on(comm);
  rep_pending = stage_held = false;
}

void FsdpEngine::Impl::all_reduce_replicas(Unit& d) {
  const size_t n = d.flat.shard_numel;
  const DType rdt = opt.reduce_dtype;
  if (rdt == DType::F32) return replicate.all_reduce(d.grad.data(), n, DType::F32, ReduceOp::Sum);
  stage_for_comm();
  be.cast(d.grad.data(), DType::F32, stage_full.data(), rdt, n, comm);
  replicate.all_reduce(stage_full.data(), n, rdt, ReduceOp::Sum);
  be.cast(stage_full.data(), rdt, d.grad.data(), DType::F32, n, comm);
}

void FsdpEngine::Impl::reduce_pending() {
  const auto any = [](const std::vector<char>& v) { return std::find(v.begin(), v.end(), 1) != v.end(); };
  if (!any(local_pending) && !any(replicate_pending)) return;
  root_grad_ready->record(compute);  // the backward has written the full gradients
  root_grad_ready->wait_on(comm);
  for (size_t u = 0; u < units.size(); ++u) {
    if (local_pending[u]) {
      const Stream done = reduce(u, full_grad(u));
      local_pending[u] = 0;
      if (u > 0) {
        const size_t gs = (u - 1) % block_grad_full.size();
        be.zero(block_grad_full[gs].data(), block_grad_full[gs].bytes(), done);
        grad_reduced[gs]->record(done);
      }
    }
    if (replicate_pending[u]) all_reduce_replicas(units[u]), replicate_pending[u] = 0;
  }
  root_reduction_pending = true;  // the next backward zeroes the root's full gradient after this
}

void FsdpEngine::Impl::drop_pending() {
  last_announced = false;
  squares_taken = false;
  for (size_t u = 1; u < units.size(); ++u)
    if (local_pending[u]) {
      const DeviceArray& g = block_grad_full[(u - 1) % block_grad_full.size()];
      be.zero(g.data(), g.bytes(), compute);
    }
  std::fill(local_pending.begin(), local_pending.end(), 0);  // the root's is zeroed by the next backward
  std::fill(replicate_pending.begin(), replicate_pending.end(), 0);  // fresh slices are overwritten
}

void FsdpEngine::Impl::add_to_grad(Unit& d, const void* slice, DType dt, Stream s) {
  char& fresh = grad_fresh[static_cast<size_t>(&d - units.data())];
  if (fresh) be.cast(slice, dt, d.grad.data(), DType::F32, d.flat.shard_numel, s);
  else be.accumulate(d.grad.as<float>(), slice, dt, d.flat.shard_numel, s);
  fresh = 0;
}

void FsdpEngine::Impl::settle_fresh_grads(Stream s) {
  for (size_t u = 0; u < units.size(); ++u)
    if (grad_fresh[u]) be.zero(units[u].grad.data(), units[u].grad.bytes(), s), grad_fresh[u] = 0;
}

void FsdpEngine::Impl::reduce_range(Unit& d, float* full, size_t lo, size_t hi) {
  // The slice is written in parts, each added: a slice with nothing of this step yet is zeroed first.
  char& fresh = grad_fresh[static_cast<size_t>(&d - units.data())];
  if (fresh) be.zero(d.grad.data(), d.grad.bytes(), comm), fresh = 0;
  const size_t n = d.flat.shard_numel;
  const int S = shard.size(), me = shard.rank();
  const DType rdt = opt.reduce_dtype;
  const size_t rsize = dtype_size(rdt);
  char* send = reinterpret_cast<char*>(full);
  if (rdt != DType::F32) {
    stage_for_comm();
    be.cast(full + lo, DType::F32, stage_full.as<char>() + lo * rsize, rdt, hi - lo, comm);
    send = stage_full.as<char>();
  }
  // Each rank's part of the range reduced in place on that rank (no slice-sized staging), the parts at
  // once (Communicator::reduce_pieces).
  std::vector<size_t> offsets(static_cast<size_t>(S), 0), counts(static_cast<size_t>(S), 0);
  for (int r = 0; r < S; ++r) {
    const size_t begin = static_cast<size_t>(r) * n, a = std::max(lo, begin), b = std::min(hi, begin + n);
    if (a < b) offsets[r] = a, counts[r] = b - a;
  }
  if (S > 1) shard.reduce_pieces(send, offsets, counts, rdt, ReduceOp::Sum);
  const size_t my_lo = offsets[me], my_hi = my_lo + counts[me];
  if (my_hi <= my_lo) return;
  const size_t mine = my_lo - static_cast<size_t>(me) * n;
  char* reduced = send + my_lo * rsize;
  if (replicate.size() > 1) replicate.all_reduce(reduced, my_hi - my_lo, rdt, ReduceOp::Sum);
  be.accumulate(d.grad.as<float>() + mine, reduced, rdt, my_hi - my_lo, comm);
}

void FsdpEngine::Impl::reduce_root_head(bool squares) {
  const RootSplit& rs = plan.root_split;
  Unit& d = units[0];
  root_grad_ready->record(compute);
  root_grad_ready->wait_on(comm);
  const int span = tracer.mark_begin("reduce unit 0 (head)", -1, Lane::Comm);
  if (rs.head_begin == 0 && rs.head_end >= d.flat.numel) {
    reduce_into_slice(d, root_grad());
  } else {
    reduce_range(d, root_grad(), rs.head_begin, rs.head_end);
  }
  // (int32 ids travel as 4-byte words: a gather copies them bit for bit.)
  shard.all_gather(split_ids.data(), split_ids_shard.data(), rs.token_capacity, DType::F32);
  if (replicate.size() > 1)
    replicate.all_gather(split_ids_shard.data(), split_ids_all.data(), rs.shard_ids, DType::F32);
  be.rows_mark_first(token_ids_all(), rs.id_capacity, split_first.as<int32_t>(), rs.table_rows, comm);
  if (squares) root_squares(false);
  tracer.mark_end(span);
  head_reduced->record(comm);
}

void FsdpEngine::Impl::root_squares(bool after_rows) {
  const RootSplit& rs = plan.root_split;
  Unit& d = units[0];
  const size_t n = d.flat.shard_numel, begin = static_cast<size_t>(shard.rank()) * n;
  float* slice = d.grad.as<float>();
  double* sum = norm.as<double>();
  // Root ranges in the slice's indices, clipped to it.
  const auto in_slice = [&](size_t lo, size_t hi) {
    const size_t a = std::clamp(lo, begin, begin + n) - begin, b = std::clamp(hi, begin, begin + n) - begin;
    return std::pair<size_t, size_t>{a, std::max(a, b)};
  };
  const auto [e_lo, e_hi] = in_slice(rs.extras_begin, rs.extras_end);
  const long long pos = static_cast<long long>(rs.table_offset) - static_cast<long long>(begin);
  be.rows_sum_squares(rs.width, token_ids_all(), split_first.as<int32_t>(), rs.id_capacity, rs.table_rows, slice, pos, n,
                      after_rows, sum, comm);
  if (after_rows) {
    if (e_lo < e_hi) be.sum_squares(slice + e_lo, e_hi - e_lo, sum, comm);
    return;
  }
  // The rest of the slice: outside the table and the embedding's other tensors.
  auto [t_lo, t_hi] = in_slice(rs.table_offset, rs.table_offset + rs.table_rows * rs.width);
  std::pair<size_t, size_t> cut[2] = {{t_lo, t_hi}, {e_lo, e_hi}};
  if (cut[1].first < cut[0].first) std::swap(cut[0], cut[1]);
  size_t at = 0;
  for (const auto& [lo, hi] : cut) {
    if (lo >= hi) continue;
    if (at < lo) be.sum_squares(slice + at, lo - at, sum, comm);
    at = std::max(at, hi);
  }
  if (at < n) be.sum_squares(slice + at, n - at, sum, comm);
}

void FsdpEngine::Impl::embedding_grad_begins() {
  const RootSplit& rs = plan.root_split;
  head_reduced->wait_on(compute);
  // Tied, the head's gradient of the named rows went with the head's part; with grad_from the rows are
  // written over that part.
  if (rs.table_in_head || rs.grad_from > 0)
    be.rows_zero(table_grad() + rs.table_offset, rs.width, token_ids_all(), rs.id_capacity, rs.table_rows, compute);
  // No sync in full: the head's part was the whole root, the embedding's other tensors with what the
  // earlier micro-steps left in them; the embedding's part carries this micro-step's alone.
  if (plan.no_sync == NoSync::Full && rs.extras_end > rs.extras_begin)
    be.zero(root_grad() + rs.extras_begin, (rs.extras_end - rs.extras_begin) * sizeof(float), compute);
}

void FsdpEngine::Impl::reduce_root_embedding(bool squares) {
  const RootSplit& rs = plan.root_split;
  Unit& d = units[0];
  const DType rdt = opt.reduce_dtype;
  const size_t rsize = dtype_size(rdt), extras = rs.extras_end - rs.extras_begin;
  float* full = root_grad();
  const int32_t* ids = token_ids_all();
  int32_t* first = split_first.as<int32_t>();
  const int span = tracer.mark_begin("reduce unit 0 (embedding rows)", -1, Lane::Comm);
  be.rows_pack(table_grad() + rs.table_offset, rs.width, ids, first, rs.id_capacity, rs.table_rows, split_packed.data(), rdt,
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
  if (squares) root_squares(true);
  be.zero(first, split_first.bytes(), comm);  // for the next micro-step's marks
  tracer.mark_end(span);
}

void FsdpEngine::Impl::idle() {
  if (offload) offload->idle();
  be.synchronize(compute);
  be.synchronize(comm);
  if (replicate_overlap) be.synchronize(rep);
  if (own_gather_stream()) be.synchronize(gs);
}

void FsdpEngine::Impl::finish_reductions() {
  follow_replicas();
  reductions_done->record(offload ? offload->follow_reductions() : comm);
  reductions_done->wait_on(compute);
}

void FsdpEngine::Impl::finish_root_reduction() {
  if (!root_reduction_pending) return;
  finish_reductions();
  root_reduction_pending = false;
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
  const Stream s = own_gather_stream() ? gs : compute;
  if (s != compute) head_done->record(compute), head_done->wait_on(s);
  const int n = static_cast<int>(block_grad_full.size());
  const size_t each = block_grad_full[0].bytes();
  for (int k = 0; k < n; ++k) {
    const size_t i = static_cast<size_t>(((L - 1 - k) % n + n) % n);  // the buffer of block L - 1 - k
    const size_t begin = i * each, end = std::min(head_shared, begin + each);
    if (end <= begin) continue;
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

void FsdpEngine::Impl::reduce_part(size_t u, float* full, size_t lo, size_t hi, const char* what) {
  const int span = tracer.mark_begin(what, -1, Lane::Comm);
  reduce_range(units[u], full, lo, hi);
  tracer.mark_end(span);
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
    grad_reduced[gs]->wait_on(compute);  // its last reduction has read (and zeroed) the buffer
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
  // With the root split's grad_from, the table's rows go where the head's part was (reduced by now).
  // (grad_from is never set where a micro-step may leave the root unreduced: split is on here.)
  const UnitGrads dtable = plan.root_split.grad_from > 0 ? UnitGrads{table_grad()} : droot;
  if (B > 0 && T > 0) model->embed_backward(root, tok, dtable, B, T, compute);
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

double FsdpEngine::Impl::run(const MicroBatch& mb, float grad_scale, bool backward) {
  const int B = mb.batch, T = mb.seq;
  const size_t N = static_cast<size_t>(B) * T;
  SHARDLM_CHECK(N <= max_tokens, "micro-batch of ", B, " x ", T, " tokens exceeds the planned ", max_tokens);
  SHARDLM_CHECK(mb.starts.empty() || model->config().packed, "a packed micro-batch for a model not built for packing");
  if (offload) offload->micro_step_begins(backward);
  const auto [tok, tgt] = upload_batch(mb);
  model->reset_loss(compute);

  const UnitParams root = use(0);
  if (L > 0 && forward_prefetch) gather(1);
  int span = tracer.mark_begin("forward unit 0 (embedding)", -1, Lane::Compute);
  if (N > 0) model->embed_forward(root, tok, B, T, compute);
  tracer.mark_end(span);
  forward_blocks(B, T, backward);
  // No sync in full: a micro-step before the step's last reduces nothing, and its gradients stay in the
  // full buffers for the next to add to (local_pending). The step's last micro-step (announced) takes
  // each unit's squares as its reduction lands (a device engine whose slices the reductions write).
  BackwardPlan bp;
  bp.reducing = reduces();
  bp.split = backward && plan.root_split.on && bp.reducing;
  bp.squares = backward && bp.reducing && last_announced && !offload && !host_memory && !plan.direct_grads;
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
  }
  return model->loss_sum(compute);
}

}  // namespace shardlm

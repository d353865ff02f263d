// FsdpEngine's gradient reductions (what the schedule, schedule.cpp, calls behind the backward): a unit's
// full gradient reduce-scattered into its slice (NCCL, or the copy-engine exchange) and all-reduced
// over the replicas; a range of it reduced to its owners (the first block's parts); the root's split in its
// head and embedding parts, with the norm's squares around them; what no_sync left for later; the waits that
// say the slices are final.
#include <algorithm>

#include "offload.hpp"

namespace shardlm {

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
  const size_t ranks = static_cast<size_t>(exchanger->size()), me = static_cast<size_t>(exchanger->rank());
  float* mine = full + me * n;
  float* window = exchange_window.as<float>();
  if (ranks > 2) {
    // More than two ranks: one all-to-all of the whole gradient (the plan's piece is the slice): part q goes to
    // rank q, and rank q's piece of this rank's part lands at window + q * n (this rank's own too, unused). The
    // peers' pieces are added to this rank's own in rank order, the same order on every replica.
    SHARDLM_CHECK(plan.exchange_numel == n, "reduce_by_exchange: ", ranks, " ranks exchange whole slices, not pieces of ",
                  plan.exchange_numel, " of ", n, " elements");
    exchanger->all_to_all(full, window, n, DType::F32);
    for (size_t q = 0; q < ranks; ++q)
      if (q != me) be.accumulate(mine, window + q * n, DType::F32, n, comm);
    return;
  }
  const size_t other = 1 - me, piece = plan.exchange_numel;
  const float* theirs = full + other * n;
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
  be.rows_sum_squares(rs.width, token_ids_all(), split_first.as<int32_t>(), rs.id_capacity, rs.table_rows, slice,
                      pos, n, after_rows, sum, comm);
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
  // written over that part, or (rows_packed) into their packed rows, zeroed here.
  if (rs.rows_packed) {
    be.zero(split_packed.data(), rs.id_capacity * rs.width * sizeof(float), compute);
    be.rows_slots(split_ids.as<int32_t>(), rs.token_capacity, split_first.as<int32_t>(), rs.id_capacity, rs.table_rows,
                  split_slots.as<int32_t>(), compute);
  } else if (rs.table_in_head || rs.grad_from > 0) {
    be.rows_zero(table_grad() + rs.table_offset, rs.width, token_ids_all(), rs.id_capacity, rs.table_rows, compute);
  }
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
  if (!rs.rows_packed)  // (else the embedding's backward wrote them there)
    be.rows_pack(table_grad() + rs.table_offset, rs.width, ids, first, rs.id_capacity, rs.table_rows, split_packed.data(),
                 rdt, comm);
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

void FsdpEngine::Impl::reduce_part(size_t u, float* full, size_t lo, size_t hi, const char* what) {
  const int span = tracer.mark_begin(what, -1, Lane::Comm);
  reduce_range(units[u], full, lo, hi);
  tracer.mark_end(span);
}

}  // namespace shardlm

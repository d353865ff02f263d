// The layout of one rank's engine buffers, as a pure function shared by FsdpEngine and `shardlm plan`.
#include <algorithm>

#include "shardlm/fsdp.hpp"

namespace shardlm {

size_t shard_numel_of(size_t numel, int shard_size) {
  SHARDLM_CHECK(shard_size >= 1, "shard group size must be >= 1 (got ", shard_size, ")");
  return (numel + shard_size - 1) / shard_size;
}

FsdpOptions fsdp_options(const FsdpSection& deck) {
  FsdpOptions o;
  static_cast<FsdpSection&>(o) = deck;
  if (!o.cpu_offload) o.offload_root_update = OffloadRootUpdate::Host;
  return o;
}

size_t FsdpOptions::offload_resident_bytes() const {
  if (!cpu_offload || !(offload_resident_gib > 0)) return 0;
  const double bytes = offload_resident_gib * double(size_t(1) << 30);
  return bytes >= 1e18 ? size_t(1e18) : static_cast<size_t>(bytes);
}

void plan_grad_buffers(FsdpBufferPlan& p, const FsdpOptions& opt, size_t head_scratch_bytes) {
  // (Two: an asynchronous engine that reshards; one a block already with no sync in full.)
  if (opt.cpu_offload || !p.grads_in_head_scratch || p.grad_buffers != 2 || p.block_padded == 0) return;
  const size_t fit = head_scratch_bytes / (p.block_padded * sizeof(float));
  p.grad_buffers = std::max<size_t>(2, std::min(fit, p.layers));
}

ModelConfig model_for_engine(const ModelConfig& model, const FsdpOptions& opt) {
  ModelConfig m = model;
  if (m.head_chunk_tokens == 0 && opt.cpu_offload) m.head_chunk_tokens = kOffloadHeadChunkTokens;
  return m;
}

EngineLayouts engine_layouts(const ModelConfig& cfg) {
  EngineLayouts l;
  if (cfg.lora.enabled()) {
    l.trainable = lora_layout(cfg);
    l.frozen = lora_frozen_layout(cfg);
  } else {
    l.trainable = model_layout(cfg);
  }
  return l;
}

namespace {

// fsdp.no_sync as a run with these options and groups carries it out (FsdpBufferPlan::no_sync).
NoSync resolve_no_sync(const std::vector<UnitLayout>& layout, const std::vector<UnitLayout>& frozen,
                       const FsdpOptions& opt, int shard_size, int replicate_size, DType compute_dtype,
                       bool direct_grads) {
  // Offloaded, the reductions feed the host's sums (offload.cpp); one rank in all has nothing to reduce.
  if (opt.no_sync == NoSync::Off || opt.cpu_offload || direct_grads) return NoSync::Off;
  NoSync want = opt.no_sync;
  if (want == NoSync::Auto) {
    if (opt.accumulation <= 1) return NoSync::Off;
    // The whole model gathered in the compute dtype, and the trainable part's fp32 gradient.
    size_t bytes = 0;
    for (const UnitLayout& l : layout) bytes += l.numel * (dtype_size(compute_dtype) + sizeof(float));
    for (const UnitLayout& l : frozen) bytes += l.numel * dtype_size(compute_dtype);
    want = bytes <= kNoSyncAutoBytes ? NoSync::Full : NoSync::Replicate;
  }
  // One shard: the slice is the whole gradient already, so no sync in full is the replicas' part alone.
  if (want == NoSync::Full && shard_size == 1) want = NoSync::Replicate;
  if (want == NoSync::Replicate && replicate_size == 1) return NoSync::Off;
  return want;
}

// The copy-engine exchange (dist.copy_engine_reductions): an fp32 block reduction on a device over the shard
// group, for a block slice of at most kExchangeMaxSliceBytes. Over two ranks through a window of at most
// kExchangeWindowBytes, in pieces (whole pieces of 64 elements, so that every piece starts 256-byte aligned);
// over more, in one all-to-all of the whole block gradient, so only where a block's fp32 gradient fits that
// window (an all-to-all sends each peer a run as long as the one it receives: pieces of the parts, which lie a
// slice apart, would need a copy to line them up).
void plan_exchange(FsdpBufferPlan& p, const FsdpOptions& opt, int shard_size, bool asynchronous) {
  const size_t block_shard = p.block_padded / static_cast<size_t>(shard_size);
  if (!opt.copy_engine_reductions || !asynchronous || shard_size < 2 || opt.reduce_dtype != DType::F32 ||
      opt.cpu_offload || p.grad_buffers == 0 || block_shard * sizeof(float) > kExchangeMaxSliceBytes)
    return;
  const size_t window = opt.exchange_window_bytes > 0 ? opt.exchange_window_bytes : kExchangeWindowBytes;
  if (shard_size > 2) {
    if (p.block_padded * sizeof(float) > window) return;
    p.exchange_numel = block_shard;
  } else {
    const size_t most = window / (sizeof(float) * static_cast<size_t>(shard_size)) / 64 * 64;
    p.exchange_numel = std::min(block_shard, std::max<size_t>(most, 64));
  }
  p.exchange_bytes = p.exchange_numel * sizeof(float) * static_cast<size_t>(shard_size);
}

}  // namespace

FsdpBufferPlan fsdp_buffer_plan(const std::vector<UnitLayout>& layout, const std::vector<UnitLayout>& frozen,
                                const FsdpOptions& opt, int shard_size, int replicate_size, bool asynchronous,
                                DType compute_dtype) {
  SHARDLM_CHECK(!layout.empty(), "fsdp_buffer_plan: a layout without a root unit");
  SHARDLM_CHECK(opt.reduce_dtype == DType::F32 || opt.reduce_dtype == opt.param_dtype || !asynchronous,
                "fsdp.reduce_dtype = ", dtype_name(opt.reduce_dtype), ": the CUDA backend reduces in fp32 or in fsdp.param_dtype");
  FsdpBufferPlan p;
  p.compute_dtype = compute_dtype;
  auto padded = [&](size_t u) { return shard_numel_of(layout[u].numel, shard_size) * shard_size; };
  // Every block has the same layout: block 0 stands for all of them.
  p.layers = layout.size() - 1;
  p.root_padded = padded(0);
  p.block_padded = p.layers > 0 ? padded(1) : 0;
  p.max_padded = std::max(p.root_padded, p.block_padded);
  p.max_shard = p.max_padded / shard_size;
  p.reshard = reshards_after_forward(opt.strategy);

  const bool same_dtype = compute_dtype == opt.param_dtype;
  p.staged_gather = !same_dtype;
  SHARDLM_CHECK(!p.staged_gather || (!asynchronous && compute_dtype == DType::F32),
                "fsdp_buffer_plan: only a synchronous fp32 backend gathers through staging");
  // One rank holds whole units: the model reads the slice, or its copy in the compute dtype.
  p.alias = shard_size == 1 && same_dtype;
  // Offloaded, the master stays on the host and the gathers send this copy.
  p.compute_slice = same_dtype && (opt.cpu_offload || (shard_size == 1 && opt.param_dtype != DType::F32));
  // Sharded, the gathers cast the fp32 master into their own buffer: no 16-bit copy of the slice.
  p.cast_at_gather = !p.alias && !p.compute_slice && same_dtype && opt.param_dtype != DType::F32;
  SHARDLM_CHECK(!opt.cpu_offload || same_dtype, "fsdp.cpu_offload: the backend computes in ", dtype_name(compute_dtype),
                ", not in fsdp.param_dtype = ", dtype_name(opt.param_dtype));
  // Offloaded, the gradients leave through per-unit buffers: no fp32 slice to accumulate into directly.
  p.direct_grads = asynchronous && shard_size == 1 && replicate_size == 1 && !opt.cpu_offload;
  // Offloaded, fp32 slices on the device only to sum the micro-steps there (fsdp.offload_accumulate).
  p.grad_slices = !opt.cpu_offload || opt.offload_accumulate_on_device();

  p.no_sync = resolve_no_sync(layout, frozen, opt, shard_size, replicate_size, compute_dtype, p.direct_grads);
  // No sync in full: every block keeps its gathered parameters and its full gradient through the step.
  if (p.no_sync == NoSync::Full) p.reshard = false;

  // Resharding, the blocks take turns in a few gathered buffers (the trainable and the frozen parts alike): one
  // when synchronous, else limit_all_gathers so that the next block's gather overlaps this block's compute.
  const size_t turns = asynchronous ? static_cast<size_t>(std::max(1, opt.limit_all_gathers)) : 1;
  auto gathered_copies = [&](size_t block_padded) {
    return block_padded == 0 ? 0 : p.reshard ? std::min(turns, p.layers) : p.layers;
  };
  if (!p.alias) p.block_copies = gathered_copies(p.block_padded);
  if (!p.direct_grads) {
    p.grad_buffers = p.block_padded == 0 ? 0 : p.no_sync == NoSync::Full ? p.layers : asynchronous ? 2 : 1;
    p.grads_in_head_scratch = opt.share_head_scratch && p.grad_buffers > 0 && p.no_sync != NoSync::Full;
    // No receive buffer: the reductions land in place, in this rank's piece of the full gradient (of
    // its 16-bit staging); offloaded: the landing buffers below.
    p.grad_slice = 0;
  }
  plan_exchange(p, opt, shard_size, asynchronous);
  // 16-bit staging: a full unit (gather receive, reduce send and in-place receive) and, for a staged
  // gather, a slice (its send).
  size_t elem = 0;
  if (p.staged_gather) elem = dtype_size(opt.param_dtype);
  if (opt.reduce_dtype != DType::F32 && !p.direct_grads) elem = std::max(elem, dtype_size(opt.reduce_dtype));
  p.stage_full = p.max_padded * elem;
  p.stage_slice = p.staged_gather ? p.max_shard * dtype_size(opt.param_dtype) : 0;
  if (opt.cpu_offload) {
    const size_t rsize = dtype_size(opt.reduce_dtype), csize = dtype_size(compute_dtype);
    // The 16-bit reduce-scatter sends a cast full unit and receives into a landing buffer; one shard
    // casts straight into the landing buffer.
    p.stage_full = opt.reduce_dtype != DType::F32 && shard_size > 1 ? p.max_padded * rsize : 0;
    p.stage_slice = 0;
    p.offload_slice = shard_size > 1 || opt.reduce_dtype != DType::F32 ? p.max_shard * rsize : 0;
    p.offload_landing = p.max_shard * rsize;
    p.offload_chunk = std::min(kOffloadChunk, p.max_shard);
    p.offload_stage = csize == sizeof(float) ? 0 : p.offload_chunk * csize;
    p.offload_squares = layout.size() * sizeof(double);
    // The root's update on the device keeps the first offload_resident elements of its master and AdamW's
    // two moments on the device and streams the rest through two buffers.
    const size_t root_shard = p.root_padded / shard_size;
    if (opt.offload_root_update != OffloadRootUpdate::Host && opt.optimizer == Optim::AdamWTorch &&
        !opt.moments_in_files() && layout[0].numel > 0) {
      p.offload_stream_chunk = std::min(opt.offload_stream_chunk > 0 ? opt.offload_stream_chunk : kOffloadStreamChunk, root_shard);
      p.offload_resident = std::min(root_shard, opt.offload_resident_bytes() / kRootStateBytes);
      p.offload_stream = p.offload_resident < root_shard ? p.offload_stream_chunk * kRootStateBytes : 0;
    }
  }
  if (!frozen.empty()) {
    SHARDLM_CHECK(frozen.size() == layout.size(), "fsdp_buffer_plan: ", frozen.size(), " frozen units for ",
                  layout.size(), " trainable ones");
    auto frozen_padded = [&](size_t u) { return shard_numel_of(frozen[u].numel, shard_size) * shard_size; };
    p.frozen_root_padded = frozen_padded(0);
    p.frozen_block_padded = p.layers > 0 ? frozen_padded(1) : 0;
    // Stored in the compute dtype, so one rank reads its slices whatever the trainable part does.
    p.frozen_alias = shard_size == 1;
    if (!p.frozen_alias) p.frozen_block_copies = gathered_copies(p.frozen_block_padded);
  }
  return p;
}

namespace {

RootSplit root_split_of(const ModelConfig& cfg, const UnitLayout& root, const FsdpOptions& opt, int shard_size,
                        int replicate_size, size_t max_tokens, NoSync no_sync) {
  RootSplit r;
  // LoRA trains a few saved root modules at most; offloaded, the root's reduction has its own path.
  if (opt.root_reduction == RootReduction::Whole || cfg.lora.enabled() || opt.cpu_offload ||
      shard_size * replicate_size == 1 || max_tokens == 0)
    return r;
  const ModelFamily& family = model_family(cfg.arch);
  const TensorSpec* table = nullptr;
  for (const TensorSpec& t : root.tensors)
    if (t.name == family.embedding_table && t.shape.size() == 2) table = &t;
  if (!table) return r;
  const bool tied = family.head_always_tied || cfg.tie_word_embeddings;
  auto extra = [&](const TensorSpec& t) {
    return std::find(family.embedding_extras.begin(), family.embedding_extras.end(), t.name) != family.embedding_extras.end();
  };
  size_t head_begin = root.numel, head_end = 0, extras_begin = root.numel, extras_end = 0;
  for (const TensorSpec& t : root.tensors) {
    if (extra(t)) {
      extras_begin = std::min(extras_begin, t.offset), extras_end = std::max(extras_end, t.offset + t.numel);
    } else if (&t != table || tied) {
      head_begin = std::min(head_begin, t.offset), head_end = std::max(head_end, t.offset + t.numel);
    }
  }
  if (extras_end <= extras_begin) extras_begin = extras_end = 0;
  if (head_end <= head_begin) return r;
  r.table_rows = static_cast<size_t>(table->shape[0]);
  r.width = static_cast<size_t>(table->shape[1]);
  r.token_capacity = max_tokens;
  r.shard_ids = static_cast<size_t>(shard_size) * max_tokens;
  r.id_capacity = static_cast<size_t>(shard_size) * static_cast<size_t>(replicate_size) * max_tokens;
  // The packed rows are all-reduced (twice the bytes a reduce-scatter moves per element): under half the
  // table, or the whole root's one reduction at the end moves less.
  if (opt.root_reduction == RootReduction::Auto && 2 * r.id_capacity > r.table_rows) return RootSplit{};
  r.on = true;
  r.head_begin = head_begin, r.head_end = head_end;
  r.table_offset = table->offset;
  r.table_in_head = tied;
  if (no_sync == NoSync::Full) {
    // The last micro-step reduces the whole root after the head's backward (one reduce-scatter): what
    // the earlier micro-steps left in the table and the embedding's other tensors is complete then; the
    // rows of the last micro-step's tokens and those tensors are zeroed and wait for its embedding
    // backward (Impl::embedding_grad_begins).
    r.head_begin = 0, r.head_end = root.numel;
    r.table_in_head = true;
  }
  r.extras_begin = extras_begin, r.extras_end = extras_end;
  // The table before the head's part and no larger than it: its rows can be written where the head's
  // gradient was, after that was reduced (not with no_sync full, where both hold earlier micro-steps').
  const size_t table_numel = r.table_rows * r.width;
  if (!r.table_in_head && extras_end == 0 && table->offset + table_numel <= head_begin &&
      table_numel <= root.numel - head_begin)
    r.grad_from = head_begin;
  // (The slots are the model's token ids in its embedding's backward: inside the vocabulary.)
  r.rows_packed = opt.rows_packed && r.grad_from > 0 && opt.reduce_dtype == DType::F32 && r.id_capacity <= r.table_rows;
  return r;
}

}  // namespace

void plan_root_split(FsdpBufferPlan& plan, const ModelConfig& cfg, const UnitLayout& root, const FsdpOptions& opt,
                     int shard_size, int replicate_size, size_t max_tokens) {
  plan.root_split = root_split_of(cfg, root, opt, shard_size, replicate_size, max_tokens, plan.no_sync);
  plan.root_split_bytes = plan.root_split.bytes(opt.reduce_dtype);
}

void plan_root_overlap(FsdpBufferPlan& plan, const FsdpOptions& opt) {
  const RootSplit& rs = plan.root_split;
  // With accumulation the root stays gathered from one micro-step to the next instead: gathering it again before
  // each lookup would put a root's gather (about 1 GB a rank on the 8B shape on two GPUs) in front of every
  // micro-step.
  if (!opt.table_in_head_grad || plan.alias || plan.direct_grads || rs.grad_from == 0 || opt.accumulation > 1) return;
  // Everything of the root before grad_from (the head's part) is the table: root_split_of sets grad_from
  // only where no other tensor precedes the head's part.
  constexpr size_t kAlign = 256;
  const size_t grad_bytes = plan.root_grad_numel() * sizeof(float);
  const size_t table_bytes = rs.grad_from * dtype_size(plan.compute_dtype);
  const size_t offset = (grad_bytes - std::min(grad_bytes, table_bytes) + kAlign - 1) / kAlign * kAlign;
  if (offset >= grad_bytes) return;
  plan.root_full_offset = offset;
  plan.root_overlap = grad_bytes - offset;
}

void plan_root_in_slices(FsdpBufferPlan& plan, const FsdpOptions& opt, int shard_size, int replicate_size) {
  // (The blocks' reductions add into their slices on the comm stream, the exchange's too, after the head's part:
  // the replicas' on their own stream.)
  // (One micro-step a step: a later micro-step's forward would gather the root over the gradients it keeps.)
  if (!opt.root_in_grad_slices || plan.root_overlap == 0 || !plan.root_split.rows_packed || replicate_size > 1 ||
      !plan.grad_slices || opt.cpu_offload || plan.layers == 0 || opt.accumulation > 1)
    return;
  constexpr size_t kAlign = 256;
  const size_t stride = (plan.block_padded / shard_size * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  const size_t under = (plan.root_shared_bytes() + stride - 1) / stride;
  if (2 * under > plan.layers) return;
  plan.root_in_slices = true;
  plan.slice_stride = stride;
  plan.slices_under_root = under;
}

FsdpBufferPlan engine_buffer_plan(const EngineLayouts& layouts, const ModelConfig& cfg, const FsdpOptions& opt,
                                  int shard_size, int replicate_size, bool asynchronous, DType compute_dtype,
                                  size_t max_tokens, size_t head_scratch_bytes) {
  FsdpBufferPlan plan =
      fsdp_buffer_plan(layouts.trainable, layouts.frozen, opt, shard_size, replicate_size, asynchronous, compute_dtype);
  plan_root_split(plan, cfg, layouts.trainable[0], opt, shard_size, replicate_size, max_tokens);
  plan_root_overlap(plan, opt);
  plan_root_in_slices(plan, opt, shard_size, replicate_size);
  plan_grad_buffers(plan, opt, head_scratch_bytes);
  return plan;
}

}  // namespace shardlm

// fsdp: flat parameters (one per wrapped unit), sharding strategies, the gather / use / reshard /
// reduce schedule and the optimizer step written once over the backend interface, mixed
// precision, CPU offload, planned buffers and the memory plan of `shardlm plan`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"
#include "shardlm/device.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/io.hpp"
#include "shardlm/model.hpp"
#include "shardlm/optim.hpp"

namespace shardlm {

// One unit's tensors concatenated and padded to a multiple of the shard group size; this rank
// owns the contiguous slice [shard_begin, shard_begin + shard_numel). A description only: the
// engine holds the slice's arrays on its backend.
struct FlatParameter {
  const UnitLayout* layout = nullptr;
  size_t numel = 0;
  size_t padded_numel = 0;
  size_t shard_numel = 0;
  size_t shard_begin = 0;
  // [begin, end) ranges of the slice, relative to shard_begin, that take no weight decay.
  std::vector<std::pair<size_t, size_t>> no_decay;
};
FlatParameter make_flat_parameter(const UnitLayout& layout, int shard_rank, int shard_size);
// This rank's slice of `f` as a checkpoint sees it (the padded tail of the last slices holds no parameters),
// its values at `param`; no optimizer state yet.
UnitState slice_state(const FlatParameter& f, bool primary, float* param);
// Elements of one rank's slice of a unit of `numel` elements padded to a multiple of shard_size.
size_t shard_numel_of(size_t numel, int shard_size);

// The engine's options: the deck's [fsdp] section as it is (its keys declared once, in
// src/config/keys_fsdp.cpp), what the run derives beside it, and what the keys mean together. Built from
// the section (fsdp_options), never field by field, so a new [fsdp] key reaches the engine by itself.
struct FsdpOptions : FsdpSection {
  FsdpOptions() { offload_root_update = OffloadRootUpdate::Host; }  // as fsdp_options gives without cpu_offload
  Optim optimizer = Optim::AdamWTorch;  // train.optim (not an [fsdp] key): what the engine updates its slices with
  int accumulation = 1;             // micro-steps of an optimizer step (the deck's accumulation)
  // Elements of one chunk of the root's update on the device (0: kOffloadStreamChunk; tests set less).
  size_t offload_stream_chunk = 0;
  // The block-gradient buffers may live in the model's head scratch (FsdpBufferPlan::grads_in_head_scratch);
  // tests turn it off to compare.
  bool share_head_scratch = true;
  // The gathered embedding table may lie in the head's fp32 gradient buffer (FsdpBufferPlan::root_overlap);
  // tests turn it off to compare.
  bool table_in_head_grad = true;
  // The embedding's backward may add its rows straight into the packed rows of the root's split reduction
  // (RootSplit::rows_packed); tests turn it off to compare.
  bool rows_packed = true;
  // The first block's reduction may go in two parts, its MLP's beside its attention's backward
  // (Impl::split_first_block); tests turn it off to compare.
  bool split_first_block = true;
  // Where every block keeps a buffer of its own (no resharding) and the gathers prefetch: the blocks' gathers
  // issued together at the first block's forward, a few blocks to each NCCL group (Impl::gather_blocks_ahead);
  // tests turn it off to compare.
  bool group_block_gathers = true;
  // dist.copy_engine_reductions where it can apply (a CUDA run whose shard group is on one host): the blocks'
  // reductions over a shard group of two or more on one host as copy-engine exchanges through a window
  // (FsdpBufferPlan::exchange_numel). The engine resolves it to whether it got one (ProcessGroups::shard_exchange's).
  bool copy_engine_reductions = false;
  size_t exchange_window_bytes = 0;  // its window's size (0: kExchangeWindowBytes; tests set less)

  // fsdp.offload_dir set with cpu_offload: AdamW's moments in mapped files.
  bool moments_in_files() const { return cpu_offload && !offload_dir.empty(); }
  // fsdp.offload_accumulate = device with cpu_offload: the micro-steps' reduced gradients are summed in an
  // fp32 slice on the device, which goes down once a step (offload.cpp).
  bool offload_accumulate_on_device() const { return cpu_offload && offload_accumulate == OffloadAccumulate::Device; }
  // fsdp.offload_resident_gib in bytes with cpu_offload: the device memory in which the first elements of the
  // root's master and moments stay resident when it updates on the device (12 bytes an element with AdamW);
  // 0: none. With offload_root_update = auto, any makes the engine choose Device.
  size_t offload_resident_bytes() const;
  // fsdp.offload_root_update is where the root unit's AdamW runs with cpu_offload (Host without): the engine
  // resolves Auto when it starts (a timed copy each way over the host link, kOffloadRootLinkGBs); `shardlm
  // plan` counts Auto as Device. Only AdamW updates it on the device (its fp32 moments stream in chunks);
  // another optimizer resolves Auto to Host.
};

// Bytes this rank holds, by role, for the per-rank report and `plan`.
struct FsdpMemory {
  size_t master_shard = 0;      // master slices (and compute-dtype copies of them; LoRA's frozen slices)
  size_t grad_shard = 0;        // fp32 grad slices (none on the device with CPU offload)
  size_t full_params = 0;       // gathered-parameter buffers
  size_t full_grads = 0;        // unsharded-gradient buffers
  size_t comm_staging = 0;      // reduced slices and 16-bit staging
  size_t activations = 0;       // the model's activations and workspaces
  size_t model_params = 0;      // parameters of the whole model (not per rank), for comparison
  size_t trainable_params = 0;  // of them trained (LoRA: the adapters; else all)
};

// Bytes an element of the root's update on the device moves or keeps: its fp32 master and AdamW's two
// fp32 moments (only AdamW updates the root there: FsdpOptions::offload_root_update).
constexpr size_t kRootStateBytes = 3 * sizeof(float);
// fsdp.no_sync = auto chooses Full when the whole model's gathered parameters and fp32 gradients (the
// trainable part's) take at most this many bytes: a BLOOM-560M (3.4 GB) or a Llama-3.2-1B (7.4 GB),
// not a Llama-8B (48 GB).
constexpr size_t kNoSyncAutoBytes = size_t(16) << 30;

// How the engine lays out one rank's buffers: a pure function of the layout, the options, the
// groups and the backend's nature, shared by FsdpEngine and `shardlm plan` so they cannot drift.
// Sizes are elements.
// The root unit's gradient reduced in two parts (a family with ModelFamily::embedding_table, several
// ranks, no LoRA or CPU offload): the range the head's backward writes (final norm, LM head; the tied
// table too) right after that backward, behind the blocks' backward; then the embedding's part, which is
// only the rows of the micro-batches' tokens and the small tensors beside them: every rank's token ids
// are gathered, the rows they name packed into one buffer with those tensors, all-reduced, and added to
// the slices. Pays when the rows are under half the table (else one reduction of the whole root at the
// end, as before). Offsets and sizes are elements of the root's flat parameter.
struct RootSplit {
  bool on = false;
  size_t head_begin = 0, head_end = 0;     // what the head's backward writes (hull)
  size_t table_offset = 0, table_rows = 0, width = 0;
  bool table_in_head = false;              // tied: the head wrote the table too; its token rows are zeroed after
  size_t extras_begin = 0, extras_end = 0; // the embedding's other tensors (hull; empty when none)
  size_t token_capacity = 0;               // token ids of one rank's micro-batch
  size_t shard_ids = 0;                    // of the shard group's (shard x token_capacity)
  size_t id_capacity = 0;                  // of every rank's (x replicate)
  // Untied and reducing every micro-step: the root's full gradient buffer starts at the head's part
  // (grad_from, an element offset in the root) and the table's rows reuse its first table_rows x width
  // elements once that part is reduced (the micro-step's rows zeroed first), so the table has no fp32
  // buffer of its own. 0: the buffer is the whole root.
  size_t grad_from = 0;
  // With grad_from and fp32 reductions: the embedding's backward adds each token's row straight into its
  // packed row (the row's first occurrence among every rank's ids: Backend::rows_slots), so the table's rows
  // are never written where the head's part was (that buffer is done once the head's part is reduced).
  bool rows_packed = false;
  size_t packed_numel() const { return id_capacity * width + (extras_end - extras_begin); }
  // Device bytes: this rank's ids, the shard group's, every rank's (when replicated), the rows' first
  // occurrences (table_rows), with rows_packed this rank's tokens' packed rows, the packed rows and tensors in the
  // reduce dtype.
  size_t bytes(DType reduce_dtype) const {
    if (!on) return 0;
    const size_t all = id_capacity == shard_ids ? 0 : id_capacity;
    const size_t slots = rows_packed ? token_capacity : 0;
    return (token_capacity + shard_ids + all + table_rows + slots) * sizeof(int32_t) +
           packed_numel() * dtype_size(reduce_dtype);
  }
};

struct FsdpBufferPlan {
  DType compute_dtype = DType::F32;  // of the gathered parameters the model reads
  bool alias = false;            // one-rank shard: the model reads the slice (or its compute copy) itself
  bool compute_slice = false;    // a compute-dtype copy of the slice is kept (offload, or one rank in 16 bits)
  bool cast_at_gather = false;   // the gather casts the master into its own place in the gather buffer
  bool staged_gather = false;    // gathered in param_dtype, then cast to a wider compute dtype (CPU, 16 bits)
  bool direct_grads = false;     // one rank in all: the backward accumulates into the grad slices
  bool reshard = true;           // blocks are freed after each use (FULL_SHARD, HYBRID_SHARD)
  size_t root_padded = 0, block_padded = 0, max_padded = 0, max_shard = 0, layers = 0;
  size_t block_copies = 0;       // gathered block buffers
  // Full block-gradient buffers: two alternate on an asynchronous backend (more where they fit in the head's
  // scratch: plan_grad_buffers), one on a synchronous one, one a block with no sync in full.
  size_t grad_buffers = 0;
  // They live in the model's head scratch (UnitModel::share_head_scratch, grown to hold them where it is
  // smaller), which is idle whenever they are in use: they are zeroed again after the head wrote there.
  // Not where they carry gradients from one micro-step to the next (no sync in full).
  bool grads_in_head_scratch = false;
  size_t grad_slice = 0;         // one reduced fp32 slice
  size_t stage_full = 0, stage_slice = 0;  // 16-bit staging bytes: a full unit, a slice
  // copy_engine_reductions: elements of one piece of a block's slice that an exchange moves (both ranks'
  // pieces land in the exchange window, fp32), 0 where the blocks reduce through NCCL's reduce-scatter; and
  // the window's bytes.
  size_t exchange_numel = 0, exchange_bytes = 0;
  // LoRA's frozen base: sharded like the rest but held in the compute dtype only (no master, gradient
  // or optimizer state), gathered beside the adapters. Zero without LoRA.
  size_t frozen_root_padded = 0, frozen_block_padded = 0;
  bool frozen_alias = false;        // one-rank shard: the model reads the frozen slices themselves
  size_t frozen_block_copies = 0;   // gathered frozen block buffers (the same turns as block_copies)
  // CPU offload (src/fsdp/offload.cpp): no fp32 gradient slice stays on the device. Each unit's reduced
  // slice lands in a device buffer (two, alternating; none where the reduction leaves it in the full
  // fp32 gradient: one shard, fp32), goes down to pinned host buffers in the reduce dtype (two) and is
  // summed into the host's fp32 gradient; updated slices go up in chunks, through pinned staging in the
  // compute dtype (two; none in fp32, which goes up from the pinned master itself).
  bool grad_slices = true;         // fp32 gradient slices on the backend (every run but an offloaded one)
  size_t offload_slice = 0;        // bytes of each device landing buffer
  size_t offload_landing = 0;      // bytes of each pinned host landing buffer
  size_t offload_chunk = 0;        // elements of an upload
  size_t offload_stage = 0;        // bytes of each pinned upload staging chunk
  size_t offload_stream_chunk = 0; // root update on the device: elements of one streamed chunk
  size_t offload_stream = 0;       // and bytes of each of its two device buffers (master and moments;
                                   // none when every element is resident)
  size_t offload_resident = 0;     // its first elements whose master and moments stay on the device
  size_t offload_resident_bytes() const { return offload_resident * kRootStateBytes; }
  size_t offload_squares = 0;      // bytes of the units' gradient sums of squares on the device (fp64)
  RootSplit root_split;            // set by plan_root_split (through engine_buffer_plan: the engine's and `plan`'s)
  // fsdp.no_sync resolved: Off (one micro-step a step, CPU offload, one rank in all), Replicate (the
  // replicate group's all-reduce once a step: several replicas), Full (the micro-steps before the last
  // reduce nothing: every block has its own gathered buffer and full fp32 gradient buffer).
  NoSync no_sync = NoSync::Off;
  size_t root_split_bytes = 0;     // its device buffers
  // With the root split's grad_from (untied, reducing every micro-step), the gathered root's table and the
  // head's fp32 gradient buffer share memory: one allocation holds the gradient buffer from its start and the
  // gathered root from root_full_offset bytes on, so that the gathered table (read once, by the embedding's
  // lookup at the micro-step's start) lies in the gradient buffer's last root_overlap bytes (written from the
  // head's backward on), and the head's own gathered part lies after it. The root is gathered again before
  // its next use (Impl::run, Impl::gather). One micro-step a step only (that gather is then the one after the update);
  // 0: two allocations (with accumulation, one rank, FsdpOptions::table_in_head_grad off: plan_root_overlap).
  size_t root_full_offset = 0, root_overlap = 0;
  // That allocation lies in the first blocks' gradient slices (root_in_slices): while a backward runs those
  // hold nothing yet (the first blocks' reductions land last, after the head's part has been reduced), and
  // after the optimizer step nothing again. The blocks' slices are then one allocation, each slice_stride bytes
  // (its fp32 elements, 256-byte aligned) from the last; the first slices_under_root of them lie under the root's
  // allocation and are updated before the root is gathered (Impl::update_and_gather_ahead). One micro-step a
  // step (a second would gather the root over the first's gradients: Impl::gather refuses), no replicas (their
  // all-reduces add on a stream of their own), the table's rows packed, and at most half the blocks under it, so that the root's
  // gather still runs behind the other half's update (plan_root_in_slices; fsdp.root_in_grad_slices).
  bool root_in_slices = false;
  size_t slice_stride = 0, slices_under_root = 0;
  // Bytes of the allocation holding the head's gradient buffer and the gathered root (root_overlap > 0).
  size_t root_shared_bytes() const { return root_full_offset + root_padded * dtype_size(compute_dtype); }
  // Elements of the root's full fp32 gradient buffer: from the split's grad_from on (the whole root without it),
  // none with direct gradients.
  size_t root_grad_numel() const { return direct_grads ? 0 : root_padded - root_split.grad_from; }
};
// The copy-engine exchange's window (dist.copy_engine_reductions): both ranks' pieces of a block's slice,
// fp32 (128 MiB: 16 Mi elements a piece); over more than two ranks, a whole block's fp32 gradient, so only
// blocks of at most 32 Mi elements exchange there (BLOOM-560M's, not Llama-3.2-1B's).
constexpr size_t kExchangeWindowBytes = size_t(128) << 20;
// ... and the largest block slice it reduces (fp32 bytes; two pieces). Each piece costs both ranks a
// synchronisation and a kernel that waits for SMs beside the backward: on 2 x H200 a Llama-3.2-1B block (2
// pieces) reduced 1-2% faster this way and a BLOOM-560M block (1 piece) 6%, but a Llama-3.1-8B block (7
// pieces) 1-2% slower, its exchange outlasting the next block's backward (docs/PERFORMANCE.md).
constexpr size_t kExchangeMaxSliceBytes = size_t(256) << 20;
// Elements of one upload of updated parameters under CPU offload (a multiple of kHostAdamWPiece):
// AdamW on one chunk overlaps the copy of the previous one. 16 Mi: a BLOOM-560M block (12.6 M) in one
// pass of the host threads; each pass costs ~0.1 ms of waking them (1 Mi gave 15% fewer tokens/s than
// 4 Mi, 16 Mi 1.5-2% more: docs/history/performance-log.md).
constexpr size_t kOffloadChunk = size_t(1) << 24;
// Elements of one chunk of the root's update on the device (fsdp.offload_root_update): its fp32 master
// and both moments go up, are updated, and come back, two chunks in flight (24 MiB of device memory).
constexpr size_t kOffloadStreamChunk = size_t(1) << 20;
// fsdp.offload_root_update = auto updates the root on the device when copies of kOffloadLinkProbeBytes
// measure at least this many GB/s each way (PCIe 5.0 x16 gives about 55; 4.0 about 25, where moving 12
// bytes a parameter each way costs about what the host's AdamW does: docs/history/performance-log.md).
constexpr double kOffloadRootLinkGBs = 40.0;
// ... and when the rank's slice of the root has at least this many elements (a smaller one updates on
// the host in a millisecond or two either way, and the probe's 16 MiB would outweigh it).
constexpr size_t kOffloadRootMinElements = size_t(16) << 20;
constexpr size_t kOffloadLinkProbeBytes = size_t(16) << 20;

// What the engine trains and what it holds frozen: without LoRA the model's layout and nothing; with
// LoRA the adapters and the saved root modules (lora_layout) and the rest of the base weights
// (lora_frozen_layout), unit for unit.
struct EngineLayouts {
  std::vector<UnitLayout> trainable, frozen;
};
EngineLayouts engine_layouts(const ModelConfig& cfg);
// The engine's options from the deck's [fsdp] section: its keys as they are, offload_root_update Host
// without cpu_offload.
FsdpOptions fsdp_options(const FsdpSection& deck);
// The model as an engine with these options builds it: offloaded, GPU memory is what the run is for,
// so model.head_chunk_tokens = 0 becomes kOffloadHeadChunkTokens (the LM head's fp32 logits chunk is
// tokens x vocab x 4 bytes: 0.5 GB rather than 2 GB at BLOOM's vocabulary).
ModelConfig model_for_engine(const ModelConfig& model, const FsdpOptions& opt);

// `frozen` is EngineLayouts::frozen (empty without LoRA).
FsdpBufferPlan fsdp_buffer_plan(const std::vector<UnitLayout>& layout, const std::vector<UnitLayout>& frozen,
                                const FsdpOptions& opt, int shard_size, int replicate_size, bool asynchronous,
                                DType compute_dtype);
// Where the block-gradient buffers lie in the model's head scratch (plan.grads_in_head_scratch; free while the
// blocks' backward runs, `head_scratch_bytes` of it), they cost no memory: as many as it holds, from the two of
// a resharding asynchronous engine up to one a block, so that a block's backward waits less for an earlier
// block's reduction to free its buffer. Not with fsdp.cpu_offload, whose copies down read the buffers (two).
void plan_grad_buffers(FsdpBufferPlan& plan, const FsdpOptions& opt, size_t head_scratch_bytes);
// Sets plan.root_split and its bytes for cfg's model (`root`: EngineLayouts::trainable[0]) and
// micro-batches of up to max_tokens tokens.
void plan_root_split(FsdpBufferPlan& plan, const ModelConfig& cfg, const UnitLayout& root, const FsdpOptions& opt,
                     int shard_size, int replicate_size, size_t max_tokens);
// Sets plan.root_full_offset and plan.root_overlap from plan.root_split (the gathered table in the head's
// gradient buffer; FsdpOptions::table_in_head_grad).
void plan_root_overlap(FsdpBufferPlan& plan, const FsdpOptions& opt);
// Sets plan.root_in_slices, slice_stride and slices_under_root (after plan_root_overlap).
void plan_root_in_slices(FsdpBufferPlan& plan, const FsdpOptions& opt, int shard_size, int replicate_size);
// The plan FsdpEngine allocates by and `shardlm plan` prices (memory_plan.cpp), built the same way for both:
// fsdp_buffer_plan, then plan_root_split for cfg's model and micro-batches of up to max_tokens tokens and
// plan_root_overlap and plan_root_in_slices, then plan_grad_buffers in `head_scratch_bytes` of the model's head
// scratch.
FsdpBufferPlan engine_buffer_plan(const EngineLayouts& layouts, const ModelConfig& cfg, const FsdpOptions& opt,
                                  int shard_size, int replicate_size, bool asynchronous, DType compute_dtype,
                                  size_t max_tokens, size_t head_scratch_bytes);

// One optimizer step's timeline (run.trace_step): what each stream ran, in ms from the step's start.
// Lanes: "compute" (each unit's forward and backward, the optimizer), "comm" (each unit's all-gather
// and reduction; offloaded, the reduction's copy to the host is not in it); offloaded also "down" and
// "up" (the copy streams: gradients down, updated units up, the root's state both ways when it updates
// on the device) and "host" (the worker's sums and updates, on the host's clock from the step's start);
// with dist.replicate_stream, "replicate" (the blocks' all-reduces over the replicas), with
// dist.gather_stream "gather" (the all-gathers): communication lanes as "comm" is. The lanes in a fixed
// order (the trace JSON's thread ids).
inline constexpr const char* kTraceLanes[] = {"compute", "comm", "down", "up", "host", "replicate", "gather"};
struct TraceSpan {
  std::string name;
  std::string lane;
  double begin_ms = 0, end_ms = 0;
};
struct StepTrace {
  std::vector<TraceSpan> spans;
  double step_ms = 0;  // from the step's start to the end of its optimizer step, every stream done
};
// Where the step's time went: busy = the union of a lane's spans; overlap = both lanes busy at once;
// exposed communication = comm busy while compute is not; compute idle = step - compute busy.
struct TraceSummary {
  double step_ms = 0, compute_ms = 0, comm_ms = 0, overlap_ms = 0, exposed_comm_ms = 0, compute_idle_ms = 0;
  double gather_ms = 0, reduce_ms = 0;  // the comm lane's spans by kind (summed, not unioned)
  double host_ms = 0, copy_ms = 0;      // offloaded: the host lane busy; the copy lanes (down, up) busy
};
TraceSummary summarize_trace(const StepTrace& trace);
// The timeline as Chrome's trace-event JSON (chrome://tracing, Perfetto): one process per rank, one
// thread per lane.
std::string trace_json(const StepTrace& trace, int rank);

// The model wrapped unit by unit for FSDP on one backend: the schedule of docs/design.md written once.
// On an asynchronous backend parameter all-gathers run on the communication stream ahead of the
// compute stream (forward and backward prefetch, at most limit_all_gathers gathered blocks when
// resharding) and each block's gradient is reduced on the communication stream while the compute
// stream runs the previous block's backward; a synchronous backend runs the same calls in order.
class FsdpEngine {
 public:
  // host_backend runs the optimizer under cpu_offload (the CPU backend with the host's threads).
  FsdpEngine(std::unique_ptr<Backend> backend, ProcessGroups groups, std::unique_ptr<UnitModel> model,
             const FsdpOptions& opt, const AdamWOptions& adam, uint64_t seed, size_t max_tokens,
             std::unique_ptr<Backend> host_backend = nullptr);
  ~FsdpEngine();
  FsdpEngine(const FsdpEngine&) = delete;
  FsdpEngine& operator=(const FsdpEngine&) = delete;

  // One micro-batch's forward and backward; gradients of grad_scale * (sum of token losses) are
  // reduced into the grad slices (added to what earlier micro-steps left). Returns this rank's sum
  // of token losses. Every rank calls it the same number of times (an empty micro-batch still takes
  // part in the collectives). A training pass: with LoRA dropout its masks are drawn from dropout_seed
  // (the micro-step's, dropout_micro_step_seed; ignored without dropout).
  // LossRead::later leaves the loss on the device (0 is returned) and the next call adds to it: the
  // next call that reads returns the sum of every micro-step since the last read. A step passes
  // later for all its micro-steps but the last, so the host does not wait for the device between
  // them and queues the next micro-step's work while the device runs this one. zero_grad() drops
  // a loss left unread (a step abandoned).
  enum class LossRead { now, later };
  double forward_backward(const MicroBatch& mb, float grad_scale, uint64_t dropout_seed,
                          LossRead read = LossRead::now);
  // The forward alone, as evaluation: no dropout. Not between a step's micro-steps with a loss unread.
  double forward_loss(const MicroBatch& mb);
  // The next forward_backward is the last micro-step of the optimizer step. With cpu_offload each
  // unit's gradient is then complete once its reduction reaches the host, where its sum of squares is
  // taken for grad_norm(). With `update` (the step's lr and gradient factor known before its backward:
  // no clipping, no loss scaling) each unit is also updated then, on the host while the backward of
  // the others goes on, and optimizer_step(update->lr, update->grad_factor) must come next. Changes
  // nothing without cpu_offload.
  struct StepUpdate {
    double lr = 0;
    float grad_factor = 1;
  };
  void last_micro_step(const std::optional<StepUpdate>& update = std::nullopt);
  // The step timeline (run.trace_step): called before the step's zero_grad and after its
  // optimizer_step, the engine marks every gather, reduction, forward, backward and the optimizer in
  // between with timing events; trace_end waits for the step and returns its spans.
  void trace_begin();
  StepTrace trace_end();
  void zero_grad();
  double grad_norm();  // global L2 norm of the whole gradient, the same on every rank
  // One optimizer step at lr with the gradients multiplied by grad_factor (clipping) first.
  void optimizer_step(double lr, float grad_factor);
  long optimizer_steps() const { return optimizer_->steps_taken(); }
  void set_optimizer_steps(long steps) { optimizer_->set_steps_taken(steps); }

  // This rank's slices (master and optimizer state) in host memory, for save_checkpoint and
  // load_checkpoint; the views stay valid for the engine's life (copied from the device first).
  std::vector<UnitState> checkpoint_state();
  // load_checkpoint has filled the views of checkpoint_state(): take them in.
  void checkpoint_loaded();
  // LoRA: this rank's slices of the frozen base weights, as host fp32 views holding the model's own
  // initialisation from `seed` (load_pretrained may overwrite them), and then frozen_loaded() takes
  // them in (in the compute dtype) and frees the views. Error without LoRA.
  std::vector<UnitState> frozen_state(uint64_t seed);
  void frozen_loaded();
  // This rank's part of the frozen base's checksum, as frozen_loaded took it in (values in the compute
  // dtype); the ranks' parts summed (mod 2^64) give the same value for any world and strategy.
  uint64_t frozen_checksum_part() const { return frozen_checksum_; }
  bool lora() const;

  FsdpMemory memory() const;
  // The optimizer's state on the device (offloaded: the root's resident moments only; the rest is host memory),
  // as `shardlm plan` counts it.
  size_t optimizer_bytes() const;
  // Peak backend memory of this rank (0 on the CPU, whose planned buffers are reported instead).
  size_t device_peak_bytes() const;
  // How the model runs attention (UnitModel::attention_description) and the micro-batch lengths it
  // prefers (UnitModel::length_multiple).
  std::string attention_description() const;
  int length_multiple() const;
  std::string fp8_description() const;  // UnitModel::fp8_description
  ProcessGroups& groups() { return groups_; }
  const Backend& backend() const { return *backend_; }
  const FsdpBufferPlan& buffer_plan() const { return plan_; }
  size_t num_units() const;
  const FlatParameter& unit(size_t u) const;
  // The options as the engine resolved them (fsdp.offload_root_update = auto decided), and with
  // cpu_offload where the root unit's AdamW runs, in words (empty without it).
  const FsdpOptions& options() const;
  std::string offload_description() const;
  // This rank's gradient slice of unit u, copied to the host (tests, inspection).
  std::vector<float> grad_slice(size_t u);

  // ---- generation with a key/value cache (every rank of the world calls these together) ----
  // A cache for `slots` sequences of up to `max_len` positions, steps of up to `max_rows` rows.
  void decode_begin(int slots, int max_len, int max_rows);
  // Runs the model on n rows: row r is token tokens[r] at position positions[r] of the sequence in
  // cache slot slots[r]; it attends to its slot's positions 0..positions[r]. For each of the m rows
  // listed in logit_rows, next[i] is the argmax of its logits (the lowest id on ties), or with
  // `logits` (host, m x vocab_size; m at most `slots`) the fp32 logits themselves, for sampling (then
  // `next` may be null). n may be 0: the rank still takes part in the collectives.
  void decode_step(const int32_t* tokens, const int* slots, const int* positions, int n, const int* logit_rows,
                   int m, int32_t* next, float* logits = nullptr);
  void decode_end();
  int vocab_size() const;  // the logits' width
  const ModelConfig& model_config() const;  // the model it runs (generation reads its rotary options)

 private:
  void refresh_compute_slices();
  void pin(void* p, size_t bytes);
  struct Unit;
  struct Impl;
  // Destroyed in reverse: the optimizer and the buffers before the groups, the backends last.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Backend> host_backend_;
  ProcessGroups groups_;
  FsdpBufferPlan plan_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<float*> quantised_state_views(size_t u);
  std::vector<void*> pinned_;  // host arrays page-locked by the backend, unlocked before they are freed
  std::vector<std::vector<float>> frozen_staging_;  // frozen_state's views, until frozen_loaded
  uint64_t frozen_checksum_ = 0;
};

// ---- memory plan (`shardlm plan`): one rank's bytes, from the same sizes the engines allocate ----

// What one rank runs: the model, the backend and the FSDP settings of the deck, the world.
struct MemoryPlanSpec {
  ModelConfig model;
  BackendKind backend = BackendKind::Cpu;
  FsdpOptions fsdp;                       // cpu_offload: CUDA backend only
  bool activation_checkpointing = false;  // CUDA backend only
  int world_size = 1;
  int ranks_per_node = 0;  // 0: every rank on one node
  int micro_batch = 1;
  int max_seq = 1;
};

// One rank's memory. `record` and `optimizer` are what the run writes in its "memory" records;
// device_total() is what it reports as peak memory (the CPU's planned buffers, or the bytes
// cudaMalloc'd through the planned device buffers).
struct RankMemoryPlan {
  int shard_size = 1, replicate_size = 1;
  FsdpMemory record;
  size_t optimizer = 0;       // optimizer state (train.optim's) in the memory that device_total counts
  size_t host_optimizer = 0;  // CUDA offload: the optimizer state in host memory instead
  size_t offload_file_bytes = 0;  // fsdp.offload_dir: the moments in its mapped files instead (not in host_bytes)
  size_t model_extra = 0;     // CUDA: buffers of the model outside activation_bytes (norm statistics, ALiBi slopes)
  // FsdpBufferPlan::grads_in_head_scratch: the bytes the block-gradient buffers and the model's head scratch
  // share, counted once, under record.full_grads (record.activations leaves them out).
  size_t shared_head_scratch = 0;
  size_t exchange_bytes = 0;  // the copy-engine exchange's window (FsdpBufferPlan::exchange_bytes), in comm_staging
  size_t io_buffers = 0;      // CUDA: token and target ids of a micro-batch, loss and norm scalars
  size_t host_bytes = 0;      // CUDA: host memory of the rank (checkpoint staging of the master and moments;
                              // with offload the master, moments, fp32 gradient and pinned copy buffers)
  int ranks_per_node = 1;     // the ranks whose host memory one node holds

  size_t host_per_node() const { return host_bytes * static_cast<size_t>(ranks_per_node); }

  size_t params() const { return record.master_shard + record.full_params; }
  size_t grads() const { return record.grad_shard + record.full_grads; }
  size_t activations() const { return record.activations + model_extra; }
  size_t buffers() const { return record.comm_staging + io_buffers; }
  size_t device_total() const { return params() + grads() + optimizer + activations() + buffers(); }
};

// The shard-group size of `strategy` for this world (HYBRID_SHARD: the ranks of one node).
int plan_shard_size(const MemoryPlanSpec& spec);
// Throws an Error naming the reason when the backend cannot run the model.
RankMemoryPlan plan_rank_memory(const MemoryPlanSpec& spec);
// GPU memory a CUDA rank uses outside its planned buffers: CUDA context, cuBLASLt (handle and its
// 32 MiB workspace) and NCCL; measured on one H100 as nvidia-smi's process total minus the planned
// peak (docs/history/performance-log.md: 20.07 - 17.94 GiB and 15.94 - 13.80 GiB).
constexpr size_t kCudaRuntimeOverheadBytes = static_cast<size_t>(2.14 * 1024 * 1024 * 1024);

}  // namespace shardlm

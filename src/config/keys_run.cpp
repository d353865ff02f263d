// The [dist], [checkpoint] and [run] sections' keys and their checks.
// Adding a key: keys.cpp's first lines.
#include "key_builders.hpp"

namespace shardlm::config_detail {

static void check_dist(const RunConfig& cfg, int world_size) {
  const int rpn = cfg.dist.ranks_per_node;
  if (rpn > 0 && world_size % rpn != 0)
    bad_value("dist.ranks_per_node", std::to_string(rpn), concat("world size ", world_size, " is not divisible by it"));
}

static void check_checkpoint(const RunConfig& cfg, int) {
  if (cfg.data.eval_file.empty() && cfg.checkpoint.keep_best != KeepBest::None)
    bad_value("checkpoint.keep_best", keep_best_name(cfg.checkpoint.keep_best), "needs data.eval_file");
}

DeckSection dist_section() {
  return {"dist", check_dist, {
      int_key("dist.ranks_per_node", SHARDLM_FIELD(dist.ranks_per_node), 0, "must be >= 0")
          .doc("0 = the real hosts; K > 0 treats each K consecutive ranks as one node (must divide the number of "
               "ranks), to run the HYBRID_SHARD strategies' layout on one machine"),
      double_key("dist.timeout", SHARDLM_FIELD(dist.timeout), kPositive)
          .cuda()
          .doc("seconds how long an NCCL wait may make no progress before the job ends (below); the environment "
               "variable `SHARDLM_NCCL_TIMEOUT`, when set, replaces the default, and the key, when given, wins over "
               "it"),
      flag_key("dist.replicate_stream", SHARDLM_FIELD(dist.replicate_stream))
          .cuda()
          .doc("with a replicate group of several ranks (HYBRID_SHARD, HYBRID_SHARD_ZERO2, NO_SHARD): the blocks' "
               "all-reduces over the replicas run on a CUDA stream and NCCL communicator of their own, beside the "
               "shard group's all-gathers and reduce-scatters instead of after them; `false` queues them all on one "
               "stream (the same arithmetic either way). Not with `fsdp.cpu_offload`. The second communicator costs "
               "NCCL's buffers once more (outside the memory plan, as the first's)"),
      flag_key("dist.gather_stream", SHARDLM_FIELD(dist.gather_stream))
          .cuda()
          .doc("with a shard group of several ranks: the units' all-gathers run on a CUDA stream and NCCL "
               "communicator of their own, so that a gather (the next block's, prefetched) never waits behind "
               "a reduction; `false` queues gathers and reductions on one stream. Not with `fsdp.cpu_offload`, "
               "which keeps its order on one stream. The same arithmetic either way; the second communicator "
               "costs NCCL's buffers once more"),
      flag_key("dist.gather_copy_engine", SHARDLM_FIELD(dist.gather_copy_engine))
          .cuda()
          .doc("with `dist.gather_stream`, 16-bit parameters and a shard group of several ranks on one host, "
               "under NCCL 2.28 or later: the all-gathers run on the GPU's copy engines instead of its SMs, so "
               "that the compute they overlap keeps every SM (the gathered buffers are NCCL symmetric windows, "
               "`ncclMemAlloc`'d, on a communicator with the zero-CTA policy; the run's log says so). Elsewhere "
               "(an fp32 master is gathered as it is), or `false`, NCCL's kernels move them. The same bytes either "
               "way"),
      flag_key("dist.symmetric_reductions", SHARDLM_FIELD(dist.symmetric_reductions))
          .cuda()
          .doc("with a shard group of several ranks on one host, under NCCL 2.28 or later: the blocks' gradient "
               "buffers (and the LM head's scratch, when they lie in it) are NCCL symmetric windows of the shard "
               "group, `ncclMemAlloc`'d, so that NCCL reduce-scatters them with its symmetric kernels, which read "
               "the peers' buffers directly and take fewer SMs (9 thread blocks instead of 32 on 2 x H200). "
               "Elsewhere, or `false`, NCCL's ring kernels. The same sums on 2 ranks; on more, to rounding"),
      flag_key("dist.copy_engine_reductions", SHARDLM_FIELD(dist.copy_engine_reductions))
          .cuda()
          .doc("with `fsdp.reduce_dtype = fp32`, a shard group of several ranks on one host and NCCL 2.28 or later, "
               "without `fsdp.cpu_offload`: each block's reduce-scatter runs as an exchange on the GPU's copy "
               "engines through an NCCL symmetric window of at most 128 MiB (on a zero-CTA communicator of its own, "
               "whose windows the block gradients then are). Two ranks exchange in pieces: an all-to-all moves each "
               "rank's piece of the other's part of the gradient into the other's window, which adds it to its "
               "own with one kernel. More ranks exchange a block's whole gradient in one all-to-all and add the "
               "peers' parts in rank order, so only where a block's fp32 gradient fits the window (e.g. BLOOM-560M "
               "on 4 ranks; not Llama-3.2-1B's 243 MB). NCCL's reduce-scatter kernels would hold SMs "
               "through the whole backward beside it. Only for blocks whose gradient slice is at most 256 MiB "
               "(e.g. Llama-3.2-1B, BLOOM-560M; not Llama-3.1-8B, whose exchange outlasts the backward beside "
               "it: docs/PERFORMANCE.md). The root's reductions and the first block's split one "
               "stay NCCL's. The run's log says so. Elsewhere, or `false`, NCCL's kernels. The "
               "same sums on two ranks (a + b); on more, to rounding"),
  }};
}

DeckSection checkpoint_section() {
  return {"checkpoint", check_checkpoint, {
      output_folder_key("checkpoint.dir", SHARDLM_FIELD(checkpoint.dir))
          .doc("where checkpoints go; empty = `RUN_DIR/checkpoints`; a relative path is taken from the current "
               "folder and kept absolute (in `deck.resolved.ini` too)"),
      int_key("checkpoint.every", SHARDLM_FIELD(checkpoint.every), 0, "must be >= 0")
          .doc("optimizer steps between checkpoints; 0 = none on a cadence"),
      int_key("checkpoint.keep_last", SHARDLM_FIELD(checkpoint.keep_last), 0, "must be >= 0")
          .doc("checkpoints kept (the oldest are deleted); 0 = keep all"),
      resume_key("checkpoint.resume")
          .doc("`auto`: continue from `DIR/latest` if there is one, else start fresh; a checkpoint that is damaged, "
               "inconsistent (an impossible step or position) or another run's (its run id is not `RUN_DIR/run_id`'s)"
               " is skipped with a warning naming it and why, for the next older one. A path: that checkpoint file, "
               "or a checkpoint folder's latest (another run's is then allowed, and the log says so)"),
      flag_key("checkpoint.at_end", SHARDLM_FIELD(checkpoint.at_end))
          .doc("write a checkpoint when training ends (before the last evaluation and generation, so a failure there "
               "loses no training)"),
      flag_key("checkpoint.collective_buffering", SHARDLM_FIELD(checkpoint.collective_buffering))
          .doc("`false`: each rank writes its own slices (contiguous, never interleaved with another rank's) straight"
               " to the file with its own MPI-IO writes; `true`: MPI-IO's two-phase collective buffering routes them "
               "through aggregator ranks, which can be faster on a striped parallel file system (Lustre, GPFS); on "
               "one node it is slower (docs/PERFORMANCE.md)"),
      flag_key("checkpoint.load_weights_only", SHARDLM_FIELD(checkpoint.load_weights_only))
          .doc("with `resume` set: take only the checkpoint's parameters and start a new run from step 0 (fresh "
               "optimizer state, schedule and data order; give it a new `run.dir`, as for any fresh run); the model "
               "config may then differ from the checkpoint's (other eps, rope, tokenizer) as long as every tensor's "
               "shape matches. Without it, resume refuses a checkpoint of another model config, naming the key"),
      flag_key("checkpoint.allow_new_batch", SHARDLM_FIELD(checkpoint.allow_new_batch))
          .doc("resume a checkpoint written with another `train.batch_size`: the step count and schedule go on, the "
               "position in the epoch becomes the examples already taken divided by the new global batch (rounded "
               "down: a few examples may come again), the run's last step the checkpoint's plus what is left of the "
               "epochs in the new batches (capped by `train.max_steps`; the schedule ends there), and the log says "
               "so. Without it such a resume is refused naming both batches, since its steps would take other "
               "examples than the run that wrote it"),
      enum_key("checkpoint.keep_best", SHARDLM_FIELD(checkpoint.keep_best), keep_best_name)
          .doc("`eval_loss`: the checkpoint of the lowest eval loss is kept beside the last `keep_last` (not counted "
               "among them), named by the file `DIR/best` (its file name on the first line, `eval_loss VALUE` on the "
               "second; written through a rename as `latest`). An evaluation that beats the best writes a checkpoint "
               "of its step (unless that step has one already) and points `best` at it (a `best_checkpoint` record "
               "and line). A resumed run reads `DIR/best` and keeps comparing against it. As Trainer's "
               "`load_best_model_at_end` with `metric_for_best_model = eval_loss`, except that the best stays a "
               "checkpoint: `shardlm export DIR/$(head -1 DIR/best)` exports it. Needs `data.eval_file`"),
      flag_key("checkpoint.every_epoch", SHARDLM_FIELD(checkpoint.every_epoch))
          .doc("also a checkpoint at the end of every epoch (before its evaluation), as Trainer's `save_strategy = "
               "epoch`; `import-accelerate` maps that setting here. With `every` too, a step due for both writes one"),
  }};
}

DeckSection run_section() {
  return {"run", nullptr, {
      nonempty_text_key("run.dir", SHARDLM_FIELD(run.dir), "path to a folder")
          .doc("output folder: `metrics.jsonl`, `deck.resolved.ini`, `run_id` (the run's identity, made when a fresh "
               "run starts, kept by its resumes and carried by each checkpoint: "
               "[checkpoint.md](checkpoint.md#the-run-id)), checkpoints (relative to the current folder)"),
      enum_key("run.backend", SHARDLM_FIELD(run.backend), backend_name)
          .doc("compute backend; `cuda` needs a build with `SHARDLM_CUDA` and one GPU per rank"),
      double_key("run.peak_tflops", SHARDLM_FIELD(run.peak_tflops), kNonNegative)
          .doc("peak rate of one rank's device in TFLOP/s that the MFU (model FLOPs utilisation) of every train line "
               "and the summary is measured against; 0 = the GPU's dense (no sparsity) tensor-core peak for "
               "`fsdp.param_dtype` (bf16 or fp16), found from its CUDA device name (below); no MFU on the CPU "
               "backend, with fp32 parameters or on a GPU the table lacks, unless this key is set"),
      flag_key("run.overwrite", SHARDLM_FIELD(run.overwrite))
          .doc("a fresh run (`checkpoint.resume = none`, `auto` with no checkpoint to continue, or "
               "`checkpoint.load_weights_only`) into a `dir` that already holds a run (`metrics.jsonl`, "
               "`predictions.json`, checkpoints) is refused unless this is `true`; then nothing of the earlier run is"
               " touched until the new run has passed every check it makes before its first step (deck, model, "
               "tokenizer, data, backend, weights): its files (those, `deck.resolved.ini`, `run_id`, step timelines) "
               "are then moved into `.replaced-run` folders and deleted after the new run's first logged step or "
               "checkpoint, and a line says what was replaced; a start that fails before that leaves the earlier run "
               "as it was (\"The run folder\"). `deck.resolved.ini` keeps `overwrite = false` (a comment says it was "
               "given), so a rerun of it never replaces a run unasked"),
      int_key("run.trace_step", SHARDLM_FIELD(run.trace_step), 0, "must be >= 0 (0 = no timeline)")
          .doc("the optimizer step whose timeline is recorded, numbered as the log numbers steps (`step N/M`; a "
               "resumed run continues the count; a step outside the run's is warned about at start): rank 0 writes "
               "`dir/trace_stepN_rankR.json` for every rank R (Chrome trace events: open in `chrome://tracing` or "
               "ui.perfetto.dev), with one span per unit's forward and backward and the optimizer on the `compute` "
               "lane and per unit's all-gather and reduction on the `comm` lane, timed by GPU events; metrics.jsonl "
               "gets a `\"trace\"` record per rank (`step_ms`, `compute_ms` and `comm_ms` busy, `overlap_ms`, "
               "`exposed_comm_ms` = communication while the compute stream is idle, `compute_idle_ms`, `gather_ms`, "
               "`reduce_ms`) and rank 0's is printed. The traced step starts on drained streams, so it is a little "
               "slower than its neighbours (offloaded, its forward does not overlap the previous step's updates). "
               "Offloaded, three more lanes: `down` (each gradient's copy to the host, the root's state coming back "
               "when it updates on the GPU), `up` (each updated unit going up) and `host` (the worker's sums and "
               "per-unit updates, timed on the host's clock from the step's start, which the GPU events share to "
               "within the start's synchronisation); the record adds `copy_ms` (down and up busy) and `host_ms`, and "
               "the printed line their values. 0 = none"),
      flag_key("run.tensorboard", SHARDLM_FIELD(run.tensorboard))
          .doc("rank 0 writes the run's scalars for TensorBoard to `dir/tensorboard/events.out.tfevents.SECONDS.HOST`"
               " (TFRecord-framed Event protocol buffers, as TensorFlow writes them), a new file at each start or "
               "resume (TensorBoard reads the folder's files as one run): at each logged step `train/loss`, "
               "`train/learning_rate`, `train/grad_norm`, `train/epoch` (the names of Trainer's TensorBoard "
               "callback), `train/tokens_per_second`, `train/memory_gib` (the largest rank's peak) and `train/mfu` "
               "(when there is a peak); at each evaluation `eval/loss`, `eval/runtime` and, with generation, "
               "`eval/exact_match` and `eval/f1`; the same values as `metrics.jsonl` (in float32). `tensorboard "
               "--logdir runs` reads them, on a login node too (no network needed); checked with TensorBoard's own "
               "reader (`tests/fixtures/tensorboard/read_events.py`: a CPU run and its resume, two files, every "
               "scalar equal to metrics.jsonl) on 2026-11-28. A few hundred bytes per logged step"),
      flag_key("run.smoke", SHARDLM_FIELD(run.smoke))
          .doc("a smoke run ([below](#smoke-runs)): the deck's model family at 2 layers of a tiny width with random "
               "weights, 2 steps of its data (or synthetic text where its files are missing), into `dir` + `-smoke`; "
               "`shardlm train DECK --tiny` is the same"),
  }};
}

}  // namespace shardlm::config_detail

// The [fsdp] section's keys and the checks between the offload keys.
// Adding a key: keys.cpp's first lines.
#include "key_builders.hpp"

namespace shardlm::config_detail {

// The offload keys act on an offloaded run only, and some of their values exclude each other.
static void check_fsdp(const RunConfig& cfg, int) {
  const FsdpSection& f = cfg.fsdp;
  if (!f.offload_dir.empty() && !f.cpu_offload)
    bad_value("fsdp.offload_dir", "'" + f.offload_dir + "'",
              "keeps the host AdamW's moments of an offloaded run: set fsdp.cpu_offload = true, or leave it empty");
  if (f.offload_accumulate == OffloadAccumulate::Device && !f.cpu_offload)
    bad_value("fsdp.offload_accumulate", "device",
              "says where an offloaded run sums its micro-steps' gradients: set fsdp.cpu_offload = true, or use host");
  if (f.offload_root_update == OffloadRootUpdate::Device && !f.cpu_offload)
    bad_value("fsdp.offload_root_update", "device",
              "says where an offloaded run updates its root unit: set fsdp.cpu_offload = true, or use auto");
  if (f.offload_resident_gib > 0 &&
      (!f.cpu_offload || f.offload_root_update == OffloadRootUpdate::Host || !f.offload_dir.empty()))
    bad_value("fsdp.offload_resident_gib", format_double(f.offload_resident_gib),
              "keeps part of the root unit's optimizer state on the GPU when an offloaded run updates the root "
              "there: set fsdp.cpu_offload = true, fsdp.offload_root_update = auto or device and no "
              "fsdp.offload_dir, or use 0");
  // The root's update on the device streams AdamW's fp32 moments; 8-bit moments update on the host with the rest.
  if (cfg.train.optim != Optim::AdamWTorch && f.cpu_offload &&
      (f.offload_root_update == OffloadRootUpdate::Device || f.offload_resident_gib > 0))
    bad_value("train.optim", optim_name(cfg.train.optim),
              "updates an offloaded run's root unit on the host: use fsdp.offload_root_update = auto or host and "
              "fsdp.offload_resident_gib = 0, or train.optim = adamw_torch");
  if (f.offload_root_update == OffloadRootUpdate::Device && !f.offload_dir.empty())
    bad_value("fsdp.offload_root_update", "device",
              "streams the root's moments from host memory, and fsdp.offload_dir keeps them in files: leave "
              "fsdp.offload_dir empty, or use auto (which then updates the root on the host)");
}

// What is sharded, the dtypes, recomputation.
static std::vector<KeySpec> precision_keys() {
  return {
      strategy_key("fsdp.strategy").doc("what is sharded over which ranks (below)"),
      dtype_key("fsdp.param_dtype", SHARDLM_FIELD(fsdp.param_dtype))
          .doc("dtype parameters are gathered and computed in; `bf16` on the CUDA backend needs compute capability "
               "8.0 or newer (below)"),
      dtype_key("fsdp.reduce_dtype", SHARDLM_FIELD(fsdp.reduce_dtype))
          .on("both (`cuda`: `fp32` or `param_dtype`)")
          .doc("dtype gradients are reduced in"),
      flag_key("fsdp.activation_checkpointing", SHARDLM_FIELD(fsdp.activation_checkpointing))
          .cuda()
          .doc("keep only each block's input and recompute its activations before its backward (less memory, one more"
               " forward); no effect on the CPU backend (a warning at start says so)"),
  };
}

// CPU offload and what it leaves to choose.
static std::vector<KeySpec> offload_keys() {
  return {
      flag_key("fsdp.cpu_offload", SHARDLM_FIELD(fsdp.cpu_offload))
          .cuda()
          .doc("the fp32 master slice, the fp32 gradient and both AdamW moments stay in host memory and AdamW runs on"
               " the CPU (the optimizer of the CPU backend); the GPU keeps only the compute-dtype slice it gathers "
               "from. Each unit's reduced gradient goes to the host in `reduce_dtype` as soon as it is reduced "
               "(pinned buffers, a copy stream), where it is summed in fp32; each unit is updated on the host and "
               "goes back up on its own, the next forward's gathers waiting for their own unit only. Without clipping"
               " (`train.max_grad_norm = 0`) and loss scaling a unit is updated as soon as its gradient is there, "
               "during the backward; with clipping the updates wait for the global norm and overlap the next forward "
               "(docs/design.md, \"CPU offload\"). Saves 16 bytes per parameter of the rank's slice on the GPU (the "
               "fp32 master, gradient and moments) at the cost of the backward's one-unit gradient buffers, and needs"
               " 16 on the host plus the pinned copy buffers (`shardlm plan` shows host memory per rank and per "
               "node). The host AdamW is vectorised (AVX-512, AVX2 or the baseline, whichever the CPU has) and runs "
               "on the rank's share of the node's cores: `OMP_NUM_THREADS` (or `OPENBLAS_NUM_THREADS`) if set, else "
               "the cores the rank is bound to, else the node's cores over its ranks, at most `SLURM_CPUS_PER_TASK`. "
               "On the CPU backend everything is in host memory already and the key changes nothing (a warning at "
               "start says so)"),
      text_key("fsdp.offload_dir", SHARDLM_FIELD(fsdp.offload_dir), "path to a folder")
          .cuda()
          .doc("with `cpu_offload = true`: the host AdamW's two moments (8 bytes per parameter of the rank's slice) "
               "live in memory-mapped files created in this directory instead of host memory, for a host whose memory"
               " is smaller than the 16 bytes per parameter offload otherwise needs (the fp32 master and gradient, 8 "
               "bytes, stay in memory). Give a local NVMe directory (`$TMPDIR` or the node's scratch), never a "
               "network filesystem. The files are unlinked as soon as they are made, so nothing is left behind, even "
               "by a killed run; their size is in `shardlm plan` (not in host/rank). Cost: while the page cache can "
               "hold the moments they run at memory speed (the kernel keeps them; `bench_host_adamw --moments-dir "
               "DIR` measures it); when it cannot, every optimizer step reads and writes both moments, 16 bytes per "
               "parameter of disk traffic: for a rank's 8 B parameters 128 GB a step, about 20 s at 6.5 GB/s (a PCIe "
               "4 NVMe), against about 1.5 s for AdamW in memory at 170 GB/s (docs/history/performance-log.md, \"Host"
               " AdamW against memory bandwidth\"). Refused without `cpu_offload`; changes nothing on the CPU "
               "backend, as `cpu_offload`"),
      enum_key("fsdp.offload_accumulate", SHARDLM_FIELD(fsdp.offload_accumulate), offload_accumulate_name)
          .cuda()
          .doc("with `cpu_offload = true` and gradient accumulation (`train.batch_size` more than `micro_batch_size` "
               "x ranks): where the micro-steps' reduced gradients are summed. `host`: every micro-step's reduced "
               "slice goes down and the host adds it into the fp32 gradient (nothing fp32 per parameter on the GPU; "
               "PCIe traffic and host adds once per micro-step). `device`: they are summed in an fp32 slice on the "
               "GPU (4 bytes per parameter of the rank's slice, in `shardlm plan`'s `grads` column), which goes down "
               "once, in the step's last micro-step, straight into the host gradient: one copy and no host adds per "
               "step, whatever the accumulation. Same numbers either way (fp32 sums of the same reduced values, in "
               "the same order). Choose `device` when the GPU has the room and the run is PCIe-bound (small "
               "micro-batches, many micro-steps); `host` when the GPU memory is what offload is for. The slice is "
               "held whenever the key says `device`; without accumulation nothing uses it (the start-up log warns), "
               "and a step of a single micro-step (packing can make one) goes the host's way. Refused without "
               "`cpu_offload`; changes nothing on the CPU backend"),
      enum_key("fsdp.offload_root_update", SHARDLM_FIELD(fsdp.offload_root_update), offload_root_update_name)
          .cuda()
          .doc("with `cpu_offload = true`: where the root unit's AdamW runs (the root holds the embeddings, the LM "
               "head and the final norm: 46% of BLOOM-560M's parameters, 13% of Llama-3.1-8B's). `host`: with the "
               "blocks, on the host's cores. `device`: on the GPU, while the host's cores update the blocks: in a "
               "step whose root gradient is on the GPU whole in fp32 (one micro-step with an fp32 reduction, or "
               "`offload_accumulate = device`), that gradient does not go down; the root's fp32 master and both "
               "moments go up in 4 MiB chunks, are updated by the GPU's AdamW (which also writes the compute-dtype "
               "slice the next forward reads) and come back down, 12 bytes per parameter each way over the host link,"
               " two chunks in flight (24 MiB of GPU memory). Other steps (host sums of several micro-steps, a 16-bit"
               " reduction) update the root on the host. Same numbers either way (the host AdamW has the GPU kernel's"
               " formula). It pays where the link is fast against the host's memory: the host moves about 34 bytes "
               "per parameter for its own update. `auto`: `device` when the rank's slice of the root has at least 16 "
               "Mi elements and a timed 16 MiB copy each way at start-up measures at least 40 GB/s (PCIe 5.0 x16 "
               "gives about 55; PCIe 4.0 about 25, where it would not pay), else `host` (a smaller root updates on "
               "the host in a millisecond or two); the start-up log says what it measured and chose (`optimizer:` "
               "line), the setup record has `offload_root_update`. `device` is refused without `cpu_offload` and with"
               " `offload_dir` (the moments are streamed from host memory; `auto` then chooses `host`)"),
      double_key("fsdp.offload_resident_gib", SHARDLM_FIELD(fsdp.offload_resident_gib), kNonNegative)
          .cuda()
          .doc("with `cpu_offload = true` and the root updated on the GPU: GiB of GPU memory in which that much of "
               "the root unit's fp32 master and AdamW moments (12 bytes per parameter of the rank's slice; more than "
               "the slice keeps all of it) stays on the GPU between steps instead of going up and back over the host "
               "link: those parameters update where they are, at the GPU's memory speed, and the host's memory is "
               "left to the blocks' AdamW (partial offload, as DeepSpeed's `offload_optimizer.ratio`). The host keeps"
               " its copy of the whole state: the resident part comes down before anything on the host reads it (a "
               "checkpoint, a step whose root updates on the host) and goes back up before the next update on the "
               "GPU; a loaded checkpoint replaces it. Any value makes `offload_root_update = auto` choose `device` "
               "without measuring the link. `shardlm plan` counts it (the master with the parameters, the moments as "
               "optimizer); the start-up `optimizer:` line says how much of the root is resident, the setup record "
               "has `offload_resident_bytes`. Use GPU memory the run leaves free, for instance what "
               "`activation_checkpointing` frees (it costs an offloaded run little: its backward waits for the "
               "gradients' copies to the host anyway; docs/PERFORMANCE.md). With LoRA it keeps nothing (the root "
               "trains no adapter). Refused without `cpu_offload`, with `offload_root_update = host` and with "
               "`offload_dir`"),
  };
}

// How the gradients are reduced and the parameters gathered.
static std::vector<KeySpec> communication_keys() {
  return {
      enum_key("fsdp.root_reduction", SHARDLM_FIELD(fsdp.root_reduction), root_reduction_name)
          .doc("with several ranks: how the root unit's gradient (embeddings, final norm, LM head) is reduced. "
               "`split`: in two parts. The part the head's backward writes (the final norm and the LM head, or with a"
               " tied head the whole table) is reduced right after the head's backward, so it overlaps the blocks' "
               "backward; the embedding's part is only the rows of the micro-batch's tokens (and BLOOM's embedding "
               "LayerNorm): every rank's token ids are gathered, the rows they name packed into one buffer (`id rows "
               "x hidden` in `reduce_dtype`), all-reduced and added to the slices, instead of reducing the whole "
               "table at the end. `whole`: the whole root after the embedding's backward (one reduce-scatter). "
               "`auto`: `split` when every rank's tokens of a micro-batch (ranks x `micro_batch_size` x `max_length`)"
               " are under half the vocabulary, else `whole` (an all-reduce of that many rows would move more than "
               "the table's reduce-scatter). Same numbers either way, to rounding. With an untied head, `split` also "
               "spares the table's fp32 gradient buffer (its rows reuse the head's once that is reduced; not with "
               "`no_sync = full`). Not with LoRA or `cpu_offload` (their root has its own path) or on one rank "
               "(nothing to reduce). `shardlm plan` counts its buffers (comm staging: the ids, one int32 per "
               "vocabulary row, the packed rows)"),
      enum_key("fsdp.no_sync", SHARDLM_FIELD(fsdp.no_sync), no_sync_name)
          .doc("with gradient accumulation (several micro-steps a step): how often the gradients are communicated, as"
               " PyTorch's `no_sync`. `full`: the micro-steps before the step's last reduce nothing; each block keeps"
               " its gathered parameters and its own full fp32 gradient buffer through the step (FULL_SHARD then "
               "holds what SHARD_GRAD_OP does, plus one full fp32 gradient per block), and the last micro-step "
               "reduces each unit once, behind its backward: one all-gather and one reduce-scatter per block a step "
               "instead of two and one per micro-step. `replicate`: every micro-step reduce-scatters in the shard "
               "group, the replicate group's all-reduce (HYBRID_SHARD's between nodes, NO_SHARD's) runs once, in the "
               "last micro-step, on the summed slice; no extra memory (HSDP's way). `off`: every micro-step reduces "
               "everything (as before). `auto`: `full` when the whole model's gathered parameters plus its fp32 "
               "gradients take at most 16 GiB (BLOOM-560M 3.4 GB, Llama-3.2-1B 7.4 GB; not an 8B), else `replicate`; "
               "nothing without accumulation. `full` on a shard group of one (NO_SHARD) is `replicate`; one rank in "
               "all, or `cpu_offload`, runs `off`. Same numbers to rounding (the sums' order changes). `shardlm plan`"
               " counts the buffers of the mode it resolves"),
      flag_key("fsdp.fresh_block_grads", SHARDLM_FIELD(fsdp.fresh_block_grads))
          .doc("each block's backward writes its fp32 parameter gradients whole where their memory holds nothing "
               "needed (a buffer its reduction has read; on one rank, a gradient slice after the step's update): the "
               "projections' weight gradients straight from their GEMMs, the few values the norms and biases add "
               "up zeroed first, so the engine zeroes no block-gradient memory (on 2 x H200 the Llama-3.1-8B shape "
               "ran 1.9% faster on 2 GPUs and 2.4% on one, [PERFORMANCE.md](PERFORMANCE.md)). Later micro-steps of a "
               "step add to it as before; the same values. `false`: the memory is zeroed and added to, as before "
               "(for comparison). Not with `cpu_offload` or LoRA, which zero as before"),
      flag_key("fsdp.root_in_grad_slices", SHARDLM_FIELD(fsdp.root_in_grad_slices))
          .doc("the root's gathered parameters and the LM head's fp32 gradient buffer lie in the first blocks' fp32 "
               "gradient slices, which hold nothing from the optimizer step until those blocks' reductions land, the "
               "last of the backward: with an untied head, the root's reduction split, the table's rows packed "
               "(`fp32` reductions), one micro-step a step, one shard group without replicas, and at most half the "
               "blocks under it; elsewhere (accumulation, replicas, CPU offload, a tied head) the key does nothing. "
               "The full Llama-3.1-8B (2048 x 2, activation checkpointing) then plans at 34.56 GiB a GPU on 4 GPUs "
               "instead of 37.49, and measured 64.35 GiB a rank on 2 instead of 67.28 (2 ranks sharing an H200; "
               "FSDP2 eager holds 65.76 on 2 x H200). The same values: bit for bit on the CPU backend, within the "
               "run-to-run spread of the GPU's atomic sums on the CUDA backend. `false`: separate buffers. "
               "[design.md](design.md) has the details"),
      flag_key("fsdp.forward_prefetch", SHARDLM_FIELD(fsdp.forward_prefetch))
          .cuda()
          .doc("queue the next block's all-gather before this block's forward, so it overlaps this block's compute; "
               "where every block keeps its gathered parameters (SHARD_GRAD_OP, HYBRID_SHARD_ZERO2, `no_sync = full`), "
               "blocks of up to 128 MiB are gathered at the first block's forward instead, several to one NCCL call; "
               "`false`: each block is gathered when it is needed. No effect on the CPU backend (synchronous)"),
      enum_key("fsdp.backward_prefetch", SHARDLM_FIELD(fsdp.backward_prefetch), backward_prefetch_name)
          .cuda()
          .doc("when the previous block's all-gather is queued in backward: `pre` before this block's backward "
               "(overlaps it; PyTorch's BACKWARD_PRE), `post` after this block's backward and reduce-scatter "
               "(PyTorch's BACKWARD_POST), `none` when it is needed"),
      int_key("fsdp.limit_all_gathers", SHARDLM_FIELD(fsdp.limit_all_gathers), 1, "must be >= 1")
          .cuda()
          .doc("FULL_SHARD and HYBRID_SHARD: how many gathered block buffers exist, so how many all-gathers can be in"
               " flight or in use at once (each costs one block's parameters in `param_dtype`); `1` makes gathers and"
               " compute alternate (no prefetch, least memory). Other strategies keep every block gathered from "
               "forward to backward"),
  };
}

DeckSection fsdp_section() {
  return grouped_section("fsdp", check_fsdp, {precision_keys(), offload_keys(), communication_keys()});
}

}  // namespace shardlm::config_detail

// The keys of Accelerate's config file and of Hugging Face TrainingArguments that
// `shardlm import-accelerate` knows, with what each becomes in a deck or why it has no counterpart.
// docs/accelerate.md prints these tables (test_accelerate_import checks they agree).
#include <cstring>
#include <sstream>

#include "accelerate_import.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

namespace {

constexpr ForeignKeyUse M = ForeignKeyUse::Mapped;
constexpr ForeignKeyUse E = ForeignKeyUse::NoEffect;
constexpr ForeignKeyUse N = ForeignKeyUse::NotDone;

const char* kLaunch = "the launch: mpirun or srun start and place the ranks, MPI bootstraps NCCL";
const char* kTpu = "TPUs only";
const char* kPython = "Python's or PyTorch's machinery; shardlm is one compiled program";
const char* kHub = "the Hugging Face Hub: shardlm writes files only (`shardlm export` makes a model folder to upload)";
const char* kTrackers = "metrics go to RUN_DIR/metrics.jsonl with Trainer's keys and to TensorBoard event files (`run.tensorboard`, on by default); no other tracker";
const char* kScript = "read by the training script, not by Trainer";
const char* kNotOptimizer = "shardlm's optimizers are AdamW and 8-bit AdamW (`train.optim`), without extra arguments";
// The registry's block classes, each family's (before kKeys: it points into this string).
const std::string kBlockClassesNote = "checked: " + hf_block_class_names() + " are the blocks shardlm wraps";
const char* kEvalLoss = "shardlm evaluates the eval loss (and SQuAD EM/F1 by generation) after each epoch, nothing else";

const std::vector<ForeignKey> kKeys = {
    // ---- Accelerate config file, top level ----
    {"accelerate", "compute_environment", "\"LOCAL_MACHINE\"", E, "LOCAL_MACHINE is what shardlm runs on; AMAZON_SAGEMAKER has no counterpart"},
    {"accelerate", "distributed_type", "\"NO\"", M, "`fsdp.strategy` (FSDP: from fsdp_config; MULTI_GPU: NO_SHARD, which is DDP; NO: NO_SHARD on one rank; MULTI_CPU: NO_SHARD, `run.backend = cpu`); others are refused"},
    {"accelerate", "mixed_precision", "\"no\"", M, "`fsdp.param_dtype`, `fsdp.reduce_dtype` (no: fp32; fp8: bf16 with `model.fp8_linear`, the blocks' linear layers in FP8; on the CPU backend bf16 and a warning); TrainingArguments' bf16/fp16 win over it, as in Trainer"},
    {"accelerate", "use_cpu", "false", M, "`run.backend` (cpu or cuda)"},
    {"accelerate", "num_processes", "1", M, "the ranks the deck is written for (`train.batch_size` = per-device batch x accumulation x num_processes; `mpirun -np`)"},
    {"accelerate", "num_machines", "1", M, "said in the deck's header; HYBRID_SHARD's nodes are the real hosts (`dist.ranks_per_node = 0`)"},
    {"accelerate", "machine_rank", "0", E, kLaunch},
    {"accelerate", "main_process_ip", "null", E, kLaunch},
    {"accelerate", "main_process_port", "null", E, kLaunch},
    {"accelerate", "rdzv_backend", "\"static\"", E, kLaunch},
    {"accelerate", "same_network", "true", E, kLaunch},
    {"accelerate", "main_training_function", "\"main\"", E, "no Python script: the deck is the whole run"},
    {"accelerate", "gpu_ids", "\"all\"", N, "each rank takes its local rank's GPU; choose GPUs with CUDA_VISIBLE_DEVICES or the scheduler (srun --gpus)"},
    {"accelerate", "enable_cpu_affinity", "false", N, "shardlm pins nothing itself: bind with srun --cpu-bind or mpirun --bind-to"},
    {"accelerate", "debug", "false", N, "Accelerate's collective shape checks; shardlm checks shapes before it starts instead"},
    {"accelerate", "downcast_bf16", "\"no\"", E, kTpu},
    {"accelerate", "fsdp_config", "{}", M, "the [fsdp] keys, below"},
    {"accelerate", "deepspeed_config", "{}", N, "DeepSpeed is refused (distributed_type DEEPSPEED)"},
    {"accelerate", "megatron_lm_config", "{}", N, "tensor and pipeline parallelism: shardlm is FSDP only"},
    {"accelerate", "parallelism_config", "{}", N, "tensor, context and pipeline parallelism: shardlm is FSDP only"},
    {"accelerate", "fp8_config", "{}", N,
     "one FP8 recipe, set by mixed_precision: fp8 (`model.fp8_linear`): torchao's tensorwise current scaling, E4M3 for every operand; Transformer Engine's and MS-AMP's settings (backend, fp8_format HYBRID, amax_history_len, amax_compute_algo, margin, interval) are not read"},
    {"accelerate", "ipex_config", "{}", N, "Intel Extension for PyTorch: no counterpart"},
    {"accelerate", "mpirun_config", "{}", E, "shardlm is started by mpirun or srun itself"},
    {"accelerate", "dynamo_config", "{}", E, kPython},
    {"accelerate", "dynamo_backend", "\"NO\"", E, kPython},
    {"accelerate", "tpu_env", "[]", E, kTpu},
    {"accelerate", "tpu_use_cluster", "false", E, kTpu},
    {"accelerate", "tpu_use_sudo", "false", E, kTpu},
    {"accelerate", "tpu_name", "null", E, kTpu},
    {"accelerate", "tpu_zone", "null", E, kTpu},
    {"accelerate", "commands", "null", E, kTpu},
    {"accelerate", "command_file", "null", E, kTpu},
    // ---- fsdp_config ----
    {"fsdp_config", "fsdp_version", "1", M, "`fsdp.strategy` (version 2 takes it from fsdp_reshard_after_forward)"},
    {"fsdp_config", "fsdp_sharding_strategy", "\"FULL_SHARD\"", M, "`fsdp.strategy` (names or Accelerate's numbers 1-5)"},
    {"fsdp_config", "fsdp_reshard_after_forward", "true", M, "`fsdp.strategy` (true: FULL_SHARD, false: SHARD_GRAD_OP; a strategy name in Accelerate 1.6+'s FSDP1 spelling)"},
    {"fsdp_config", "fsdp_offload_params", "false", M, "`fsdp.cpu_offload`"},
    {"fsdp_config", "fsdp_auto_wrap_policy", "null", M, "shardlm wraps each transformer block, as TRANSFORMER_BASED_WRAP (a warning for SIZE_BASED_WRAP and NO_WRAP)"},
    {"fsdp_config", "fsdp_transformer_layer_cls_to_wrap", "null", M, kBlockClassesNote.c_str()},
    {"fsdp_config", "fsdp_min_num_params", "0", N, "SIZE_BASED_WRAP's threshold: shardlm wraps by block"},
    {"fsdp_config", "fsdp_backward_prefetch", "null", M, "`fsdp.backward_prefetch` (BACKWARD_PRE: pre, BACKWARD_POST: post, NO_PREFETCH or absent: none); with fsdp_version 2: pre, absent or not (FSDP2 has no such setting and always prefetches as BACKWARD_PRE; Accelerate drops the key with a warning, and so does shardlm)"},
    {"fsdp_config", "fsdp_backward_prefetch_policy", "null", M, "older name of fsdp_backward_prefetch"},
    {"fsdp_config", "fsdp_forward_prefetch", "false", M, "`fsdp.forward_prefetch`; with fsdp_version 2: false, absent or not (Accelerate has no forward prefetch for FSDP2: each block is gathered when its forward needs it; true is a warning)"},
    {"fsdp_config", "fsdp_state_dict_type", "\"FULL_STATE_DICT\"", M, "checkpoints are always one HDF5 file holding every rank's slices (a warning: not Accelerate's format; `shardlm export` writes the full safetensors model)"},
    {"fsdp_config", "fsdp_sync_module_states", "true", E, "every rank starts from the same weights without a broadcast: each reads its own slices of model.dir, or draws them from train.seed"},
    {"fsdp_config", "fsdp_use_orig_params", "true", E, "PyTorch's flat-parameter bookkeeping; weight decay already skips biases and norms"},
    {"fsdp_config", "fsdp_cpu_ram_efficient_loading", "false", E, "each rank always reads only its own slices of the weights"},
    {"fsdp_config", "fsdp_activation_checkpointing", "false", M, "`fsdp.activation_checkpointing`"},
    {"fsdp_config", "fsdp_limit_all_gathers", "true", M, "`fsdp.limit_all_gathers` (true: 2, shardlm's default; false: a warning, shardlm always limits)"},
    {"fsdp_config", "fsdp_cpu_offload_pin_memory", "true", E, "shardlm's offload copies go through its own pinned buffers"},
    {"fsdp_config", "fsdp_mixed_precision_policy", "null", N, "the dtypes come from mixed_precision (bf16 or fp16 for parameters and reductions)"},
    {"fsdp_config", "fsdp_ignored_modules", "null", N, "every parameter is sharded"},
    {"fsdp_config", "xla", "false", E, kTpu},
    {"fsdp_config", "xla_fsdp_settings", "null", E, kTpu},
    {"fsdp_config", "xla_fsdp_grad_ckpt", "false", E, kTpu},
    {"fsdp_config", "xla_fsdp_v2", "false", E, kTpu},
    // ---- TrainingArguments ----
    {"training_args", "output_dir", "\"trainer_output\"", M, "`run.dir`"},
    {"training_args", "overwrite_output_dir", "false", E, "shardlm writes into run.dir whether or not it exists"},
    {"training_args", "per_device_train_batch_size", "8", M, "`train.micro_batch_size`, and `train.batch_size` with the accumulation and num_processes"},
    {"training_args", "per_gpu_train_batch_size", "null", M, "older name of per_device_train_batch_size (wins over it when set, as in Trainer)"},
    {"training_args", "gradient_accumulation_steps", "1", M, "`train.batch_size` = per-device batch x this x num_processes"},
    {"training_args", "num_train_epochs", "3.0", M, "`train.epochs` (a fraction: rounded up, with a warning)"},
    {"training_args", "max_steps", "-1", M, "`train.max_steps` (-1: 0)"},
    {"training_args", "learning_rate", "5e-05", M, "`train.lr`"},
    {"training_args", "lr_scheduler_type", "\"linear\"", M, "`train.lr_schedule`, the same name (linear, constant, constant_with_warmup, cosine, cosine_with_restarts, polynomial, cosine_with_min_lr); others: linear, with a warning"},
    {"training_args", "lr_scheduler_kwargs", "{}", M, "num_cycles: `train.lr_num_cycles`; power: `train.lr_power`; lr_end: `train.lr_end`; min_lr_rate: `train.min_lr_ratio` (min_lr: over learning_rate); others: a warning"},
    {"training_args", "warmup_steps", "0", M, "`train.warmup_steps` (a fraction below 1 is a ratio: `train.warmup_ratio`; with constant: 0, with a warning)"},
    {"training_args", "warmup_ratio", "0.0", M, "`train.warmup_ratio` (warmup_steps wins when both are set, as in Trainer)"},
    {"training_args", "optim", "\"adamw_torch\"", M, "`train.optim`: adamw_torch, adamw_torch_fused, adamw_hf, adamw_apex_fused: adamw_torch; adamw_8bit, adamw_bnb_8bit, paged_adamw_8bit: adamw_8bit (block-wise 8-bit moments, as bitsandbytes'; not its bits); others: adamw_torch, with a warning"},
    {"training_args", "optim_args", "null", N, kNotOptimizer},
    {"training_args", "optim_target_modules", "null", N, "GaLore and APOLLO: no counterpart"},
    {"training_args", "adafactor", "false", N, kNotOptimizer},
    {"training_args", "weight_decay", "0.0", M, "`train.weight_decay`"},
    {"training_args", "adam_beta1", "0.9", M, "`train.adam_beta1`"},
    {"training_args", "adam_beta2", "0.999", M, "`train.adam_beta2`"},
    {"training_args", "adam_epsilon", "1e-08", M, "`train.adam_eps`"},
    {"training_args", "max_grad_norm", "1.0", M, "`train.max_grad_norm` (0 or below: 0, no clipping, as in Trainer)"},
    {"training_args", "average_tokens_across_devices", "true", M, "what shardlm always does: the loss is the mean over the loss tokens of the whole global batch (false: a warning)"},
    {"training_args", "label_smoothing_factor", "0.0", N, "no label smoothing"},
    {"training_args", "bf16", "false", M, "`fsdp.param_dtype = bf16`, `fsdp.reduce_dtype = bf16`"},
    {"training_args", "fp16", "false", M, "`fsdp.param_dtype = fp16`, `fsdp.reduce_dtype = fp16`; dynamic loss scaling turns itself on (`train.loss_scale = 0`) as Trainer's GradScaler"},
    {"training_args", "fp16_opt_level", "\"O1\"", E, "apex's AMP levels: shardlm's mixed precision is its own"},
    {"training_args", "half_precision_backend", "\"auto\"", E, kPython},
    {"training_args", "fp16_backend", "\"auto\"", E, kPython},
    {"training_args", "bf16_full_eval", "false", N, "evaluation runs in fsdp.param_dtype, as training"},
    {"training_args", "fp16_full_eval", "false", N, "evaluation runs in fsdp.param_dtype, as training"},
    {"training_args", "tf32", "null", N, "fp32 GEMMs use cuBLASLt's fp32 compute"},
    {"training_args", "gradient_checkpointing", "false", M, "`fsdp.activation_checkpointing` (either this or fsdp_activation_checkpointing turns it on)"},
    {"training_args", "gradient_checkpointing_kwargs", "null", E, "PyTorch's checkpoint options (use_reentrant): shardlm recomputes each block its own way"},
    {"training_args", "torch_compile", "false", E, kPython},
    {"training_args", "torch_compile_backend", "null", E, kPython},
    {"training_args", "torch_compile_mode", "null", E, kPython},
    {"training_args", "torchdynamo", "null", E, kPython},
    {"training_args", "use_liger_kernel", "false", E, "shardlm's kernels already fuse the norms, rotary, SwiGLU and the loss"},
    {"training_args", "liger_kernel_config", "null", E, "shardlm's kernels already fuse the norms, rotary, SwiGLU and the loss"},
    {"training_args", "use_cache", "false", E, "training keeps no key/value cache; generation does"},
    {"training_args", "neftune_noise_alpha", "null", N, "no NEFTune noise"},
    {"training_args", "torch_empty_cache_steps", "null", E, "shardlm plans its memory up front; there is no allocator cache to empty"},
    {"training_args", "auto_find_batch_size", "false", N, "`shardlm plan` prints the largest micro-batch that fits before the run"},
    {"training_args", "logging_strategy", "\"steps\"", M, "steps: `train.log_every`; epoch and no: a warning (shardlm logs every train.log_every steps)"},
    {"training_args", "logging_steps", "500", M, "`train.log_every` (a fraction below 1: a warning)"},
    {"training_args", "logging_first_step", "false", N, "the first logged step is train.log_every"},
    {"training_args", "log_on_each_node", "true", E, "rank 0 prints; every rank's errors are printed with its rank"},
    {"training_args", "logging_nan_inf_filter", "true", N, "a step with a non-finite loss stops the run (fp16: skipped by the loss scaler)"},
    {"training_args", "logging_dir", "null", E, kTrackers},
    {"training_args", "include_num_input_tokens_seen", "false", E, "tokens/s are in every train record"},
    {"training_args", "include_tokens_per_second", "false", E, "tokens/s are in every train record"},
    {"training_args", "log_level", "\"passive\"", E, "shardlm's log has one level"},
    {"training_args", "log_level_replica", "\"warning\"", E, "shardlm's log has one level"},
    {"training_args", "disable_tqdm", "null", E, "the progress bar shows on a terminal only"},
    {"training_args", "report_to", "\"none\"", N, kTrackers},
    {"training_args", "run_name", "null", E, kTrackers},
    {"training_args", "project", "\"huggingface\"", E, kTrackers},
    {"training_args", "trackio_space_id", "\"trackio\"", E, kTrackers},
    {"training_args", "eval_strategy", "\"no\"", M, "epoch: the eval loss after each epoch when data.eval_file is set; steps: `eval.every_steps` (shardlm also evaluates each epoch: a warning); no: a warning when data.eval_file is given"},
    {"training_args", "evaluation_strategy", "\"no\"", M, "older name of eval_strategy"},
    {"training_args", "eval_steps", "null", M, "`eval.every_steps` with eval_strategy steps (null: logging_steps, as Trainer; a fraction below 1: a warning)"},
    {"training_args", "eval_delay", "0", N, kEvalLoss},
    {"training_args", "per_device_eval_batch_size", "8", M, "`eval.batch_size` (prompts a rank decodes together for EM/F1; the eval loss runs train.micro_batch_size samples at a time)"},
    {"training_args", "per_gpu_eval_batch_size", "null", M, "older name of per_device_eval_batch_size"},
    {"training_args", "prediction_loss_only", "false", E, kEvalLoss},
    {"training_args", "eval_on_start", "false", N, kEvalLoss},
    {"training_args", "eval_do_concat_batches", "true", E, kPython},
    {"training_args", "eval_use_gather_object", "false", E, kPython},
    {"training_args", "eval_accumulation_steps", "null", E, kPython},
    {"training_args", "include_for_metrics", "[]", E, "compute_metrics is Python: shardlm computes the loss and SQuAD EM/F1"},
    {"training_args", "include_inputs_for_metrics", "false", E, "compute_metrics is Python: shardlm computes the loss and SQuAD EM/F1"},
    {"training_args", "batch_eval_metrics", "false", E, "compute_metrics is Python: shardlm computes the loss and SQuAD EM/F1"},
    {"training_args", "jit_mode_eval", "false", E, kPython},
    {"training_args", "use_legacy_prediction_loop", "false", E, kPython},
    {"training_args", "past_index", "-1", E, "models with mems (Transformer-XL, XLNet): not among shardlm's families"},
    {"training_args", "save_strategy", "\"steps\"", M, "steps: `checkpoint.every = save_steps`; epoch: `checkpoint.every_epoch = true`; no: `checkpoint.every = 0`, `checkpoint.at_end = false`; best: a warning (`checkpoint.keep_best` keeps the best by eval loss)"},
    {"training_args", "save_steps", "500", M, "`checkpoint.every` (a fraction below 1: a warning)"},
    {"training_args", "save_total_limit", "null", M, "`checkpoint.keep_last` (null: 0, keep all)"},
    {"training_args", "save_safetensors", "true", E, "checkpoints are HDF5; `shardlm export` writes safetensors"},
    {"training_args", "save_on_each_node", "false", E, "all ranks write one checkpoint file together on a shared file system"},
    {"training_args", "save_only_model", "false", N, "checkpoints always hold the optimizer state (`shardlm export` writes the model alone)"},
    {"training_args", "enable_jit_checkpoint", "false", E, "SIGTERM and SIGUSR1 always write a checkpoint at the next step"},
    {"training_args", "restore_callback_states_from_checkpoint", "false", E, "no callbacks"},
    {"training_args", "resume_from_checkpoint", "null", N, "shardlm resumes from its own checkpoints (`checkpoint.resume = auto` or a path), not from Trainer's"},
    {"training_args", "ignore_data_skip", "false", N, "a resumed run always continues at the checkpoint's position in the data"},
    {"training_args", "load_best_model_at_end", "false", M, "`checkpoint.keep_best = eval_loss` (the best checkpoint is kept and named by DIR/best, not loaded at the end: a warning)"},
    {"training_args", "metric_for_best_model", "null", M, "loss or eval_loss (or null) with load_best_model_at_end: `checkpoint.keep_best = eval_loss`; another metric: a warning"},
    {"training_args", "greater_is_better", "null", N, "the best checkpoint is the lowest eval loss"},
    {"training_args", "push_to_hub", "false", N, kHub},
    {"training_args", "hub_model_id", "null", E, kHub},
    {"training_args", "hub_strategy", "\"every_save\"", E, kHub},
    {"training_args", "hub_token", "null", E, kHub},
    {"training_args", "hub_private_repo", "null", E, kHub},
    {"training_args", "hub_always_push", "false", E, kHub},
    {"training_args", "hub_revision", "null", E, kHub},
    {"training_args", "push_to_hub_model_id", "null", E, kHub},
    {"training_args", "push_to_hub_organization", "null", E, kHub},
    {"training_args", "push_to_hub_token", "null", E, kHub},
    {"training_args", "seed", "42", M, "`train.seed`"},
    {"training_args", "data_seed", "null", N, "train.seed orders the data too"},
    {"training_args", "full_determinism", "false", E, "a run is deterministic for a given deck and rank count"},
    {"training_args", "use_cpu", "false", M, "`run.backend = cpu`"},
    {"training_args", "no_cuda", "false", M, "older name of use_cpu"},
    {"training_args", "use_mps_device", "false", N, "no Apple GPUs"},
    {"training_args", "use_ipex", "false", N, "Intel Extension for PyTorch: no counterpart"},
    {"training_args", "tpu_num_cores", "null", E, kTpu},
    {"training_args", "tpu_metrics_debug", "false", E, kTpu},
    {"training_args", "local_rank", "-1", E, kLaunch},
    {"training_args", "ddp_backend", "null", E, "NCCL on the CUDA backend, MPI on the CPU backend"},
    {"training_args", "ddp_timeout", "1800", N, "the NCCL wait limit is `dist.timeout` (600 s by default), not set from here"},
    {"training_args", "ddp_find_unused_parameters", "null", E, "DistributedDataParallel's options: shardlm's NO_SHARD reduces every gradient"},
    {"training_args", "ddp_bucket_cap_mb", "null", E, "DistributedDataParallel's options: shardlm reduces one flat gradient per block"},
    {"training_args", "ddp_broadcast_buffers", "null", E, "DistributedDataParallel's options: the models have no buffers to broadcast"},
    {"training_args", "fsdp", "\"\"", M, "`fsdp.strategy` (full_shard, shard_grad_op, hybrid_shard, hybrid_shard_zero2, no_shard), `fsdp.cpu_offload` (offload); auto_wrap: by block"},
    {"training_args", "fsdp_config", "null", M, "the fsdp_config keys above (with or without their fsdp_ prefix)"},
    {"training_args", "fsdp_min_num_params", "0", N, "SIZE_BASED_WRAP's threshold: shardlm wraps by block"},
    {"training_args", "fsdp_transformer_layer_cls_to_wrap", "null", M, "checked, as fsdp_config's"},
    {"training_args", "accelerator_config", "null", N, "split_batches, dispatch_batches, even_batches: each rank reads its own share of every global batch"},
    {"training_args", "dispatch_batches", "null", N, "each rank reads its own share of every global batch"},
    {"training_args", "split_batches", "null", N, "each rank reads its own share of every global batch"},
    {"training_args", "parallelism_config", "null", N, "tensor, context and pipeline parallelism: shardlm is FSDP only"},
    {"training_args", "deepspeed", "null", N, "DeepSpeed: no counterpart (shardlm's FULL_SHARD is ZeRO-3's sharding)"},
    {"training_args", "debug", "\"\"", N, "no underflow/overflow tracer; fp16's loss scaler skips non-finite steps"},
    {"training_args", "skip_memory_metrics", "true", E, "peak memory per rank is in every train record"},
    {"training_args", "dataloader_drop_last", "false", M, "shardlm always drops the last incomplete global batch of an epoch (false: a warning)"},
    {"training_args", "dataloader_num_workers", "0", E, "the data are tokenized once at start-up"},
    {"training_args", "dataloader_pin_memory", "true", E, "the data are tokenized once at start-up"},
    {"training_args", "dataloader_persistent_workers", "false", E, "the data are tokenized once at start-up"},
    {"training_args", "dataloader_prefetch_factor", "null", E, "the data are tokenized once at start-up"},
    {"training_args", "remove_unused_columns", "true", E, "data.format says which fields are read"},
    {"training_args", "label_names", "null", E, "data.format says which tokens carry the loss"},
    {"training_args", "group_by_length", "false", N, "samples are drawn in a seeded random order (train.shuffle)"},
    {"training_args", "train_sampling_strategy", "\"random\"", M, "`train.shuffle` (random: true, sequential: false, group_by_length: a warning)"},
    {"training_args", "length_column_name", "\"length\"", E, "used by group_by_length only"},
    {"training_args", "sharded_ddp", "\"\"", N, "FairScale's sharded DDP (transformers before 4.35): use fsdp.strategy"},
    {"training_args", "xpu_backend", "null", E, "Intel XPUs: NCCL on the CUDA backend, MPI on the CPU backend"},
    {"training_args", "tp_size", "0", N, "tensor parallelism: shardlm is FSDP only"},
    {"training_args", "ray_scope", "\"last\"", E, "Ray Tune: no hyperparameter search"},
    {"training_args", "mp_parameters", "\"\"", E, "SageMaker model parallelism: no counterpart"},
    {"training_args", "do_train", "false", E, kScript},
    {"training_args", "do_eval", "false", E, kScript},
    {"training_args", "do_predict", "false", E, kScript},
    // ---- TRL's SFTConfig (TrainingArguments plus these, in the same file) ----
    {"sft_config", "max_length", "1024", M, "`data.max_length` (null: a warning; shardlm always cuts at data.max_length)"},
    {"sft_config", "max_seq_length", "null", M, "older name of max_length (TRL before 0.20)"},
    {"sft_config", "packing", "false", M, "`data.packing`; true is a warning: TRL's per-device batch counts packed rows, `train.batch_size` counts samples (scale it by the samples a row holds)"},
    {"sft_config", "packing_strategy", "\"bfd\"", M, "with packing: bfd is what shardlm does (whole samples, longest first, into the first row with room); bfd_split and wrapped: a warning"},
    {"sft_config", "assistant_only_loss", "false", M, "`data.train_on_prompt` (true: false, the loss on the assistant's turns only; false: true, every token of the conversation, as TRL)"},
    {"sft_config", "completion_only_loss", "null", M, "null or true: what shardlm does for {\"prompt\", \"completion\"} records; false: a warning (shardlm always takes the loss on the completion)"},
    {"sft_config", "chat_template_path", "null", M, "`data.chat_template` (a .jinja or .json file as given; a tokenizer folder: its tokenizer_config.json)"},
    {"sft_config", "dataset_text_field", "\"text\"", N, "shardlm's JSON lines read the field text (data.format = jsonl), or messages / conversations / instruction (data.format = chat)"},
    {"sft_config", "dataset_kwargs", "null", N, "skip_prepare_dataset: shardlm always tokenizes the records itself"},
    {"sft_config", "dataset_num_proc", "null", E, "the data are tokenized once at start-up, on every rank"},
    {"sft_config", "dataset_batch_size", "null", E, "the data are tokenized once at start-up, on every rank"},
    {"sft_config", "model_init_kwargs", "null", N, "the model's dtypes come from fsdp.param_dtype, its attention is shardlm's own"},
    {"sft_config", "eos_token", "null", N, "the end of a turn is what the chat template writes; the end of a text sample is the tokenizer's eos"},
    {"sft_config", "pad_token", "null", E, "padding takes no loss; shardlm chooses the pad id itself"},
    {"sft_config", "truncation_mode", "\"keep_start\"", N, "a sample longer than data.max_length loses its end (keep_start)"},
    {"sft_config", "shuffle_dataset", "false", E, "train.shuffle draws the samples in a seeded random order each epoch"},
    {"sft_config", "padding_free", "false", E, "with data.packing, samples in one row never attend to each other; without it, rows are padded"},
    {"sft_config", "pad_to_multiple_of", "null", E, "shardlm pads each micro-batch to its longest row"},
    {"sft_config", "eval_packing", "null", N, "the eval loss is computed on unpacked samples"},
    {"sft_config", "loss_type", "null", M, "nll and chunked_nll (null): the mean token cross-entropy, shardlm's loss (its fused head never holds the full logits); dft: a warning"},
    {"sft_config", "activation_offloading", "false", N, "activations stay on the GPU: fsdp.activation_checkpointing recomputes them instead"},
};

const char* use_name(ForeignKeyUse u) {
  return u == ForeignKeyUse::Mapped ? "deck" : u == ForeignKeyUse::NoEffect ? "no effect" : "not done";
}

}  // namespace

const std::vector<ForeignKey>& foreign_keys() { return kKeys; }

const ForeignKey* find_foreign_key(const std::string& source, const std::string& name) {
  for (const ForeignKey& k : kKeys)
    if (source == k.source && name == k.name) return &k;
  return nullptr;
}

std::string foreign_key_tables() {
  std::ostringstream os;
  const struct { const char* source; const char* title; } sources[] = {
      {"accelerate", "Accelerate config file (top level)"},
      {"fsdp_config", "Accelerate `fsdp_config` (and TrainingArguments' `fsdp_config`)"},
      {"training_args", "TrainingArguments"},
      {"sft_config", "TRL `SFTConfig` (its own keys, in the same `--training-args` file)"}};
  for (const auto& s : sources) {
    os << "### " << s.title << "\n\n| key | default | becomes | deck key, or why not |\n| --- | --- | --- | --- |\n";
    for (const ForeignKey& k : kKeys)
      if (std::strcmp(k.source, s.source) == 0)
        os << "| `" << k.name << "` | `" << k.default_json << "` | " << use_name(k.use) << " | " << k.deck << " |\n";
    os << "\n";
  }
  return os.str();
}

}  // namespace shardlm

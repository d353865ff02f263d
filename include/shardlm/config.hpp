// config: the input deck (INI sections) plus --section.key=value overrides, validated into a typed run config.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/device.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

// The deck's word-valued keys, parsed once here (src/config/choices.cpp names them; the deck's
// spelling is the name in lower case).
enum class DataFormat { Squad, Jsonl, Chess, Chat };       // data.format
enum class ChatFormat { Auto, Messages, Sharegpt, Alpaca };  // data.chat_format
enum class TokenizerSource { Auto, Byte, File };           // data.tokenizer: auto | byte | a path
// train.lr_schedule: transformers' get_scheduler names (src/optim/schedule.cpp).
enum class LrSchedule { Linear, Constant, ConstantWithWarmup, Cosine, CosineWithRestarts, Polynomial, CosineWithMinLr };
// train.optim: TrainingArguments' optim names (src/optim: AdamW, and 8-bit AdamW with block-wise quantised moments).
enum class Optim { AdamWTorch, AdamW8bit };
enum class BackwardPrefetch { Pre, Post, None };           // fsdp.backward_prefetch
enum class OffloadAccumulate { Host, Device };             // fsdp.offload_accumulate
enum class OffloadRootUpdate { Auto, Host, Device };       // fsdp.offload_root_update
enum class RootReduction { Auto, Split, Whole };           // fsdp.root_reduction
enum class NoSync { Auto, Off, Replicate, Full };         // fsdp.no_sync
enum class EvalGenerate { End, Epoch, None };              // eval.generate
enum class ResumeFrom { None, Auto, Path };                // checkpoint.resume: none | auto | a path
enum class KeepBest { None, EvalLoss };                     // checkpoint.keep_best
const char* data_format_name(DataFormat f);                // "squad", ...
const char* chat_format_name(ChatFormat f);                // "auto" | "messages" | "sharegpt" | "alpaca"
const char* tokenizer_source_name(TokenizerSource t);      // "auto" | "byte" | "file"
const char* lr_schedule_name(LrSchedule s);                // "linear" | "constant" | "cosine" | ...
const char* optim_name(Optim o);                           // "adamw_torch" | "adamw_8bit"
const char* backward_prefetch_name(BackwardPrefetch p);    // "pre" | "post" | "none"
const char* offload_accumulate_name(OffloadAccumulate a);  // "host" | "device"
const char* offload_root_update_name(OffloadRootUpdate r); // "auto" | "host" | "device"
const char* root_reduction_name(RootReduction r);          // "auto" | "split" | "whole"
const char* no_sync_name(NoSync n);                        // "auto" | "off" | "replicate" | "full"
const char* eval_generate_name(EvalGenerate g);            // "end" | "epoch" | "none"
const char* resume_from_name(ResumeFrom r);                // "none" | "auto" | "path"
const char* keep_best_name(KeepBest k);                    // "none" | "eval_loss"
const char* backend_name(BackendKind b);                   // run.backend: "cpu" | "cuda"
const char* attention_impl_name(AttentionImpl a);          // model.attention: "auto" | "cudnn" | "native"
const char* lora_init_name(LoraInit i);                    // lora.init: "kaiming" | "gaussian"

// The model's shape; with `dir` (a Hugging Face model directory) the shape comes from its
// config.json and the initial weights from its safetensors files. LoRA (ModelConfig::lora) is the
// deck's [lora] section, or `adapter`'s adapter_config.json when it names a PEFT adapter to start from.
struct ModelSection : ModelConfig {
  std::string dir;
  std::string adapter;  // a PEFT adapter directory (adapter_config.json, adapter_model.safetensors); empty: none
};

struct DataSection {
  DataFormat format = DataFormat::Squad;
  std::string train_file;
  std::string eval_file;          // empty: no evaluation
  int max_length = 512;
  bool packing = false;           // training rows hold several samples end to end (pack_rows)
  size_t train_size = 0;          // 0 = all records
  size_t eval_size = 0;
  // Auto: model.dir's tokenizer.json, else byte (a deck resolves it at load); File: tokenizer_file.
  TokenizerSource tokenizer = TokenizerSource::Auto;
  std::string tokenizer_file;  // a tokenizer.json (a folder holding one is resolved to its file at load)
  // data.format = chat: the records' layout, the template (a .jinja file or a tokenizer_config.json;
  // empty: model.dir's) and whether the prompt's tokens take a loss too (default: assistant turns only).
  ChatFormat chat_format = ChatFormat::Auto;
  std::string chat_template;
  bool train_on_prompt = false;
};

struct TrainSection {
  int epochs = 1;
  int batch_size = 0;        // global: samples per optimizer step over all ranks
  int micro_batch_size = 1;  // per rank per forward pass
  double lr = 5e-5;
  double weight_decay = 0.01;
  int warmup_steps = 0;
  double warmup_ratio = 0;   // of the run's steps, rounded up; used when warmup_steps is 0 (Trainer's rule)
  Optim optim = Optim::AdamWTorch;
  LrSchedule lr_schedule = LrSchedule::Linear;
  // The schedules' arguments (transformers' lr_scheduler_kwargs): 0 cycles = the schedule's default
  // (cosine 0.5, cosine_with_restarts 1); polynomial's power and final rate; cosine_with_min_lr's floor.
  double lr_num_cycles = 0;
  double lr_power = 1.0;
  double lr_end = 1e-7;
  double min_lr_ratio = 0;
  // Trainer's EarlyStoppingCallback on the eval loss: stop after `patience` evaluations in a row
  // that do not improve on the best by more than `threshold`; 0 = off.
  int early_stopping_patience = 0;
  double early_stopping_threshold = 0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double max_grad_norm = 1.0;  // 0 = no clipping
  double loss_scale = 0;       // dynamic loss scaling: 0 = from 65536 when fp16 is used, else off; > 0 = start here
  uint64_t seed = 42;
  bool shuffle = true;
  int log_every = 1;
  int max_steps = 0;  // 0 = run every epoch to the end
};

struct FsdpSection {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  DType param_dtype = DType::F32;
  DType reduce_dtype = DType::F32;
  bool activation_checkpointing = false;  // recompute each block's activations in its backward (CUDA backend)
  bool cpu_offload = false;  // CUDA backend: fp32 master and AdamW state in host memory, the step on the CPU
  // With cpu_offload: AdamW's moments in memory-mapped files in this directory (local NVMe) instead of
  // host memory; empty: in host memory.
  std::string offload_dir;
  // With cpu_offload and gradient accumulation, where the micro-steps' reduced gradients are summed:
  // Host: each goes down as it is reduced and the host adds it (no fp32 per parameter on the device);
  // Device: summed in an fp32 slice on the device, which goes down once, in the step's last micro-step.
  OffloadAccumulate offload_accumulate = OffloadAccumulate::Host;
  // With cpu_offload, where the root unit's (embeddings, head) AdamW runs: Host, with the blocks; Device:
  // on the GPU, its fp32 master and moments streamed up and back over the host link while the host's
  // cores update the blocks; Auto: Device when the link measures at least kOffloadRootLinkGBs each way.
  OffloadRootUpdate offload_root_update = OffloadRootUpdate::Auto;
  // With cpu_offload and the root updated on the device: GiB of GPU memory in which that much of the
  // root's fp32 master and AdamW moments (12 bytes a parameter) stays resident, instead of going up and
  // back over the host link every step; 0: none (everything streams).
  double offload_resident_gib = 0.0;
  // How the root unit's gradient is reduced with several ranks: Split: the head's part right after the
  // head's backward, the embedding's token rows at the end (FsdpBufferPlan::root_split); Whole: all of
  // it at the end; Auto: Split when every rank's tokens name under half the embedding's rows.
  RootReduction root_reduction = RootReduction::Auto;
  // Gradient accumulation's communication (several micro-steps a step), as PyTorch's no_sync: Full: the
  // micro-steps before the last keep every unit's gradient unsharded and its parameters gathered, and
  // only the last reduces (once a step, at the memory of unsharded gradients and parameters); Replicate:
  // each micro-step reduce-scatters in the shard group, the replicate group's all-reduce runs once, in
  // the last (HSDP's; no extra memory); Off: every micro-step reduces everything; Auto: Full when the
  // unsharded model fits kNoSyncAutoBytes, else Replicate (FsdpBufferPlan::no_sync).
  NoSync no_sync = NoSync::Auto;
  // The blocks' backward writes their fp32 gradients into memory whose content nothing needs (a buffer its
  // reduction has read, a slice zero_grad left), instead of the engine zeroing it to be added to; false: zeroed
  // as before (UnitModel::writes_fresh_block_grads says which models can).
  bool fresh_block_grads = true;
  // The head's gradient buffer and the gathered root in the first blocks' gradient slices where they fit
  // (FsdpBufferPlan::root_in_slices: one micro-step a step among its conditions); false: separate buffers.
  bool root_in_grad_slices = true;
  // The CUDA backend's all-gather schedule (the CPU backend runs synchronously and ignores them):
  bool forward_prefetch = true;          // gather the next block while this one computes
  // Pre: gather the previous block before this one's backward; Post: after it; None: only when needed.
  BackwardPrefetch backward_prefetch = BackwardPrefetch::Pre;
  int limit_all_gathers = 2;             // FULL_SHARD: gathered block buffers (all-gathers in flight + in use)
};

// Evaluation by generation: SQuAD exact match and F1 from greedy answers (data.format = squad).
struct EvalSection {
  EvalGenerate generate = EvalGenerate::End;  // End: after the last epoch | Epoch: after every epoch | None
  int max_new_tokens = 50;       // tokens generated per answer at most (EOS ends it earlier)
  int batch_size = 0;            // prompts decoded together on a rank; 0 = train.micro_batch_size
  int every_steps = 0;           // the eval loss every N optimizer steps too (beside each epoch's); 0 = none
};

struct DistSection {
  int ranks_per_node = 0;  // 0 = the real node layout; K > 0 emulates nodes of K ranks
  double timeout = 600;    // seconds an NCCL wait may make no progress before the job ends (default_dist_timeout())
  bool replicate_stream = true;  // the replicate group's block all-reduces on a stream of their own (NCCL)
  bool gather_stream = true;     // the all-gathers on a stream of their own (NCCL)
  bool gather_copy_engine = true;  // those all-gathers on the copy engines (NCCL 2.28+, a shard group on one host)
  bool symmetric_reductions = true;  // the block gradients in NCCL symmetric windows (NCCL 2.28+, one host)
  bool copy_engine_reductions = true;  // the blocks' reduce-scatters as copy-engine exchanges and a sum (same)
};

struct CheckpointSection {
  std::string dir;              // empty: RUN_DIR/checkpoints
  int every = 0;                // optimizer steps between checkpoints; 0 = none on a cadence
  int keep_last = 3;            // checkpoints kept; 0 = all
  ResumeFrom resume = ResumeFrom::None;  // Auto: the checkpoint dir's latest, if any; Path: resume_path
  std::string resume_path;               // a checkpoint file or a checkpoint folder (resume = Path)
  bool at_end = true;           // write one when training ends
  bool collective_buffering = false;  // MPI-IO two-phase aggregation of the slices (parallel file systems)
  bool load_weights_only = false;     // resume takes only the parameters: a fresh run from another model config
  bool allow_new_batch = false;       // resume a checkpoint written with another train.batch_size
  KeepBest keep_best = KeepBest::None;  // EvalLoss: the checkpoint of the lowest eval loss kept beside the last N (DIR/best)
  bool every_epoch = false;     // one at the end of every epoch too (Trainer's save_strategy = epoch)
};

struct RunSection {
  std::string dir = "runs/run";
  BackendKind backend = BackendKind::Cpu;
  double peak_tflops = 0;  // per rank, for the model FLOPs utilisation (MFU); 0 = the GPU's peak from its name
  bool overwrite = false;  // a fresh run may replace an earlier run left in dir
  // The optimizer step, numbered as the log numbers them (a resumed run continues the count), whose
  // timeline is written to dir/trace_stepN_rankR.json for each rank R, with a "trace" record per rank
  // in metrics.jsonl; 0 = none.
  int trace_step = 0;
  bool tensorboard = true;  // rank 0 writes dir/tensorboard/events.out.tfevents.* (TensorBoard's scalars)
  // A smoke run (`--run.smoke`, `shardlm train DECK --tiny`): the deck's model family at a tiny width and
  // depth with random weights, a few steps of its data, or of synthetic data where its files are missing
  // (src/config/smoke.cpp says what it changes; RunConfig::notes lists it for the run's log).
  bool smoke = false;
};

// data.tokenizer and checkpoint.resume as the resolved deck writes them: the word, or the path.
std::string tokenizer_text(const DataSection& data);
std::string resume_text(const CheckpointSection& checkpoint);

struct RunConfig {
  ModelSection model;
  DataSection data;
  TrainSection train;
  FsdpSection fsdp;
  EvalSection eval;
  DistSection dist;
  CheckpointSection checkpoint;
  RunSection run;
  // Every key with its resolved value ("section.key", "value"), in a fixed order.
  std::vector<std::pair<std::string, std::string>> resolved;
  // What loading the deck changed that the deck does not say, one line each ("model.dir from the command
  // line: ...", a smoke run's substitutions): rank 0 prints them when the run starts.
  std::vector<std::string> notes;

  // Micro-steps per optimizer step for a world of `world` ranks (validated to divide).
  int grad_accum(int world) const { return train.batch_size / (world * train.micro_batch_size); }
  // Where checkpoints go: checkpoint.dir, or RUN_DIR/checkpoints when it is empty.
  std::string checkpoint_dir() const { return checkpoint.dir.empty() ? run.dir + "/checkpoints" : checkpoint.dir; }
  // The tokenizer.json data.tokenizer names, Auto made concrete (model.dir's); empty: the byte tokenizer.
  std::string tokenizer_json() const {
    if (data.tokenizer == TokenizerSource::File) return data.tokenizer_file;
    if (data.tokenizer == TokenizerSource::Auto && !model.dir.empty()) return model.dir + "/tokenizer.json";
    return "";
  }
};

// Why data.tokenizer = auto finds no tokenizer: `model_dir` has no tokenizer.json (training's error; `shardlm
// generate` adds what it takes instead).
std::string missing_tokenizer_message(const std::string& model_dir);

// Reads the deck, applies overrides ("--section.key=value" or "--section.key value"), checks
// every value and every file, and the batch size against `world_size` ranks and the node size.
// Throws Error with one message naming the key (and the nearest valid key for an unknown one).
// check_data_files = false (`shardlm plan`, which needs only the shape) leaves the data files
// unread and unset.
RunConfig load_run_config(const std::string& deck_path, const std::vector<std::string>& overrides,
                          int world_size, bool check_data_files = true);
// The same from the deck's text, named `deck_path` in errors, its relative paths taken from `deck_dir`
// (`shardlm generate` loads a checkpoint's resolved deck this way).
RunConfig load_run_config_text(const std::string& text, const std::string& deck_path, const std::string& deck_dir,
                               const std::vector<std::string>& overrides, int world_size, bool check_data_files = true);

// The resolved deck as INI text, loadable again by load_run_config. With model.dir the shape keys are comments.
std::string resolved_deck_ini(const RunConfig& cfg);
// Whether "section.key" is one of the model's shape keys, which model.dir's config.json gives instead.
bool is_model_shape_key(const std::string& name);
// The keys that act on the CUDA backend alone (docs/deck.md's `cuda` column) that cfg sets away from their
// defaults, as "key = value" in the table's order, less those named in `except` (warned about in words of their
// own): what a CPU run warns does nothing.
std::vector<std::string> cuda_only_settings(const RunConfig& cfg, const std::vector<std::string>& except);
// "section.key" -> value of an INI text as resolved_deck_ini writes it; Error naming `where` and the
// line for a line that is neither a section header nor `key = value`.
std::map<std::string, std::string> ini_values(const std::string& text, const std::string& where);

// docs/deck.md (`doc`) with the table of each section's keys, between the section's marker comments,
// written anew from the keys' declarations (src/config/keys_<section>.cpp): `shardlm deck-reference`.
// Error naming the section whose markers are missing.
std::string deck_reference_tables(const std::string& doc);

// One deck key and its value checked as loading a deck checks them, through the key's declaration (its
// parser and range) alone: Error "KEY = VALUE: why", or "unknown key 'KEY' WHERE (did you mean ...?)" with
// the nearest valid key. The files and folders a path key names are not looked for, and the checks
// between keys (the batch on the ranks, a schedule's arguments) wait for load_run_config.
void check_deck_value(const std::string& key, const std::string& value, const std::string& where);

// Levenshtein distance, for the nearest-key hint.
size_t edit_distance(const std::string& a, const std::string& b);

// ---- LoRA against the model's family (src/config/lora.cpp) ----------------------------------

// `names` (lora.target_modules as written; "all-linear" = every linear module) as the family's
// module names in its order, repeats removed. Error "WHERE: ..." listing the valid names for a name
// the family does not have.
std::vector<std::string> resolve_lora_targets(const ModelConfig& cfg, const std::vector<std::string>& names,
                                              const std::string& where);
// lora.modules_to_save (or an adapter_config.json's) as PEFT reads it: each entry selects every module
// whose path ends with it (peft_saves), and must select root modules that shardlm trains whole
// (lora_savable_modules) and nothing else; the result is their names (SavableModule::name), in layout
// order. Error "WHERE: ..." saying why otherwise (a module of the blocks, a tied embedding or head, no
// module at all) and listing the valid names.
std::vector<std::string> resolve_lora_saved_modules(const ModelConfig& cfg, const std::vector<std::string>& names,
                                                    const std::string& where);
// The first of r, alpha, target_modules, modules_to_save and use_rslora on which `run` (the deck's
// values) and `file` (an adapter's) disagree, as "lora.r = 8 disagrees with SOURCE (r = 16)"; ""
// when they agree. Only the deck keys `compared` says yes to are compared.
std::string lora_disagreement(const LoraConfig& run, const LoraConfig& file, const std::string& source,
                              const std::function<bool(const std::string& deck_key)>& compared);

// ---- PEFT's adapter_config.json (src/config/peft_config.cpp) --------------------------------

struct PeftAdapterConfig {
  LoraConfig lora;
  std::string base_model_name_or_path;  // empty when the file says null
  // Its names are the module paths of the family's multimodal model (ModelConfig::hf_multimodal): the base
  // model's own naming unless its paths name the other model's modules (a checkpoint's, a Gemma 3 adapter made
  // on the other folder of the same text model); adapter_model.safetensors' names follow it.
  bool hf_multimodal = false;
};
// Reads an adapter_config.json of a LoRA adapter for `model`'s family (`source` names the file in
// errors). What shardlm does not compute as PEFT would (DoRA, biases, per-layer ranks, layer
// selection, a regular expression for target_modules, ...) is refused naming the key.
PeftAdapterConfig peft_adapter_config_from_json(const std::string& json_text, const std::string& source,
                                                const ModelConfig& model);
// adapter_config.json as PEFT 0.21 saves a CAUSAL_LM LoRA adapter of cfg.lora (keys sorted, indent 2);
// an empty base_model_name_or_path is written as null.
std::string peft_adapter_config_json(const ModelConfig& cfg, const std::string& base_model_name_or_path);

}  // namespace shardlm

// config: the input deck (INI sections) plus --section.key=value overrides, validated into a typed run config.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/dist.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

// fsdp.backward_prefetch: when the previous block's gather is queued in the backward.
enum class BackwardPrefetch { Pre, Post, None };

// The model's shape; with `dir` (a Hugging Face model directory) the shape comes from its
// config.json and the initial weights from its safetensors files.
struct ModelSection : ModelConfig {
  std::string dir;
};

struct DataSection {
  std::string format = "squad";  // squad | jsonl | chess
  std::string train_file;
  std::string eval_file;          // empty: no evaluation
  int max_length = 512;
  size_t train_size = 0;          // 0 = all records
  size_t eval_size = 0;
  std::string tokenizer = "auto";  // auto (model.dir's tokenizer.json, else byte) | byte | tokenizer.json path
};

struct TrainSection {
  int epochs = 1;
  int batch_size = 0;        // global: samples per optimizer step over all ranks
  int micro_batch_size = 1;  // per rank per forward pass
  double lr = 5e-5;
  double weight_decay = 0.01;
  int warmup_steps = 0;
  std::string lr_schedule = "linear";  // linear | constant
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
  // The CUDA backend's all-gather schedule (the CPU backend runs synchronously and ignores them):
  bool forward_prefetch = true;          // gather the next block while this one computes
  std::string backward_prefetch = "pre"; // pre: gather the previous block before this one's backward;
                                         // post: after it; none: only when needed
  int limit_all_gathers = 2;             // FULL_SHARD: gathered block buffers (all-gathers in flight + in use)
};

// Evaluation by generation: SQuAD exact match and F1 from greedy answers (data.format = squad).
struct EvalSection {
  std::string generate = "end";  // end: after the last epoch | epoch: after every epoch | none
  int max_new_tokens = 50;       // tokens generated per answer at most (EOS ends it earlier)
  int batch_size = 0;            // prompts decoded together on a rank; 0 = train.micro_batch_size
};

struct DistSection {
  int ranks_per_node = 0;  // 0 = the real node layout; K > 0 emulates nodes of K ranks
  double timeout = 600;    // seconds an NCCL wait may make no progress before the job ends (default_dist_timeout())
};

struct CheckpointSection {
  std::string dir;              // empty: RUN_DIR/checkpoints
  int every = 0;                // optimizer steps between checkpoints; 0 = none on a cadence
  int keep_last = 3;            // checkpoints kept; 0 = all
  std::string resume = "none";  // none | auto | PATH (a checkpoint file or a checkpoint folder)
  bool at_end = true;           // write one when training ends
  bool collective_buffering = false;  // MPI-IO two-phase aggregation of the slices (parallel file systems)
};

struct RunSection {
  std::string dir = "runs/run";
  std::string backend = "cpu";
  double peak_tflops = 0;  // per rank, for the model FLOPs utilisation (MFU) in the log; 0 = not reported
};

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

  // Micro-steps per optimizer step for a world of `world` ranks (validated to divide).
  int grad_accum(int world) const { return train.batch_size / (world * train.micro_batch_size); }
  // Where checkpoints go: checkpoint.dir, or RUN_DIR/checkpoints when it is empty.
  std::string checkpoint_dir() const { return checkpoint.dir.empty() ? run.dir + "/checkpoints" : checkpoint.dir; }
  // data.tokenizer with "auto" made concrete: model.dir's tokenizer.json, or "byte" without one.
  std::string tokenizer_spec() const {
    if (data.tokenizer != "auto") return data.tokenizer;
    return model.dir.empty() ? "byte" : model.dir + "/tokenizer.json";
  }
};

// Reads the deck, applies overrides ("--section.key=value" or "--section.key value"), checks
// every value and every file, and the batch size against `world_size` ranks and the node size.
// Throws Error with one message naming the key (and the nearest valid key for an unknown one).
// check_data_files = false (`shardlm plan`, which needs only the shape) leaves the data files
// unread and unset.
RunConfig load_run_config(const std::string& deck_path, const std::vector<std::string>& overrides,
                          int world_size, bool check_data_files = true);

// The resolved deck as INI text, loadable again by load_run_config.
std::string resolved_deck_ini(const RunConfig& cfg);

// Levenshtein distance, for the nearest-key hint.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace shardlm

// io: sharded checkpoints in parallel HDF5, safetensors, Hugging Face export.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "shardlm/config.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

// ---- HDF5 checkpoints -----------------------------------------------------------------------

constexpr int kCheckpointFormatVersion = 2;

// Everything besides the tensors that a run needs to continue exactly.
struct CheckpointMeta {
  int format_version = kCheckpointFormatVersion;
  long step = 0;             // optimizer steps completed
  int epoch = 0;             // epoch of the next step
  long epoch_step = 0;       // steps already done in that epoch (the position in the data)
  uint64_t seed = 0;         // initialisation and data-order seed (the sampler is a function of it)
  long optimizer_steps = 0;  // the optimizer's step counter (AdamW: bias correction)
  std::string lr_schedule;   // LR-schedule state: schedule, base lr, warmup, total steps
  double base_lr = 0;
  long warmup_steps = 0;
  long total_steps = 0;
  double loss_scale = 1.0;   // dynamic loss scale (1 when unused)
  int world_size = 1;
  int shard_group_size = 1;
  std::string strategy;      // "FULL_SHARD", ...
  ModelConfig model;
  std::string deck;          // resolved deck, INI text
  std::string version;       // shardlm version that wrote it
  std::string tokenizer_hash;  // tokenizer_hash() of the run's tokenizer; empty: written before it was kept
  // LoRA runs (the units hold the adapters only): the adapters' adapter_config.json text
  // (peft_adapter_config_json, base_model_name_or_path = model.dir) and the frozen base weights'
  // checksum (FsdpEngine::frozen_checksum_part summed over the ranks, 16 hex digits). Empty otherwise.
  std::string lora;
  std::string base_checksum;
  // The run that wrote it (RUN_DIR/run_id, made at the run's first start), its global batch
  // (train.batch_size) and steps per epoch: resume = auto refuses another run's checkpoint, and a
  // resume another batch (checkpoint.allow_new_batch). Empty / 0: written before they were kept.
  std::string run_id;
  long global_batch = 0;
  long steps_per_epoch = 0;
  // A hash of the run's training examples (their tokens and targets, in the order loaded, 16 hex
  // digits): a resume on the same deck whose data file changed since is told. Empty: written before
  // it was kept.
  std::string train_data_hash;
};

// One vector of an optimizer's per-element fp32 state (AdamW: exp_avg, exp_avg_sq), sliced as the
// unit's param. The checkpoint stores it as the dataset /units/<unit>/<name>, beside param.
struct StateVector {
  std::string name;  // a dataset name: not empty, not "param" or "index", no '/', not "."
  float* data = nullptr;
};

// One FSDP unit's state on this rank: the part [begin, begin + count) of the unit's logical
// (unpadded) flat vector that this rank owns, clipped to numel (count may be 0 at the padded
// tail). `primary` is true on exactly one rank per element (the first replica): primaries write
// their slices and verify checksums; every rank reads the slice it owns.
struct UnitState {
  const UnitLayout* layout = nullptr;
  size_t numel = 0;
  size_t begin = 0;
  size_t count = 0;
  bool primary = true;
  float* param = nullptr;  // fp32 master
  // The optimizer's state, `count` elements each; the checkpoint only names and copies it.
  std::vector<StateVector> optimizer;
};

struct CheckpointWriteStats {
  std::string path;
  size_t bytes = 0;     // size of the file
  double seconds = 0;   // from open to the rename, slowest rank
};

// Collective over comm. Writes DIR/ckpt-<step 8 digits>.h5 under a temporary name, renames it
// once every rank has finished, then points DIR/latest at it and deletes the oldest beyond
// keep_last (0 keeps all). SHARDLM_FAULT_CHECKPOINT=after_units:N (for tests) aborts the job
// after N units are written.
struct CheckpointWriteOptions {
  // MPI-IO two-phase aggregation of the slices (checkpoint.collective_buffering); off, each rank
  // writes its own hyperslab directly.
  bool collective_buffering = false;
  // Each rank writes its slice of a vector in H5Dwrite calls of at most this many bytes, and the
  // disk write of each starts as soon as it returns.
  size_t piece_bytes = size_t{32} << 20;
  // A checkpoint file name of DIR that keep_last pruning never deletes (DIR/best's: checkpoint.keep_best).
  std::string keep_name;
};
// DIR/best (checkpoint.keep_best): the file name of the checkpoint with the best eval loss on its first
// line and that loss on the second, replaced through a rename as DIR/latest is; then the previous best
// goes if it is not among the last keep_last (0 keeps all).
void write_best_pointer(const std::string& dir, const std::string& name, double eval_loss, int keep_last);
// The checkpoint file name DIR/best holds and its eval loss; false when there is no DIR/best or it
// names a file that is gone.
bool read_best_pointer(const std::string& dir, std::string* name, double* eval_loss);
CheckpointWriteStats save_checkpoint(const std::string& dir, int keep_last, const CheckpointMeta& meta,
                                     const std::vector<UnitState>& units, MPI_Comm comm,
                                     const CheckpointWriteOptions& options = {});

// Collective over comm. Checks the file's contents checksum (attributes, index rows and the
// vectors' checksums as written; Error "... is damaged: ..." when they differ), its attributes for
// impossible values ("... is inconsistent: ..."), its model and units against `units`, and each unit's stored
// optimizer vectors against the names its `optimizer` lists (Error naming the file, unit and
// dataset on any mismatch), reads each rank's slices, verifies every dataset's checksum.
// `check_meta`, when given, runs on every rank on the file's attributes before any data is read;
// an Error it throws ends the load on every rank with its message. weights_only: only each unit's
// param is read (the file's optimizer state, whatever it holds, is left).
CheckpointMeta load_checkpoint(const std::string& path, const std::vector<UnitState>& units, MPI_Comm comm,
                               const std::function<void(const CheckpointMeta&)>& check_meta = {},
                               bool weights_only = false);
// "" when the checkpoint's model config equals `run`'s, else the first key that differs with both
// values ("num_heads is 4 in the checkpoint, 8 in this run").
std::string model_config_difference(const ModelConfig& checkpoint, const ModelConfig& run);

// What a checkpoint keeps of a run's tokenizer (tokenizer_json as RunConfig::tokenizer_json gives
// it): "byte" for the byte tokenizer, else the FNV-1a 64 hash of the bytes of its tokenizer.json, as
// 16 hex digits. Error naming the file when it cannot be read.
std::string tokenizer_hash(const std::string& tokenizer_json);
// data.tokenizer of a checkpoint's deck with the hash the file keeps, as `shardlm inspect` shows it:
// "byte", "/m/tokenizer.json (hash 1f0e2d3c4b5a6978)" or "... (no hash kept: ...)".
std::string checkpoint_tokenizer_text(const CheckpointMeta& checkpoint);
// "" when the checkpoint was written with the tokenizer whose hash is `run_hash` (or keeps no hash),
// else data.tokenizer's source and short hash on both sides ("data.tokenizer is byte in the
// checkpoint, /m/tokenizer.json (hash 1f0e2d3c4b5a) in this run").
std::string tokenizer_difference(const CheckpointMeta& checkpoint, const RunConfig& run, const std::string& run_hash);

// Resolves checkpoint.resume: None -> ""; Auto -> the first of resume_candidates(dir), or "" when
// there is none yet; Path -> resolve_checkpoint_path(path).
std::string resolve_resume(ResumeFrom from, const std::string& path, const std::string& dir);
// The checkpoints resume = auto tries, in order: the file DIR/latest names, then the older
// ckpt-*.h5 of DIR, newest first (all of them, newest first, when latest is missing or names
// nothing; `note` then says so). Empty when DIR holds none; Error when latest names a missing file
// and no checkpoint is left.
std::vector<std::string> resume_candidates(const std::string& dir, std::string* note);
// Deletes the ckpt-*.h5.tmp files in DIR: writes of a job killed before it could finish them (the
// caller holds DIR's lock, so no other job is writing). Returns a line naming them, "" when none.
std::string remove_unfinished_checkpoints(const std::string& dir);
// Whether a load_checkpoint error says the file is damaged (truncated, unreadable, checksum), as
// opposed to a checkpoint of another model or optimizer.
bool checkpoint_damaged(const std::string& error);
// Whether the error says the checkpoint belongs to another run (its run id is not this run's).
bool checkpoint_of_another_run(const std::string& error);
// Whether resume = auto may pass over the checkpoint a load_checkpoint (or setup) error is about:
// damaged, inconsistent (impossible or out-of-range position), or another run's.
bool checkpoint_unusable(const std::string& error);
// A checkpoint folder -> its latest; a run folder -> the latest of run_checkpoint_folder(); a file
// -> itself. Error if the path does not exist or a folder holds no checkpoint, naming the argument
// it came from (`what`: the deck key, or the subcommand's own argument).
std::string resolve_checkpoint_path(const std::string& path, const std::string& what = "--checkpoint.resume");
// Where a run folder's checkpoints are: the checkpoint.dir of its deck.resolved.ini, else RUN/checkpoints.
std::string run_checkpoint_folder(const std::string& run_dir);

// Serial, read-only access for `shardlm inspect` and `shardlm export` (no MPI needed).
struct CheckpointTensor {
  std::string unit;   // "root", "h.0", ...
  std::string name;   // Hugging Face name without the "transformer." prefix
  std::vector<int64_t> shape;
  size_t offset = 0;  // in the unit's flat vector
  size_t numel = 0;
};

// The optimizer vectors one unit of a checkpoint holds beside its param (dataset names, in name order).
struct CheckpointUnitState {
  std::string unit;
  std::vector<std::string> optimizer;
};

class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);  // Error naming the file if unreadable
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const CheckpointMeta& meta() const { return meta_; }
  const std::vector<CheckpointTensor>& tensors() const { return tensors_; }
  const std::vector<CheckpointUnitState>& unit_states() const { return unit_states_; }  // in unit order
  // The fp32 master values of one tensor (checksum of its unit's dataset verified on first use).
  std::vector<float> read(const CheckpointTensor& t);
  // What the metadata alone shows, without reading any vector, one line each naming the file: the
  // contents checksum not matching (attributes, index or vectors' checksums changed, vectors
  // swapped), or impossible attributes (a negative step, epoch_step past its epoch). Empty when
  // none (files written before the contents checksum are only checked for impossible values).
  const std::vector<std::string>& metadata_problems() const { return metadata_problems_; }
  // Error with the first of metadata_problems(): what reads a checkpoint to use it (resume,
  // generate, export) calls this first; inspect shows the problems instead.
  void require_intact() const {
    if (!metadata_problems_.empty()) throw Error(metadata_problems_.front());
  }
  // metadata_problems(), then reads every stored vector of every unit (param and optimizer state)
  // and compares its checksum: one line per damaged dataset ("checkpoint FILE is damaged: dataset
  // D: checksum mismatch"), empty when the file is intact.
  std::vector<std::string> verify();

 private:
  std::string path_;
  long long file_ = -1;  // hid_t
  CheckpointMeta meta_;
  std::vector<CheckpointTensor> tensors_;
  std::vector<CheckpointUnitState> unit_states_;
  std::map<std::string, bool> verified_;
  std::vector<std::string> metadata_problems_;
};

// ---- safetensors and Hugging Face export ----------------------------------------------------

struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
  DType dtype = DType::F32;  // written as F32, or rounded to BF16 / F16 (round to nearest even)
};

// Writes one safetensors file (header JSON with dtype/shape/data_offsets, 8-byte aligned data).
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of a safetensors file written with F32, BF16 or F16 data, as fp32.
// Defensive: header length, offsets, dtype and byte counts are checked against the file.
std::vector<SafetensorsEntry> read_safetensors(const std::string& path);

// One tensor of a safetensors file: its dtype (F32, BF16 or F16), shape and where its data starts.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t numel = 0;
  uint64_t file_offset = 0;
};

// A safetensors file opened for reading parts of tensors: the header is read and checked (as by
// read_safetensors) on construction, the data is read only where asked.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // the header's __metadata__
  // Elements [first, first + count) of t (row-major, flat) converted to fp32.
  void read(const SafetensorsTensor& t, size_t first, size_t count, float* out);
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_;
  std::ifstream in_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
  uint64_t bytes_read_ = 0;
};

// A Hugging Face model directory: config.json and its weights (model.safetensors, or the shards a
// model.safetensors.index.json lists). Opening reads config.json and the safetensors headers and
// checks that the files hold exactly the tensors the config's layout needs, with their shapes
// (Error naming the file and tensor otherwise); the data is read only by read_unit_slice.
class HfModelDir {
 public:
  explicit HfModelDir(const std::string& dir);
  const ModelConfig& config() const { return config_; }
  // Elements [begin, end) of unit `unit`'s flat vector (layout of config()), converted to fp32:
  // only the bytes of that range are read. Padding past the unit's end reads as 0.
  void read_unit_slice(size_t unit, size_t begin, size_t end, float* out);
  // The same for a flat vector laid out as `as`, tensors of unit `unit` by name (LoRA's split root:
  // lora_frozen_layout's, or lora_layout's saved modules); Error naming a tensor the unit lacks.
  void read_unit_slice(size_t unit, const UnitLayout& as, size_t begin, size_t end, float* out);
  const std::vector<UnitLayout>& layout() const { return layout_; }
  uint64_t bytes_read() const;

 private:
  struct Source {
    size_t file = 0;
    const SafetensorsTensor* tensor = nullptr;
  };
  std::string dir_;
  ModelConfig config_;
  std::vector<UnitLayout> layout_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::vector<Source>> sources_;  // [unit][tensor of the unit]
};

// The LoRA base checksum (base_checksum_term) of `dir`'s weights as the frozen base of `lora_model`
// (its lora_frozen_layout), rounded to param_dtype as a run computing in it reads them: what
// CheckpointMeta::base_checksum keeps of the base a run trained its adapters on. Reads every base
// weight once.
std::string lora_base_checksum(HfModelDir& dir, const ModelConfig& lora_model, DType param_dtype);

// What an export writes besides the weights.
struct HfExportOptions {
  // config.json's and generation_config.json's special tokens, e.g. {"eos_token_id": 257}.
  std::map<std::string, int> token_ids;
  size_t max_shard_bytes = 5000000000ull;  // above it, shards and an index (save_pretrained's 5GB)
  DType dtype = DType::F32;                // of the weights; config.json's torch_dtype says it
  // Files copied into the folder as they are (tokenizer.json, tokenizer_config.json, a source
  // model's generation_config.json, ...), by their file name.
  std::vector<std::string> copy_files;
  // Files written with this text, by name (a byte tokenizer's tokenizer.json, ...).
  std::map<std::string, std::string> text_files;
  // A non-empty output folder is an Error unless set; then only the export's own files in it are
  // replaced (write_staged_folder).
  bool overwrite = false;
};

// Writes DIR/config.json (the family's ModelFamily::hf_architecture, with the token
// ids and torch_dtype) and the weights as DIR/model.safetensors, or, above max_shard_bytes, as
// model-0000i-of-0000n.safetensors with model.safetensors.index.json, as transformers'
// save_pretrained does; then generation_config.json (written from the token ids unless a copied
// file provides it) and the options' other files. `tensors` lists the model's tensors (layout
// names, which the export maps with hf_tensor_name); `fetch` returns one tensor's fp32 values.
void export_hf_model(const std::string& dir, const ModelConfig& cfg, const std::vector<CheckpointTensor>& tensors,
                     const std::function<std::vector<float>(const CheckpointTensor&)>& fetch,
                     const HfExportOptions& options = {});

// ---- PEFT LoRA adapters (src/io/peft_adapter.cpp) -------------------------------------------

// One tensor of an adapter by its layout name (lora_layout's "layers.0.self_attn.q_proj.lora_A.weight",
// or model_layout's root tensor of a module of lora.modules_to_save, "lm_head.weight").
struct AdapterTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // fp32, row-major
};

// The tensors an adapter of cfg.lora holds, in file order: every block's lora_layout tensors, then
// the root's (the modules of lora.modules_to_save, whole, as PEFT saves them).
std::vector<TensorSpec> peft_adapter_tensors(const ModelConfig& cfg);

// Writes DIR/adapter_config.json (peft_adapter_config_json) and DIR/adapter_model.safetensors (fp32,
// PEFT's names: peft_tensor_name), the folder written beside DIR and put in its place when complete,
// as PeftModel.from_pretrained(base, DIR) loads it. `tensors` must be exactly peft_adapter_tensors(cfg),
// in any order, with their shapes and finite values (Error naming the tensor otherwise).
void write_peft_adapter(const std::string& dir, const ModelConfig& cfg, const std::string& base_model_name_or_path,
                        const std::vector<AdapterTensor>& tensors, bool overwrite = false);

struct PeftAdapter {
  LoraConfig lora;                      // from adapter_config.json
  std::string base_model_name_or_path;  // as the file says it; empty when null
  std::map<std::string, AdapterTensor> tensors;  // by layout name: exactly peft_adapter_tensors of `lora`
};
// Reads a PEFT LoRA adapter directory for the base model of shape `cfg`: adapter_config.json
// (peft_adapter_config_from_json; when cfg.lora is on it must agree with it) and
// adapter_model.safetensors (F32, BF16 or F16), whose tensors must be exactly those the config
// implies, with their shapes and finite values. Errors name the file and the key or tensor.
PeftAdapter read_peft_adapter(const std::string& dir, const ModelConfig& cfg);

// The model of a LoRA run's checkpoint with its [lora] (CheckpointMeta::lora); *base_dir receives the
// base model folder the run started from (empty: the seeded initialisation). Error for a checkpoint
// of a whole model.
ModelConfig checkpoint_lora_model(const CheckpointMeta& meta, const std::string& path, std::string* base_dir);
// The checks an export into DIR makes before it writes (a symbolic link, a non-empty folder without
// `overwrite`, a leftover DIR.partial), made up front so a long export fails at once.
void check_export_folder(const std::string& dir, bool overwrite);

// Writes the adapters of a LoRA run's checkpoint as a PEFT adapter folder DIR (write_peft_adapter);
// returns the base model folder it names (base_model_name_or_path): `base_dir` when given (the caller
// has checked it is the base the adapters were trained on; the adapter names its modules), else the run's
// model.dir as recorded.
std::string export_checkpoint_adapter(const std::string& checkpoint_path, const std::string& dir, bool overwrite = false,
                                      const std::string& base_dir = "");

}  // namespace shardlm

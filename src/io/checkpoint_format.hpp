// Private to the checkpoint code: names in the HDF5 file, the index record, the slice checksum,
// a content hash, an owning HDF5 handle, HDF5 error text, and agreeing on an error across ranks
// before throwing.
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/io.hpp"

namespace shardlm::ckpt {

// ---- names --------------------------------------------------------------------------------------

constexpr const char* kUnitsGroup = "/units";
constexpr const char* kIndexDataset = "index";
constexpr const char* kChecksumAttr = "checksum";
constexpr const char* kLatestFile = "latest";
constexpr const char* kBestFile = "best";  // checkpoint.keep_best's pointer
constexpr const char* kParamDataset = "param";
// Root attributes a checkpoint may lack: files written before they were kept load without them.
constexpr const char* kTokenizerHashAttr = "tokenizer_hash";
constexpr const char* kLoraAttr = "lora";
constexpr const char* kBaseChecksumAttr = "base_checksum";
constexpr const char* kRunIdAttr = "run_id";
constexpr const char* kGlobalBatchAttr = "global_batch";
constexpr const char* kStepsPerEpochAttr = "steps_per_epoch";
constexpr const char* kTrainDataHashAttr = "train_data_hash";
// Kept since after the contents checksum (below) was: a file that lacks it was hashed without it, so
// its absence adds nothing to the hash (it is only ever compared to warn).
inline bool meta_attribute_after_contents_checksum(const std::string& name) { return name == kTrainDataHashAttr; }
inline bool optional_meta_attribute(const std::string& name) {
  return name == kTokenizerHashAttr || name == kLoraAttr || name == kBaseChecksumAttr || name == kRunIdAttr ||
         name == kGlobalBatchAttr || name == kStepsPerEpochAttr || meta_attribute_after_contents_checksum(name);
}
// Root attribute binding everything a resume reads besides the vectors' data (ContentsHash); files
// written before it was kept lack it and are read without that check.
constexpr const char* kContentsChecksumAttr = "contents_checksum";

inline std::string unit_group_path(const std::string& unit) { return std::string(kUnitsGroup) + "/" + unit; }
inline std::string vector_path(const std::string& unit, const std::string& name) {
  return unit_group_path(unit) + "/" + name;
}

// The attributes of CheckpointMeta after format_version (which each side handles first), in the
// order they are written: f(name, field) for each; model_config is the ModelConfig, stored as its
// HF config.json text; the optional ones (optional_meta_attribute) come last.
template <typename Meta, typename F>
void for_each_meta_attribute(Meta& m, F&& f) {
  f("step", m.step);
  f("epoch", m.epoch);
  f("epoch_step", m.epoch_step);
  f("optimizer_steps", m.optimizer_steps);
  f("warmup_steps", m.warmup_steps);
  f("total_steps", m.total_steps);
  f("seed", m.seed);
  f("base_lr", m.base_lr);
  f("loss_scale", m.loss_scale);
  f("lr_schedule", m.lr_schedule);
  f("strategy", m.strategy);
  f("world_size", m.world_size);
  f("shard_group_size", m.shard_group_size);
  f("model_config", m.model);
  f("version", m.version);
  f("deck", m.deck);
  f(kTokenizerHashAttr, m.tokenizer_hash);
  f(kLoraAttr, m.lora);
  f(kBaseChecksumAttr, m.base_checksum);
  f(kRunIdAttr, m.run_id);
  f(kGlobalBatchAttr, m.global_batch);
  f(kStepsPerEpochAttr, m.steps_per_epoch);
  f(kTrainDataHashAttr, m.train_data_hash);
}

// A unit's vectors as stored: param first, then the optimizer's in the caller's order.
inline std::vector<StateVector> stored_vectors(const UnitState& u) {
  std::vector<StateVector> v{{kParamDataset, u.param}};
  v.insert(v.end(), u.optimizer.begin(), u.optimizer.end());
  return v;
}

// Error (from `caller`) unless the unit's optimizer vectors have distinct names that can sit beside
// param and index in the unit's group.
inline void check_optimizer_names(const UnitState& u, const char* caller) {
  for (size_t i = 0; i < u.optimizer.size(); ++i) {
    const std::string& name = u.optimizer[i].name;
    SHARDLM_CHECK(!name.empty() && name != "." && name.find('/') == std::string::npos && name != kParamDataset &&
                      name != kIndexDataset,
                  caller, ": unit ", u.layout->name, " has an optimizer vector named '", name,
                  "' (not a dataset name beside param and index)");
    for (size_t j = 0; j < i; ++j)
      SHARDLM_CHECK(u.optimizer[j].name != name, caller, ": unit ", u.layout->name, " lists optimizer vector '",
                    name, "' twice");
  }
}

// "ckpt-00000010.h5": eight digits keep names in step order when listed.
inline std::string checkpoint_file_name(long step) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%08ld.h5", step);
  return name;
}

// ---- the per-unit tensor index ----------------------------------------------------------------

constexpr size_t kIndexNameBytes = 128;
constexpr int kIndexMaxDims = 4;

// One row of /units/<unit>/index (an HDF5 compound): where a tensor lies in the unit's flat vector.
struct IndexRecord {
  char name[kIndexNameBytes];
  uint64_t offset;
  uint64_t numel;
  int32_t ndim;
  int64_t shape[kIndexMaxDims];  // unused dimensions are 0
};

// ---- checksum -----------------------------------------------------------------------------------

// One term per element, so the sum of terms over any partition of the elements is the same (slices
// sum independently, then all-reduce): the float's bits times the odd weight 2 * index + 1. An odd
// weight keeps any change of one element visible (delta * odd != 0 mod 2^64), and the index ties a
// value to its position; one multiply-add per element, cheap enough to hide behind the write.
inline uint64_t checksum_term(uint64_t index, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return static_cast<uint64_t>(bits) * (2 * index + 1);
}

// Sum (mod 2^64) of the terms of data[0, count), which holds elements [begin, begin + count).
// Four independent sums with running weights let the multiply-adds overlap.
inline uint64_t checksum_slice(const float* data, size_t begin, size_t count) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  uint64_t w = 2 * static_cast<uint64_t>(begin) + 1;
  const size_t quads = count / 4;
  for (size_t q = 0; q < quads; ++q, w += 8) {
    uint32_t b[4];
    std::memcpy(b, data + 4 * q, sizeof b);
    s0 += b[0] * w;
    s1 += b[1] * (w + 2);
    s2 += b[2] * (w + 4);
    s3 += b[3] * (w + 6);
  }
  for (size_t i = 4 * quads; i < count; ++i) s0 += checksum_term(begin + i, data[i]);
  return s0 + s1 + s2 + s3;
}

// ---- content hash -------------------------------------------------------------------------------

// FNV-1a, 64-bit: fast and stable (not cryptographic), to tell contents apart. add_bytes over a
// whole text gives the standard FNV-1a 64 of those bytes.
class Fnv1a {
 public:
  void add(uint64_t x) { hash_ = (hash_ ^ x) * 0x100000001b3ULL; }  // the FNV prime
  void add_bytes(const std::string& bytes) {
    for (char c : bytes) add(static_cast<unsigned char>(c));
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;  // the offset basis
};

// What contents_checksum covers, in this order: every root attribute of for_each_meta_attribute
// (format_version first) by name and stored value, then per unit in stored order its name, its index
// rows and, for param and then the optimizer's vectors in name order, the dataset's name and its
// checksum attribute. A changed attribute, a damaged index or two vectors swapped (the checksum
// attribute travels with its dataset, away from the name it was bound to) all change it.
class ContentsHash {
 public:
  void attribute(const char* name, int64_t v) { tagged(name, 1, static_cast<uint64_t>(v)); }
  void attribute(const char* name, uint64_t v) { tagged(name, 2, v); }
  void attribute(const char* name, double v) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    tagged(name, 3, bits);
  }
  // A string attribute by its stored text (a ModelConfig as its JSON).
  void text_attribute(const char* name, const std::string& text) {
    tagged(name, 4, text.size());
    hash_.add_bytes(text);
  }
  void absent(const char* name) { tagged(name, 5, 0); }
  void unit(const std::string& name) { word(name, 6); }
  void tensor(const std::string& name, uint64_t offset, uint64_t numel, const std::vector<int64_t>& shape) {
    word(name, 7);
    hash_.add(offset);
    hash_.add(numel);
    hash_.add(shape.size());
    for (int64_t d : shape) hash_.add(static_cast<uint64_t>(d));
  }
  void dataset(const std::string& name, uint64_t checksum) {
    word(name, 8);
    hash_.add(checksum);
  }
  uint64_t value() const { return hash_.value(); }

 private:
  // A name, then a tag no byte equals (0x100 + kind): names and kinds cannot run into each other.
  void word(const std::string& name, uint64_t kind) {
    hash_.add_bytes(name);
    hash_.add(0x100 + kind);
  }
  void tagged(const char* name, uint64_t kind, uint64_t value) {
    word(name, kind);
    hash_.add(value);
  }
  Fnv1a hash_;
};

// ---- HDF5 handles and errors ------------------------------------------------------------------

// Owns one HDF5 identifier and closes it with the matching H5?close.
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer close) : id_(id), close_(close) {}
  ~H5Id() { reset(); }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  H5Id(H5Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and reports whether closing succeeded (a file's close writes its last metadata).
  bool close() {
    if (id_ < 0) return true;
    const herr_t rc = close_(id_);
    id_ = -1;
    return rc >= 0;
  }
  void reset() { close(); }
  // Hands the identifier to the caller, who closes it.
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

inline H5Id h5_file(hid_t id) { return H5Id(id, H5Fclose); }
inline H5Id h5_group(hid_t id) { return H5Id(id, H5Gclose); }
inline H5Id h5_dataset(hid_t id) { return H5Id(id, H5Dclose); }
inline H5Id h5_space(hid_t id) { return H5Id(id, H5Sclose); }
inline H5Id h5_type(hid_t id) { return H5Id(id, H5Tclose); }
inline H5Id h5_attr(hid_t id) { return H5Id(id, H5Aclose); }
inline H5Id h5_plist(hid_t id) { return H5Id(id, H5Pclose); }

// The user sees one message of ours, not HDF5's stack dump on stderr.
inline void silence_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// The innermost description on HDF5's error stack ("truncated file: eof = ...") or a fallback;
// clears the stack so the next failure starts afresh.
inline std::string h5_error_text(const char* fallback = "HDF5 error") {
  std::string text;
  auto take_innermost = [](unsigned n, const H5E_error2_t* err, void* out) -> herr_t {
    auto* s = static_cast<std::string*>(out);
    if (n == 0 && err->desc) *s = err->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? std::string(fallback) : text;
}

// HDF5 compound of IndexRecord in memory (HDF5 converts to and from the packed file type).
inline H5Id index_memory_type() {
  H5Id type = h5_type(H5Tcreate(H5T_COMPOUND, sizeof(IndexRecord)));
  H5Id name = h5_type(H5Tcopy(H5T_C_S1));
  H5Tset_size(name.get(), kIndexNameBytes);
  H5Tset_strpad(name.get(), H5T_STR_NULLTERM);
  const hsize_t dims[1] = {kIndexMaxDims};
  H5Id shape = h5_type(H5Tarray_create2(H5T_NATIVE_INT64, 1, dims));
  H5Tinsert(type.get(), "name", HOFFSET(IndexRecord, name), name.get());
  H5Tinsert(type.get(), "offset", HOFFSET(IndexRecord, offset), H5T_NATIVE_UINT64);
  H5Tinsert(type.get(), "numel", HOFFSET(IndexRecord, numel), H5T_NATIVE_UINT64);
  H5Tinsert(type.get(), "ndim", HOFFSET(IndexRecord, ndim), H5T_NATIVE_INT32);
  H5Tinsert(type.get(), "shape", HOFFSET(IndexRecord, shape), shape.get());
  return type;
}

// ---- agreeing on errors -----------------------------------------------------------------------

// Collective: if any rank's `local_error` is non-empty, every rank throws AgreedError with the
// lowest failing rank's message, so no rank is left waiting in a collective.
inline void agree_on_error(MPI_Comm comm, const std::string& local_error) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const int mine = local_error.empty() ? INT32_MAX : rank;
  int first = INT32_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == INT32_MAX) return;
  int len = rank == first ? static_cast<int>(local_error.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, comm);
  std::vector<char> text(static_cast<size_t>(len));
  if (rank == first) std::memcpy(text.data(), local_error.data(), text.size());
  MPI_Bcast(text.data(), len, MPI_CHAR, first, comm);
  throw AgreedError(std::string(text.begin(), text.end()));
}

// ---- files on disk (checkpoint_files.cpp) -----------------------------------------------------

// Rank-local, for rank 0 after every rank closed the file: renames TMP to FINAL, points DIR/latest
// at FINAL's name (written to latest.tmp, synced, renamed), prunes beyond keep_last (0 keeps all)
// and deletes abandoned temporaries of earlier steps. Throws Error naming the path at fault.
void publish_checkpoint(const std::string& dir, const std::string& tmp_path, const std::string& final_path,
                        int keep_last, const std::string& keep_name = "");
// Deletes the oldest checkpoints of DIR beyond keep_last (0 keeps all), never keep_name (DIR/best's,
// not counted) nor `newest` (the one just written).
void prune_checkpoints(const std::string& dir, int keep_last, const std::string& keep_name, const std::string& newest);

}  // namespace shardlm::ckpt

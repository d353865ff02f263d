// save_checkpoint: every rank writes its slices of each unit into one HDF5 file through MPI-IO
// (collective H5Dwrite calls, in pieces whose disk writes start at once), under a temporary name
// that rank 0 renames once all ranks are done.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <type_traits>

#include "checkpoint_format.hpp"

namespace shardlm {
namespace {

using namespace ckpt;
namespace fs = std::filesystem;

// This rank's first failure. HDF5 calls after a failure still run (on invalid ids they fail at
// once) so that every rank keeps making the same collective calls until the next agreement.
class FirstFailure {
 public:
  explicit FirstFailure(std::string file) : file_(std::move(file)) {}
  // Records `what` with HDF5's reason when `ok` is false; returns ok.
  bool check(bool ok, const std::string& what) {
    const int err = errno;
    if (!ok && message_.empty()) message_ = concat("checkpoint ", file_, ": ", what, ": ", h5_error_text(), cause(err));
    if (!ok) H5Eclear2(H5E_DEFAULT);
    return ok;
  }
  const std::string& message() const { return message_; }

 private:
  // The system's reason under HDF5's ("file write failed"): errno when it is a disk's, or a file
  // system with (next to) no free space left.
  std::string cause(int err) const {
    if (err == ENOSPC || err == EDQUOT || err == EIO || err == EROFS || err == EFBIG)
      return concat(" (", std::strerror(err), ")");
    struct statvfs fs_stats {};
    const std::string dir = fs::path(file_).parent_path().string();
    if (::statvfs(dir.empty() ? "." : dir.c_str(), &fs_stats) != 0) return "";
    const uint64_t free_bytes = uint64_t{fs_stats.f_bavail} * fs_stats.f_frsize;
    const uint64_t total = uint64_t{fs_stats.f_blocks} * fs_stats.f_frsize;
    if (free_bytes >= (uint64_t{1} << 20) && free_bytes * 100 >= total) return "";
    return concat(" (", std::strerror(ENOSPC), ": ", format_bytes(free_bytes), " free on its file system)");
  }

  std::string file_;
  std::string message_;
};

void put_scalar(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* value, FirstFailure& f) {
  H5Id space = h5_space(H5Screate(H5S_SCALAR));
  H5Id attr = h5_attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  f.check(attr.valid() && H5Awrite(attr.get(), mem_type, value) >= 0, concat("writing attribute ", name));
}

// Fixed-length UTF-8 string of the text plus its terminator (h5dump prints it as plain text).
void put_string(hid_t obj, const char* name, const std::string& value, FirstFailure& f) {
  H5Id type = h5_type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), value.size() + 1);
  H5Tset_strpad(type.get(), H5T_STR_NULLTERM);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  put_scalar(obj, name, type.get(), type.get(), value.c_str(), f);
}

// One attribute of v's type: int as I32, long as I64, ModelConfig as its compact HF config JSON (one
// line in h5dump).
void put_attribute(hid_t obj, const char* name, int v, FirstFailure& f) {
  put_scalar(obj, name, H5T_STD_I32LE, H5T_NATIVE_INT, &v, f);
}
void put_attribute(hid_t obj, const char* name, long v, FirstFailure& f) {
  const int64_t x = v;
  put_scalar(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &x, f);
}
void put_attribute(hid_t obj, const char* name, uint64_t v, FirstFailure& f) {
  put_scalar(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v, f);
}
void put_attribute(hid_t obj, const char* name, double v, FirstFailure& f) {
  put_scalar(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v, f);
}
void put_attribute(hid_t obj, const char* name, const std::string& v, FirstFailure& f) { put_string(obj, name, v, f); }
std::string stored_text(const ModelConfig& v) { return nlohmann::ordered_json::parse(hf_config_json(v)).dump(); }
void put_attribute(hid_t obj, const char* name, const ModelConfig& v, FirstFailure& f) {
  put_string(obj, name, stored_text(v), f);
}

// The attribute's stored value into the contents hash, as the reader will see it.
void hash_attribute(ContentsHash& h, const char* name, int v) { h.attribute(name, int64_t{v}); }
void hash_attribute(ContentsHash& h, const char* name, long v) { h.attribute(name, int64_t{v}); }
void hash_attribute(ContentsHash& h, const char* name, uint64_t v) { h.attribute(name, v); }
void hash_attribute(ContentsHash& h, const char* name, double v) { h.attribute(name, v); }
void hash_attribute(ContentsHash& h, const char* name, const std::string& v) { h.text_attribute(name, v); }
void hash_attribute(ContentsHash& h, const char* name, const ModelConfig& v) { h.text_attribute(name, stored_text(v)); }

// Collective: every rank writes the same values (parallel HDF5 requires identical metadata calls).
// The contents checksum is created here and set once the datasets' checksums are known; `hash`
// takes the attributes.
void write_meta(hid_t file, const CheckpointMeta& meta, ContentsHash& hash, FirstFailure& f) {
  put_attribute(file, "format_version", kCheckpointFormatVersion, f);
  hash_attribute(hash, "format_version", kCheckpointFormatVersion);
  for_each_meta_attribute(meta, [&](const char* name, const auto& field) {
    // Left out when empty: the file is then the one an earlier shardlm wrote, checksum and all.
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, std::string>)
      if (field.empty() && meta_attribute_after_contents_checksum(name)) return;
    put_attribute(file, name, field, f);
    hash_attribute(hash, name, field);
  });
  put_attribute(file, kContentsChecksumAttr, uint64_t{0}, f);
}

// HDF5 compound of IndexRecord as stored: packed, little-endian, readable field names.
H5Id index_file_type() {
  H5Id name = h5_type(H5Tcopy(H5T_C_S1));
  H5Tset_size(name.get(), kIndexNameBytes);
  H5Tset_strpad(name.get(), H5T_STR_NULLTERM);
  const hsize_t dims[1] = {kIndexMaxDims};
  H5Id shape = h5_type(H5Tarray_create2(H5T_STD_I64LE, 1, dims));
  const size_t size = kIndexNameBytes + 8 + 8 + 4 + 8 * kIndexMaxDims;
  H5Id type = h5_type(H5Tcreate(H5T_COMPOUND, size));
  H5Tinsert(type.get(), "name", 0, name.get());
  H5Tinsert(type.get(), "offset", kIndexNameBytes, H5T_STD_U64LE);
  H5Tinsert(type.get(), "numel", kIndexNameBytes + 8, H5T_STD_U64LE);
  H5Tinsert(type.get(), "ndim", kIndexNameBytes + 16, H5T_STD_I32LE);
  H5Tinsert(type.get(), "shape", kIndexNameBytes + 20, shape.get());
  return type;
}

std::vector<IndexRecord> index_records(const UnitLayout& layout) {
  std::vector<IndexRecord> rows(layout.tensors.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const TensorSpec& t = layout.tensors[i];
    IndexRecord& r = rows[i];
    std::memset(&r, 0, sizeof r);
    std::memcpy(r.name, t.name.data(), t.name.size());  // length checked by check_units
    r.offset = t.offset;
    r.numel = t.numel;
    r.ndim = static_cast<int32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) r.shape[d] = t.shape[d];
  }
  return rows;
}

// Rank 0 writes the whole (small) dataset, the others select nothing; one collective transfer.
void write_selected(hid_t dset, hid_t mem_type, hsize_t begin, hsize_t count, bool mine, const void* data,
                    hid_t dxpl, const std::string& what, FirstFailure& f) {
  H5Id file_space = h5_space(H5Dget_space(dset));
  const hsize_t one = 1;
  H5Id mem_space = h5_space(H5Screate_simple(1, mine && count > 0 ? &count : &one, nullptr));
  if (mine && count > 0) {
    f.check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &begin, nullptr, &count, nullptr) >= 0,
            concat("selecting ", what));
  } else {
    H5Sselect_none(file_space.get());
    H5Sselect_none(mem_space.get());
  }
  static const float dummy = 0;  // HDF5 wants a buffer even for an empty selection
  errno = 0;
  f.check(H5Dwrite(dset, mem_type, mem_space.get(), file_space.get(), dxpl, data ? data : &dummy) >= 0,
          concat("writing ", what));
}

// One unit's group, index and vector datasets (in stored_vectors order), created before anything
// is written; they stay open until the data and the checksums are written.
struct OpenUnit {
  H5Id group;
  H5Id index;
  std::vector<H5Id> dsets;
};

void write_index(const OpenUnit& open, const UnitState& u, int rank, hid_t dxpl, FirstFailure& f) {
  if (!open.index.valid()) return;
  const std::vector<IndexRecord> rows = index_records(*u.layout);
  H5Id mem_type = index_memory_type();
  const std::string what = unit_group_path(u.layout->name) + "/" + kIndexDataset;
  write_selected(open.index.get(), mem_type.get(), 0, rows.size(), rank == 0, rows.data(), dxpl, what, f);
}

OpenUnit create_unit(hid_t file, const UnitState& u, FirstFailure& f) {
  OpenUnit out;
  const std::string group_path = unit_group_path(u.layout->name);
  out.group = h5_group(H5Gcreate2(file, group_path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  f.check(out.group.valid(), concat("creating ", group_path));
  {
    const hsize_t n = u.layout->tensors.size();
    H5Id space = h5_space(H5Screate_simple(1, &n, nullptr));
    H5Id file_type = index_file_type();
    out.index = h5_dataset(H5Dcreate2(out.group.get(), kIndexDataset, file_type.get(), space.get(), H5P_DEFAULT,
                                      H5P_DEFAULT, H5P_DEFAULT));
    f.check(out.index.valid(), concat("creating ", group_path, "/", kIndexDataset));
  }

  // Space is allocated at creation and never pre-filled: every element is written once.
  H5Id dcpl = h5_plist(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  const hsize_t numel = u.numel;
  H5Id space = h5_space(H5Screate_simple(1, &numel, nullptr));
  for (const StateVector& v : stored_vectors(u)) {
    out.dsets.push_back(h5_dataset(H5Dcreate2(out.group.get(), v.name.c_str(), H5T_IEEE_F32LE, space.get(),
                                              H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)));
    if (f.check(out.dsets.back().valid(), concat("creating ", vector_path(u.layout->name, v.name))))
      put_attribute(out.dsets.back().get(), kChecksumAttr, uint64_t{0}, f);  // set once the data is written
  }
  return out;
}

// Writes the value of the checksum attribute create_unit made: no file space is allocated after the
// reservation.
void set_checksum(hid_t dset, uint64_t value, const std::string& what, FirstFailure& f) {
  H5Id attr = h5_attr(H5Aopen(dset, kChecksumAttr, H5P_DEFAULT));
  f.check(attr.valid() && H5Awrite(attr.get(), H5T_NATIVE_UINT64, &value) >= 0, concat("writing the checksum of ", what));
}

// A unit's share of the contents hash: its name, index rows, and each stored vector's name with its
// checksum (checksum_of(v) for stored_vectors' v), param first, then the optimizer's in name order.
template <typename ChecksumOf>
void hash_unit(ContentsHash& hash, const UnitState& u, ChecksumOf checksum_of) {
  hash.unit(u.layout->name);
  for (const TensorSpec& t : u.layout->tensors) hash.tensor(t.name, t.offset, t.numel, t.shape);
  const std::vector<StateVector> vectors = stored_vectors(u);
  std::vector<size_t> order(vectors.size());
  for (size_t v = 0; v < order.size(); ++v) order[v] = v;
  std::sort(order.begin() + 1, order.end(), [&](size_t a, size_t b) { return vectors[a].name < vectors[b].name; });
  for (size_t v : order) hash.dataset(vectors[v].name, checksum_of(v));
}

bool writes_slice(const UnitState& u) { return u.primary && u.count > 0; }

// Starts the disk write of each piece as soon as it is in the page cache (Linux sync_file_range),
// instead of leaving all of it to the sync at the end; a plain write-then-fsync waits for every
// byte after the last copy. Only a hint: the MPI_File_sync at the end is what makes the data
// durable, so a file system that does not support it (or a failed open) only loses the overlap.
class EarlyWriteback {
 public:
  explicit EarlyWriteback(const std::string& path) : fd_(::open(path.c_str(), O_WRONLY | O_CLOEXEC)) {}
  ~EarlyWriteback() {
    if (fd_ >= 0) ::close(fd_);
  }
  EarlyWriteback(const EarlyWriteback&) = delete;
  EarlyWriteback& operator=(const EarlyWriteback&) = delete;
  void start(uint64_t offset, size_t bytes) {
#ifdef __linux__
    if (fd_ >= 0 && bytes > 0)
      (void)::sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(bytes), SYNC_FILE_RANGE_WRITE);
#else
    (void)offset;
    (void)bytes;
#endif
  }

 private:
  int fd_;
};

// The slice checksums of every unit run on a helper thread while the data is written and flushed,
// so that the checkpoint is limited by the disk, not by a second pass over memory.
class ChecksumThread {
 public:
  explicit ChecksumThread(const std::vector<UnitState>& units) : first_(units.size() + 1, 0) {
    for (size_t i = 0; i < units.size(); ++i) first_[i + 1] = first_[i] + 1 + units[i].optimizer.size();
    sums_.assign(first_.back(), 0);
    thread_ = std::thread([this, &units] {
      for (size_t i = 0; i < units.size(); ++i) {
        if (!writes_slice(units[i])) continue;
        const std::vector<StateVector> vectors = stored_vectors(units[i]);
        for (size_t v = 0; v < vectors.size(); ++v)
          sums_[first_[i] + v] = checksum_slice(vectors[v].data, units[i].begin, units[i].count);
      }
    });
  }
  ~ChecksumThread() { join(); }
  ChecksumThread(const ChecksumThread&) = delete;
  ChecksumThread& operator=(const ChecksumThread&) = delete;
  // This rank's partial sums, one per stored vector of each unit (see at()).
  const std::vector<uint64_t>& sums() {
    join();
    return sums_;
  }
  // Where the sum of vector v of unit i lies in sums().
  size_t at(size_t i, size_t v) const { return first_[i] + v; }

 private:
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  std::vector<size_t> first_;  // [unit] -> its param's sum; its optimizer's sums follow
  std::vector<uint64_t> sums_;
  std::thread thread_;
};

// What SHARDLM_FAULT_CHECKPOINT asks for (tests): after_units:N kills every rank after N units;
// write_error:RANK:PIECE makes rank RANK's PIECE-th data write (0-based, over the whole file)
// fail with ENOSPC, as a full disk would; reserve_error makes the space reservation fail so;
// no_reserve skips the reservation, so that a real full disk fails inside HDF5's writes;
// slow_units:MS waits MS milliseconds after each unit, so a signal can be sent while a write is in progress.
struct Fault {
  int after_units = -1;
  long slow_unit_ms = 0;
  int error_rank = -1;
  long error_piece = -1;
  bool reserve_error = false;
  bool no_reserve = false;
};

Fault fault_from_env() {
  Fault fault;
  const char* spec = std::getenv("SHARDLM_FAULT_CHECKPOINT");
  if (!spec || !*spec) return fault;
  const std::string s = spec;
  const std::string usage = "expected after_units:N, write_error:RANK:PIECE, reserve_error, no_reserve or slow_units:MS";
  auto number = [&](const char* text, char stop, const char** next) {
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    SHARDLM_CHECK(end != text && n >= 0 && n < (1L << 40) && *end == stop, "SHARDLM_FAULT_CHECKPOINT='",
                  clip_for_message(s), "': ", usage);
    if (next) *next = end + 1;
    return n;
  };
  if (s == "reserve_error") {
    fault.reserve_error = true;
  } else if (s == "no_reserve") {
    fault.no_reserve = true;
  } else if (s.rfind("slow_units:", 0) == 0) {
    fault.slow_unit_ms = number(s.c_str() + 11, '\0', nullptr);
  } else if (s.rfind("after_units:", 0) == 0) {
    fault.after_units = static_cast<int>(number(s.c_str() + 12, '\0', nullptr));
  } else if (s.rfind("write_error:", 0) == 0) {
    const char* next = nullptr;
    fault.error_rank = static_cast<int>(number(s.c_str() + 12, ':', &next));
    fault.error_piece = number(next, '\0', nullptr);
  } else {
    throw Error(concat("SHARDLM_FAULT_CHECKPOINT='", clip_for_message(s), "': ", usage));
  }
  return fault;
}

// Rank-local checks of the caller's units; the hash lets ranks compare their unit lists cheaply.
uint64_t check_units(const std::vector<UnitState>& units) {
  Fnv1a hash;
  for (size_t i = 0; i < units.size(); ++i) {
    const UnitState& u = units[i];
    SHARDLM_CHECK(u.layout, "save_checkpoint: unit ", i, " has no layout");
    SHARDLM_CHECK(u.numel == u.layout->numel, "save_checkpoint: unit ", u.layout->name, " has numel ", u.numel,
                  " but its layout ", u.layout->numel);
    SHARDLM_CHECK(u.begin + u.count <= u.numel, "save_checkpoint: unit ", u.layout->name, " slice [", u.begin,
                  ", ", u.begin + u.count, ") is past its ", u.numel, " elements");
    check_optimizer_names(u, "save_checkpoint");
    for (const StateVector& v : stored_vectors(u))
      SHARDLM_CHECK(u.count == 0 || !u.primary || v.data, "save_checkpoint: unit ", u.layout->name,
                    " has no buffer for ", v.name);
    for (const TensorSpec& t : u.layout->tensors) {
      SHARDLM_CHECK(t.name.size() < kIndexNameBytes, "save_checkpoint: tensor name '", t.name, "' is longer than ",
                    kIndexNameBytes - 1, " bytes");
      SHARDLM_CHECK(t.shape.size() <= static_cast<size_t>(kIndexMaxDims), "save_checkpoint: tensor ", t.name,
                    " has more than ", kIndexMaxDims, " dimensions");
    }
    hash.add_bytes(u.layout->name);
    hash.add(u.numel);
    // Every rank must create the same datasets in the same order (collective HDF5 metadata).
    for (const StateVector& v : u.optimizer) {
      hash.add_bytes(v.name);
      hash.add(0x100);  // a separator no character equals: [ab, c] and [a, bc] differ
    }
    hash.add(u.optimizer.size());
  }
  return hash.value();
}

// Collective: every rank must pass the same units, and the primary slices must cover each unit.
std::string check_units_agree(const std::vector<UnitState>& units, uint64_t hash, MPI_Comm comm) {
  uint64_t mine[2] = {hash, ~hash}, most[2] = {0, 0};
  MPI_Allreduce(mine, most, 2, MPI_UINT64_T, MPI_MAX, comm);
  if (most[0] != ~most[1])
    return "save_checkpoint: ranks passed different units (names, sizes or optimizer vectors)";
  std::vector<unsigned long long> covered(units.size()), total(units.size());
  for (size_t i = 0; i < units.size(); ++i) covered[i] = units[i].primary ? units[i].count : 0;
  MPI_Allreduce(covered.data(), total.data(), static_cast<int>(units.size()), MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm);
  for (size_t i = 0; i < units.size(); ++i) {
    if (total[i] != units[i].numel)
      return concat("save_checkpoint: the primary slices of unit ", units[i].layout->name, " hold ", total[i],
                    " elements, the unit has ", units[i].numel, " (primary must be true on exactly one rank per element)");
  }
  return "";
}

// Rank 0 reserves the disk space of the whole file (every dataset is allocated when the units are
// created, so where the data ends is known) before any data is written: a full
// disk is then found by one fallocate, with a clear message, instead of inside HDF5's collective
// writes. A file system that cannot reserve (EOPNOTSUPP) is written without a reservation.
std::string reserve_space(const std::string& path, uint64_t data_end, bool injected) {
  const uint64_t bytes = data_end + (uint64_t{64} << 10);  // and room for the metadata after the data
  if (injected)
    return concat("checkpoint ", path, ": cannot reserve ", format_bytes(bytes), ": ", std::strerror(ENOSPC),
                  " (injected by SHARDLM_FAULT_CHECKPOINT)");
#ifdef __linux__
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return concat("checkpoint ", path, ": cannot open it to reserve space: ", std::strerror(errno));
  const int rc = ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes));
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EOPNOTSUPP && err != ENOSYS && err != EINVAL)
    return concat("checkpoint ", path, ": cannot reserve ", format_bytes(bytes), ": ", std::strerror(err));
#else
  (void)bytes;
#endif
  return "";
}

// Ends the job if closing a failed checkpoint hangs: after a failure inside HDF5 the ranks' file
// states may differ, and H5Fclose's collective steps could then wait for each other for good. Rank
// 0 prints the failure (the one error line of the job), every rank aborts.
class CloseDeadline {
 public:
  CloseDeadline(std::string message, double seconds, int rank)
      : thread_([this, message = std::move(message), seconds, rank] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (done_cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) return;
          if (rank == 0) {
            std::fprintf(stderr, "shardlm: error: %s (closing the unfinished checkpoint did not end in %g s)\n",
                         message.c_str(), seconds);
            std::fflush(stderr);
          }
          MPI_Abort(MPI_COMM_WORLD, 1);
        }) {}
  ~CloseDeadline() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  CloseDeadline(const CloseDeadline&) = delete;
  CloseDeadline& operator=(const CloseDeadline&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

// The open HDF5 file of one checkpoint write. write() is collective and throws AgreedError on any
// rank's failure; abandon() then closes and deletes the unfinished file on every rank.
class FileWriter {
 public:
  FileWriter(std::string tmp_path, MPI_Comm comm) : tmp_path_(std::move(tmp_path)), comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
  }

  void write(const CheckpointMeta& meta, const std::vector<UnitState>& units, const Fault& fault,
             const CheckpointWriteOptions& options) {
    FirstFailure f(tmp_path_);
    create(options, f);
    ContentsHash contents;
    write_skeleton(meta, units, fault, contents, f);
    ChecksumThread checksums(units);
    write_slices(units, fault, options, f);
    write_checksums(units, checksums, contents, f);
    // The attributes reach the disk when rank 0 syncs the file before renaming it.
    dxpl_.reset();
    fapl_.reset();
    f.check(file_.close(), "closing");
    agree_on_error(comm_, f.message());
  }

  // Collective, after write() threw AgreedError(message) on every rank: closes the file and deletes
  // it. Rank 0 first empties it, so that the metadata HDF5 writes while closing finds room even on
  // the disk this file filled; the close runs under a deadline.
  void abandon(const std::string& message) {
    if (rank_ == 0 && file_.valid()) (void)::truncate(tmp_path_.c_str(), 0);
    MPI_Barrier(comm_);
    {
      CloseDeadline deadline(message, 10.0, rank_);
      open_.clear();
      dxpl_.reset();
      fapl_.reset();
      (void)file_.close();
      H5Eclear2(H5E_DEFAULT);
    }
    MPI_Barrier(comm_);
    if (rank_ == 0) {
      std::error_code ignored;
      fs::remove(tmp_path_, ignored);  // a failed write leaves nothing a resume could pick up
    }
  }

 private:
  // The file, created collectively, and the transfer properties of its slices.
  void create(const CheckpointWriteOptions& options, FirstFailure& f) {
    fapl_ = h5_plist(H5Pcreate(H5P_FILE_ACCESS));
    H5Pset_fapl_mpio(fapl_.get(), comm_, MPI_INFO_NULL);
    // v1.8+ objects: dense attribute storage (a deck beyond 64 KiB) and link creation order.
    H5Pset_libver_bounds(fapl_.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST);
    H5Pset_coll_metadata_write(fapl_.get(), true);
    file_ = h5_file(H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl_.get()));
    agree_on_error(comm_, file_.valid() ? "" : concat("cannot create checkpoint '", tmp_path_, "': ", h5_error_text()));

    dxpl_ = h5_plist(H5Pcreate(H5P_DATASET_XFER));
    H5Pset_dxpl_mpio(dxpl_.get(), H5FD_MPIO_COLLECTIVE);
    // Every rank calls H5Dwrite for every piece either way. Without collective buffering each rank's
    // contiguous hyperslab goes to the file through its own MPI_File_write_at: the slices of the
    // ranks never interleave, so two-phase aggregation would only copy every byte once more through
    // the aggregator ranks (slower on one node: docs/history/performance-log.md). On a striped parallel file
    // system, aggregators aligned to the stripes can be the faster choice: the deck key turns it on.
    if (!options.collective_buffering) H5Pset_dxpl_mpio_collective_opt(dxpl_.get(), H5FD_MPIO_INDIVIDUAL_IO);
  }

  // The metadata, the units group, every unit's datasets and index, and the file's room reserved.
  void write_skeleton(const CheckpointMeta& meta, const std::vector<UnitState>& units, const Fault& fault,
                      ContentsHash& contents, FirstFailure& f) {
    write_meta(file_.get(), meta, contents, f);
    {
      // Units are listed in creation order (h.10 would otherwise sort before h.2).
      H5Id gcpl = h5_plist(H5Pcreate(H5P_GROUP_CREATE));
      H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
      H5Id group = h5_group(H5Gcreate2(file_.get(), kUnitsGroup, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
      f.check(group.valid(), concat("creating ", kUnitsGroup));
    }
    agree_on_error(comm_, f.message());

    open_.reserve(units.size());
    for (const UnitState& u : units) open_.push_back(create_unit(file_.get(), u, f));
    agree_on_error(comm_, f.message());
    if (!fault.no_reserve)
      agree_on_error(comm_, rank_ == 0 ? reserve_space(tmp_path_, data_end(units), fault.reserve_error) : "");
    for (size_t i = 0; i < units.size(); ++i) write_index(open_[i], units[i], rank_, dxpl_.get(), f);
    agree_on_error(comm_, f.message());

  }

  // Every rank's slices of every unit's vectors, collectively, in pieces.
  void write_slices(const std::vector<UnitState>& units, const Fault& fault, const CheckpointWriteOptions& options,
                    FirstFailure& f) {
    // Slices go out in pieces of options.piece_bytes, so that the disk starts on one while the next is
    // copied into the page cache. Every rank makes the same number of collective transfers per
    // vector: the most pieces any rank's slice of the unit needs (a rank with fewer, or none, selects
    // nothing in the rest).
    const size_t piece = std::max<size_t>(1, options.piece_bytes / sizeof(float));  // elements
    std::vector<unsigned long long> pieces(units.size()), most_pieces(units.size());
    for (size_t i = 0; i < units.size(); ++i) pieces[i] = writes_slice(units[i]) ? (units[i].count + piece - 1) / piece : 0;
    MPI_Allreduce(pieces.data(), most_pieces.data(), static_cast<int>(units.size()), MPI_UNSIGNED_LONG_LONG, MPI_MAX,
                  comm_);

    EarlyWriteback writeback(tmp_path_);
    long piece_number = 0;
    for (size_t i = 0; i < units.size(); ++i) {
      const UnitState& u = units[i];
      const std::vector<StateVector> vectors = stored_vectors(u);
      for (size_t v = 0; v < vectors.size(); ++v) {
        const hid_t dset = open_[i].dsets[v].get();
        const haddr_t base = H5Dget_offset(dset);
        const float* data = vectors[v].data;
        const size_t mine = writes_slice(u) ? u.count : 0;
        const std::string what = vector_path(u.layout->name, vectors[v].name);
        for (unsigned long long p = 0; p < most_pieces[i]; ++p, ++piece_number) {
          const size_t first = std::min<size_t>(p * piece, mine);
          size_t count = std::min(piece, mine - first);
          // An injected failure still takes part in the collective transfer, with nothing selected.
          const bool injected = rank_ == fault.error_rank && piece_number == fault.error_piece;
          if (injected) count = 0;
          write_selected(dset, H5T_NATIVE_FLOAT, u.begin + first, count, count > 0, count > 0 ? data + first : nullptr,
                         dxpl_.get(), what, f);
          if (injected)
            f.check(false, concat("writing ", what, ": ", std::strerror(ENOSPC), " (injected by SHARDLM_FAULT_CHECKPOINT)"));
          if (base != HADDR_UNDEF) writeback.start(base + (u.begin + first) * sizeof(float), count * sizeof(float));
        }
      }
      agree_on_error(comm_, f.message());
      // Simulates a job killed mid-write: the temporary file stays behind, latest is untouched.
      if (fault.after_units >= 0 && static_cast<int>(i) + 1 == fault.after_units) std::_Exit(86);
      if (fault.slow_unit_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(fault.slow_unit_ms));
    }
    // The data reaches the disk here (MPI_File_sync) while the checksum thread may still be running.
    f.check(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) >= 0, "flushing");
    agree_on_error(comm_, f.message());

  }

  // The datasets' checksums summed over the ranks, and the contents checksum over all of them.
  void write_checksums(const std::vector<UnitState>& units, ChecksumThread& checksums, ContentsHash& contents,
                       FirstFailure& f) {
    const std::vector<uint64_t>& partial = checksums.sums();
    std::vector<uint64_t> total(partial.size(), 0);
    MPI_Allreduce(partial.data(), total.data(), static_cast<int>(total.size()), MPI_UINT64_T, MPI_SUM, comm_);
    for (size_t i = 0; i < units.size(); ++i) {
      const std::vector<StateVector> vectors = stored_vectors(units[i]);
      for (size_t v = 0; v < open_[i].dsets.size(); ++v)
        set_checksum(open_[i].dsets[v].get(), total[checksums.at(i, v)],
                     vector_path(units[i].layout->name, vectors[v].name), f);
      hash_unit(contents, units[i], [&](size_t v) { return total[checksums.at(i, v)]; });
    }
    {
      const uint64_t value = contents.value();
      H5Id attr = h5_attr(H5Aopen(file_.get(), kContentsChecksumAttr, H5P_DEFAULT));
      f.check(attr.valid() && H5Awrite(attr.get(), H5T_NATIVE_UINT64, &value) >= 0,
              concat("writing attribute ", kContentsChecksumAttr));
    }
    agree_on_error(comm_, f.message());
    open_.clear();

  }

  // Where the last byte of the (allocated at creation) vector datasets lies in the file.
  uint64_t data_end(const std::vector<UnitState>& units) const {
    uint64_t end = 0;
    for (size_t i = 0; i < open_.size(); ++i)
      for (const H5Id& d : open_[i].dsets) {
        const haddr_t at = H5Dget_offset(d.get());
        if (at != HADDR_UNDEF) end = std::max<uint64_t>(end, at + uint64_t{units[i].numel} * sizeof(float));
      }
    return end;
  }

  std::string tmp_path_;
  MPI_Comm comm_;
  int rank_ = 0;
  H5Id fapl_, file_, dxpl_;
  std::vector<OpenUnit> open_;
};

}  // namespace

CheckpointWriteStats save_checkpoint(const std::string& dir, int keep_last, const CheckpointMeta& meta,
                                     const std::vector<UnitState>& units, MPI_Comm comm,
                                     const CheckpointWriteOptions& options) {
  Timer timer;
  silence_hdf5_errors();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);

  std::string error;
  Fault fault;
  uint64_t hash = 0;
  try {
    fault = fault_from_env();
    hash = check_units(units);
    SHARDLM_CHECK(!dir.empty(), "save_checkpoint: no checkpoint folder given");
    if (rank == 0) fs::create_directories(dir);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_on_error(comm, error);  // also makes sure DIR exists before any rank opens the file
  agree_on_error(comm, check_units_agree(units, hash, comm));

  const std::string final_path = (fs::path(dir) / checkpoint_file_name(meta.step)).string();
  const std::string tmp_path = final_path + ".tmp";
  {
    FileWriter writer(tmp_path, comm);
    try {
      writer.write(meta, units, fault, options);
    } catch (const AgreedError& e) {
      writer.abandon(e.what());
      throw;
    }
  }

  // Every rank has closed the file (the agreement above is a barrier); rank 0 makes it visible.
  CheckpointWriteStats stats;
  stats.path = final_path;
  unsigned long long bytes = 0;
  error.clear();
  if (rank == 0) {
    try {
      publish_checkpoint(dir, tmp_path, final_path, keep_last, options.keep_name);
      bytes = fs::file_size(final_path);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_on_error(comm, error);  // no rank returns before the rename
  MPI_Bcast(&bytes, 1, MPI_UNSIGNED_LONG_LONG, 0, comm);
  stats.bytes = bytes;
  const double mine = timer.seconds();
  MPI_Allreduce(&mine, &stats.seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  return stats;
}

}  // namespace shardlm

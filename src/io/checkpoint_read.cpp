// Reading checkpoints: load_checkpoint (collective, each rank reads its slices through MPI-IO,
// checksums verified) and CheckpointReader (serial, one tensor at a time for inspect and export).
#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "../core/input_file.hpp"

#include "checkpoint_format.hpp"

namespace shardlm {
namespace {

using namespace ckpt;
namespace fs = std::filesystem;

// ---- attributes -----------------------------------------------------------------------------

void get_scalar(hid_t obj, const char* name, hid_t mem_type, void* out, const std::string& file) {
  H5Id attr = h5_attr(H5Aopen(obj, name, H5P_DEFAULT));
  SHARDLM_CHECK(attr.valid(), "checkpoint ", file, " is damaged: attribute '", name, "' cannot be opened: ",
                h5_error_text("it is missing"));
  SHARDLM_CHECK(H5Aread(attr.get(), mem_type, out) >= 0, "checkpoint ", file, " is damaged: attribute '", name,
                "' cannot be read as a number: ", h5_error_text());
}

// A numeric attribute read as T, which mem_type (H5T_NATIVE_*) describes.
template <typename T>
T get_number(hid_t obj, const char* name, hid_t mem_type, const std::string& file) {
  T v = 0;
  get_scalar(obj, name, mem_type, &v, file);
  return v;
}

// Fixed-length (as written here) or variable-length strings (as other tools may write).
std::string get_string(hid_t obj, const char* name, const std::string& file) {
  H5Id attr = h5_attr(H5Aopen(obj, name, H5P_DEFAULT));
  SHARDLM_CHECK(attr.valid(), "checkpoint ", file, " is damaged: attribute '", name, "' cannot be opened: ",
                h5_error_text("it is missing"));
  H5Id type = h5_type(H5Aget_type(attr.get()));
  SHARDLM_CHECK(H5Tget_class(type.get()) == H5T_STRING, "checkpoint ", file, ": attribute '", name,
                "' is not a string");
  std::string value;
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id mem = h5_type(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* text = nullptr;
    SHARDLM_CHECK(H5Aread(attr.get(), mem.get(), &text) >= 0, "checkpoint ", file, " is damaged: attribute '", name,
                  "' cannot be read: ", h5_error_text());
    if (text) value = text;
    H5free_memory(text);
  } else {
    std::vector<char> text(H5Tget_size(type.get()) + 1, '\0');
    SHARDLM_CHECK(H5Aread(attr.get(), type.get(), text.data()) >= 0, "checkpoint ", file, " is damaged: attribute '", name,
                  "' cannot be read: ", h5_error_text());
    value = text.data();  // stops at the terminator or the padding
  }
  return value;
}

// One attribute into `out`, read as out's type.
void get_attribute(hid_t obj, const char* name, const std::string& file, int& out) {
  out = get_number<int>(obj, name, H5T_NATIVE_INT, file);
}
void get_attribute(hid_t obj, const char* name, const std::string& file, long& out) {
  out = static_cast<long>(get_number<int64_t>(obj, name, H5T_NATIVE_INT64, file));
}
void get_attribute(hid_t obj, const char* name, const std::string& file, uint64_t& out) {
  out = get_number<uint64_t>(obj, name, H5T_NATIVE_UINT64, file);
}
void get_attribute(hid_t obj, const char* name, const std::string& file, double& out) {
  out = get_number<double>(obj, name, H5T_NATIVE_DOUBLE, file);
}
void get_attribute(hid_t obj, const char* name, const std::string& file, std::string& out) {
  out = get_string(obj, name, file);
}

// The attribute as read into the contents hash (the writer's hash_attribute of the same value).
void hash_attribute(ContentsHash& h, const char* name, int v) { h.attribute(name, int64_t{v}); }
void hash_attribute(ContentsHash& h, const char* name, long v) { h.attribute(name, int64_t{v}); }
void hash_attribute(ContentsHash& h, const char* name, uint64_t v) { h.attribute(name, v); }
void hash_attribute(ContentsHash& h, const char* name, double v) { h.attribute(name, v); }
void hash_attribute(ContentsHash& h, const char* name, const std::string& v) { h.text_attribute(name, v); }

template <typename T>
void read_attribute(hid_t file, const char* name, const std::string& path, T& out, ContentsHash& hash) {
  get_attribute(file, name, path, out);
  hash_attribute(hash, name, out);
}
// A model config is hashed as its stored text, not as parsed and written again.
void read_attribute(hid_t file, const char* name, const std::string& path, ModelConfig& out, ContentsHash& hash) {
  const std::string text = get_string(file, name, path);
  hash.text_attribute(name, text);
  out = model_config_from_hf(text, concat("checkpoint ", path, ": attribute ", name));
}

// The root attributes; `hash` takes them for contents_problem.
CheckpointMeta read_meta(hid_t file, const std::string& path, ContentsHash& hash) {
  CheckpointMeta m;
  read_attribute(file, "format_version", path, m.format_version, hash);
  SHARDLM_CHECK(m.format_version == kCheckpointFormatVersion, "checkpoint ", path, " has format_version ",
                m.format_version, "; this shardlm reads format ", kCheckpointFormatVersion);
  for_each_meta_attribute(m, [&](const char* name, auto& field) {
    if (optional_meta_attribute(name) && H5Aexists(file, name) == 0) {  // an older file
      if (!meta_attribute_after_contents_checksum(name)) hash.absent(name);
      return;
    }
    read_attribute(file, name, path, field, hash);
  });
  return m;
}

// Values no run writes, each named with the file ("" when there is none): what the checksums cannot
// catch in a file written wrong, or in one written before the contents checksum was kept.
std::string meta_problem(const CheckpointMeta& m, const std::string& path) {
  const std::string at = concat("checkpoint ", path, " is inconsistent: ");
  if (m.step < 0) return concat(at, "step ", m.step, " is negative");
  if (m.epoch < 0) return concat(at, "epoch ", m.epoch, " is negative");
  if (m.epoch_step < 0) return concat(at, "epoch_step ", m.epoch_step, " is negative");
  if (m.optimizer_steps < 0) return concat(at, "optimizer_steps ", m.optimizer_steps, " is negative");
  if (m.total_steps < 0) return concat(at, "total_steps ", m.total_steps, " is negative");
  if (m.step > m.total_steps)
    return concat(at, "step ", m.step, " is past total_steps ", m.total_steps, " of the run that wrote it");
  if (m.global_batch < 0) return concat(at, "global_batch ", m.global_batch, " is negative");
  if (m.steps_per_epoch < 0) return concat(at, "steps_per_epoch ", m.steps_per_epoch, " is negative");
  if (m.steps_per_epoch > 0 && m.epoch_step > m.steps_per_epoch)
    return concat(at, "epoch_step ", m.epoch_step, " is past the ", m.steps_per_epoch, " steps of its epochs");
  return "";
}

// ---- units ----------------------------------------------------------------------------------

// The unit groups under /units in the order they were written.
std::vector<std::string> unit_names(hid_t file, const std::string& path) {
  H5Id group = h5_group(H5Gopen2(file, kUnitsGroup, H5P_DEFAULT));
  SHARDLM_CHECK(group.valid(), "checkpoint ", path, " is damaged: group ", kUnitsGroup, " cannot be opened: ",
                h5_error_text("it is missing"));
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
  };
  hsize_t at = 0;
  SHARDLM_CHECK(H5Literate(group.get(), H5_INDEX_CRT_ORDER, H5_ITER_INC, &at, collect, &names) >= 0,
                "checkpoint ", path, ": cannot list ", kUnitsGroup, " in creation order: ", h5_error_text());
  return names;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return "[" + s + "]";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return "[" + s + "]";
}

std::vector<CheckpointTensor> read_index(hid_t file, const std::string& unit, const std::string& path) {
  const std::string where = unit_group_path(unit) + "/" + kIndexDataset;
  H5Id dset = h5_dataset(H5Dopen2(file, where.c_str(), H5P_DEFAULT));
  SHARDLM_CHECK(dset.valid(), "checkpoint ", path, " is damaged: dataset ", where, " cannot be opened: ",
                h5_error_text("it is missing"));
  H5Id space = h5_space(H5Dget_space(dset.get()));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  SHARDLM_CHECK(n >= 0, "checkpoint ", path, ": dataset ", where, " has no size");
  std::vector<IndexRecord> rows(static_cast<size_t>(n));
  H5Id mem_type = index_memory_type();
  SHARDLM_CHECK(n == 0 || H5Dread(dset.get(), mem_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) >= 0,
                "checkpoint ", path, " is damaged: dataset ", where, " cannot be read: ", h5_error_text());
  std::vector<CheckpointTensor> tensors;
  for (const IndexRecord& r : rows) {
    SHARDLM_CHECK(r.ndim >= 0 && r.ndim <= kIndexMaxDims, "checkpoint ", path, " is damaged: dataset ", where,
                  " has a tensor with ", r.ndim, " dimensions");
    CheckpointTensor t;
    t.unit = unit;
    t.name.assign(r.name, strnlen(r.name, kIndexNameBytes));
    t.shape.assign(r.shape, r.shape + r.ndim);
    t.offset = r.offset;
    t.numel = r.numel;
    tensors.push_back(std::move(t));
  }
  return tensors;
}

// The optimizer vectors stored in a unit's group: every link but param and index, in name order.
std::vector<std::string> stored_optimizer_vectors(hid_t file, const std::string& unit, const std::string& path) {
  const std::string where = unit_group_path(unit);
  H5Id group = h5_group(H5Gopen2(file, where.c_str(), H5P_DEFAULT));
  SHARDLM_CHECK(group.valid(), "checkpoint ", path, " is damaged: group ", where, " cannot be opened: ",
                h5_error_text("it is missing"));
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    const std::string n = name;
    if (n != kParamDataset && n != kIndexDataset) static_cast<std::vector<std::string>*>(out)->push_back(n);
    return 0;
  };
  hsize_t at = 0;
  SHARDLM_CHECK(H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, &at, collect, &names) >= 0, "checkpoint ",
                path, ": cannot list ", where, ": ", h5_error_text());
  return names;
}

// The file's optimizer vectors of unit u must be exactly those the run keeps: a checkpoint of
// another optimizer would otherwise lose state or leave some of it unset.
void check_optimizer_vectors(hid_t file, const UnitState& u, const std::string& path) {
  check_optimizer_names(u, "load_checkpoint");
  std::vector<std::string> wanted;
  for (const StateVector& v : u.optimizer) wanted.push_back(v.name);
  std::sort(wanted.begin(), wanted.end());
  const std::vector<std::string> found = stored_optimizer_vectors(file, u.layout->name, path);
  if (found == wanted) return;
  std::vector<std::string> missing, extra;
  std::set_difference(wanted.begin(), wanted.end(), found.begin(), found.end(), std::back_inserter(missing));
  std::set_difference(found.begin(), found.end(), wanted.begin(), wanted.end(), std::back_inserter(extra));
  std::string what;
  for (const std::string& n : missing) what += concat("; missing dataset ", vector_path(u.layout->name, n));
  for (const std::string& n : extra) what += concat("; extra dataset ", vector_path(u.layout->name, n));
  throw Error(concat("checkpoint ", path, ": unit ", u.layout->name, " holds optimizer state ", join_names(found),
                     ", the run's optimizer keeps ", join_names(wanted), what, " (written by another optimizer?)"));
}

// Elements in a 1-D dataset; Error naming it if missing or not 1-D.
size_t dataset_length(hid_t dset, const std::string& where, const std::string& path) {
  SHARDLM_CHECK(dset >= 0, "checkpoint ", path, " is damaged: dataset ", where, " cannot be opened: ",
                h5_error_text("it is missing"));
  H5Id space = h5_space(H5Dget_space(dset));
  SHARDLM_CHECK(H5Sget_simple_extent_ndims(space.get()) == 1, "checkpoint ", path, ": dataset ", where,
                " is not one-dimensional");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  return static_cast<size_t>(n);
}

// The file must hold exactly the caller's units, with the same sizes and tensors (rank-local).
void check_layout(hid_t file, const std::vector<UnitState>& units, const std::string& path, bool weights_only) {
  std::vector<std::string> wanted;
  for (const UnitState& u : units) {
    SHARDLM_CHECK(u.layout, "load_checkpoint: a unit has no layout");
    wanted.push_back(u.layout->name);
  }
  const std::vector<std::string> found = unit_names(file, path);
  SHARDLM_CHECK(found == wanted, "checkpoint ", path, " holds units ", join_names(found), ", the model has ",
                join_names(wanted), " (different model shape?)");
  for (const UnitState& u : units) {
    SHARDLM_CHECK(u.begin + u.count <= u.numel, "load_checkpoint: unit ", u.layout->name, " slice [", u.begin, ", ",
                  u.begin + u.count, ") is past its ", u.numel, " elements");
    if (!weights_only) check_optimizer_vectors(file, u, path);
    for (const StateVector& v : stored_vectors(u)) {
      const std::string where = vector_path(u.layout->name, v.name);
      H5Id dset = h5_dataset(H5Dopen2(file, where.c_str(), H5P_DEFAULT));
      const size_t n = dataset_length(dset.get(), where, path);
      SHARDLM_CHECK(n == u.numel, "checkpoint ", path, ": ", where, " has ", n, " elements, the model needs ",
                    u.numel, " (different model shape?)");
    }
    const std::vector<CheckpointTensor> tensors = read_index(file, u.layout->name, path);
    const std::string where = unit_group_path(u.layout->name) + "/" + kIndexDataset;
    SHARDLM_CHECK(tensors.size() == u.layout->tensors.size(), "checkpoint ", path, ": ", where, " lists ",
                  tensors.size(), " tensors, the model has ", u.layout->tensors.size(), " (different model?)");
    for (size_t i = 0; i < tensors.size(); ++i) {
      const CheckpointTensor& t = tensors[i];
      const TensorSpec& s = u.layout->tensors[i];
      SHARDLM_CHECK(t.name == s.name && t.shape == s.shape && t.offset == s.offset, "checkpoint ", path, ": ",
                    where, ": tensor ", i, " is ", t.name, " ", shape_text(t.shape), " at ", t.offset,
                    ", the model has ", s.name, " ", shape_text(s.shape), " at ", s.offset, " (different model?)");
    }
  }
}

uint64_t checksum_attribute(hid_t dset, const std::string& where, const std::string& path) {
  H5Id attr = h5_attr(H5Aopen(dset, kChecksumAttr, H5P_DEFAULT));
  uint64_t sum = 0;
  SHARDLM_CHECK(attr.valid() && H5Aread(attr.get(), H5T_NATIVE_UINT64, &sum) >= 0, "checkpoint ", path,
                " is damaged: dataset ", where, " has no readable checksum attribute");
  return sum;
}

std::string checksum_mismatch(const std::string& path, const std::string& where) {
  return concat("checkpoint ", path, " is damaged: dataset ", where, ": checksum mismatch");
}

// "" when the file keeps no contents checksum (written before it was kept) or the file's
// attributes (in `hash` already), index rows and dataset checksums give the value it keeps; else
// the damage, naming the file. Metadata only: no vector's data is read.
std::string contents_problem(hid_t file, const std::string& path, ContentsHash hash) {
  if (H5Aexists(file, kContentsChecksumAttr) <= 0) return "";
  const uint64_t kept = get_number<uint64_t>(file, kContentsChecksumAttr, H5T_NATIVE_UINT64, path);
  for (const std::string& unit : unit_names(file, path)) {
    hash.unit(unit);
    for (const CheckpointTensor& t : read_index(file, unit, path)) hash.tensor(t.name, t.offset, t.numel, t.shape);
    std::vector<std::string> names{kParamDataset};
    for (const std::string& name : stored_optimizer_vectors(file, unit, path)) names.push_back(name);
    for (const std::string& name : names) {
      const std::string where = vector_path(unit, name);
      H5Id dset = h5_dataset(H5Dopen2(file, where.c_str(), H5P_DEFAULT));
      SHARDLM_CHECK(dset.valid(), "checkpoint ", path, " is damaged: dataset ", where, " cannot be opened: ",
                    h5_error_text("it is missing"));
      hash.dataset(name, checksum_attribute(dset.get(), where, path));
    }
  }
  if (hash.value() == kept) return "";
  return concat("checkpoint ", path, " is damaged: its attributes, tensor index or vectors' checksums are not those its ",
                kContentsChecksumAttr, " was computed over (changed after it was written, or vectors swapped?)");
}

// Collective: each rank reads [begin, begin + count) of the unit's datasets; primaries' partial
// checksums are summed and compared with the attributes. Returns this rank's error.
std::string read_unit(hid_t file, const UnitState& u, hid_t dxpl, MPI_Comm comm, const std::string& path,
                      bool weights_only) {
  std::string error;
  std::vector<StateVector> vectors = stored_vectors(u);
  if (weights_only) vectors.resize(1);  // param
  // The optimizer's in name order: the same collective reads on every rank, whatever order each
  // rank listed them in (check_layout has matched the names with the file's).
  std::sort(vectors.begin() + 1, vectors.end(),
            [](const StateVector& a, const StateVector& b) { return a.name < b.name; });
  std::vector<uint64_t> partial(vectors.size(), 0), expected(vectors.size(), 0);
  for (size_t v = 0; v < vectors.size(); ++v) {
    const std::string where = vector_path(u.layout->name, vectors[v].name);
    H5Id dset = h5_dataset(H5Dopen2(file, where.c_str(), H5P_DEFAULT));
    H5Id file_space = h5_space(H5Dget_space(dset.get()));
    const hsize_t begin = u.begin, count = u.count, one = 1;
    H5Id mem_space = h5_space(H5Screate_simple(1, count > 0 ? &count : &one, nullptr));
    if (count > 0) {
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &begin, nullptr, &count, nullptr);
    } else {
      H5Sselect_none(file_space.get());
      H5Sselect_none(mem_space.get());
    }
    float dummy = 0;  // HDF5 wants a buffer even for an empty selection
    float* out = count > 0 ? vectors[v].data : &dummy;
    if (count > 0 && !out) {
      if (error.empty()) error = concat("load_checkpoint: unit ", u.layout->name, " has no buffer for ", where);
      out = &dummy;
      H5Sselect_none(file_space.get());
      H5Sselect_none(mem_space.get());
    }
    // An empty vector (a unit with nothing trained: LoRA's root) has no storage to read from.
    const bool empty = H5Sget_simple_extent_npoints(file_space.get()) == 0;
    const herr_t rc = empty ? 0 : H5Dread(dset.get(), H5T_NATIVE_FLOAT, mem_space.get(), file_space.get(), dxpl, out);
    if (rc < 0 && error.empty())
      error = concat("checkpoint ", path, " is damaged: dataset ", where, " cannot be read: ", h5_error_text());
    if (rc >= 0 && u.primary && count > 0 && out != &dummy) partial[v] = checksum_slice(out, u.begin, u.count);
    try {
      expected[v] = checksum_attribute(dset.get(), where, path);
    } catch (const Error& e) {
      if (error.empty()) error = e.what();
    }
  }
  std::vector<uint64_t> total(vectors.size(), 0);
  MPI_Allreduce(partial.data(), total.data(), static_cast<int>(total.size()), MPI_UINT64_T, MPI_SUM, comm);
  for (size_t v = 0; v < vectors.size() && error.empty(); ++v)
    if (total[v] != expected[v]) error = checksum_mismatch(path, vector_path(u.layout->name, vectors[v].name));
  return error;
}

std::string open_failure(const std::string& path) {
  if (!fs::exists(path)) return concat("cannot open checkpoint '", path, "': no such file");
  const std::string reason = h5_error_text("not a readable HDF5 file");
  if (H5Fis_hdf5(path.c_str()) == 0)
    return concat("cannot open checkpoint '", path, "': it is damaged: not an HDF5 file (", reason, ")");
  return concat("cannot open checkpoint '", path, "': it is damaged: ", reason);
}

// "" when `path` is a regular file, else why it cannot be opened as a checkpoint: a pipe would block
// H5Fopen, a folder or device is no checkpoint either.
std::string not_a_checkpoint_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return concat("cannot open checkpoint '", path, "': no such file");
  try {
    check_input_file(path, "checkpoint", std::numeric_limits<uint64_t>::max());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

CheckpointMeta load_checkpoint(const std::string& path, const std::vector<UnitState>& units, MPI_Comm comm,
                               const std::function<void(const CheckpointMeta&)>& check_meta, bool weights_only) {
  silence_hdf5_errors();
  agree_on_error(comm, not_a_checkpoint_file(path));  // every rank refuses a pipe before any opens it
  H5Id fapl = h5_plist(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  H5Id file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  agree_on_error(comm, file.valid() ? "" : open_failure(path));

  CheckpointMeta meta;
  std::string error;
  try {
    ContentsHash hash;
    meta = read_meta(file.get(), path, hash);
    const std::string damage = contents_problem(file.get(), path, hash);
    if (!damage.empty()) throw Error(damage);
    const std::string inconsistency = meta_problem(meta, path);
    if (!inconsistency.empty()) throw Error(inconsistency);
    if (check_meta) check_meta(meta);
    check_layout(file.get(), units, path, weights_only);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_on_error(comm, error);

  H5Id dxpl = h5_plist(H5Pcreate(H5P_DATASET_XFER));
  H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
  for (const UnitState& u : units)
    agree_on_error(comm, read_unit(file.get(), u, dxpl.get(), comm, path, weights_only));
  return meta;
}

// ---- CheckpointReader -------------------------------------------------------------------------

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  silence_hdf5_errors();
  const std::string not_a_file = not_a_checkpoint_file(path);
  if (!not_a_file.empty()) throw Error(not_a_file);
  // Default (serial) file access: no MPI-IO, so it works on one rank or without MPI at all.
  H5Id file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) throw Error(open_failure(path));
  ContentsHash hash;
  meta_ = read_meta(file.get(), path, hash);
  for (const std::string& unit : unit_names(file.get(), path)) {
    std::vector<CheckpointTensor> unit_tensors = read_index(file.get(), unit, path);
    tensors_.insert(tensors_.end(), unit_tensors.begin(), unit_tensors.end());
    unit_states_.push_back({unit, stored_optimizer_vectors(file.get(), unit, path)});
  }
  // Kept for metadata_problems() and verify(): inspect still shows what such a file holds.
  for (const std::string& problem : {contents_problem(file.get(), path, hash), meta_problem(meta_, path)})
    if (!problem.empty()) metadata_problems_.push_back(problem);
  file_ = file.release();  // closed in the destructor
}

CheckpointReader::~CheckpointReader() {
  if (file_ >= 0) H5Fclose(static_cast<hid_t>(file_));
}

std::vector<float> CheckpointReader::read(const CheckpointTensor& t) {
  const std::string where = vector_path(t.unit, kParamDataset);
  const hid_t file = static_cast<hid_t>(file_);
  H5Id dset = h5_dataset(H5Dopen2(file, where.c_str(), H5P_DEFAULT));
  const size_t n = dataset_length(dset.get(), where, path_);
  SHARDLM_CHECK(t.offset + t.numel <= n, "checkpoint ", path_, ": tensor ", t.name, " [", t.offset, ", ",
                t.offset + t.numel, ") lies past the end of ", where, " (", n, " elements)");
  H5Id file_space = h5_space(H5Dget_space(dset.get()));
  if (!verified_[t.unit]) {
    // First use of this unit: read the whole dataset once to check it, then cut the tensor out.
    std::vector<float> all(n);
    SHARDLM_CHECK(n == 0 || H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()) >= 0,
                  "checkpoint ", path_, " is damaged: dataset ", where, " cannot be read: ", h5_error_text());
    SHARDLM_CHECK(checksum_slice(all.data(), 0, n) == checksum_attribute(dset.get(), where, path_),
                  checksum_mismatch(path_, where));
    verified_[t.unit] = true;
    return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(t.offset),
                              all.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel));
  }
  std::vector<float> values(t.numel);
  if (t.numel == 0) return values;
  const hsize_t begin = t.offset, count = t.numel;
  H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &begin, nullptr, &count, nullptr);
  H5Id mem_space = h5_space(H5Screate_simple(1, &count, nullptr));
  SHARDLM_CHECK(H5Dread(dset.get(), H5T_NATIVE_FLOAT, mem_space.get(), file_space.get(), H5P_DEFAULT,
                        values.data()) >= 0,
                "checkpoint ", path_, " is damaged: dataset ", where, " cannot be read: ", h5_error_text());
  return values;
}

std::vector<std::string> CheckpointReader::verify() {
  std::vector<std::string> damage = metadata_problems_;
  const hid_t file = static_cast<hid_t>(file_);
  for (const CheckpointUnitState& u : unit_states_) {
    std::vector<std::string> names{kParamDataset};
    names.insert(names.end(), u.optimizer.begin(), u.optimizer.end());
    for (const std::string& name : names) {
      const std::string where = vector_path(u.unit, name);
      try {
        H5Id dset = h5_dataset(H5Dopen2(file, where.c_str(), H5P_DEFAULT));
        const size_t n = dataset_length(dset.get(), where, path_);
        std::vector<float> all(n);
        SHARDLM_CHECK(n == 0 || H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()) >= 0,
                      "checkpoint ", path_, " is damaged: dataset ", where, " cannot be read: ", h5_error_text());
        SHARDLM_CHECK(checksum_slice(all.data(), 0, n) == checksum_attribute(dset.get(), where, path_),
                      checksum_mismatch(path_, where));
      } catch (const Error& e) {
        damage.push_back(e.what());
      }
    }
  }
  return damage;
}

std::string model_config_difference(const ModelConfig& checkpoint, const ModelConfig& run) {
  // Both as Hugging Face config.json: every shape key, the norms' eps, rope and the vocabulary.
  const nlohmann::json a = nlohmann::json::parse(hf_config_json(checkpoint));
  const nlohmann::json b = nlohmann::json::parse(hf_config_json(run));
  // initializer_range only says how a fresh model is drawn.
  for (const auto& [key, value] : b.items()) {
    if (key == "initializer_range") continue;
    const auto there = a.find(key);
    if (there == a.end()) return concat(key, " is not in the checkpoint, ", value.dump(), " in this run");
    if (*there != value) return concat(key, " is ", there->dump(), " in the checkpoint, ", value.dump(), " in this run");
  }
  for (const auto& [key, value] : a.items())
    if (!b.contains(key) && key != "initializer_range") return concat(key, " is ", value.dump(), " in the checkpoint, absent in this run");
  return "";
}

bool checkpoint_damaged(const std::string& error) {
  return error.find(" is damaged: ") != std::string::npos || error.find("': it is damaged: ") != std::string::npos;
}

bool checkpoint_of_another_run(const std::string& error) {
  return error.find(" belongs to another run: ") != std::string::npos;
}

bool checkpoint_unusable(const std::string& error) {
  return checkpoint_damaged(error) || error.find(" is inconsistent") != std::string::npos ||
         checkpoint_of_another_run(error);
}

}  // namespace shardlm

// Serial HDF5 edits of a checkpoint copy, for the tests of what a reader refuses: an attribute set
// to a value no run writes, attributes removed (a file as written before they were kept), two
// datasets swapped, bytes of a dataset's data flipped.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace ckpt_edit {

// Opens `path` for writing, runs edit(file), closes; false when any step failed.
template <typename Edit>
bool edit_file(const std::string& path, Edit edit) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) return false;
  const bool ok = edit(file);
  return H5Fclose(file) >= 0 && ok;
}

// Root attribute `name` (an integer of any width) set to `value`; HDF5 converts to the stored type.
inline bool set_integer(const std::string& path, const char* name, int64_t value) {
  return edit_file(path, [&](hid_t file) {
    const hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
    const bool ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_INT64, &value) >= 0;
    if (attr >= 0) H5Aclose(attr);
    return ok;
  });
}

inline bool remove_attributes(const std::string& path, const std::vector<std::string>& names) {
  return edit_file(path, [&](hid_t file) {
    for (const std::string& name : names)
      if (H5Adelete(file, name.c_str()) < 0) return false;
    return true;
  });
}

// The attributes a checkpoint written before run ids, global batch and contents checksum lacks.
inline bool make_old_format(const std::string& path) {
  return remove_attributes(path, {"run_id", "global_batch", "steps_per_epoch", "contents_checksum"});
}

// Swaps the names of two datasets (with their data and checksum attributes) of one file.
inline bool swap_datasets(const std::string& path, const std::string& a, const std::string& b) {
  return edit_file(path, [&](hid_t file) {
    const std::string parked = a + ".parked";
    return H5Lmove(file, a.c_str(), file, parked.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0 &&
           H5Lmove(file, b.c_str(), file, a.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0 &&
           H5Lmove(file, parked.c_str(), file, b.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0;
  });
}

// XORs `count` bytes at `skip` bytes into a dataset's (contiguous) data with `mask`; false if it has none.
inline bool flip_dataset_bytes(const std::string& path, const std::string& dataset, size_t skip, int count,
                               char mask = 0x5a) {
  haddr_t offset = HADDR_UNDEF;
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) return false;
    const hid_t dset = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
    if (dset >= 0) offset = H5Dget_offset(dset);
    if (dset >= 0) H5Dclose(dset);
    H5Fclose(file);
  }
  if (offset == HADDR_UNDEF) return false;
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  for (int i = 0; i < count; ++i) {
    const auto at = static_cast<std::streamoff>(offset + skip + static_cast<size_t>(i));
    f.seekg(at);
    char c = 0;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ mask));
  }
  return static_cast<bool>(f);
}

}  // namespace ckpt_edit

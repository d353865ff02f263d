// read_safetensors: a defensive reader of untrusted safetensors files (F32, BF16, F16 data, returned as fp32).
#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "../core/input_file.hpp"
#include "shardlm/io.hpp"

// The data section is read as the host's bytes; safetensors is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace shardlm {
namespace {

// std::map-backed: ordered_json's linear key lookup would make parsing a header of many keys quadratic.
using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100000000;  // the reference implementation's limit
constexpr int kMaxJsonDepth = 8;  // a valid header nests 3 deep; deeper input only costs memory

// One tensor's header entry, checked against the data section.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t numel = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Untrusted text for an error message: control characters (and with ascii_only, every non-ASCII byte) become '?'.
std::string printable(std::string text, bool ascii_only = false) {
  for (char& c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || (ascii_only && u > 0x7f)) c = '?';
  }
  return text;
}

[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, const std::string& why) {
  throw Error(concat("safetensors ", path, ": tensor '", printable(name), "': ", why));
}

uint64_t read_le64(const unsigned char* bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | bytes[i];
  return v;
}

// Reads `bytes` bytes at `offset`; Error if the file ends first (it may have shrunk since it was sized).
void read_at(const std::string& path, std::ifstream& in, uint64_t offset, char* dst, size_t bytes) {
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(dst, static_cast<std::streamsize>(bytes));
  SHARDLM_CHECK(in && static_cast<size_t>(in.gcount()) == bytes, "safetensors ", path, ": cannot read ", bytes,
                " bytes at offset ", offset, " (file truncated?)");
}

// A non-negative JSON integer, or false.
bool as_uint(const Json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

struct Header {
  Json json;
  std::vector<std::string> keys;  // the top-level keys in file order (Json sorts them by name)
};

// Parses the header text; rejects duplicate keys (the JSON library would keep one silently) and deep nesting.
Header parse_header(const std::string& path, const std::string& text) {
  Header header;
  std::vector<std::set<std::string>> open_objects;
  const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    SHARDLM_CHECK(depth <= kMaxJsonDepth, "safetensors ", path, ": header nests deeper than ", kMaxJsonDepth,
                  " levels");
    if (event == E::object_start) open_objects.emplace_back();
    if (event == E::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == E::key && !open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second)
      throw Error(concat("safetensors ", path, ": header has the key '", printable(parsed.get<std::string>()),
                         "' twice"));
    if (event == E::key && open_objects.size() == 1) header.keys.push_back(parsed.get<std::string>());
    return true;
  };
  try {
    header.json = Json::parse(text, check);
  } catch (const nlohmann::json::exception& e) {
    throw Error(concat("safetensors ", path, ": header is not valid JSON: ", printable(e.what(), true)));
  }
  SHARDLM_CHECK(header.json.is_object(), "safetensors ", path, ": header is not a JSON object");
  return header;
}

void check_metadata(const std::string& path, const Json& meta) {
  SHARDLM_CHECK(meta.is_object(), "safetensors ", path, ": __metadata__ is not a JSON object");
  for (const auto& [key, value] : meta.items())
    SHARDLM_CHECK(value.is_string(), "safetensors ", path, ": __metadata__ '", printable(key), "' is not a string");
}

DType parse_st_dtype(const std::string& path, const std::string& name, const Json& entry) {
  const auto it = entry.find("dtype");
  if (it == entry.end() || !it->is_string()) fail_tensor(path, name, "no \"dtype\" string");
  const std::string dtype = it->get<std::string>();
  if (dtype == "F32") return DType::F32;
  if (dtype == "BF16") return DType::BF16;
  if (dtype == "F16") return DType::F16;
  fail_tensor(path, name, concat("dtype '", dtype, "' is not supported (F32, BF16 and F16 are)"));
}

// Fills info.shape and info.numel; the element count must fit in 64 bits together with its byte size.
void parse_shape(const std::string& path, const Json& entry, TensorInfo& info) {
  const auto it = entry.find("shape");
  if (it == entry.end() || !it->is_array()) fail_tensor(path, info.name, "no \"shape\" array");
  uint64_t numel = 1;
  for (const Json& d : *it) {
    uint64_t dim = 0;
    if (!as_uint(d, dim)) fail_tensor(path, info.name, concat("shape has ", d.dump(), ", not a non-negative integer"));
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_tensor(path, info.name, concat("shape dimension ", dim, " is too large"));
    if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 4 / dim)
      fail_tensor(path, info.name, "shape's element count overflows");
    numel *= dim;
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  info.numel = numel;
}

void parse_offsets(const std::string& path, const Json& entry, uint64_t data_bytes, TensorInfo& info) {
  const auto it = entry.find("data_offsets");
  if (it == entry.end() || !it->is_array() || it->size() != 2 || !as_uint((*it)[0], info.begin) ||
      !as_uint((*it)[1], info.end))
    fail_tensor(path, info.name, "no \"data_offsets\" array of two non-negative integers");
  if (info.begin > info.end)
    fail_tensor(path, info.name, concat("data_offsets [", info.begin, ", ", info.end, "] end before they begin"));
  if (info.end > data_bytes)
    fail_tensor(path, info.name, concat("data_offsets [", info.begin, ", ", info.end, "] run past the data section of ",
                                        data_bytes, " bytes"));
  const uint64_t expected = info.numel * dtype_size(info.dtype);
  if (info.end - info.begin != expected)
    fail_tensor(path, info.name, concat("data_offsets [", info.begin, ", ", info.end, "] hold ", info.end - info.begin,
                                        " bytes, the shape and dtype need ", expected));
}

TensorInfo parse_entry(const std::string& path, const std::string& name, const Json& entry, uint64_t data_bytes) {
  TensorInfo info;
  info.name = name;
  if (!entry.is_object()) fail_tensor(path, name, "entry is not a JSON object");
  info.dtype = parse_st_dtype(path, name, entry);
  parse_shape(path, entry, info);
  parse_offsets(path, entry, data_bytes, info);
  return info;
}

// Sorts by data offset (the writer's order; ties keep the header's order) and rejects tensors sharing bytes.
void sort_and_check_overlaps(const std::string& path, std::vector<TensorInfo>& infos) {
  std::stable_sort(infos.begin(), infos.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;  // end of the furthest-reaching tensor so far
  const TensorInfo* last = nullptr;
  for (const auto& t : infos) {
    if (t.begin < covered)
      fail_tensor(path, t.name,
                  concat("data_offsets [", t.begin, ", ", t.end, "] overlap tensor '", printable(last->name), "'"));
    if (t.end > covered) {
      covered = t.end;
      last = &t;
    }
  }
}

// Elements [first, first + count) of tensor t (data at absolute file offset `at`) as fp32 into out.
// 16-bit data is converted a chunk at a time so the values are never held twice.
void read_range(const std::string& path, std::ifstream& in, uint64_t at, DType dtype, size_t first, size_t count,
                float* out) {
  if (count == 0) return;
  if (dtype == DType::F32) {
    read_at(path, in, at + first * 4, reinterpret_cast<char*>(out), count * 4);
    return;
  }
  constexpr size_t kChunk = size_t(1) << 20;
  std::vector<uint16_t> raw(std::min(kChunk, count));
  for (size_t done = 0; done < count; done += raw.size()) {
    const size_t n = std::min(raw.size(), count - done);
    read_at(path, in, at + (first + done) * 2, reinterpret_cast<char*>(raw.data()), n * 2);
    unpack16(dtype, raw.data(), out + done, n);
  }
}

// The checked header of an open file: its tensors in data order and where the data section starts.
// The tensors of the header; its __metadata__ into *metadata when given.
std::vector<TensorInfo> read_header(const std::string& path, std::ifstream& in, uint64_t* data_start,
                                    std::map<std::string, std::string>* metadata = nullptr) {
  SHARDLM_CHECK(in, "safetensors ", path, ": cannot open the file");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  SHARDLM_CHECK(in && size >= 0, "safetensors ", path, ": cannot read the file");
  const uint64_t file_bytes = static_cast<uint64_t>(size);
  SHARDLM_CHECK(file_bytes >= 8, "safetensors ", path, ": file is ", file_bytes,
                " bytes, too short for the 8-byte header length");

  unsigned char length_bytes[8];
  read_at(path, in, 0, reinterpret_cast<char*>(length_bytes), 8);
  const uint64_t header_bytes = read_le64(length_bytes);
  SHARDLM_CHECK(header_bytes <= kMaxHeaderBytes, "safetensors ", path, ": header length ", header_bytes,
                " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  SHARDLM_CHECK(header_bytes <= file_bytes - 8, "safetensors ", path, ": header length ", header_bytes,
                " runs past the end of the ", file_bytes, "-byte file");

  std::string text(header_bytes, '\0');
  read_at(path, in, 8, text.data(), text.size());
  const Header header = parse_header(path, text);
  text = std::string();  // the parsed header replaces its text

  *data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - *data_start;
  std::vector<TensorInfo> infos;
  for (const std::string& name : header.keys) {
    const Json& entry = header.json.at(name);
    if (name == "__metadata__") {
      check_metadata(path, entry);
      if (metadata)
        for (const auto& [key, value] : entry.items()) (*metadata)[key] = value.get<std::string>();
    } else {
      infos.push_back(parse_entry(path, name, entry, data_bytes));
    }
  }
  sort_and_check_overlaps(path, infos);
  return infos;
}

// The path, once it names a regular file: a folder, a pipe or a device is refused by name before
// it is opened (a pipe would block the open, a folder would read as a truncated file).
const std::string& checked_path(const std::string& path) {
  check_input_file(path, "safetensors file", std::numeric_limits<uint64_t>::max());
  return path;
}

}  // namespace

std::vector<SafetensorsEntry> read_safetensors(const std::string& path) {
  std::ifstream in(checked_path(path), std::ios::binary);
  uint64_t data_start = 0;
  const std::vector<TensorInfo> infos = read_header(path, in, &data_start);
  std::vector<SafetensorsEntry> tensors;
  tensors.reserve(infos.size());
  for (const auto& t : infos) {
    std::vector<float> values(t.numel);
    read_range(path, in, data_start + t.begin, t.dtype, 0, t.numel, values.data());
    tensors.push_back({t.name, t.shape, std::move(values)});
  }
  return tensors;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), in_(checked_path(path), std::ios::binary) {
  uint64_t data_start = 0;
  for (const TensorInfo& t : read_header(path, in_, &data_start, &metadata_))
    tensors_.push_back({t.name, t.dtype, t.shape, t.numel, data_start + t.begin});
}

void SafetensorsFile::read(const SafetensorsTensor& t, size_t first, size_t count, float* out) {
  SHARDLM_CHECK(first <= t.numel && count <= t.numel - first, "safetensors ", path_, ": tensor '", printable(t.name),
                "': elements [", first, ", ", first + count, ") are outside its ", t.numel);
  read_range(path_, in_, t.file_offset, t.dtype, first, count, out);
  bytes_read_ += count * dtype_size(t.dtype);
}

}  // namespace shardlm

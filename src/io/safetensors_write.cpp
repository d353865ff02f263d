// write_safetensors: one safetensors file of F32, BF16 or F16 tensors, header padded to 8 bytes,
// written via PATH.tmp.
#include <nlohmann/json.hpp>
#include <set>

#include "shardlm/io.hpp"

// The data section is written as the host's bytes; safetensors is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace shardlm {
namespace {

const char* safetensors_dtype(DType t) { return by_dtype(t, "F32", "BF16", "F16"); }

// Number of elements a shape holds; Error on a negative dimension or overflow.
size_t checked_numel(const std::string& path, const SafetensorsEntry& t) {
  size_t numel = 1;
  for (int64_t d : t.shape) {
    SHARDLM_CHECK(d >= 0, "safetensors ", path, ": tensor '", t.name, "': negative dimension ", d);
    const size_t ud = static_cast<size_t>(d);
    SHARDLM_CHECK(ud == 0 || numel <= SIZE_MAX / 4 / ud, "safetensors ", path, ": tensor '", t.name,
                  "': shape too large");
    numel *= ud;
  }
  return numel;
}

// The header JSON: __metadata__ first (format "pt" unless the caller sets it), then the tensors in order.
// Assembled piece by piece: a JSON object keyed by name would sort the tensors or look keys up linearly.
std::string build_header(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::json meta = {{"format", "pt"}};
  for (const auto& [key, value] : metadata) meta[key] = value;

  std::set<std::string> seen;
  size_t offset = 0;
  std::string text;
  try {
    text = "{\"__metadata__\":" + meta.dump();
    for (const auto& t : tensors) {
      SHARDLM_CHECK(t.name != "__metadata__", "safetensors ", path, ": '__metadata__' is not a valid tensor name");
      SHARDLM_CHECK(seen.insert(t.name).second, "safetensors ", path, ": tensor '", t.name, "' appears twice");
      const size_t numel = checked_numel(path, t);
      SHARDLM_CHECK(t.data.size() == numel, "safetensors ", path, ": tensor '", t.name, "': ", t.data.size(),
                    " values for a shape of ", numel, " elements");
      const size_t bytes = numel * dtype_size(t.dtype);
      const nlohmann::json entry = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape},
                                    {"data_offsets", {offset, offset + bytes}}};
      text += "," + nlohmann::json(t.name).dump() + ":" + entry.dump();
      offset += bytes;
    }
    text += "}";
  } catch (const nlohmann::json::exception& e) {  // names or metadata that are not UTF-8
    throw Error(concat("safetensors ", path, ": cannot encode the header: ", e.what()));
  }
  // Spaces after the JSON put the data section at an 8-byte aligned file offset, as the reference does.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = build_header(path, tensors, metadata);
  replace_file(path, "safetensors file", [&](int fd, const std::string& tmp) {
    unsigned char size[8];
    for (int i = 0; i < 8; ++i) size[i] = static_cast<unsigned char>(uint64_t{header.size()} >> (8 * i));
    write_all(fd, size, sizeof size, "safetensors file", tmp);
    write_all(fd, header, "safetensors file", tmp);
    for (const auto& t : tensors) {
      if (t.dtype == DType::F32) {
        write_all(fd, t.data.data(), t.data.size() * sizeof(float), "safetensors file", tmp);
        continue;
      }
      // 16-bit types rounded to nearest even.
      std::vector<uint16_t> half(t.data.size());
      for (size_t i = 0; i < t.data.size(); ++i)
        half[i] = t.dtype == DType::BF16 ? float_to_bf16(t.data[i]) : float_to_fp16(t.data[i]);
      write_all(fd, half.data(), half.size() * sizeof(uint16_t), "safetensors file", tmp);
    }
  });
}

}  // namespace shardlm

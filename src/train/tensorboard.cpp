// TensorBoard event files: CRC32C, TFRecord framing, a small protocol-buffer writer for Event and
// Summary, and the file rank 0 appends the run's scalars to.
#include "tensorboard.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "shardlm/core.hpp"

namespace shardlm {

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// Protocol-buffer wire format: a field's key is (number << 3) | wire type.
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, Wire wire) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire); }
template <typename T>
void put_little(std::string& out, T v) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // the hosts shardlm runs on are little-endian, as the wire format
  out.append(reinterpret_cast<const char*>(b), sizeof(T));
}
void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event's wall_time (field 1, double) and step (field 2, int64).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, kFixed64);
  put_little(e, wall_time);
  if (step != 0) {
    put_key(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(const std::string& data) {
  std::string out;
  std::string length;
  put_little(length, static_cast<uint64_t>(data.size()));
  out += length;
  put_little(out, masked_crc32c(length.data(), length.size()));
  out += data;
  put_little(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");  // Event.file_version
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);  // Summary.Value.tag
    put_key(v, 2, kFixed32);  // Summary.Value.simple_value (float)
    put_little(v, static_cast<float>(value));
    put_bytes(summary, 1, v);  // Summary.value
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);  // Event.summary
  return e;
}

// The file is made at the first scalars, not here: a run that fails before it logs anything (a
// run.overwrite that puts the earlier run back) leaves no file of its own. Until then path_ is the folder.
TensorBoardWriter::TensorBoardWriter(const std::string& folder) : path_(folder) {}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (fd_ < 0) {
    const std::string folder = path_;
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    if (ec) throw Error(concat("cannot create the TensorBoard folder '", folder, "': ", ec.message()));
    char host[256] = "host";
    gethostname(host, sizeof host - 1);
    const double t = now_seconds();
    const std::string base = concat(folder, "/events.out.tfevents.", static_cast<long long>(t), ".", host);
    // A resume within the same second on the same host gets its own file too.
    for (int n = 0; fd_ < 0; ++n) {
      path_ = n == 0 ? base : concat(base, ".", n);
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
      if (fd_ < 0 && errno != EEXIST) throw Error(concat("cannot create '", path_, "': ", std::strerror(errno)));
    }
    write(file_version_event(t));
  }
  write(scalars_event(now_seconds(), step, values));
}

void TensorBoardWriter::write(const std::string& event) {
  const std::string record = tfrecord_frame(event);
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(concat("cannot write the TensorBoard events file '", path_, "': ", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
}

}  // namespace shardlm

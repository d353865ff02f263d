// core: errors with context, rank-aware logging, dtypes and conversions, timers, memory accounting.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

namespace shardlm {

// ---- errors ---------------------------------------------------------------------------------

// Every user-facing failure is an Error: its message names the key, file or rank at fault.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// An Error every rank raised together (after agreeing on it): one rank reports it, all exit cleanly.
class AgreedError : public Error {
 public:
  explicit AgreedError(const std::string& what) : Error(what) {}
};

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

#define SHARDLM_CHECK(cond, ...)                                                     \
  do {                                                                               \
    if (!(cond)) throw ::shardlm::Error(::shardlm::concat(__VA_ARGS__));             \
  } while (0)

// At most `limit` characters of `text` for an error message: a value as long as a whole data line
// is cut, with its length said ("... (52428800 characters)").
std::string clip_for_message(const std::string& text, size_t limit = 200);

// ---- input files ----------------------------------------------------------------------------

// The limits of the files shardlm reads whole or by lines (docs/deck.md "Limits").
constexpr uint64_t kMaxDeckBytes = uint64_t(16) << 20;       // input deck, config.json, json side files
constexpr uint64_t kMaxTokenizerBytes = uint64_t(1) << 30;   // tokenizer.json and its kin
constexpr uint64_t kMaxDataFileBytes = uint64_t(256) << 30;  // a training or evaluation data file

// Opens `path` for reading when it is a regular file of at most max_bytes: Error "cannot open WHAT
// 'PATH'" when it does not open, and naming the cause when it is a directory, a device (such as
// /dev/zero), a pipe or larger than the limit.
std::unique_ptr<std::istream> open_input_file(const std::string& path, const std::string& what, uint64_t max_bytes);
// The whole of such a file.
std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// ---- output files ---------------------------------------------------------------------------

// Writes all of `text` at the descriptor's position, retrying short writes; Error "writing WHAT
// 'PATH': <reason>" (e.g. "No space left on device") on failure.
void write_all(int fd, const void* data, size_t bytes, const std::string& what, const std::string& path);
inline void write_all(int fd, const std::string& text, const std::string& what, const std::string& path) {
  write_all(fd, text.data(), text.size(), what, path);
}
// Writes PATH atomically: `fill` writes the content to the descriptor of PATH.tmp (with write_all),
// which is then synced and renamed over PATH. On any failure the .tmp is removed, PATH is untouched,
// and Error names the file, WHAT it is and the reason.
void replace_file(const std::string& path, const std::string& what, const std::function<void(int fd, const std::string& tmp)>& fill);
inline void replace_file(const std::string& path, const std::string& text, const std::string& what) {
  replace_file(path, what, [&](int fd, const std::string& tmp) { write_all(fd, text, what, tmp); });
}
// Error naming WHAT and the reason unless folder DIR exists (it is created) and a file can be created in it.
void check_writable_folder(const std::string& dir, const std::string& what);

// ---- logging --------------------------------------------------------------------------------

// Rank 0 prints info lines; every rank may print an error line prefixed by its rank.
void set_log_rank(int rank);
void log_info(const std::string& line);   // rank 0 only, stdout
void log_error(const std::string& line);  // any rank, stderr, prefixed "shardlm: rank R: "

// ---- dtypes ---------------------------------------------------------------------------------

enum class DType { F32, BF16, F16 };

// The value of `t` out of one per dtype: the maps from DType to names and types in other spellings.
template <typename V>
V by_dtype(DType t, V f32, V bf16, V f16) {
  return t == DType::F32 ? f32 : t == DType::BF16 ? bf16 : f16;
}

const char* dtype_name(DType t);
DType parse_dtype(const std::string& name);  // "fp32" | "bf16" | "fp16"; throws Error otherwise
size_t dtype_size(DType t);

// Round-to-nearest-even conversions; NaN stays NaN, overflow goes to inf like the hardware does.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);
float fp16_to_float(uint16_t h);

// Round an fp32 value to the nearest value representable in `t` (identity for F32).
float round_to(DType t, float f);

// splitmix64's finaliser: a bijective mix whose outputs of consecutive inputs look independent
// (counter-based initialisation, checksums that must not depend on how values are split up).
inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
void round_to(DType t, float* data, size_t n);
// Pack fp32 values into 16-bit storage of `t` (BF16 or F16) and back.
void pack16(DType t, const float* src, uint16_t* dst, size_t n);
void unpack16(DType t, const uint16_t* src, float* dst, size_t n);

// ---- timing ---------------------------------------------------------------------------------

class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// ---- memory accounting ----------------------------------------------------------------------

// What the planned buffers of a rank hold; reported per rank and compared to `shardlm plan`.
enum class MemKind { Params, Grads, Optimizer, Activations, Comm, Other, Count };

// Memory of a backend (device memory on the CUDA backend, host memory on the CPU backend; NCCL window
// memory too), freed when the object goes; its bytes count against the backend's accounting.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 protected:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// An owned, possibly empty, array of backend memory.
struct DeviceArray {
  std::unique_ptr<DeviceMemory> memory;
  void* data() const { return memory ? memory->data() : nullptr; }
  size_t bytes() const { return memory ? memory->bytes() : 0; }
  template <typename T>
  T* as() const { return static_cast<T*>(data()); }
};

struct MemoryStats {
  size_t current[static_cast<int>(MemKind::Count)] = {};
  size_t total_current = 0;
  size_t total_peak = 0;
};

MemoryStats& memory_stats();
void memory_reset_peak();
size_t process_peak_rss_bytes();  // high-water resident set size of this process
size_t host_available_bytes();    // MemAvailable of /proc/meminfo: what the host gives without swapping

// A zero-initialised, 64-byte aligned array of T whose bytes count against one MemKind.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t n, MemKind kind) { allocate(n, kind); }
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }

  void allocate(size_t n, MemKind kind);
  void release();
  void zero() {
    if (n_) std::memset(data_, 0, n_ * sizeof(T));
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(n_, o.n_);
    std::swap(kind_, o.kind_);
  }
  T* data_ = nullptr;
  size_t n_ = 0;
  MemKind kind_ = MemKind::Other;
};

void memory_track_alloc(MemKind kind, size_t bytes);
void memory_track_free(MemKind kind, size_t bytes);
void* aligned_zero_alloc(size_t bytes);
void aligned_free(void* p);

template <typename T>
void Buffer<T>::allocate(size_t n, MemKind kind) {
  release();
  if (n == 0) return;
  data_ = static_cast<T*>(aligned_zero_alloc(n * sizeof(T)));
  n_ = n;
  kind_ = kind;
  memory_track_alloc(kind_, n_ * sizeof(T));
}

template <typename T>
void Buffer<T>::release() {
  if (!data_) return;
  memory_track_free(kind_, n_ * sizeof(T));
  aligned_free(data_);
  data_ = nullptr;
  n_ = 0;
}

// Human-readable byte count ("12.3 MiB").
std::string format_bytes(size_t bytes);
// A 64-bit value as 16 hex digits: how checkpoints, run ids and adapters write hashes and checksums.
std::string hex_digits(uint64_t value);

}  // namespace shardlm

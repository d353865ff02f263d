// Host-side helpers shared by the GPU suites: a device check, CUDA error checks, device memory
// that frees itself, copies of fp32 host values to and from device buffers in any dtype, and random
// test values.
#pragma once

#include <cuda_runtime_api.h>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_model_test_support.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

namespace cuda_test {

using shardlm::DType;

// The GPU suites carry the label gpu; without a device they fail with this message.
inline void require_device(const char* suite) {
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0)
    BOOST_FAIL(suite << " needs a CUDA GPU: cudaGetDeviceCount returned "
                     << (rc == cudaSuccess ? "0 devices" : cudaGetErrorString(rc))
                     << " (these tests carry the label gpu; run them on a GPU machine)");
}

inline void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) BOOST_FAIL(what << ": " << cudaGetErrorString(rc));
}

#define CUDA_OK(call) ::cuda_test::check_cuda((call), #call)

// Device memory owned by one test.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) check_cuda(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }

  char* get() const { return static_cast<char*>(ptr_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  // A pointer `bytes` past the start: the kernels must take their unaligned paths for it.
  void* offset(size_t bytes) const { return get() + bytes; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Host values (already representable in dt) as the bytes of dt, and back.
inline std::vector<unsigned char> to_bytes(const std::vector<float>& v, DType dt) {
  std::vector<unsigned char> bytes(v.size() * shardlm::dtype_size(dt));
  if (v.empty()) return bytes;
  if (dt == DType::F32) {
    std::memcpy(bytes.data(), v.data(), bytes.size());
  } else {
    std::vector<uint16_t> half(v.size());
    shardlm::pack16(dt, v.data(), half.data(), v.size());
    std::memcpy(bytes.data(), half.data(), bytes.size());
  }
  return bytes;
}

inline std::vector<float> from_bytes(const std::vector<unsigned char>& bytes, DType dt) {
  std::vector<float> v(bytes.size() / shardlm::dtype_size(dt));
  if (v.empty()) return v;
  if (dt == DType::F32) {
    std::memcpy(v.data(), bytes.data(), bytes.size());
  } else {
    std::vector<uint16_t> half(v.size());
    std::memcpy(half.data(), bytes.data(), bytes.size());
    shardlm::unpack16(dt, half.data(), v.data(), v.size());
  }
  return v;
}

// Waits for the copy to land: cudaMemcpy from pageable memory may return before its DMA finishes,
// and a kernel on a non-blocking stream does not wait for it (it could read the old values).
inline void upload(void* dst, const std::vector<float>& v, DType dt) {
  const std::vector<unsigned char> bytes = to_bytes(v, dt);
  if (!bytes.empty()) check_cuda(cudaMemcpy(dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// Waits for the device first: the kernels under test may run on any stream.
inline std::vector<float> download(const void* src, size_t n, DType dt) {
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<unsigned char> bytes(n * shardlm::dtype_size(dt));
  if (n > 0) check_cuda(cudaMemcpy(bytes.data(), src, bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  return from_bytes(bytes, dt);
}

// A device buffer holding v in dt.
inline DeviceBuffer to_device(const std::vector<float>& v, DType dt) {
  DeviceBuffer b(std::max<size_t>(v.size(), 1) * shardlm::dtype_size(dt));
  upload(b.get(), v, dt);
  return b;
}

template <typename T>
DeviceBuffer to_device_raw(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size(), 1) * sizeof(T));
  if (!v.empty()) CUDA_OK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

template <typename T>
std::vector<T> from_device_raw(const void* src, size_t n) {
  std::vector<T> v(n);
  if (n > 0) CUDA_OK(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// A Llama config with one head of head_dim and the given rope (theta, Llama 3.1 scaling factor and
// original context), for the rotary tables (llama_inverse_frequencies).
inline shardlm::ModelConfig rope_config(int head_dim, float theta, float factor, int original) {
  shardlm::ModelConfig c;
  c.arch = "llama";
  c.num_heads = 1;
  c.hidden_size = head_dim;
  c.rope_theta = theta;
  c.rope_scaling.factor = factor;
  c.rope_scaling.original_max_position_embeddings = original;
  return c;
}

// n normal values of the given scale around offset, rounded to dt.
inline std::vector<float> random_values(size_t n, std::mt19937& rng, DType dt, float scale = 1.0f,
                                        float offset = 0.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = shardlm::round_to(dt, offset + normal(rng));
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Largest |got - ref| relative to the largest |ref|, infinite on a NaN (model_test::max_relative_error).
inline double relative_error(const std::vector<float>& got, const std::vector<double>& ref) {
  return model_test::max_relative_error(got, ref);
}
inline double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  return relative_error(got, to_double(ref));
}
inline double relative_error(const std::vector<double>& got, const std::vector<double>& ref) {
  return relative_error(std::vector<float>(got.begin(), got.end()), ref);
}

// Central differences of f at x, element by element.
template <typename F>
std::vector<double> numeric_gradient(F&& f, std::vector<double> x, double eps = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double up = f(x);
    x[i] = keep - eps;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

}  // namespace cuda_test

// Checking CUDA, cuBLASLt and NCCL return codes: a failure throws shardlm::Error naming the call,
// the file and line, and the library's own message.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t rc, const char* call, const char* file, int line) {
  throw Error(concat("CUDA error in ", call, " (", file, ":", line, "): ", cudaGetErrorName(rc), ": ",
                     cudaGetErrorString(rc)));
}

[[noreturn]] inline void throw_cublas(cublasStatus_t rc, const char* call, const char* file, int line) {
  throw Error(concat("cuBLASLt error in ", call, " (", file, ":", line, "): status ", static_cast<int>(rc)));
}

}  // namespace shardlm::cuda

#define SHARDLM_CUDA_CHECK(call)                                                      \
  do {                                                                                \
    const cudaError_t shardlm_rc_ = (call);                                           \
    if (shardlm_rc_ != cudaSuccess) ::shardlm::cuda::throw_cuda(shardlm_rc_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch configuration was accepted.
#define SHARDLM_CUDA_LAUNCH_CHECK() SHARDLM_CUDA_CHECK(cudaGetLastError())

#define SHARDLM_CUBLAS_CHECK(call)                                                      \
  do {                                                                                  \
    const cublasStatus_t shardlm_rc_ = (call);                                          \
    if (shardlm_rc_ != CUBLAS_STATUS_SUCCESS) ::shardlm::cuda::throw_cublas(shardlm_rc_, #call, __FILE__, __LINE__); \
  } while (0)

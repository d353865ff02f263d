// current_gpu_info: the device's name and compute capability, and a probe of whether this binary's
// kernels load on it (cudaFuncGetAttributes fails with "no kernel image" when neither SASS for its
// architecture nor PTX it can JIT-compile was built in).
#include <cuda_runtime_api.h>

#include "cuda_check.hpp"
#include "gpu_info.hpp"

namespace shardlm::cuda {

namespace {
__global__ void arch_probe_kernel() {}
}  // namespace

GpuInfo current_gpu_info() {
  int device = 0;
  cudaDeviceProp prop{};
  SHARDLM_CUDA_CHECK(cudaGetDevice(&device));
  SHARDLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  GpuInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  cudaFuncAttributes attr{};
  const cudaError_t rc = cudaFuncGetAttributes(&attr, arch_probe_kernel);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // the probe's error is the answer, not a sticky failure
    info.kernels_load = !(rc == cudaErrorNoKernelImageForDevice || rc == cudaErrorInvalidDeviceFunction);
    SHARDLM_CHECK(!info.kernels_load || rc == cudaSuccess, "cudaFuncGetAttributes: ", cudaGetErrorString(rc));
  }
  return info;
}

const char* built_cuda_archs() { return SHARDLM_CUDA_ARCHS_TEXT; }

}  // namespace shardlm::cuda

// What the run-time guard asks of this rank's GPU: its name and compute capability, the
// architectures this binary was built for, and whether its kernels load on the GPU.
#pragma once

#include <string>

namespace shardlm::cuda {

struct GpuInfo {
  std::string name;                  // "Tesla V100-SXM2-32GB"
  int major = 0, minor = 0;          // compute capability
  bool kernels_load = true;          // a kernel of this binary has an image the GPU can run (SASS or PTX)
};

// The current device's (cudaSetDevice first).
GpuInfo current_gpu_info();

// The architectures this binary was built with, as CMake's SHARDLM_CUDA_ARCHS ("70;80", "80-virtual").
const char* built_cuda_archs();

}  // namespace shardlm::cuda

// The run-time guard of the CUDA backend: before NCCL starts, every rank checks that this binary has
// kernels for its GPU and that the GPU has the deck's 16-bit dtype, and all ranks stop together
// with a message naming the GPU and what to change.
#pragma once

#include <string>

#include "shardlm/config.hpp"
#include "shardlm/dist.hpp"

namespace shardlm {

// What the guard knows of one rank's GPU.
struct GpuFacts {
  std::string name;             // the CUDA device name
  int major = 0, minor = 0;     // compute capability
  std::string forged_by;        // non-empty: the compute capability came from this (the test hook), not the GPU
  std::string built_archs;      // CMake's SHARDLM_CUDA_ARCHS of this binary: "70;80", "80-virtual", ...
  bool kernels_load = true;     // the GPU loaded a kernel of this binary (false: no image for it)
};

// Whether a binary built for CMake architectures `archs` ("70;80;90", "80-real", "80-virtual",
// "90a") has code for compute capability major.minor: SASS of the same major and a minor at most
// the GPU's, or PTX of an architecture at most the GPU's. "all", "all-major" and "native" count as
// covering (the load probe decides).
bool archs_cover(const std::string& archs, int major, int minor);

// "" when the run can go; else the message: the GPU (name, compute capability) and, for each
// problem, what to change (rebuild for its architecture; fp16 with loss scaling instead of bf16).
// fp8_linear: model.fp8_linear, which needs compute capability 8.9 or newer.
std::string gpu_run_problem(const GpuFacts& gpu, DType param_dtype, DType reduce_dtype, bool fp8_linear = false);

// "7.0" or "70" as (7, 0); Error naming `what` otherwise.
void parse_compute_capability(const std::string& text, const std::string& what, int& major, int& minor);

// The check on this rank (CUDA backend only; selects the rank's GPU). Throws Error with
// gpu_run_problem's message, prefixed by the rank. SHARDLM_FORGE_COMPUTE_CAPABILITY=MAJOR.MINOR
// replaces the GPU's compute capability (a test hook: a V100's limits on any GPU).
void check_gpu_for_run(const RunConfig& cfg, const Topology& topo);

}  // namespace shardlm

#define BOOST_TEST_MODULE test_gpu_guard
#include <boost/test/unit_test.hpp>
// test_gpu_guard: the CUDA backend's start-up guard as a pure function, on the CPU: which CMake
// architecture lists cover which GPUs, and the messages for a V100 given bf16 or a binary without
// its kernels (tests/test_cuda_guard.cpp runs the same guard on a GPU with a forged capability).

#include "gpu_guard.hpp"
#include "test_support.hpp"

using namespace shardlm;

BOOST_AUTO_TEST_CASE(architecture_lists_cover_the_gpus_they_should) {
  // SASS: the same major, a minor at most the GPU's; PTX ("80" carries both): any GPU at least it.
  BOOST_TEST(archs_cover("70;80", 7, 0));
  BOOST_TEST(archs_cover("70;80", 8, 6));   // sm_80 SASS runs on 8.6
  BOOST_TEST(archs_cover("70;80", 9, 0));   // compute_80 PTX, JIT-compiled
  BOOST_TEST(!archs_cover("80;90", 7, 0));  // CUDA 13's default: no V100
  BOOST_TEST(!archs_cover("80-real;90-real", 10, 0));
  BOOST_TEST(archs_cover("80-real;90-real", 8, 9));
  BOOST_TEST(archs_cover("80-virtual", 9, 0));
  BOOST_TEST(!archs_cover("80-virtual", 7, 5));
  BOOST_TEST(!archs_cover("86-real", 8, 0));
  BOOST_TEST(archs_cover("90a", 9, 0));
  BOOST_TEST(!archs_cover("90a", 10, 0));    // arch-specific code runs on that GPU only, and has no PTX
  BOOST_TEST(archs_cover("70,80", 8, 0));    // the compiled-in text's separator
  BOOST_TEST(archs_cover("native", 7, 0));   // the load probe decides
  BOOST_TEST(!archs_cover("", 8, 0));
}

BOOST_AUTO_TEST_CASE(a_v100_stops_bf16_and_names_the_deck_keys) {
  GpuFacts v100{"Tesla V100-SXM2-32GB", 7, 0, "", "70;80", true};
  BOOST_TEST(gpu_run_problem(v100, DType::F16, DType::F16).empty());
  BOOST_TEST(gpu_run_problem(v100, DType::F32, DType::F32).empty());
  const std::string m = gpu_run_problem(v100, DType::BF16, DType::BF16);
  BOOST_TEST(contains(m, "GPU 'Tesla V100-SXM2-32GB' has compute capability 7.0"), m);
  BOOST_TEST(contains(m, "fsdp.param_dtype = bf16 needs compute capability 8.0"), m);
  BOOST_TEST(contains(m, "--fsdp.param_dtype=fp16 --fsdp.reduce_dtype=fp16"), m);
  BOOST_TEST(contains(m, "loss scaling"), m);
  BOOST_TEST(!contains(m, "no kernels"), m);
  BOOST_TEST(contains(gpu_run_problem(v100, DType::F32, DType::BF16), "fsdp.reduce_dtype = bf16"));
  GpuFacts a100{"NVIDIA A100-SXM4-80GB", 8, 0, "", "70;80", true};
  BOOST_TEST(gpu_run_problem(a100, DType::BF16, DType::BF16).empty());
}

// model.fp8_linear needs FP8 tensor cores (compute capability 8.9 or newer): an A100 stops naming itself.
BOOST_AUTO_TEST_CASE(fp8_linear_needs_compute_capability_8_9) {
  GpuFacts a100{"NVIDIA A100-SXM4-80GB", 8, 0, "", "80;90", true};
  const std::string m = gpu_run_problem(a100, DType::BF16, DType::F32, true);
  BOOST_TEST(contains(m, "GPU 'NVIDIA A100-SXM4-80GB' has compute capability 8.0"), m);
  BOOST_TEST(contains(m, "model.fp8_linear needs compute capability 8.9"), m);
  BOOST_TEST(gpu_run_problem(a100, DType::BF16, DType::F32, false).empty());
  GpuFacts l40s{"NVIDIA L40S", 8, 9, "", "89", true};
  BOOST_TEST(gpu_run_problem(l40s, DType::BF16, DType::F32, true).empty());
  GpuFacts h100{"NVIDIA H100 80GB HBM3", 9, 0, "", "90", true};
  BOOST_TEST(gpu_run_problem(h100, DType::BF16, DType::F32, true).empty());
}

BOOST_AUTO_TEST_CASE(a_binary_without_the_gpus_kernels_names_both_architectures) {
  GpuFacts v100{"Tesla V100-PCIE-16GB", 7, 0, "", "80,90", true};
  const std::string m = gpu_run_problem(v100, DType::F16, DType::F16);
  BOOST_TEST(contains(m, "no kernels for sm_70"), m);
  BOOST_TEST(contains(m, "built for CUDA architectures 80,90"), m);
  BOOST_TEST(contains(m, "-DSHARDLM_CUDA_ARCHS=70"), m);
  BOOST_TEST(contains(m, "CUDA 11.8 or 12"), m);
  // Both problems at once: each said.
  const std::string both = gpu_run_problem(v100, DType::BF16, DType::BF16);
  BOOST_TEST((contains(both, "no kernels") && contains(both, "bf16 needs")), both);
  // The load probe wins over a list that looks right (a real GPU only; a forged one has no probe).
  GpuFacts probe_failed{"NVIDIA H100 80GB HBM3", 9, 0, "", "native", false};
  BOOST_TEST(contains(gpu_run_problem(probe_failed, DType::BF16, DType::BF16), "no kernels for sm_90"));
  GpuFacts forged{"NVIDIA H100 80GB HBM3", 7, 0, "SHARDLM_FORGE_COMPUTE_CAPABILITY", "80,90", true};
  BOOST_TEST(contains(gpu_run_problem(forged, DType::BF16, DType::BF16), "7.0 (forged by SHARDLM_FORGE_COMPUTE_CAPABILITY)"));
}

BOOST_AUTO_TEST_CASE(forged_capabilities_parse_or_are_refused) {
  int major = 0, minor = 0;
  parse_compute_capability("7.0", "X", major, minor);
  BOOST_TEST(major == 7);
  BOOST_TEST(minor == 0);
  parse_compute_capability("86", "X", major, minor);
  BOOST_TEST(major == 8);
  BOOST_TEST(minor == 6);
  for (const char* bad : {"", "7", "seven", "7.x", "7.10", "0.5"})
    BOOST_TEST(contains(error_of([&] { parse_compute_capability(bad, "X", major, minor); }), "expected a compute capability"), bad);
}

#define BOOST_TEST_MODULE test_cuda_guard
#include <boost/test/unit_test.hpp>
// test_cuda_guard (GPU): the start-up guard on a real GPU. SHARDLM_FORGE_COMPUTE_CAPABILITY makes the
// guard see a V100 (7.0) on whatever GPU runs the suite: `shardlm train` with bf16 then stops before
// NCCL starts with one message naming the GPU and the deck keys, and exit code 1; fp16 goes past
// the guard unless the binary lacks sm_70 code, which the message then says. Unforged, the GPU's
// own capability passes.

#include <filesystem>
#include <string>

#include "gpu_guard.hpp"
#include "gpu_info.hpp"
#include "launch_support.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

// `shardlm train input/demo.ini` on one rank on the GPU, for one step, with `env` before mpirun.
Outcome train_on_gpu(const std::string& env, const std::string& args) {
  const fs::path dir = fs::path(SHARDLM_BINARY_DIR) / "test_runs" / "cuda_guard";
  fs::remove_all(dir);
  return run_shardlm(1,
                     "train " SHARDLM_SOURCE_DIR "/input/demo.ini --run.backend=cuda --train.max_steps=1 "
                     "--eval.generate=none --checkpoint.at_end=false --run.dir=" + dir.string() + " " + args,
                     env, 300);
}

}  // namespace

BOOST_AUTO_TEST_CASE(bf16_on_a_forged_v100_stops_at_start_with_the_deck_keys) {
  const Outcome o = train_on_gpu("SHARDLM_FORGE_COMPUTE_CAPABILITY=7.0", "--fsdp.param_dtype=bf16 --fsdp.reduce_dtype=bf16");
  BOOST_TEST(o.exit_code == 1, o.output);
  BOOST_TEST(count_of(o.output, "shardlm: error: rank 0: GPU '") == 1u, o.output);
  BOOST_TEST(contains(o.output, "has compute capability 7.0 (forged by SHARDLM_FORGE_COMPUTE_CAPABILITY)"), o.output);
  BOOST_TEST(contains(o.output, "fsdp.param_dtype = bf16 needs compute capability 8.0"), o.output);
  BOOST_TEST(contains(o.output, "--fsdp.param_dtype=fp16 --fsdp.reduce_dtype=fp16"), o.output);
}

BOOST_AUTO_TEST_CASE(a_forged_gpu_without_kernels_names_both_architectures) {
  // A capability no build targets (sm_50): the binary's architectures and the GPU's are named.
  const Outcome o = train_on_gpu("SHARDLM_FORGE_COMPUTE_CAPABILITY=5.0", "--fsdp.param_dtype=fp16 --fsdp.reduce_dtype=fp16");
  BOOST_TEST(o.exit_code == 1, o.output);
  BOOST_TEST(contains(o.output, "no kernels for sm_50: it was built for CUDA architectures "), o.output);
  BOOST_TEST(contains(o.output, "-DSHARDLM_CUDA_ARCHS=50"), o.output);
}

// (A forged A100 passes where the binary has sm_80 code; a build for the GPU's own architecture alone, such
// as -DSHARDLM_CUDA_ARCHS=90, refuses it naming sm_80.)
BOOST_AUTO_TEST_CASE(the_gpus_own_capability_and_a_forged_a100_pass) {
  const bool a100_code = shardlm::archs_cover(shardlm::cuda::built_cuda_archs(), 8, 0);
  for (const char* env : {"", "SHARDLM_FORGE_COMPUTE_CAPABILITY=8.0"}) {
    const Outcome o = train_on_gpu(env, "--fsdp.param_dtype=bf16 --fsdp.reduce_dtype=bf16");
    if (*env != 0 && !a100_code) {
      BOOST_TEST(o.exit_code == 1, env << "\n" << o.output);
      BOOST_TEST(contains(o.output, "no kernels for sm_80: it was built for CUDA architectures "), o.output);
      continue;
    }
    BOOST_TEST(o.exit_code == 0, env << "\n" << o.output);
    BOOST_TEST(!contains(o.output, "shardlm: error"), o.output);
  }
  const Outcome bad = train_on_gpu("SHARDLM_FORGE_COMPUTE_CAPABILITY=seven", "");
  BOOST_TEST(bad.exit_code == 1, bad.output);
  BOOST_TEST(contains(bad.output, "SHARDLM_FORGE_COMPUTE_CAPABILITY = 'seven': expected a compute capability"), bad.output);
}

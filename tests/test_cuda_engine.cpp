// The CUDA engine against the CPU engine (GPU machine, under mpirun, one GPU per rank): the same
// tiny BLOOM and data give per-step losses equal to 1e-4 relative over 20 steps in fp32, bf16
// stays within 2% of the fp32 curve over 100 steps, activation checkpointing changes nothing, and
// a checkpoint written on the GPU resumes on the CPU bit-compatibly in format. A tiny Llama
// (grouped-query attention, untied head, Llama 3.1 rope scaling) matches the CPU backend likewise.
#define BOOST_TEST_MODULE test_cuda_engine
#include "mpi_fixture.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "shardlm/train.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

RunConfig config(const std::string& backend, const std::string& name, int steps) {
  RunConfig cfg;
  cfg.model.vocab_size = 259;
  cfg.model.hidden_size = 64;
  cfg.model.num_layers = 2;
  cfg.model.num_heads = 4;
  cfg.data.train_file = SHARDLM_SOURCE_DIR "/input/data/demo_squad_train.json";
  cfg.data.max_length = 128;
  cfg.train.batch_size = 8;
  cfg.train.micro_batch_size = 2;
  cfg.train.lr = 3e-3;
  cfg.train.warmup_steps = 5;
  cfg.train.epochs = 10;  // 25 steps an epoch: max_steps is what ends the run
  cfg.train.max_steps = steps;
  cfg.train.seed = 7;
  cfg.run.backend = backend;
  cfg.run.dir = concat(SHARDLM_BINARY_DIR, "/test_runs/cuda_engine_np", world_size(), "/", name);
  cfg.checkpoint.at_end = false;
  return cfg;
}

// A tiny Llama on the same data: 4 query heads over 2 key/value heads, SwiGLU width 96, untied
// LM head, Llama 3.1 rope scaling with a short original context (so every band of it is used).
RunConfig llama_config(const std::string& backend, const std::string& name, int steps) {
  RunConfig cfg = config(backend, "llama_" + name, steps);
  cfg.model.arch = "llama";
  cfg.model.num_kv_heads = 2;
  cfg.model.intermediate_size = 96;
  cfg.model.tie_word_embeddings = false;
  cfg.model.rope_scaling.factor = 8;
  cfg.model.rope_scaling.original_max_position_embeddings = 64;
  return cfg;
}

TrainOptions quiet() {
  TrainOptions o;
  o.echo = false;
  return o;
}

double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

struct NeedsGpu {
  NeedsGpu() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) BOOST_FAIL("test_cuda_engine needs a CUDA GPU per rank");
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(cuda_engine, NeedsGpu)

// The all-gather schedule changes when parameters arrive, never what is computed: every
// combination of forward_prefetch, backward_prefetch and limit_all_gathers (one buffer: gathers
// and compute alternate; three: a block is kept longer) gives the default schedule's losses.
// On one rank nothing is gathered, so this is only meaningful on 2 or more GPUs.
BOOST_AUTO_TEST_CASE(all_gather_schedules_give_the_same_losses) {
  RunConfig base = config("cuda", "schedule_default", 12);
  base.model.num_layers = 4;
  const TrainResult want = train(base, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(want.step_losses.size() == 12u);
  for (const char* backward : {"pre", "post", "none"})
    for (bool forward : {true, false})
      for (int limit : {1, 2, 3}) {
        RunConfig cfg = config("cuda", concat("schedule_", backward, forward, limit), 12);
        cfg.model.num_layers = 4;
        cfg.fsdp.backward_prefetch = backward;
        cfg.fsdp.forward_prefetch = forward;
        cfg.fsdp.limit_all_gathers = limit;
        const TrainResult got = train(cfg, MPI_COMM_WORLD, quiet());
        BOOST_TEST_CONTEXT("backward_prefetch " << backward << ", forward_prefetch " << forward
                                                << ", limit_all_gathers " << limit) {
          BOOST_TEST_REQUIRE(got.step_losses.size() == 12u);
          BOOST_TEST(max_relative(got.step_losses, want.step_losses) < 1e-5);
        }
      }
}

BOOST_AUTO_TEST_CASE(fp32_matches_the_cpu_backend) {
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard}) {
    RunConfig cpu = config("cpu", "cpu", 20), gpu = config("cuda", "gpu", 20);
    cpu.fsdp.strategy = gpu.fsdp.strategy = s;
    const TrainResult want = train(cpu, MPI_COMM_WORLD, quiet());
    const TrainResult got = train(gpu, MPI_COMM_WORLD, quiet());
    BOOST_TEST_CONTEXT(strategy_name(s)) {
      BOOST_TEST_REQUIRE(got.step_losses.size() == 20u);
      BOOST_TEST(max_relative(got.step_losses, want.step_losses) < 1e-4);
      BOOST_TEST(max_relative(got.grad_norms, want.grad_norms) < 1e-3);
    }
  }
}

BOOST_AUTO_TEST_CASE(activation_checkpointing_gives_the_same_losses) {
  RunConfig plain = config("cuda", "plain", 10), ckpt = config("cuda", "ac", 10);
  ckpt.fsdp.activation_checkpointing = true;
  const TrainResult a = train(plain, MPI_COMM_WORLD, quiet());
  const TrainResult b = train(ckpt, MPI_COMM_WORLD, quiet());
  BOOST_TEST(max_relative(a.step_losses, b.step_losses) < 1e-6);
}

BOOST_AUTO_TEST_CASE(bf16_tracks_the_fp32_curve) {
  RunConfig fp32 = config("cuda", "fp32", 100), bf16 = config("cuda", "bf16", 100);
  bf16.fsdp.param_dtype = DType::BF16;
  const TrainResult a = train(fp32, MPI_COMM_WORLD, quiet());
  const TrainResult b = train(bf16, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(b.step_losses.size() == 100u);
  BOOST_TEST(max_relative(b.step_losses, a.step_losses) < 0.02);
  BOOST_TEST(b.step_losses.back() < b.step_losses.front() / 2);
}

BOOST_AUTO_TEST_CASE(fp16_with_loss_scaling_trains_and_skips_overflow) {
  RunConfig fp32 = config("cuda", "fp32_ref", 100), fp16 = config("cuda", "fp16", 100);
  fp16.fsdp.param_dtype = DType::F16;
  fp16.fsdp.reduce_dtype = DType::F16;
  const TrainResult a = train(fp32, MPI_COMM_WORLD, quiet());
  const TrainResult b = train(fp16, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(b.step_losses.size() == 100u);
  BOOST_TEST(max_relative(b.step_losses, a.step_losses) < 0.02);
  // A scale far too large: the first steps overflow, are skipped on every rank, the scale falls.
  RunConfig big = config("cuda", "fp16_overflow", 40);
  big.fsdp.param_dtype = DType::F16;
  big.fsdp.reduce_dtype = DType::F16;
  big.train.loss_scale = 1099511627776.0;  // 2^40
  const TrainResult c = train(big, MPI_COMM_WORLD, quiet());
  BOOST_TEST(c.skipped_steps > 5);
  BOOST_TEST(c.loss_scale < 1099511627776.0);
  for (double l : c.step_losses) BOOST_TEST(std::isfinite(l));
}

// CPU offload: the step runs on the host with the CPU backend's AdamW; the losses are those of the
// GPU step, and the GPU holds less (no fp32 master, no moments).
BOOST_AUTO_TEST_CASE(cpu_offload_gives_the_same_losses_in_less_gpu_memory) {
  RunConfig on_gpu = config("cuda", "no_offload", 20), offload = config("cuda", "offload", 20);
  offload.fsdp.cpu_offload = true;
  const TrainResult a = train(on_gpu, MPI_COMM_WORLD, quiet());
  const TrainResult b = train(offload, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(b.step_losses.size() == 20u);
  BOOST_TEST(max_relative(b.step_losses, a.step_losses) < 1e-4);
  for (DType dt : {DType::BF16}) {
    RunConfig x = config("cuda", "offload_bf16", 20);
    x.fsdp.param_dtype = dt;
    x.fsdp.cpu_offload = true;
    const TrainResult c = train(x, MPI_COMM_WORLD, quiet());
    BOOST_TEST(max_relative(c.step_losses, a.step_losses) < 0.02);
  }
}

BOOST_AUTO_TEST_CASE(a_gpu_checkpoint_resumes_on_the_cpu) {
  RunConfig gpu = config("cuda", "save", 10);
  gpu.checkpoint.every = 5;
  const TrainResult g = train(gpu, MPI_COMM_WORLD, quiet());
  RunConfig cpu = config("cpu", "resume", 10);
  cpu.checkpoint.resume = gpu.run.dir + "/checkpoints/ckpt-00000005.h5";
  const TrainResult c = train(cpu, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(c.step_losses.size() == 5u);
  BOOST_TEST(max_relative(c.step_losses, std::vector<double>(g.step_losses.begin() + 5, g.step_losses.end())) < 1e-4);
}

BOOST_AUTO_TEST_CASE(llama_fp32_matches_the_cpu_backend) {
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::NoShard}) {
    RunConfig cpu = llama_config("cpu", "cpu", 20), gpu = llama_config("cuda", "gpu", 20);
    cpu.fsdp.strategy = gpu.fsdp.strategy = s;
    const TrainResult want = train(cpu, MPI_COMM_WORLD, quiet());
    const TrainResult got = train(gpu, MPI_COMM_WORLD, quiet());
    BOOST_TEST_CONTEXT(strategy_name(s)) {
      BOOST_TEST_REQUIRE(got.step_losses.size() == 20u);
      BOOST_TEST(max_relative(got.step_losses, want.step_losses) < 1e-4);
      BOOST_TEST(max_relative(got.grad_norms, want.grad_norms) < 1e-3);
    }
  }
}

BOOST_AUTO_TEST_CASE(llama_activation_checkpointing_gives_the_same_losses) {
  RunConfig plain = llama_config("cuda", "plain", 10), ckpt = llama_config("cuda", "ac", 10);
  ckpt.fsdp.activation_checkpointing = true;
  const TrainResult a = train(plain, MPI_COMM_WORLD, quiet());
  const TrainResult b = train(ckpt, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(b.step_losses.size() == 10u);
  BOOST_TEST(max_relative(a.step_losses, b.step_losses) < 1e-6);
}

BOOST_AUTO_TEST_CASE(llama_bf16_tracks_the_fp32_curve) {
  RunConfig fp32 = llama_config("cuda", "fp32", 100), bf16 = llama_config("cuda", "bf16", 100);
  bf16.fsdp.param_dtype = DType::BF16;
  const TrainResult a = train(fp32, MPI_COMM_WORLD, quiet());
  const TrainResult b = train(bf16, MPI_COMM_WORLD, quiet());
  BOOST_TEST_REQUIRE(b.step_losses.size() == 100u);
  BOOST_TEST(max_relative(b.step_losses, a.step_losses) < 0.03);
  BOOST_TEST(b.step_losses.back() < b.step_losses.front() / 2);
}

BOOST_AUTO_TEST_SUITE_END()

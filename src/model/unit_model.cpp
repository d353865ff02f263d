// make_unit_model and unit_model_memory: the UnitModel of a run on either backend, and what it
// holds, from the same family record (so that `shardlm plan` and the run agree); the CPU model of
// cfg.arch and its activation bytes.
#include "cpu_head.hpp"
#include "unit_model_internal.hpp"
#ifdef SHARDLM_HAVE_CUDA
#include "cuda/cuda_model.hpp"  // the factory's result is destroyed here on errors
#endif

namespace shardlm {

std::unique_ptr<UnitModel> make_unit_model(const ModelConfig& cfg, BackendKind backend, DType compute_dtype,
                                           int max_batch, int max_seq, bool activation_checkpointing) {
  SHARDLM_CHECK(max_batch >= 0 && max_seq >= 0, "make_unit_model: negative max_batch ", max_batch, " or max_seq ",
                max_seq);
  const ModelFamily& family = model_family(cfg.arch);
  if (backend == BackendKind::Cpu) {
    SHARDLM_CHECK(compute_dtype == DType::F32, "the CPU backend computes in fp32, not ", dtype_name(compute_dtype),
                  " (16-bit parameters are unpacked before use)");
    return model_detail::make_cpu_unit_model(family.make_cpu(cfg, max_batch, max_seq), max_batch, max_seq);
  }
#ifdef SHARDLM_HAVE_CUDA
  SHARDLM_CHECK(family.make_cuda, "model.arch = '", cfg.arch, "' has no CUDA model");
  return model_detail::make_cuda_unit_model(
      family.make_cuda(cfg, compute_dtype, max_batch, max_seq, activation_checkpointing), compute_dtype);
#else
  throw Error("run.backend = cuda: this shardlm was built without the CUDA backend");
#endif
}

ModelMemory unit_model_memory(const ModelConfig& cfg, BackendKind backend, DType compute_dtype, int max_batch,
                              int max_seq, bool activation_checkpointing) {
  SHARDLM_CHECK(max_batch >= 0 && max_seq >= 0, "unit_model_memory: negative max_batch ", max_batch, " or max_seq ",
                max_seq);
  const ModelFamily& family = model_family(cfg.arch);
  if (backend == BackendKind::Cuda)
    return family.cuda_memory(cfg, compute_dtype, max_batch, max_seq, activation_checkpointing);
  // The CPU adapter's hidden states and their gradients, two of each.
  const size_t tokens = static_cast<size_t>(max_batch) * max_seq, hidden = tokens * cfg.hidden_size;
  return ModelMemory{family.cpu_activation_bytes(cfg, max_batch, max_seq) + 4 * hidden * sizeof(float), 0,
                     model_detail::CpuLmHead::scratch_bytes_for(tokens, cfg.vocab_size)};
}

std::unique_ptr<CpuModel> make_cpu_model(const ModelConfig& cfg, int max_batch, int max_seq) {
  return model_family(cfg.arch).make_cpu(cfg, max_batch, max_seq);
}

size_t cpu_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq) {
  return model_family(cfg.arch).cpu_activation_bytes(cfg, max_batch, max_seq);
}

}  // namespace shardlm

// make_cuda_model: the GPU model of the architecture a ModelConfig names.
#include "cuda_model.hpp"

#include "bloom_cuda.hpp"
#include "llama_cuda.hpp"

namespace shardlm::cuda {

std::unique_ptr<CudaModel> make_cuda_model(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                           bool activation_checkpointing) {
  if (cfg.is_llama()) return std::make_unique<LlamaCuda>(cfg, dt, max_batch, max_seq, activation_checkpointing);
  SHARDLM_CHECK(cfg.arch == "bloom", "model.arch = '", cfg.arch, "' is not supported (bloom or llama)");
  return std::make_unique<BloomCuda>(cfg, dt, max_batch, max_seq, activation_checkpointing);
}

namespace {

[[noreturn]] void no_decoding(const ModelConfig& cfg) {
  throw Error(concat("greedy generation on the CUDA backend: model.arch = ", cfg.arch,
                     " has no GPU decoding path yet (BLOOM has); set eval.generate = none"));
}

}  // namespace

void CudaModel::decode_allocate(int, int, int) { no_decoding(config()); }
void CudaModel::decode_embed(const void*, const int32_t*, int, cudaStream_t) { no_decoding(config()); }
void CudaModel::decode_block(int, const void*, const int32_t*, const int32_t*, int, cudaStream_t) {
  no_decoding(config());
}
void CudaModel::decode_head_argmax(const void*, const int32_t*, int, int32_t*, cudaStream_t) { no_decoding(config()); }

}  // namespace shardlm::cuda

// LoRA on the CUDA models' linear layers (cuda_lora.hpp).
#include "cuda_lora.hpp"

#include <algorithm>

#include "lora_dropout.hpp"
#include "matmul.hpp"

namespace shardlm::cuda {

CudaLoraBlocks::CudaLoraBlocks(const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool checkpointing)
    : modules_(model_detail::lora_modules(cfg)),
      dt_(dt),
      es_(dtype_size(dt)),
      checkpointing_(checkpointing),
      sizes_(lora_cuda_sizes(cfg, dt, static_cast<size_t>(std::max(max_batch, 0)) * std::max(max_seq, 0))),
      dropout_(cfg.lora.dropout) {
  size_t targeted = 0;
  for (const model_detail::CpuLora& m : modules_) slice_.push_back(m.on ? targeted++ : 0);
  if (sizes_.modules == 0) return;
  model_detail::check_lora_dropout_sizes(cfg, max_batch, max_seq);
  const size_t saved_blocks = checkpointing ? 1 : static_cast<size_t>(cfg.num_layers);
  xa_.allocate(saved_blocks * sizes_.xa());
  dxa_.allocate(sizes_.dxa());
  if (sizes_.dropped > 0) dropped_.allocate(sizes_.dropped);
}

const void* CudaLoraBlocks::adapter_input(int layer, int module, const void* x, int rows, int seq, cudaStream_t s) {
  if (!dropping()) return x;
  lora_dropout(x, dropped_.data(), rows, seq, modules_[module].in, mask(layer, module), false, dt_, s);
  return dropped_.data();
}

const model_detail::CpuLora& CudaLoraBlocks::adapted(const char* what, int layer, int module,
                                                     const void* adapter) const {
  SHARDLM_CHECK(adapter != nullptr, "LoRA: block ", layer, " was given no adapter parameters (", what, ")");
  return modules_[module];
}

void CudaLoraBlocks::apply(const model_detail::CpuLora& m, const void* adapter, const void* x, int rows, void* xa,
                           void* y, int ldy, Gemm& gemm, cudaStream_t s) const {
  const MatMul plain{gemm, s}, scaled{gemm, s, m.scale};
  plain(false, true, rows, m.r, m.in, x, m.in, at(adapter, m.a), m.in, xa, m.r, dt_, dt_);  // x A^T
  if (y) scaled(false, true, rows, m.out, m.r, xa, m.r, at(adapter, m.b), m.r, y, ldy, dt_, dt_, 1);
}

char* CudaLoraBlocks::xa(int layer, int module) const {
  const size_t saved_block = checkpointing_ ? 0 : static_cast<size_t>(layer);
  return xa_.data() + saved_block * sizes_.xa() + slice_[module] * sizes_.slice;
}

void CudaLoraBlocks::forward(int layer, int module, const void* adapter, const void* x, int rows, int seq, void* y,
                             int ldy, Gemm& gemm, cudaStream_t s) {
  if (!on(module) || rows == 0) return;
  const model_detail::CpuLora& m = adapted("forward", layer, module, adapter);
  apply(m, adapter, adapter_input(layer, module, x, rows, seq, s), rows, xa(layer, module), y, ldy, gemm, s);
}

void CudaLoraBlocks::param_backward(int layer, int module, const void* adapter, const void* x, const void* dy,
                                    int ldy, int rows, int seq, float* dadapter, Gemm& gemm, cudaStream_t s) {
  b_backward(layer, module, adapter, dy, ldy, rows, dadapter, gemm, s);
  a_backward(layer, module, adapter, x, rows, seq, dadapter, gemm, s);
}

void CudaLoraBlocks::b_backward(int layer, int module, const void* adapter, const void* dy, int ldy, int rows,
                                float* dadapter, Gemm& gemm, cudaStream_t s) {
  if (!on(module) || rows == 0) return;
  const model_detail::CpuLora& m = adapted("backward", layer, module, adapter);
  SHARDLM_CHECK(dadapter != nullptr, "LoRA: block ", layer, " was given no adapter gradients");
  char* dxa = dxa_.data() + slice_[module] * sizes_.slice;
  const MatMul scaled{gemm, s, m.scale};
  // dB[out, r] += scale dy^T xa; dxa[rows, r] = scale dy B.
  scaled(true, false, m.out, m.r, rows, dy, ldy, xa(layer, module), m.r, dadapter + m.b, m.r, dt_, DType::F32, 1);
  scaled(false, false, rows, m.r, m.out, dy, ldy, at(adapter, m.b), m.r, dxa, m.r, dt_, dt_);
}

void CudaLoraBlocks::a_backward(int layer, int module, const void* adapter, const void* x, int rows, int seq,
                                float* dadapter, Gemm& gemm, cudaStream_t s) {
  if (!on(module) || rows == 0) return;
  const model_detail::CpuLora& m = adapted("backward", layer, module, adapter);
  SHARDLM_CHECK(dadapter != nullptr, "LoRA: block ", layer, " was given no adapter gradients");
  const char* dxa = dxa_.data() + slice_[module] * sizes_.slice;
  // dA[r, in] += dxa^T x, reading the forward's dropout(x): its mask again, from the same seed and coordinates.
  const void* input = adapter_input(layer, module, x, rows, seq, s);
  const MatMul plain{gemm, s};
  plain(true, false, m.r, m.in, rows, dxa, m.r, input, m.in, dadapter + m.a, m.in, dt_, DType::F32, 1);
}

void CudaLoraBlocks::input_backward(int layer, int module, const void* adapter, int rows, int seq, void* dx,
                                    Gemm& gemm, cudaStream_t s) {
  if (!on(module) || rows == 0) return;
  const model_detail::CpuLora& m = modules_[module];
  const char* dxa = dxa_.data() + slice_[module] * sizes_.slice;
  const MatMul plain{gemm, s};
  if (!dropping()) {
    plain(false, false, rows, m.in, m.r, dxa, m.r, at(adapter, m.a), m.in, dx, m.in, dt_, dt_, 1);
    return;
  }
  // The branch's input was dropout(x): d(x A^T) A reaches x through the same mask and scale.
  plain(false, false, rows, m.in, m.r, dxa, m.r, at(adapter, m.a), m.in, dropped_.data(), m.in, dt_, dt_);
  lora_dropout(dropped_.data(), dx, rows, seq, m.in, mask(layer, module), true, dt_, s);
}

void CudaLoraBlocks::decode_allocate(int max_rows) {
  if (sizes_.modules == 0) return;
  decode_xa_.allocate(static_cast<size_t>(std::max(max_rows, 0)) * modules_.front().r * es_);
}

void CudaLoraBlocks::decode_forward(int layer, int module, const void* adapter, const void* x, int n, void* y,
                                    int ldy, Gemm& gemm, cudaStream_t s) {
  if (!on(module) || n == 0) return;
  apply(adapted("decoding", layer, module, adapter), adapter, x, n, decode_xa_.data(), y, ldy, gemm, s);
}

}  // namespace shardlm::cuda

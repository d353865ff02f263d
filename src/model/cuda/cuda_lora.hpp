// Private to the CUDA models: LoRA on a block's linear layers, CpuLora's math (cpu_lora.hpp) through
// cuBLASLt. y += scale (x A^T) B^T with x A^T in the compute dtype, kept per saved block for the
// backward (under activation checkpointing the one saved block's is recomputed with the block); the
// adapters' gradients accumulate in fp32 as the base weights' do. In training forwards with lora.dropout
// the adapters read dropout(x) (lora_dropout.cu, the CPU models' masks). Buffers of lora_cuda_sizes.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <vector>

#include "../cpu_lora.hpp"
#include "cuda_lora_sizes.hpp"
#include "device_memory.hpp"
#include "gemm.hpp"

namespace shardlm::cuda {

// Modules are indices in the family's linear_modules order; `adapter` is a block's gathered adapters
// (lora_layout) in the compute dtype, `dadapter` their fp32 gradients. x, dx and the kept x A^T are
// dense rows; y and dy may be columns of a wider matrix (row stride ld), as q|k|v and gate|up are. The
// calls of a block take its rows as `rows` = B x T rows of `seq` = T positions (the masks' coordinates).
class CudaLoraBlocks {
 public:
  // Nothing is allocated when cfg's LoRA is off. Buffers for max_batch x max_seq rows; with
  // checkpointing one block's x A^T at a time; dropout's scratch only with lora.dropout > 0.
  CudaLoraBlocks(const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool checkpointing);
  CudaLoraBlocks(const CudaLoraBlocks&) = delete;
  CudaLoraBlocks& operator=(const CudaLoraBlocks&) = delete;

  bool on(int module) const { return !modules_.empty() && modules_[module].on; }
  // UnitModel::set_dropout: the next forwards (their recomputations and backwards too) drop the
  // adapters' input with masks of `seed`, or (nullopt, the state after construction) not at all.
  void set_dropout(std::optional<uint64_t> seed) { seed_ = seed; }
  // y[rows, out] += scale (x A^T) B^T of x[rows, in] (when on; dropout(x) when dropping); x A^T kept for
  // block `layer`'s backward. A null y forms only x A^T (a recomputation whose output the backward
  // does not read).
  void forward(int layer, int module, const void* adapter, const void* x, int rows, int seq, void* y, int ldy,
               Gemm& gemm, cudaStream_t s);
  // dB += scale dy^T (x A^T) and dA += d(x A^T)^T x for dy[rows, out] (when on; dropout(x) again when
  // dropping), with d(x A^T) = scale dy B kept for input_backward.
  void param_backward(int layer, int module, const void* adapter, const void* x, const void* dy, int ldy, int rows,
                      int seq, float* dadapter, Gemm& gemm, cudaStream_t s);
  // param_backward in its two halves, for a caller that has dy before x (LlamaCuda's down_proj, whose input
  // the activation's backward writes again): b_backward, dB and d(x A^T) from dy; then a_backward, dA from
  // d(x A^T) and x. input_backward may come between them.
  void b_backward(int layer, int module, const void* adapter, const void* dy, int ldy, int rows, float* dadapter,
                  Gemm& gemm, cudaStream_t s);
  void a_backward(int layer, int module, const void* adapter, const void* x, int rows, int seq, float* dadapter,
                  Gemm& gemm, cudaStream_t s);
  // dx[rows, in] += d(x A^T) A (when on; after the module's param_backward or b_backward), through the forward's mask
  // when dropping.
  void input_backward(int layer, int module, const void* adapter, int rows, int seq, void* dx, Gemm& gemm,
                      cudaStream_t s);

  // Greedy decoding: y += the LoRA term of x over n rows, through scratch of up to max_rows rows that
  // exists from decode_allocate to decode_free.
  void decode_allocate(int max_rows);
  void decode_free() { decode_xa_.release(); }
  void decode_forward(int layer, int module, const void* adapter, const void* x, int n, void* y, int ldy,
                      Gemm& gemm, cudaStream_t s);

  // The training buffers' bytes: saved blocks x lora_cuda_sizes' xa(), and its scratch().
  size_t bytes() const { return xa_.bytes() + dxa_.bytes() + dropped_.bytes(); }

 private:
  char* xa(int layer, int module) const;  // where the module's x A^T of block `layer` is kept
  const model_detail::CpuLora& adapted(const char* what, int layer, int module, const void* adapter) const;
  // The layer's y += scale (x A^T) B^T with x A^T written to xa.
  void apply(const model_detail::CpuLora& m, const void* adapter, const void* x, int rows, void* xa, void* y, int ldy,
             Gemm& gemm, cudaStream_t s) const;
  const char* at(const void* adapter, size_t offset) const { return static_cast<const char*>(adapter) + offset * es_; }
  bool dropping() const { return dropout_ > 0 && seed_.has_value(); }
  DropoutMask mask(int layer, int module) const { return dropout_mask(*seed_, dropout_, layer, module); }
  // dropout(x) written to dropped_ for module `module` of block `layer` when dropping, else x itself.
  const void* adapter_input(int layer, int module, const void* x, int rows, int seq, cudaStream_t s);

  std::vector<model_detail::CpuLora> modules_;  // offsets and shapes, as the CPU models read them
  std::vector<size_t> slice_;                   // each targeted module's place among the targeted ones
  DType dt_;
  size_t es_;
  bool checkpointing_;
  LoraCudaSizes sizes_;
  DeviceBuffer<char> xa_;   // [saved block][module] slices of sizes_.slice
  DeviceBuffer<char> dxa_;  // [module] slices
  DeviceBuffer<char> decode_xa_;
  double dropout_ = 0;            // lora.dropout
  std::optional<uint64_t> seed_;  // set_dropout
  DeviceBuffer<char> dropped_;    // sizes_.dropped
};

}  // namespace shardlm::cuda

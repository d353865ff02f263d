// Private to src/model: LoRA on the CPU models' linear layers, fp32, through cpu_gemm. A block's
// adapted layers in the family's module order (linear_modules), with the activations each keeps.
#pragma once

#include <cstddef>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

namespace shardlm::model_detail {

// One linear layer's adapters inside a block's adapter parameters (lora_layout): y += scale * (x A^T) B^T.
struct CpuLora {
  bool on = false;         // the layer is targeted
  size_t a = 0, b = 0;     // offsets of lora_A [r, in] and lora_B [out, r]
  int in = 0, out = 0, r = 0;
  float scale = 0;

  // y[rows, out] += scale * (x A^T) B^T; xa[rows, r] receives x A^T (kept for the backward).
  void forward(const float* adapter, const float* x, int rows, float* xa, float* y) const;
  // dB += scale * dy^T xa and dA += dxa^T x with dxa[rows, r] = scale * dy B (written, for input_backward).
  void param_backward(const float* adapter, const float* x, const float* xa, const float* dy, int rows,
                      float* dadapter, float* dxa) const;
  // dx[rows, in] += dxa A.
  void input_backward(const float* adapter, const float* dxa, int rows, float* dx) const;
};

// One CpuLora per module of cfg's family (linear_modules' order), `on` where cfg.lora targets it; empty
// when LoRA is off or there are no blocks. The CUDA models read their offsets and shapes from it too.
std::vector<CpuLora> lora_modules(const ModelConfig& cfg);

// The adapters of a CPU model's blocks (every block has the same layout): one CpuLora per module of
// the family, `on` where cfg.lora targets it, and the x A^T each layer keeps for its backward.
class CpuLoraBlocks {
 public:
  // Nothing is allocated when cfg's LoRA is off.
  CpuLoraBlocks(const ModelConfig& cfg, int max_tokens);
  bool on(int module) const { return !modules_.empty() && modules_[module].on; }
  // The layer's forward of module `module` (when on): y += its LoRA term of x.
  void forward(int layer, int module, const float* adapter, const float* x, int rows, float* y);
  // Its parameter gradients (into dadapter) and the module's d(x A^T) for input_backward.
  void param_backward(int layer, int module, const float* adapter, const float* x, const float* dy, int rows,
                      float* dadapter);
  // dx += the module's LoRA input gradient (after param_backward).
  void input_backward(int module, const float* adapter, int rows, float* dx);
  // Decoding: y += the LoRA term of x over n rows (scratch sized by decode_begin).
  void decode_forward(int module, const float* adapter, const float* x, int n, float* y);
  void decode_begin(int max_rows);
  size_t floats() const;  // what the buffers hold
  // The floats CpuLoraBlocks(cfg, max_tokens) holds, without building it.
  static size_t floats_for(const ModelConfig& cfg, size_t max_tokens);

 private:
  std::vector<CpuLora> modules_;
  std::vector<std::vector<Buffer<float>>> xa_;  // [layer][module]: x A^T of the last forward
  std::vector<Buffer<float>> dxa_;              // [module]: scale * dy B of the last param_backward
  std::vector<float> decode_xa_;
};

}  // namespace shardlm::model_detail

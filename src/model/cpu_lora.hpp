// Private to src/model: LoRA on the CPU models' linear layers, fp32, through cpu_gemm. A block's
// adapted layers in the family's module order (linear_modules), with the activations each keeps, and
// LoRA dropout on their input in training forwards (set_dropout; masks of dropout_mask.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "../device/dropout_mask.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

namespace shardlm::model_detail {

// Where a module's output goes when a model keeps its rows apart (a fused module, Phi-3's qkv_proj: q, k and v
// in arrays of their own): consecutive rows of B from row 0, `width` of them into y[rows, width] each.
struct LoraOutput {
  float* y;
  int width;
};
struct LoraOutputGrad {
  const float* dy;
  int width;
};

// One linear layer's adapters inside a block's adapter parameters (lora_layout): y += scale * (x A^T) B^T.
struct CpuLora {
  bool on = false;         // the layer is targeted
  size_t a = 0, b = 0;     // offsets of lora_A [r, in] and lora_B [out, r]
  int in = 0, out = 0, r = 0;
  float scale = 0;

  // y[rows, out] += scale * (x A^T) B^T; xa[rows, r] receives x A^T (kept for the backward).
  void forward(const float* adapter, const float* x, int rows, float* xa, float* y) const;
  // The same with the output in parts (LoraOutput), whose widths add up to `out`.
  void forward(const float* adapter, const float* x, int rows, float* xa, const std::vector<LoraOutput>& parts) const;
  // dB += scale * dy^T xa and dA += dxa^T x with dxa[rows, r] = scale * dy B (written, for input_backward).
  void param_backward(const float* adapter, const float* x, const float* xa, const float* dy, int rows,
                      float* dadapter, float* dxa) const;
  // The same with dy in parts: dxa = scale * sum of dy_p B_p.
  void param_backward(const float* adapter, const float* x, const float* xa, const std::vector<LoraOutputGrad>& dy,
                      int rows, float* dadapter, float* dxa) const;
  // dx[rows, in] += dxa A (= with accumulate false).
  void input_backward(const float* adapter, const float* dxa, int rows, bool accumulate, float* dx) const;
};

// One CpuLora per module of cfg's family (linear_modules' order), `on` where cfg.lora targets it; empty
// when LoRA is off or there are no blocks. The CUDA models read their offsets and shapes from it too.
std::vector<CpuLora> lora_modules(const ModelConfig& cfg);
// The widest input of an adapted layer (0 without LoRA): LoRA dropout's scratch holds that many columns.
int lora_widest_input(const ModelConfig& cfg);
// Error naming lora.dropout when micro-batches of max_batch x max_seq tokens have coordinates the masks'
// counters cannot hold (dropout_mask_fits); nothing without dropout.
void check_lora_dropout_sizes(const ModelConfig& cfg, int max_batch, int max_seq);

// out[r, c] = mask.factor(r / seq, r % seq, c) * x[r, c] for rows of `cols` (+= with accumulate): dropout
// of x, or the masked input gradient of the dropped x added into dx.
void apply_lora_dropout(const DropoutMask& mask, const float* x, int rows, int seq, int cols, bool accumulate,
                        float* out);

// The adapters of a CPU model's blocks (every block has the same layout): one CpuLora per module of
// the family, `on` where cfg.lora targets it, and the x A^T each layer keeps for its backward. The
// calls of a block take its rows as `rows` = B x T rows of `seq` = T positions (the masks' coordinates).
class CpuLoraBlocks {
 public:
  // Nothing is allocated when cfg's LoRA is off; dropout's scratch only with lora.dropout > 0.
  CpuLoraBlocks(const ModelConfig& cfg, int max_batch, int max_seq);
  bool on(int module) const { return !modules_.empty() && modules_[module].on; }
  // UnitModel::set_dropout: the next forwards (and backwards) drop the adapters' input with masks of
  // `seed`, or (nullopt, the state after construction) not at all.
  void set_dropout(std::optional<uint64_t> seed) { seed_ = seed; }
  // The layer's forward of module `module` (when on): y += its LoRA term of x (of dropout(x) when dropping).
  void forward(int layer, int module, const float* adapter, const float* x, int rows, int seq, float* y);
  // The same for a module whose output the model keeps in parts (LoraOutput).
  void forward(int layer, int module, const float* adapter, const float* x, int rows, int seq,
               const std::vector<LoraOutput>& parts);
  // Its parameter gradients (into dadapter) and the module's d(x A^T) for input_backward.
  void param_backward(int layer, int module, const float* adapter, const float* x, const float* dy, int rows, int seq,
                      float* dadapter);
  void param_backward(int layer, int module, const float* adapter, const float* x,
                      const std::vector<LoraOutputGrad>& dy, int rows, int seq, float* dadapter);
  // dx += the module's LoRA input gradient (after param_backward), masked as its forward's input was.
  void input_backward(int layer, int module, const float* adapter, int rows, int seq, float* dx);
  // Decoding: y += the LoRA term of x over n rows (scratch sized by decode_begin); never drops.
  void decode_forward(int module, const float* adapter, const float* x, int n, float* y);
  void decode_forward(int module, const float* adapter, const float* x, int n, const std::vector<LoraOutput>& parts);
  void decode_begin(int max_rows);
  size_t floats() const;  // what the buffers hold
  // The floats CpuLoraBlocks(cfg, max_batch, max_seq) holds (max_tokens = max_batch x max_seq), without
  // building it.
  static size_t floats_for(const ModelConfig& cfg, size_t max_tokens);

 private:
  bool dropping() const { return dropout_ > 0 && seed_.has_value(); }
  // x dropped into dropped_ for module `module` of block `layer` when dropping, else x itself.
  const float* adapter_input(int layer, int module, const float* x, int rows, int seq);

  std::vector<CpuLora> modules_;
  std::vector<std::vector<Buffer<float>>> xa_;  // [layer][module]: x A^T of the last forward
  std::vector<Buffer<float>> dxa_;              // [module]: scale * dy B of the last param_backward
  std::vector<float> decode_xa_;
  double dropout_ = 0;              // lora.dropout
  std::optional<uint64_t> seed_;    // set_dropout
  // With dropout: [max_tokens, lora_widest_input] scratch, a layer's dropout(x), or its LoRA input gradient
  // before the mask.
  Buffer<float> dropped_;
};

}  // namespace shardlm::model_detail

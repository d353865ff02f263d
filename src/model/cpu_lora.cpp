// LoRA on the CPU models' linear layers (cpu_lora.hpp).
#include "cpu_lora.hpp"

#include <algorithm>

#include "model_internal.hpp"
#include "shardlm/device.hpp"

namespace shardlm::model_detail {

void CpuLora::forward(const float* adapter, const float* x, int rows, float* xa, float* y) const {
  forward(adapter, x, rows, xa, std::vector<LoraOutput>{{y, out}});
}

void CpuLora::forward(const float* adapter, const float* x, int rows, float* xa,
                      const std::vector<LoraOutput>& parts) const {
  if (rows == 0) return;
  cpu_gemm(false, true, rows, r, in, 1.0f, x, in, adapter + a, in, 0.0f, xa, r);
  size_t row = 0;  // of B
  for (const LoraOutput& p : parts) {
    cpu_gemm(false, true, rows, p.width, r, scale, xa, r, adapter + b + row * r, r, 1.0f, p.y, p.width);
    row += p.width;
  }
  SHARDLM_CHECK(row == static_cast<size_t>(out), "LoRA: output parts of ", row, " rows for a module of ", out);
}

void CpuLora::param_backward(const float* adapter, const float* x, const float* xa, const float* dy, int rows,
                             float* dadapter, float* dxa) const {
  param_backward(adapter, x, xa, std::vector<LoraOutputGrad>{{dy, out}}, rows, dadapter, dxa);
}

void CpuLora::param_backward(const float* adapter, const float* x, const float* xa,
                             const std::vector<LoraOutputGrad>& dy, int rows, float* dadapter, float* dxa) const {
  if (rows == 0) return;
  // dB[out, r] += scale * dy^T xa; dxa[rows, r] = scale * dy B; dA[r, in] += dxa^T x (B's rows part by part).
  size_t row = 0;
  for (const LoraOutputGrad& p : dy) {
    cpu_gemm(true, false, p.width, r, rows, scale, p.dy, p.width, xa, r, 1.0f, dadapter + b + row * r, r);
    cpu_gemm(false, false, rows, r, p.width, scale, p.dy, p.width, adapter + b + row * r, r, row == 0 ? 0.0f : 1.0f,
             dxa, r);
    row += p.width;
  }
  SHARDLM_CHECK(row == static_cast<size_t>(out), "LoRA: gradient parts of ", row, " rows for a module of ", out);
  cpu_gemm(true, false, r, in, rows, 1.0f, dxa, r, x, in, 1.0f, dadapter + a, in);
}

void CpuLora::input_backward(const float* adapter, const float* dxa, int rows, bool accumulate, float* dx) const {
  if (rows == 0) return;
  cpu_gemm(false, false, rows, in, r, 1.0f, dxa, r, adapter + a, in, accumulate ? 1.0f : 0.0f, dx, in);
}

std::vector<CpuLora> lora_modules(const ModelConfig& cfg) {
  std::vector<CpuLora> out;
  if (!cfg.lora.enabled() || cfg.num_layers == 0) return out;
  const UnitLayout block = lora_layout(cfg)[1];
  for (const LinearModule& m : linear_modules(cfg)) {
    CpuLora l;
    l.on = cfg.lora.targets(m.name);
    l.in = static_cast<int>(m.in), l.out = static_cast<int>(m.out), l.r = cfg.lora.r;
    l.scale = static_cast<float>(cfg.lora.scale());
    if (l.on) {
      const std::string p = block.name + "." + m.path;
      l.a = tensor_offset(block, p + ".lora_A.weight", "LoRA layout");
      l.b = tensor_offset(block, p + ".lora_B.weight", "LoRA layout");
    }
    out.push_back(l);
  }
  return out;
}

int lora_widest_input(const ModelConfig& cfg) {
  int widest = 0;
  for (const CpuLora& l : lora_modules(cfg))
    if (l.on) widest = std::max(widest, l.in);
  return widest;
}

void check_lora_dropout_sizes(const ModelConfig& cfg, int max_batch, int max_seq) {
  if (!cfg.lora.enabled() || cfg.lora.dropout == 0) return;
  SHARDLM_CHECK(dropout_mask_fits(max_batch, max_seq, lora_widest_input(cfg)), "lora.dropout = ", cfg.lora.dropout,
                ": micro-batches of ", max_batch, " x ", max_seq, " tokens through layers of ", lora_widest_input(cfg),
                " inputs exceed the dropout masks' coordinates (at most 2^", kDropoutSequenceBits, " sequences of 2^",
                kDropoutPositionBits, " positions, 2^", kDropoutColumnBits, " inputs)");
}

void apply_lora_dropout(const DropoutMask& mask, const float* x, int rows, int seq, int cols, bool accumulate,
                        float* out) {
  for (int row = 0; row < rows; ++row) {
    const uint32_t b = static_cast<uint32_t>(row / seq), t = static_cast<uint32_t>(row % seq);
    const size_t at = static_cast<size_t>(row) * cols;
    for (int c = 0; c < cols; ++c) {
      const float v = x[at + c] * mask.factor(b, t, static_cast<uint32_t>(c));
      out[at + c] = accumulate ? out[at + c] + v : v;
    }
  }
}

CpuLoraBlocks::CpuLoraBlocks(const ModelConfig& cfg, int max_batch, int max_seq)
    : modules_(lora_modules(cfg)), dropout_(cfg.lora.dropout) {
  if (modules_.empty()) return;
  check_lora_dropout_sizes(cfg, max_batch, max_seq);
  const size_t max_tokens = static_cast<size_t>(std::max(max_batch, 0)) * std::max(max_seq, 0);
  xa_.resize(cfg.num_layers);
  const size_t n = static_cast<size_t>(max_tokens) * cfg.lora.r;
  for (auto& layer : xa_) {
    layer.resize(modules_.size());
    for (size_t m = 0; m < modules_.size(); ++m)
      if (modules_[m].on) layer[m].allocate(n, MemKind::Activations);
  }
  dxa_.resize(modules_.size());
  for (size_t m = 0; m < modules_.size(); ++m)
    if (modules_[m].on) dxa_[m].allocate(n, MemKind::Activations);
  if (dropout_ > 0) dropped_.allocate(max_tokens * lora_widest_input(cfg), MemKind::Activations);
}

const float* CpuLoraBlocks::adapter_input(int layer, int module, const float* x, int rows, int seq) {
  if (!dropping()) return x;
  apply_lora_dropout(dropout_mask(*seed_, dropout_, layer, module), x, rows, seq, modules_[module].in, false,
                     dropped_.data());
  return dropped_.data();
}

void CpuLoraBlocks::forward(int layer, int module, const float* adapter, const float* x, int rows, int seq,
                            float* y) {
  if (on(module)) forward(layer, module, adapter, x, rows, seq, {{y, modules_[module].out}});
}

void CpuLoraBlocks::forward(int layer, int module, const float* adapter, const float* x, int rows, int seq,
                            const std::vector<LoraOutput>& parts) {
  if (!on(module)) return;
  SHARDLM_CHECK(adapter != nullptr, "LoRA: block ", layer, " was given no adapter parameters");
  modules_[module].forward(adapter, adapter_input(layer, module, x, rows, seq), rows, xa_[layer][module].data(),
                           parts);
}

void CpuLoraBlocks::param_backward(int layer, int module, const float* adapter, const float* x, const float* dy,
                                   int rows, int seq, float* dadapter) {
  if (on(module)) param_backward(layer, module, adapter, x, {{dy, modules_[module].out}}, rows, seq, dadapter);
}

void CpuLoraBlocks::param_backward(int layer, int module, const float* adapter, const float* x,
                                   const std::vector<LoraOutputGrad>& dy, int rows, int seq, float* dadapter) {
  if (!on(module)) return;
  SHARDLM_CHECK(dadapter != nullptr, "LoRA: block ", layer, " was given no adapter gradients");
  // dA reads the forward's dropout(x): its mask again, from the same seed and coordinates.
  modules_[module].param_backward(adapter, adapter_input(layer, module, x, rows, seq), xa_[layer][module].data(), dy,
                                  rows, dadapter, dxa_[module].data());
}

void CpuLoraBlocks::input_backward(int layer, int module, const float* adapter, int rows, int seq, float* dx) {
  if (!on(module)) return;
  const CpuLora& m = modules_[module];
  if (!dropping()) {
    m.input_backward(adapter, dxa_[module].data(), rows, true, dx);
    return;
  }
  // The branch's input was dropout(x): its gradient dxa A reaches x through the same mask and scale.
  m.input_backward(adapter, dxa_[module].data(), rows, false, dropped_.data());
  apply_lora_dropout(dropout_mask(*seed_, dropout_, layer, module), dropped_.data(), rows, seq, m.in, true, dx);
}

void CpuLoraBlocks::decode_begin(int max_rows) {
  size_t r = 0;
  for (const CpuLora& l : modules_) r = l.r;
  decode_xa_.assign(static_cast<size_t>(max_rows) * r, 0.0f);
}

void CpuLoraBlocks::decode_forward(int module, const float* adapter, const float* x, int n, float* y) {
  if (on(module)) modules_[module].forward(adapter, x, n, decode_xa_.data(), y);
}

void CpuLoraBlocks::decode_forward(int module, const float* adapter, const float* x, int n,
                                   const std::vector<LoraOutput>& parts) {
  if (on(module)) modules_[module].forward(adapter, x, n, decode_xa_.data(), parts);
}

size_t CpuLoraBlocks::floats() const {
  size_t n = 0;
  for (const auto& layer : xa_)
    for (const Buffer<float>& b : layer) n += b.size();
  for (const Buffer<float>& b : dxa_) n += b.size();
  return n + dropped_.size();
}

size_t CpuLoraBlocks::floats_for(const ModelConfig& cfg, size_t max_tokens) {
  if (!cfg.lora.enabled() || cfg.num_layers == 0) return 0;
  size_t on = 0;
  for (const LinearModule& m : linear_modules(cfg)) on += cfg.lora.targets(m.name);
  const size_t dropped = cfg.lora.dropout > 0 ? max_tokens * lora_widest_input(cfg) : 0;
  return (static_cast<size_t>(cfg.num_layers) + 1) * on * max_tokens * cfg.lora.r + dropped;
}

}  // namespace shardlm::model_detail

// BloomCpu: fp32 forward and backward of BLOOM's blocks on the CPU, around the shared embedding,
// LM head and attention (src/model/cpu_*.hpp). Every matrix product goes through cpu_gemm; the
// element-wise parts (LayerNorm, softmax, GELU) are loops.
#include "bloom_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "../cpu_attention.hpp"
#include "../cpu_head.hpp"
#include "../cpu_layers.hpp"
#include "../cpu_model_base.hpp"
#include "bloom_layout.hpp"
#include "shardlm/device.hpp"

namespace shardlm {
namespace {

// The block's linear layers in bloom_linear_modules' order: LoRA's module indices.
enum Module { kQkvProj, kDenseProj, kMlpInProj, kMlpOutProj };

using model_detail::AttentionShape;
using model_detail::CpuNorm;
using model_detail::linear;
using model_detail::linear_input_backward;
using model_detail::linear_param_backward;

// BLOOM's tanh approximation of GELU: sqrt(2/pi) and the cubic coefficient.
constexpr float kGeluScale = 0.79788456f;
constexpr float kGeluCubic = 0.044715f;

// tanh through one expf: about 3x cheaper than std::tanh, within ~1e-7 absolute; saturates to +-1.
float fast_tanh(float x) { return 1.0f - 2.0f / (std::exp(2.0f * x) + 1.0f); }

float gelu_inner_tanh(float u) { return fast_tanh(kGeluScale * u * (1.0f + kGeluCubic * u * u)); }

float gelu_value(float u, float tanh_inner) { return 0.5f * u * (1.0f + tanh_inner); }

float gelu_derivative(float u, float tanh_inner) {
  const float inner_derivative = kGeluScale * (1.0f + 3.0f * kGeluCubic * u * u);
  return 0.5f * (1.0f + tanh_inner) + 0.5f * u * (1.0f - tanh_inner * tanh_inner) * inner_derivative;
}

// A block's tensors (bloom_block_offsets) with its two LayerNorms.
struct BlockOffsets : BloomBlockOffsets {
  CpuNorm ln1, ln2;
};

BlockOffsets block_offsets(const UnitLayout& block, float eps) {
  BlockOffsets o;
  static_cast<BloomBlockOffsets&>(o) = bloom_block_offsets(block);
  o.ln1 = CpuNorm{CpuNorm::Kind::Layer, o.ln1_weight, o.ln1_bias, eps};
  o.ln2 = CpuNorm{CpuNorm::Kind::Layer, o.ln2_weight, o.ln2_bias, eps};
  return o;
}

// The fused qkv rows [N, 3H] hold each head's q, k and v side by side (transformers' BloomAttention view).
AttentionShape interleaved_heads(int B, int T, int heads, int d, const float* slopes) {
  const int H = heads * d;
  return AttentionShape{B, T, heads, heads, d, 3 * H, 3 * H, 3 * d, slopes};
}

// What one block's forward keeps for its backward, sized for the largest micro-batch.
struct BlockActivations {
  Buffer<float> ln1_xhat, ln1_rstd, ln1_out;  // input LayerNorm
  Buffer<float> qkv;                          // fused query/key/value [N, 3H]
  Buffer<float> probs;                        // attention probabilities [B, heads, T, T]
  Buffer<float> context;                      // attention output before the dense projection [N, H]
  Buffer<float> ln2_xhat, ln2_rstd, ln2_out;  // post-attention LayerNorm
  Buffer<float> mlp_pre_gelu;                 // [N, 4H]; GELU and its derivative are rebuilt from it
};

struct State {
  BlockOffsets block;
  std::vector<float> slopes;
  std::vector<BlockActivations> layers;

  // Workspaces shared by every layer (only one forward or backward runs at a time).
  Buffer<float> hidden_work[3];  // [N, H]: h_mid in forward; dln, dh_mid, dcontext in backward
  Buffer<float> wide_work[2];    // [N, 4H]: GELU output; dGELU and du in backward
  Buffer<float> qkv_grad;        // [N, 3H]
  Buffer<float> score_grad;      // [T, T] of one (sequence, head)
};

// Greedy decoding's scratch arrays (CpuModelBase::scratch): a norm's state and output, the fused
// qkv, the attention context, the mid-block residual, the MLP's wide activations, scores of a row.
enum DecodeScratch { kXhat, kRstd, kNorm, kQkv, kContext, kMid, kWide, kScores };

// What block_forward and block_backward of one call share: the layer's saved activations, the
// block's offsets, the attention's shape, the rows (B * T) and the hidden size.
struct BlockCall {
  BlockActivations& a;
  const BlockOffsets& o;
  AttentionShape shape;
  int N, H;
};

class BloomCpu final : public model_detail::CpuModelBase {
 public:
  BloomCpu(const ModelConfig& cfg, int max_batch, int max_seq);

  void block_forward(int layer, CpuParams p, const float* h_in, float* h_out, int B, int T) override;
  void block_backward(int layer, CpuParams p, const float* dh_out, float* dh_in, UnitGrads g, int B,
                      int T) override;
  void decode_begin(int slots, int max_len, int max_rows) override;
  void block_decode(int layer, CpuParams p, const float* h_in, float* h_out, int n, const int* slots,
                    const int* positions) override;

 private:
  // Forward: begins the layer's step, backward: checks it (CpuModelBase::enter_block); then what both share.
  BlockCall block_call(int layer, int B, int T, bool forward);

  State m_;
};

}  // namespace

BloomCpu::BloomCpu(const ModelConfig& cfg, int max_batch, int max_seq)
    : CpuModelBase("BloomCpu", cfg, max_batch, max_seq) {
  const std::vector<UnitLayout> layout = bloom_layout(cfg);  // also validates the config
  State& m = m_;
  if (cfg.num_layers > 0) m.block = block_offsets(layout[1], cfg.layer_norm_eps);
  m.slopes = alibi_slopes(cfg.num_heads);

  const size_t H = cfg.hidden_size, heads = cfg.num_heads;
  const size_t tokens = static_cast<size_t>(max_batch) * max_seq;
  // Word embeddings, then their LayerNorm; ln_f, then the tied head.
  const BloomRootOffsets root = bloom_root_offsets(layout[0]);
  const float eps = cfg.layer_norm_eps;
  const CpuNorm embed_norm{CpuNorm::Kind::Layer, root.embed_norm_weight, root.embed_norm_bias, eps};
  const CpuNorm final_norm{CpuNorm::Kind::Layer, root.final_norm_weight, root.final_norm_bias, eps};
  build_ends(root.embeddings, &embed_norm, final_norm, root.embeddings);
  m.layers.resize(cfg.num_layers);
  for (BlockActivations& a : m.layers) {
    allocate_activations(a.ln1_xhat, tokens * H);
    allocate_activations(a.ln1_rstd, tokens);
    allocate_activations(a.ln1_out, tokens * H);
    allocate_activations(a.qkv, tokens * 3 * H);
    allocate_activations(a.probs, tokens * heads * max_seq);
    allocate_activations(a.context, tokens * H);
    allocate_activations(a.ln2_xhat, tokens * H);
    allocate_activations(a.ln2_rstd, tokens);
    allocate_activations(a.ln2_out, tokens * H);
    allocate_activations(a.mlp_pre_gelu, tokens * 4 * H);
  }
  if (cfg.num_layers > 0) {
    for (Buffer<float>& w : m.hidden_work) allocate_activations(w, tokens * H);
    for (Buffer<float>& w : m.wide_work) allocate_activations(w, tokens * 4 * H);
    allocate_activations(m.qkv_grad, tokens * 3 * H);
    allocate_activations(m.score_grad, static_cast<size_t>(max_seq) * max_seq);
  }
}

size_t bloom_cpu_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq) {
  SHARDLM_CHECK(max_batch >= 0 && max_seq >= 0, "cpu_activation_bytes: negative max_batch ", max_batch,
                " or max_seq ", max_seq);
  // The allocations of BloomCpu's constructor, element by element.
  const size_t H = cfg.hidden_size, heads = cfg.num_heads, L = cfg.num_layers;
  const size_t tokens = static_cast<size_t>(max_batch) * max_seq;
  const size_t per_layer = 2 * (2 * tokens * H + tokens) + tokens * 3 * H + tokens * heads * max_seq +
                           tokens * H + tokens * 4 * H;
  size_t floats = L * per_layer;
  if (L > 0) floats += 3 * tokens * H + 2 * tokens * 4 * H + tokens * 3 * H + static_cast<size_t>(max_seq) * max_seq;
  return floats * sizeof(float) + model_detail::cpu_shared_bytes(cfg, true, max_batch, max_seq);
}

// ---- transformer block ----------------------------------------------------------------------

BlockCall BloomCpu::block_call(int layer, int B, int T, bool forward) {
  enter_block(layer, B, T, forward);
  AttentionShape shape = interleaved_heads(B, T, cfg_.num_heads, cfg_.head_dim(), m_.slopes.data());
  shape.starts = starts_;
  return {m_.layers[layer], m_.block, shape, B * T, cfg_.hidden_size};
}

void BloomCpu::block_forward(int layer, CpuParams p, const float* h_in, float* h_out, int B, int T) {
  State& m = m_;
  const auto [a, o, shape, N, H] = block_call(layer, B, T, true);
  if (N == 0) return;
  const int d = shape.head_dim;
  const float* params = p.base;
  // A linear layer of the block (weight and bias), with its LoRA term when it is adapted.
  auto adapted = [&](Module mod, const float* x, int in, size_t w, size_t bias, int out, const float* residual,
                     float* y) {
    linear(x, N, in, params + w, params + bias, out, residual, y);
    lora_.forward(layer, mod, p.adapter, x, N, T, y);
  };

  o.ln1.forward_rows(params, h_in, N, H, a.ln1_xhat.data(), a.ln1_rstd.data(), a.ln1_out.data());
  adapted(kQkvProj, a.ln1_out.data(), H, o.qkv_weight, o.qkv_bias, 3 * H, nullptr, a.qkv.data());
  const float* qkv = a.qkv.data();
  model_detail::attention_forward(shape, qkv, qkv + d, qkv + 2 * d, a.probs.data(), a.context.data());
  float* h_mid = m.hidden_work[0].data();
  adapted(kDenseProj, a.context.data(), H, o.dense_weight, o.dense_bias, H, h_in, h_mid);

  o.ln2.forward_rows(params, h_mid, N, H, a.ln2_xhat.data(), a.ln2_rstd.data(), a.ln2_out.data());
  adapted(kMlpInProj, a.ln2_out.data(), H, o.mlp_in_weight, o.mlp_in_bias, 4 * H, nullptr, a.mlp_pre_gelu.data());
  float* gelu = m.wide_work[0].data();
  const size_t wide = static_cast<size_t>(N) * 4 * H;
  for (size_t i = 0; i < wide; ++i) {
    const float u = a.mlp_pre_gelu[i];
    gelu[i] = gelu_value(u, gelu_inner_tanh(u));
  }
  adapted(kMlpOutProj, gelu, 4 * H, o.mlp_out_weight, o.mlp_out_bias, H, h_mid, h_out);
}

void BloomCpu::block_backward(int layer, CpuParams p, const float* dh_out, float* dh_in, UnitGrads g, int B,
                              int T) {
  State& m = m_;
  const auto [a, o, shape, N, H] = block_call(layer, B, T, false);
  if (N == 0) return;
  const int d = shape.head_dim;
  const float* params = p.base;
  // A linear layer's parameter gradients (weight and bias unless frozen, its adapters when adapted),
  // then its input gradient (written) with the LoRA term.
  auto param_backward = [&](Module mod, const float* x, const float* dy, int in, int out, size_t w, size_t bias) {
    linear_param_backward(x, dy, N, in, out, g.base_at(w), g.base_at(bias));
    lora_.param_backward(layer, mod, p.adapter, x, dy, N, T, g.adapter);
  };
  auto input_backward = [&](Module mod, const float* dy, int in, size_t w, int out, float* dx) {
    linear_input_backward(dy, N, in, params + w, out, false, dx);
    lora_.input_backward(layer, mod, p.adapter, N, T, dx);
  };
  float* dln = m.hidden_work[0].data();
  float* dh_mid = m.hidden_work[1].data();
  float* dcontext = m.hidden_work[2].data();
  float* dmlp = m.wide_work[0].data();  // GELU derivative, then d(pre-GELU)
  float* gelu = m.wide_work[1].data();  // GELU output, then d(GELU output)

  // MLP: one tanh per element gives both the GELU output (for dW) and its derivative.
  const size_t wide = static_cast<size_t>(N) * 4 * H;
  for (size_t i = 0; i < wide; ++i) {
    const float u = a.mlp_pre_gelu[i], t = gelu_inner_tanh(u);
    gelu[i] = gelu_value(u, t);
    dmlp[i] = gelu_derivative(u, t);
  }
  param_backward(kMlpOutProj, gelu, dh_out, 4 * H, H, o.mlp_out_weight, o.mlp_out_bias);
  input_backward(kMlpOutProj, dh_out, 4 * H, o.mlp_out_weight, H, gelu);
  for (size_t i = 0; i < wide; ++i) dmlp[i] *= gelu[i];
  param_backward(kMlpInProj, a.ln2_out.data(), dmlp, H, 4 * H, o.mlp_in_weight, o.mlp_in_bias);
  input_backward(kMlpInProj, dmlp, H, o.mlp_in_weight, 4 * H, dln);
  // h_out = h_mid + mlp(LN2(h_mid)): the residual passes dh_out straight through.
  std::memcpy(dh_mid, dh_out, sizeof(float) * N * H);
  o.ln2.backward_rows(params, dln, a.ln2_xhat.data(), a.ln2_rstd.data(), N, H, dh_mid, g.base);

  // Attention: dense projection, then attention itself, then the fused qkv projection.
  param_backward(kDenseProj, a.context.data(), dh_mid, H, H, o.dense_weight, o.dense_bias);
  input_backward(kDenseProj, dh_mid, H, o.dense_weight, H, dcontext);
  const float* qkv = a.qkv.data();
  float* dqkv = m.qkv_grad.data();
  model_detail::attention_backward(shape, qkv, qkv + d, qkv + 2 * d, a.probs.data(), dcontext, m.score_grad.data(),
                                   dqkv, dqkv + d, dqkv + 2 * d);
  param_backward(kQkvProj, a.ln1_out.data(), dqkv, H, 3 * H, o.qkv_weight, o.qkv_bias);
  input_backward(kQkvProj, dqkv, H, o.qkv_weight, 3 * H, dln);
  // h_mid = h_in + attention(LN1(h_in)).
  std::memcpy(dh_in, dh_mid, sizeof(float) * N * H);
  o.ln1.backward_rows(params, dln, a.ln1_xhat.data(), a.ln1_rstd.data(), N, H, dh_in, g.base);
}

// ---- greedy decoding with a key/value cache ------------------------------------------------

void BloomCpu::decode_begin(int slots, int max_len, int max_rows) {
  const size_t H = cfg_.hidden_size, rows = std::max(max_rows, 0), len = std::max(max_len, 0);
  begin_decoding(slots, max_len, max_rows, cfg_.num_heads,
                 {rows * H, rows, rows * H, rows * 3 * H, rows * H, rows * H, rows * 4 * H, len});
}

void BloomCpu::block_decode(int layer, CpuParams p, const float* h_in, float* h_out, int n,
                            const int* slots, const int* positions) {
  check_decode_rows(layer, n, slots, positions);
  if (n == 0) return;
  const float* params = p.base;
  auto adapted = [&](Module mod, const float* x, int in, size_t w, size_t bias, int out, const float* residual,
                     float* y) {
    linear(x, n, in, params + w, params + bias, out, residual, y);
    lora_.decode_forward(mod, p.adapter, x, n, y);
  };
  const BlockOffsets& o = m_.block;
  const int H = cfg_.hidden_size;
  const AttentionShape shape = interleaved_heads(n, 1, cfg_.num_heads, cfg_.head_dim(), m_.slopes.data());
  const int d = shape.head_dim;
  float* norm = scratch(kNorm);

  o.ln1.forward_rows(params, h_in, n, H, scratch(kXhat), scratch(kRstd), norm);
  float* qkv = scratch(kQkv);
  adapted(kQkvProj, norm, H, o.qkv_weight, o.qkv_bias, 3 * H, nullptr, qkv);
  model_detail::cached_attention_rows(cache(), layer, shape, qkv, qkv + d, qkv + 2 * d, n, slots, positions,
                                      scratch(kScores), scratch(kContext));
  float* h_mid = scratch(kMid);
  adapted(kDenseProj, scratch(kContext), H, o.dense_weight, o.dense_bias, H, h_in, h_mid);

  o.ln2.forward_rows(params, h_mid, n, H, scratch(kXhat), scratch(kRstd), norm);
  float* wide = scratch(kWide);
  adapted(kMlpInProj, norm, H, o.mlp_in_weight, o.mlp_in_bias, 4 * H, nullptr, wide);
  const size_t wide_n = static_cast<size_t>(n) * 4 * H;
  for (size_t i = 0; i < wide_n; ++i) wide[i] = gelu_value(wide[i], gelu_inner_tanh(wide[i]));
  adapted(kMlpOutProj, wide, 4 * H, o.mlp_out_weight, o.mlp_out_bias, H, h_mid, h_out);
}

std::unique_ptr<CpuModel> make_bloom_cpu(const ModelConfig& cfg, int max_batch, int max_seq) {
  return std::make_unique<BloomCpu>(cfg, max_batch, max_seq);
}

}  // namespace shardlm

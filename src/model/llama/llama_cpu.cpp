// LlamaCpu: fp32 forward and backward of Llama's decoder layers (RMSNorm, rotary grouped-query
// attention, SwiGLU MLP; Qwen2's q/k/v biases and Qwen3's per-head q/k RMSNorms when asked) on the CPU, around the shared embedding,
// LM head and attention (src/model/cpu_*.hpp). Every matrix product goes through cpu_gemm; the
// element-wise parts (RMSNorm, rotary, softmax, SiLU) are loops.
#include "llama_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "../cpu_attention.hpp"
#include "../cpu_head.hpp"
#include "../cpu_layers.hpp"
#include "../cpu_model_base.hpp"
#include "../model_internal.hpp"
#include "shardlm/device.hpp"

namespace shardlm {
namespace {

using model_detail::AttentionShape;
using model_detail::CpuNorm;
using model_detail::linear;
using model_detail::linear_input_backward;
using model_detail::linear_param_backward;

// The block's projections (LlamaProjection); llama_lora_slots maps them to LoRA's modules.
enum Module { kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj };

// The LoRA calls of projections given in their order: one call per module, a fused module's (Phi-3's qkv_proj)
// with the outputs (or output gradients) of its projections as parts in the rows of its B.
template <class Part>
std::vector<std::pair<int, std::vector<Part>>> lora_calls(const std::vector<LlamaLoraSlot>& slots,
                                                          std::initializer_list<std::pair<Module, Part>> projections) {
  std::vector<std::pair<int, std::vector<Part>>> calls;
  for (const auto& [projection, part] : projections) {
    const int module = slots[projection].module;
    if (calls.empty() || calls.back().first != module) calls.push_back({module, {}});
    calls.back().second.push_back(part);
  }
  return calls;
}

// A block's tensors (llama_block_offsets) with its two norms (four with LlamaBlock::qk_norm: q's and k's
// over each head; two more on the attention's and the MLP's outputs with LlamaBlock::sandwich_norms); the
// q/k/v biases are null without LlamaBlock::qkv_bias.
struct BlockOffsets : LlamaBlockOffsets {
  CpuNorm input_norm_rows, post_norm_rows, q_norm_heads, k_norm_heads, attn_out_norm_rows, mlp_out_norm_rows;
  bool gelu_tanh = false;  // LlamaBlock::gelu_tanh: GeGLU instead of SwiGLU
  const float* bias(const float* params, size_t offset) const { return qkv_bias ? params + offset : nullptr; }
  float* bias(float* params, size_t offset) const { return qkv_bias ? params + offset : nullptr; }
};

BlockOffsets block_offsets(const UnitLayout& block, float eps, const LlamaBlock& options) {
  BlockOffsets o;
  static_cast<LlamaBlockOffsets&>(o) = llama_block_offsets(block, options);
  const float offset = options.unit_offset_norms ? 1.0f : 0.0f;
  o.input_norm_rows = CpuNorm{CpuNorm::Kind::Rms, o.input_norm, 0, eps, offset};
  o.post_norm_rows = CpuNorm{CpuNorm::Kind::Rms, o.post_norm, 0, eps, offset};
  o.q_norm_heads = CpuNorm{CpuNorm::Kind::Rms, o.q_norm, 0, eps, offset};
  o.k_norm_heads = CpuNorm{CpuNorm::Kind::Rms, o.k_norm, 0, eps, offset};
  o.attn_out_norm_rows = CpuNorm{CpuNorm::Kind::Rms, o.attn_out_norm, 0, eps, offset};
  o.mlp_out_norm_rows = CpuNorm{CpuNorm::Kind::Rms, o.mlp_out_norm, 0, eps, offset};
  o.gelu_tanh = options.gelu_tanh;
  return o;
}

// Query, key and value projections in separate arrays of rows [N, heads d] and [N, kv_heads d]; layer
// `layer`'s sliding window (Mistral; Gemma 3's local layers), if any, and the model's score scale (Gemma 3's
// query_pre_attn_scalar).
AttentionShape grouped_heads(int B, int T, const ModelConfig& cfg, int layer) {
  const int d = cfg.head_dim();
  AttentionShape s{B, T, cfg.num_heads, cfg.kv_heads(), d, cfg.num_heads * d, cfg.kv_heads() * d, d, nullptr};
  s.window = cfg.layer_sliding_window(layer);
  if (cfg.query_pre_attn_scalar > 0) s.scale = cfg.attention_scale();
  return s;
}

// y = xhat * (offset + weight) again from the saved xhat (cheaper to rebuild than to keep for backward).
void rms_norm_output(const float* xhat, int rows, int H, const CpuNorm& norm, const float* params, float* y) {
  const float* weight = params + norm.weight;
  for (int r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * H;
    for (int c = 0; c < H; ++c) y[at + c] = xhat[at + c] * (norm.weight_offset + weight[c]);
  }
}

// ---- rotary embeddings ----------------------------------------------------------------------

// transformers' rotate_half convention: element i pairs with i + rot/2, both rotated by angle
// pos * inv_freq[i], in the first `rot` dimensions of each head (all d but with partial rotary, whose
// other dimensions pass through). `inverse` applies the transposed rotation (the backward of the forward one).
// x is [B*T rows of `heads` heads of d], row stride ld; cos/sin tables are [pos, rot/2]. Row t of a
// sequence sits at position t, or t - starts[row] in packed rows (starts non-null).
void apply_rotary(float* x, int B, int T, int heads, int d, int rot, int ld, const float* cos_table,
                  const float* sin_table, bool inverse, const int32_t* starts = nullptr) {
  const int half = rot / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t r = static_cast<size_t>(b) * T + t;
      float* row = x + r * ld;
      const size_t pos = static_cast<size_t>(starts ? t - starts[r] : t);
      const float* cs = cos_table + pos * half;
      const float* sn = sin_table + pos * half;
      for (int n = 0; n < heads; ++n) {
        float* head = row + static_cast<size_t>(n) * d;
        for (int i = 0; i < half; ++i) {
          const float x1 = head[i], x2 = head[i + half], s = sign * sn[i];
          head[i] = x1 * cs[i] - x2 * s;
          head[i + half] = x2 * cs[i] + x1 * s;
        }
      }
    }
}

// cos and sin of pos * inv_freq, the angle rounded to fp32 as transformers forms it, each times `scale`
// (LongRoPE's attention factor; rounded to fp32 before, as transformers scales them).
void rotary_angles(int pos, const std::vector<float>& inv_freq, float scale, float* cos_out, float* sin_out) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    cos_out[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * scale;
    sin_out[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * scale;
  }
}

// The rotary tables of one set of frequencies: cos and sin [max_seq, rotary_dim / 2].
struct RotaryTables {
  std::vector<float> inv_freq, cos, sin;
  void build(std::vector<float> freq, float scale, int max_seq) {
    inv_freq = std::move(freq);
    const size_t half = inv_freq.size();
    cos.resize(static_cast<size_t>(max_seq) * half);
    sin.resize(cos.size());
    for (int t = 0; t < max_seq; ++t) rotary_angles(t, inv_freq, scale, cos.data() + t * half, sin.data() + t * half);
  }
};

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// GELU's tanh approximation (PyTorch's gelu(approximate='tanh'), transformers' gelu_pytorch_tanh) and its
// derivative, in fp32 as PyTorch computes it.
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;
float gelu_tanh(float x) {
  const float inner = kGeluBeta * (x + kGeluKappa * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}
float gelu_tanh_grad(float x) {
  const float inner = kGeluBeta * (x + kGeluKappa * x * x * x);
  const float t = std::tanh(inner);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * x * x);
}

// The gated MLP's activation of one element: SiLU(gate) * up, or GeGLU's gelu_tanh(gate) * up.
float gated(bool geglu, float gate, float up) { return (geglu ? gelu_tanh(gate) : gate * sigmoid(gate)) * up; }
// Its derivative with respect to gate (per unit of up): silu'(g) = s (1 + g (1 - s)), or gelu_tanh'(g).
float gated_grad(bool geglu, float gate) {
  if (geglu) return gelu_tanh_grad(gate);
  const float s = sigmoid(gate);
  return s * (1.0f + gate * (1.0f - s));
}

// Sandwich norms (LlamaBlock::sandwich_norms): y = base + norm(out) over N rows of H, the norm's xhat and rstd
// kept, `normed` as scratch.
void add_normed(const CpuNorm& norm, const float* params, const float* base, const float* out, int N, int H,
                float* xhat, float* rstd, float* normed, float* y) {
  norm.forward_rows(params, out, N, H, xhat, rstd, normed);
  const size_t n = static_cast<size_t>(N) * H;
  for (size_t i = 0; i < n; ++i) y[i] = base[i] + normed[i];
}

// RMSNorm of each head (rows x heads vectors of d, row stride heads * d) in place, its xhat and rstd
// into the arrays given ([rows heads d], [rows heads]).
void norm_heads_forward(const CpuNorm& norm, const float* params, float* x, int rows, int heads, int d, float* xhat,
                        float* rstd) {
  norm.forward_rows(params, x, rows * heads, d, xhat, rstd, x);
}

// Its backward in place: dx = d(normed x) through the norm; the weight's gradient into dparams (null: frozen).
void norm_heads_backward(const CpuNorm& norm, const float* params, float* dx, const float* xhat, const float* rstd,
                         int rows, int heads, int d, float* dparams) {
  const size_t n = static_cast<size_t>(rows) * heads;
  for (size_t r = 0; r < n; ++r) norm.backward_row(params, dx + r * d, xhat + r * d, rstd[r], d, dx + r * d, false, dparams);
}

// ---- saved state ----------------------------------------------------------------------------

// What one block's forward keeps for its backward, sized for the largest micro-batch.
struct BlockActivations {
  Buffer<float> norm1_xhat, norm1_rstd;  // input RMSNorm (its output is rebuilt from xhat)
  Buffer<float> q, k, v;                 // projections, q and k after rotary: [N, nh*d], [N, nkv*d]
  Buffer<float> q_xhat, q_rstd, k_xhat, k_rstd;  // the per-head q/k RMSNorms (LlamaBlock::qk_norm only)
  Buffer<float> probs;                   // attention probabilities [B, heads, T, T]
  Buffer<float> context;                 // attention output before o_proj [N, nh*d]
  Buffer<float> norm2_xhat, norm2_rstd;  // post-attention RMSNorm
  Buffer<float> gate, up;                // [N, F]: gate_proj and up_proj outputs
  // LlamaBlock::sandwich_norms: the norms of o_proj's output and of down_proj's output
  Buffer<float> norm3_xhat, norm3_rstd, norm4_xhat, norm4_rstd;
};

struct State {
  BlockOffsets block;
  // Rotary tables: ModelConfig::rope_tables(), chosen per layer by layer_rope_table; LongRoPE's long factors' of
  // table 0 in `rope_long` (a forward of more than original_max_position_embeddings positions uses them).
  // Decoding may run past max_seq, so its angles are formed per row from inv_freq.
  std::vector<RotaryTables> rope;
  RotaryTables rope_long;
  float rope_scale = 1;  // LongRoPE's attention factor
  std::vector<LlamaLoraSlot> lora_slots;  // llama_lora_slots: where LoRA adds onto each projection
  std::vector<BlockActivations> layers;

  // Workspaces shared by every layer (only one forward or backward runs at a time).
  Buffer<float> hidden_work[2];  // [N, H]: the mid-block residual; in backward dx, and norm output / grads
  Buffer<float> wide_work[2];    // [N, F]: SiLU(gate) * up; in backward d(gate), d(up)
  Buffer<float> q_grad, k_grad, v_grad;
  Buffer<float> score_grad;      // [T, T] of one (sequence, head)
  // LlamaBlock::sandwich_norms: [N, H], o_proj's and down_proj's outputs, then their gradients.
  Buffer<float> sandwich;
  float embed_scale = 1.0f;   // LlamaBlock::scaled_embeddings: sqrt(hidden_size)
  Buffer<float> embed_grad;  // [N, H]: d(h0) times the scale, with scaled embeddings

  // Layer `layer`'s rotary table for a forward whose largest position is max_position.
  const RotaryTables& rotary_for(const ModelConfig& cfg, int layer, long long max_position) const {
    const int table = cfg.layer_rope_table(layer);
    return table == 0 && rope_uses_long(cfg, max_position) ? rope_long : rope[table];
  }
};

// Greedy decoding's scratch arrays (CpuModelBase::scratch): a norm's state and output, q, k, v, the
// attention context, the mid-block residual, SwiGLU's gate and up, scores of a row, a row's rotary
// cos and sin.
// With sandwich norms, kOut holds o_proj's and down_proj's outputs before their norms.
enum DecodeScratch { kXhat, kRstd, kNorm, kQ, kK, kV, kContext, kMid, kGate, kUp, kScores, kCos, kSin, kOut };

// What block_forward and block_backward of one call share: the layer's saved activations, the
// block's offsets, the attention's shape, the rows (B * T) and the widths: hidden, MLP, head, and the
// q and k (= v) rows (the attention shape's q_ld and kv_ld).
struct BlockCall {
  BlockActivations& a;
  const BlockOffsets& o;
  AttentionShape shape;
  int N, H, F, d, QW, KVW;
  const RotaryTables& rope;  // the layer's rotary table (LongRoPE's long factors' past the original context)
};

class LlamaCpu final : public model_detail::CpuModelBase {
 public:
  LlamaCpu(const ModelConfig& cfg, int max_batch, int max_seq, const LlamaBlock& block);

  // Scaled embeddings (LlamaBlock::scaled_embeddings): the base's lookup times the scale, and its backward.
  void embed_forward(CpuParams root, const int32_t* tokens, int B, int T, float* h0) override;
  void embed_backward(CpuParams root, const int32_t* tokens, const float* dh0, UnitGrads droot, int B,
                      int T) override;
  void block_forward(int layer, CpuParams p, const float* h_in, float* h_out, int B, int T) override;
  void block_backward(int layer, CpuParams p, const float* dh_out, float* dh_in, UnitGrads g, int B,
                      int T) override;
  size_t backward_tail_begin() const override { return tail_begin_; }
  void decode_begin(int slots, int max_len, int max_rows) override;
  void block_decode(int layer, CpuParams p, const float* h_in, float* h_out, int n, const int* slots,
                    const int* positions) override;

 private:
  // Forward: begins the layer's step, backward: checks it (CpuModelBase::enter_block); then what both share.
  BlockCall block_call(int layer, int B, int T, bool forward);

  State m_;
  size_t tail_begin_ = 0;  // llama_backward_tail_begin
};

}  // namespace

LlamaCpu::LlamaCpu(const ModelConfig& cfg, int max_batch, int max_seq, const LlamaBlock& options)
    : CpuModelBase("LlamaCpu", cfg, max_batch, max_seq) {
  const std::vector<UnitLayout> layout = llama_layout(cfg, options);  // also validates the config
  State& m = m_;
  if (cfg.num_layers > 0) {
    m.block = block_offsets(layout[1], cfg.rms_norm_eps, options);
    tail_begin_ = llama_backward_tail_begin(layout[1], m.block);
  }

  m.rope_scale = rope_attention_factor(cfg);
  m.rope.resize(cfg.rope_tables());
  for (int table = 0; table < cfg.rope_tables(); ++table) m.rope[table].build(rope_inv_freq(cfg, table), m.rope_scale, max_seq);
  if (cfg.longrope.enabled()) m.rope_long.build(rope_inv_freq(cfg, 0, true), m.rope_scale, max_seq);
  m.lora_slots = llama_lora_slots(cfg, options);

  const size_t H = cfg.hidden_size, heads = cfg.num_heads, F = cfg.ffn_size();
  const size_t QW = heads * cfg.head_dim(), KVW = static_cast<size_t>(cfg.kv_heads()) * cfg.head_dim();
  const size_t tokens = static_cast<size_t>(max_batch) * max_seq;
  // embed_tokens; the final RMSNorm, then lm_head (or embed_tokens when tied).
  const LlamaRootOffsets root = llama_root_offsets(layout[0], cfg.tie_word_embeddings);
  build_ends(root.embeddings, nullptr,
             CpuNorm{CpuNorm::Kind::Rms, root.norm, 0, cfg.rms_norm_eps, options.unit_offset_norms ? 1.0f : 0.0f},
             root.head);
  m.embed_scale = llama_embed_scale(cfg, options);
  if (options.scaled_embeddings) allocate_activations(m.embed_grad, tokens * H);
  m.layers.resize(cfg.num_layers);
  for (BlockActivations& a : m.layers) {
    allocate_activations(a.norm1_xhat, tokens * H);
    allocate_activations(a.norm1_rstd, tokens);
    allocate_activations(a.q, tokens * QW);
    allocate_activations(a.k, tokens * KVW);
    allocate_activations(a.v, tokens * KVW);
    if (options.qk_norm) {
      allocate_activations(a.q_xhat, tokens * QW);
      allocate_activations(a.q_rstd, tokens * heads);
      allocate_activations(a.k_xhat, tokens * KVW);
      allocate_activations(a.k_rstd, tokens * cfg.kv_heads());
    }
    allocate_activations(a.probs, tokens * heads * max_seq);
    allocate_activations(a.context, tokens * QW);
    allocate_activations(a.norm2_xhat, tokens * H);
    allocate_activations(a.norm2_rstd, tokens);
    allocate_activations(a.gate, tokens * F);
    allocate_activations(a.up, tokens * F);
    if (options.sandwich_norms) {
      allocate_activations(a.norm3_xhat, tokens * H);
      allocate_activations(a.norm3_rstd, tokens);
      allocate_activations(a.norm4_xhat, tokens * H);
      allocate_activations(a.norm4_rstd, tokens);
    }
  }
  if (cfg.num_layers > 0) {
    // hidden_work[1] also holds d(context), [N, QW]: wider than H where head_dim is not H / heads.
    allocate_activations(m.hidden_work[0], tokens * H);
    allocate_activations(m.hidden_work[1], tokens * std::max(H, QW));
    for (Buffer<float>& w : m.wide_work) allocate_activations(w, tokens * F);
    allocate_activations(m.q_grad, tokens * QW);
    allocate_activations(m.k_grad, tokens * KVW);
    allocate_activations(m.v_grad, tokens * KVW);
    allocate_activations(m.score_grad, static_cast<size_t>(max_seq) * max_seq);
    if (options.sandwich_norms) allocate_activations(m.sandwich, tokens * H);
  }
}

size_t llama_cpu_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq, const LlamaBlock& block) {
  SHARDLM_CHECK(max_batch >= 0 && max_seq >= 0, "cpu_activation_bytes: negative max_batch ", max_batch,
                " or max_seq ", max_seq);
  // The allocations of the constructor above, buffer by buffer.
  const size_t H = cfg.hidden_size, heads = cfg.num_heads, L = cfg.num_layers;
  const size_t QW = heads * cfg.head_dim(), KVW = static_cast<size_t>(cfg.kv_heads()) * cfg.head_dim();
  const size_t F = cfg.ffn_size(), S = max_seq;
  const size_t tokens = static_cast<size_t>(max_batch) * S;
  size_t per_layer = 2 * (tokens * H + tokens) + 2 * tokens * QW + 2 * tokens * KVW + tokens * heads * S +
                     2 * tokens * F;
  if (block.qk_norm) per_layer += tokens * (QW + heads + KVW + cfg.kv_heads());
  if (block.sandwich_norms) per_layer += 2 * (tokens * H + tokens);
  size_t floats = L * per_layer;
  if (L > 0) floats += tokens * (H + std::max(H, QW)) + 2 * tokens * F + tokens * QW + 2 * tokens * KVW + S * S;
  if (L > 0 && block.sandwich_norms) floats += tokens * H;
  if (block.scaled_embeddings) floats += tokens * H;
  return floats * sizeof(float) + model_detail::cpu_shared_bytes(cfg, false, max_batch, max_seq);
}

// ---- decoder layer --------------------------------------------------------------------------

BlockCall LlamaCpu::block_call(int layer, int B, int T, bool forward) {
  enter_block(layer, B, T, forward);
  AttentionShape shape = grouped_heads(B, T, cfg_, layer);
  shape.starts = starts_;
  return {m_.layers[layer], m_.block, shape, B * T, cfg_.hidden_size, cfg_.ffn_size(), cfg_.head_dim(), shape.q_ld,
          shape.kv_ld, m_.rotary_for(cfg_, layer, T - 1)};
}

void LlamaCpu::embed_forward(CpuParams root, const int32_t* tokens, int B, int T, float* h0) {
  CpuModelBase::embed_forward(root, tokens, B, T, h0);
  if (m_.embed_scale == 1.0f) return;
  const size_t n = static_cast<size_t>(B) * T * cfg_.hidden_size;
  for (size_t i = 0; i < n; ++i) h0[i] *= m_.embed_scale;
}

void LlamaCpu::embed_backward(CpuParams root, const int32_t* tokens, const float* dh0, UnitGrads droot, int B, int T) {
  if (m_.embed_scale == 1.0f) return CpuModelBase::embed_backward(root, tokens, dh0, droot, B, T);
  check_shape("embed_backward", B, T);
  const size_t n = static_cast<size_t>(B) * T * cfg_.hidden_size;
  float* scaled = m_.embed_grad.data();
  for (size_t i = 0; i < n; ++i) scaled[i] = dh0[i] * m_.embed_scale;
  CpuModelBase::embed_backward(root, tokens, scaled, droot, B, T);
}

void LlamaCpu::block_forward(int layer, CpuParams p, const float* h_in, float* h_out, int B, int T) {
  State& m = m_;
  const auto [a, o, shape, N, H, F, d, QW, KVW, rope] = block_call(layer, B, T, true);
  if (N == 0) return;
  const float* params = p.base;
  float* normed = m.hidden_work[1].data();
  // The LoRA terms of projections of input x, when adapted.
  auto lora = [&](const float* x, std::initializer_list<std::pair<Module, model_detail::LoraOutput>> outputs) {
    for (const auto& [module, parts] : lora_calls(m.lora_slots, outputs))
      lora_.forward(layer, module, p.adapter, x, N, T, parts);
  };
  const int rot = cfg_.rotary_dim();

  // Attention: x = h + o_proj(attention(rotary(q), rotary(k), v)) of the normed input.
  o.input_norm_rows.forward_rows(params, h_in, N, H, a.norm1_xhat.data(), a.norm1_rstd.data(), normed);
  linear(normed, N, H, params + o.q, o.bias(params, o.q_bias), QW, nullptr, a.q.data());
  linear(normed, N, H, params + o.k, o.bias(params, o.k_bias), KVW, nullptr, a.k.data());
  linear(normed, N, H, params + o.v, o.bias(params, o.v_bias), KVW, nullptr, a.v.data());
  lora(normed, {{kQProj, {a.q.data(), QW}}, {kKProj, {a.k.data(), KVW}}, {kVProj, {a.v.data(), KVW}}});
  if (o.qk_norm) {  // Qwen3: each head of q and k RMSNormed before rotary
    norm_heads_forward(o.q_norm_heads, params, a.q.data(), N, shape.heads, d, a.q_xhat.data(), a.q_rstd.data());
    norm_heads_forward(o.k_norm_heads, params, a.k.data(), N, shape.kv_heads, d, a.k_xhat.data(), a.k_rstd.data());
  }
  apply_rotary(a.q.data(), B, T, shape.heads, d, rot, QW, rope.cos.data(), rope.sin.data(), false, shape.starts);
  apply_rotary(a.k.data(), B, T, shape.kv_heads, d, rot, KVW, rope.cos.data(), rope.sin.data(), false, shape.starts);
  model_detail::attention_forward(shape, a.q.data(), a.k.data(), a.v.data(), a.probs.data(), a.context.data());
  float* x = m.hidden_work[0].data();
  if (o.sandwich_norms) {  // Gemma 3: x = h + RMSNorm(o_proj(...))
    float* out = m.sandwich.data();
    linear(a.context.data(), N, QW, params + o.o, nullptr, H, nullptr, out);
    lora(a.context.data(), {{kOProj, {out, H}}});
    add_normed(o.attn_out_norm_rows, params, h_in, out, N, H, a.norm3_xhat.data(), a.norm3_rstd.data(), normed, x);
  } else {
    linear(a.context.data(), N, QW, params + o.o, nullptr, H, h_in, x);
    lora(a.context.data(), {{kOProj, {x, H}}});
  }

  // MLP: out = x + down_proj(silu(gate_proj(n)) * up_proj(n)), n = RMSNorm(x) (GeGLU: gelu_tanh for silu;
  // sandwich norms: down_proj's output normed before the add).
  o.post_norm_rows.forward_rows(params, x, N, H, a.norm2_xhat.data(), a.norm2_rstd.data(), normed);
  linear(normed, N, H, params + o.gate, nullptr, F, nullptr, a.gate.data());
  linear(normed, N, H, params + o.up, nullptr, F, nullptr, a.up.data());
  lora(normed, {{kGateProj, {a.gate.data(), F}}, {kUpProj, {a.up.data(), F}}});
  float* act = m.wide_work[0].data();
  const size_t wide = static_cast<size_t>(N) * F;
  for (size_t i = 0; i < wide; ++i) act[i] = gated(o.gelu_tanh, a.gate[i], a.up[i]);
  if (o.sandwich_norms) {
    float* out = m.sandwich.data();
    linear(act, N, F, params + o.down, nullptr, H, nullptr, out);
    lora(act, {{kDownProj, {out, H}}});
    add_normed(o.mlp_out_norm_rows, params, x, out, N, H, a.norm4_xhat.data(), a.norm4_rstd.data(), normed, h_out);
  } else {
    linear(act, N, F, params + o.down, nullptr, H, x, h_out);
    lora(act, {{kDownProj, {h_out, H}}});
  }
}

void LlamaCpu::block_backward(int layer, CpuParams p, const float* dh_out, float* dh_in, UnitGrads g, int B,
                              int T) {
  State& m = m_;
  const auto [a, o, shape, N, H, F, d, QW, KVW, rope] = block_call(layer, B, T, false);
  if (N == 0) return;
  const float* params = p.base;
  float* dx = m.hidden_work[0].data();
  float* work = m.hidden_work[1].data();  // a norm's output, then its gradient; d(context)
  float* dgate = m.wide_work[0].data();      // SiLU(gate) * up first (for d(down_proj))
  float* dup = m.wide_work[1].data();        // d(SiLU(gate) * up) first
  // A linear layer's parameter gradients (the base's unless frozen), then its input gradient (=, or += with
  // accumulate).
  auto param_backward = [&](const float* x, const float* dy, int in, int out, size_t w, float* dbias) {
    linear_param_backward(x, dy, N, in, out, g.base_at(w), dbias);
  };
  auto input_backward = [&](const float* dy, int in, size_t w, int out, bool accumulate, float* dxin) {
    linear_input_backward(dy, N, in, params + w, out, accumulate, dxin);
  };
  // The adapters' parameter gradients of projections of input x, when adapted (before x is overwritten),
  // then (lora_input) their terms of the input gradient, added into dxin.
  auto lora_params = [&](const float* x, std::initializer_list<std::pair<Module, model_detail::LoraOutputGrad>> dys) {
    for (const auto& [module, parts] : lora_calls(m.lora_slots, dys))
      lora_.param_backward(layer, module, p.adapter, x, parts, N, T, g.adapter);
  };
  auto lora_input = [&](std::initializer_list<std::pair<Module, int>> projections, float* dxin) {
    for (const auto& [module, unused] : lora_calls(m.lora_slots, projections))
      lora_.input_backward(layer, module, p.adapter, N, T, dxin);
  };
  auto bias_grad = [&](size_t offset) { return g.base ? o.bias(g.base, offset) : nullptr; };
  const int rot = cfg_.rotary_dim();

  // Sandwich norms: the gradient of down_proj's output (of o_proj's below) through the norm after it, into
  // m.sandwich; without them the block's output gradient itself.
  auto branch_grad = [&](const CpuNorm& norm, const float* dy, const Buffer<float>& xhat, const Buffer<float>& rstd) {
    if (!o.sandwich_norms) return dy;
    float* dout = m.sandwich.data();
    std::fill(dout, dout + static_cast<size_t>(N) * H, 0.0f);
    norm.backward_rows(params, dy, xhat.data(), rstd.data(), N, H, dout, g.base);
    return static_cast<const float*>(dout);
  };
  const float* dmlp = branch_grad(o.mlp_out_norm_rows, dh_out, a.norm4_xhat, a.norm4_rstd);

  // MLP.
  const size_t wide = static_cast<size_t>(N) * F;
  for (size_t i = 0; i < wide; ++i) dgate[i] = gated(o.gelu_tanh, a.gate[i], a.up[i]);
  param_backward(dgate, dmlp, F, H, o.down, nullptr);
  lora_params(dgate, {{kDownProj, {dmlp, H}}});
  input_backward(dmlp, F, o.down, H, false, dup);
  lora_input({{kDownProj, 0}}, dup);
  for (size_t i = 0; i < wide; ++i) {
    const float gt = a.gate[i], dact = dup[i];
    dup[i] = dact * gated(o.gelu_tanh, gt, 1.0f);         // d(up) = dact * act(gate)
    dgate[i] = dact * a.up[i] * gated_grad(o.gelu_tanh, gt);  // d(gate) = dact * up * act'(gate)
  }
  rms_norm_output(a.norm2_xhat.data(), N, H, o.post_norm_rows, params, work);
  param_backward(work, dgate, H, F, o.gate, nullptr);
  param_backward(work, dup, H, F, o.up, nullptr);
  lora_params(work, {{kGateProj, {dgate, F}}, {kUpProj, {dup, F}}});
  input_backward(dgate, H, o.gate, F, false, work);
  input_backward(dup, H, o.up, F, true, work);
  lora_input({{kGateProj, 0}, {kUpProj, 0}}, work);
  // out = x + mlp(RMSNorm(x)): the residual passes dh_out straight through.
  std::memcpy(dx, dh_out, sizeof(float) * N * H);
  o.post_norm_rows.backward_rows(params, work, a.norm2_xhat.data(), a.norm2_rstd.data(), N, H, dx, g.base);
  backward_tail_done();  // from tail_begin_ on the unit's gradients are final

  // Attention: o_proj (after the norm of its output with sandwich norms), attention itself, rotary (its
  // transpose), then the q/k/v projections.
  const float* dattn = branch_grad(o.attn_out_norm_rows, dx, a.norm3_xhat, a.norm3_rstd);
  param_backward(a.context.data(), dattn, QW, H, o.o, nullptr);
  lora_params(a.context.data(), {{kOProj, {dattn, H}}});
  input_backward(dattn, QW, o.o, H, false, work);
  lora_input({{kOProj, 0}}, work);
  model_detail::attention_backward(shape, a.q.data(), a.k.data(), a.v.data(), a.probs.data(), work,
                                   m.score_grad.data(), m.q_grad.data(), m.k_grad.data(), m.v_grad.data());
  apply_rotary(m.q_grad.data(), B, T, shape.heads, d, rot, QW, rope.cos.data(), rope.sin.data(), true, shape.starts);
  apply_rotary(m.k_grad.data(), B, T, shape.kv_heads, d, rot, KVW, rope.cos.data(), rope.sin.data(), true,
               shape.starts);
  if (o.qk_norm) {
    norm_heads_backward(o.q_norm_heads, params, m.q_grad.data(), a.q_xhat.data(), a.q_rstd.data(), N, shape.heads, d,
                        g.base);
    norm_heads_backward(o.k_norm_heads, params, m.k_grad.data(), a.k_xhat.data(), a.k_rstd.data(), N,
                        shape.kv_heads, d, g.base);
  }
  rms_norm_output(a.norm1_xhat.data(), N, H, o.input_norm_rows, params, work);
  param_backward(work, m.q_grad.data(), H, QW, o.q, bias_grad(o.q_bias));
  param_backward(work, m.k_grad.data(), H, KVW, o.k, bias_grad(o.k_bias));
  param_backward(work, m.v_grad.data(), H, KVW, o.v, bias_grad(o.v_bias));
  lora_params(work, {{kQProj, {m.q_grad.data(), QW}}, {kKProj, {m.k_grad.data(), KVW}},
                     {kVProj, {m.v_grad.data(), KVW}}});
  input_backward(m.q_grad.data(), H, o.q, QW, false, work);
  input_backward(m.k_grad.data(), H, o.k, KVW, true, work);
  input_backward(m.v_grad.data(), H, o.v, KVW, true, work);
  lora_input({{kQProj, 0}, {kKProj, 0}, {kVProj, 0}}, work);
  // x = h_in + attention(RMSNorm(h_in)).
  std::memcpy(dh_in, dx, sizeof(float) * N * H);
  o.input_norm_rows.backward_rows(params, work, a.norm1_xhat.data(), a.norm1_rstd.data(), N, H, dh_in, g.base);
}

// ---- greedy decoding with a key/value cache ------------------------------------------------

void LlamaCpu::decode_begin(int slots, int max_len, int max_rows) {
  const size_t H = cfg_.hidden_size, F = cfg_.ffn_size(), rows = std::max(max_rows, 0), d = cfg_.head_dim();
  const size_t QW = cfg_.num_heads * d, KVW = cfg_.kv_heads() * d, half = m_.rope[0].inv_freq.size();
  // The norm state also serves the per-head q/k norms: rows x heads vectors of d.
  begin_decoding(slots, max_len, max_rows, cfg_.kv_heads(),
                 {rows * std::max(H, QW), rows * std::max<size_t>(1, cfg_.num_heads), rows * H, rows * QW, rows * KVW,
                  rows * KVW, rows * QW, rows * H, rows * F, rows * F, static_cast<size_t>(std::max(max_len, 0)), half,
                  half, m_.block.sandwich_norms ? rows * H : 0});
}

void LlamaCpu::block_decode(int layer, CpuParams p, const float* h_in, float* h_out, int n,
                            const int* slots, const int* positions) {
  check_decode_rows(layer, n, slots, positions);
  if (n == 0) return;
  const float* params = p.base;
  auto lora = [&](const float* x, std::initializer_list<std::pair<Module, model_detail::LoraOutput>> outputs) {
    for (const auto& [module, parts] : lora_calls(m_.lora_slots, outputs)) lora_.decode_forward(module, p.adapter, x, n, parts);
  };
  const BlockOffsets& o = m_.block;
  const int H = cfg_.hidden_size, F = cfg_.ffn_size(), d = cfg_.head_dim();
  const AttentionShape shape = grouped_heads(n, 1, cfg_, layer);
  const int QW = shape.q_ld, KVW = shape.kv_ld;
  float* normed = scratch(kNorm);
  float* q = scratch(kQ);
  float* k = scratch(kK);
  float* v = scratch(kV);
  float* cos_row = scratch(kCos);
  float* sin_row = scratch(kSin);

  o.input_norm_rows.forward_rows(params, h_in, n, H, scratch(kXhat), scratch(kRstd), normed);
  linear(normed, n, H, params + o.q, o.bias(params, o.q_bias), QW, nullptr, q);
  linear(normed, n, H, params + o.k, o.bias(params, o.k_bias), KVW, nullptr, k);
  linear(normed, n, H, params + o.v, o.bias(params, o.v_bias), KVW, nullptr, v);
  lora(normed, {{kQProj, {q, QW}}, {kKProj, {k, KVW}}, {kVProj, {v, KVW}}});
  if (o.qk_norm) {
    norm_heads_forward(o.q_norm_heads, params, q, n, shape.heads, d, scratch(kXhat), scratch(kRstd));
    norm_heads_forward(o.k_norm_heads, params, k, n, shape.kv_heads, d, scratch(kXhat), scratch(kRstd));
  }
  // Rotary at each row's own position (the angle formed in fp32 as block_forward's tables are); LongRoPE's
  // factors by the largest position of the row's sequence in this step, as transformers' forward of it picks them.
  const int rot = cfg_.rotary_dim();
  for (int r = 0; r < n; ++r) {
    const RotaryTables& rope = m_.rotary_for(cfg_, layer, rope_step_max_position(slots, positions, n, r));
    rotary_angles(positions[r], rope.inv_freq, m_.rope_scale, cos_row, sin_row);
    apply_rotary(q + static_cast<size_t>(r) * QW, 1, 1, shape.heads, d, rot, QW, cos_row, sin_row, false);
    apply_rotary(k + static_cast<size_t>(r) * KVW, 1, 1, shape.kv_heads, d, rot, KVW, cos_row, sin_row, false);
  }
  model_detail::cached_attention_rows(cache(), layer, shape, q, k, v, n, slots, positions, scratch(kScores),
                                      scratch(kContext));
  float* x = scratch(kMid);
  if (o.sandwich_norms) {
    float* out = scratch(kOut);
    linear(scratch(kContext), n, QW, params + o.o, nullptr, H, nullptr, out);
    lora(scratch(kContext), {{kOProj, {out, H}}});
    add_normed(o.attn_out_norm_rows, params, h_in, out, n, H, scratch(kXhat), scratch(kRstd), normed, x);
  } else {
    linear(scratch(kContext), n, QW, params + o.o, nullptr, H, h_in, x);
    lora(scratch(kContext), {{kOProj, {x, H}}});
  }

  o.post_norm_rows.forward_rows(params, x, n, H, scratch(kXhat), scratch(kRstd), normed);
  float* gate = scratch(kGate);
  float* up = scratch(kUp);
  linear(normed, n, H, params + o.gate, nullptr, F, nullptr, gate);
  linear(normed, n, H, params + o.up, nullptr, F, nullptr, up);
  lora(normed, {{kGateProj, {gate, F}}, {kUpProj, {up, F}}});
  const size_t wide = static_cast<size_t>(n) * F;
  for (size_t i = 0; i < wide; ++i) gate[i] = gated(o.gelu_tanh, gate[i], up[i]);
  if (o.sandwich_norms) {
    float* out = scratch(kOut);
    linear(gate, n, F, params + o.down, nullptr, H, nullptr, out);
    lora(gate, {{kDownProj, {out, H}}});
    add_normed(o.mlp_out_norm_rows, params, x, out, n, H, scratch(kXhat), scratch(kRstd), normed, h_out);
  } else {
    linear(gate, n, F, params + o.down, nullptr, H, x, h_out);
    lora(gate, {{kDownProj, {h_out, H}}});
  }
}

std::unique_ptr<CpuModel> make_llama_cpu(const ModelConfig& cfg, int max_batch, int max_seq, const LlamaBlock& block) {
  return std::make_unique<LlamaCpu>(cfg, max_batch, max_seq, block);
}

}  // namespace shardlm

// LlamaCpu: fp32 forward and backward of Llama's embedding, decoder layers (RMSNorm, rotary
// grouped-query attention, SwiGLU MLP) and LM head on the CPU. Every matrix product goes through
// cpu_gemm; the element-wise parts (RMSNorm, rotary, softmax, SiLU) are loops.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "shardlm/device.hpp"
#include "model_internal.hpp"
#include "shardlm/model.hpp"

namespace shardlm {
namespace {

// Logits of at most this many tokens exist at once (Llama 3 has 128,256 entries).
constexpr int kHeadChunkTokens = 128;

// Where each tensor starts inside the root unit's flat parameter.
struct RootOffsets {
  size_t embeddings = 0, final_norm = 0;
  size_t head = 0;  // lm_head.weight, or embed_tokens.weight when tied
};

// Where each tensor starts inside a block unit's flat parameter (the same for every block).
struct BlockOffsets {
  size_t input_norm = 0, q = 0, k = 0, v = 0, o = 0, post_norm = 0, gate = 0, up = 0, down = 0;
};

size_t offset_of(const UnitLayout& unit, const std::string& name) {
  for (const TensorSpec& t : unit.tensors)
    if (t.name == name) return t.offset;
  throw Error(concat("Llama layout: unit ", unit.name, " has no tensor ", name));
}

// Offsets come from llama_layout itself so the kernels can never disagree with the layout.
RootOffsets root_offsets(const UnitLayout& root, bool tied) {
  RootOffsets o;
  o.embeddings = offset_of(root, "embed_tokens.weight");
  o.final_norm = offset_of(root, "norm.weight");
  o.head = tied ? o.embeddings : offset_of(root, "lm_head.weight");
  return o;
}

BlockOffsets block_offsets(const UnitLayout& block) {
  const std::string p = block.name + ".";
  BlockOffsets o;
  o.input_norm = offset_of(block, p + "input_layernorm.weight");
  o.q = offset_of(block, p + "self_attn.q_proj.weight");
  o.k = offset_of(block, p + "self_attn.k_proj.weight");
  o.v = offset_of(block, p + "self_attn.v_proj.weight");
  o.o = offset_of(block, p + "self_attn.o_proj.weight");
  o.post_norm = offset_of(block, p + "post_attention_layernorm.weight");
  o.gate = offset_of(block, p + "mlp.gate_proj.weight");
  o.up = offset_of(block, p + "mlp.up_proj.weight");
  o.down = offset_of(block, p + "mlp.down_proj.weight");
  return o;
}

// ---- RMSNorm --------------------------------------------------------------------------------

// One row: y = xhat * weight with xhat = x * rstd, rstd = 1 / sqrt(mean(x^2) + eps); keeps xhat and rstd.
void rms_norm_row(const float* x, int H, const float* weight, float eps, float* xhat, float* rstd, float* y) {
  // The mean square in double: rows of large activations lose digits in a float sum.
  double squares = 0.0;
  for (int c = 0; c < H; ++c) squares += static_cast<double>(x[c]) * x[c];
  const float inv_rms = static_cast<float>(1.0 / std::sqrt(squares / H + eps));
  *rstd = inv_rms;
  for (int c = 0; c < H; ++c) {
    xhat[c] = x[c] * inv_rms;
    y[c] = xhat[c] * weight[c];
  }
}

void rms_norm_rows(const float* x, int rows, int H, const float* weight, float eps, float* xhat, float* rstd,
                   float* y) {
  for (int r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * H;
    rms_norm_row(x + at, H, weight, eps, xhat + at, rstd + r, y + at);
  }
}

// y = xhat * weight again from the saved xhat (cheaper to rebuild than to keep for backward).
void rms_norm_output(const float* xhat, int rows, int H, const float* weight, float* y) {
  for (int r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * H;
    for (int c = 0; c < H; ++c) y[at + c] = xhat[at + c] * weight[c];
  }
}

// One row's backward: dx (+)= rstd * (g - xhat * mean(g * xhat)) with g = dy * weight; dweight += dy * xhat.
void rms_norm_backward_row(const float* dy, const float* xhat, float rstd, int H, const float* weight, float* dx,
                           bool accumulate, float* dweight) {
  float sum_g_xhat = 0.0f;
  for (int c = 0; c < H; ++c) {
    sum_g_xhat += dy[c] * weight[c] * xhat[c];
    dweight[c] += dy[c] * xhat[c];
  }
  const float mean_g_xhat = sum_g_xhat / H;
  for (int c = 0; c < H; ++c) {
    const float d = rstd * (dy[c] * weight[c] - xhat[c] * mean_g_xhat);
    dx[c] = accumulate ? dx[c] + d : d;
  }
}

void rms_norm_backward_rows(const float* dy, const float* xhat, const float* rstd, int rows, int H,
                            const float* weight, float* dx, float* dweight) {
  for (int r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * H;
    rms_norm_backward_row(dy + at, xhat + at, rstd[r], H, weight, dx + at, true, dweight);
  }
}

// ---- rotary embeddings ----------------------------------------------------------------------

// transformers' rotate_half convention: element i pairs with i + d/2, both rotated by angle
// pos * inv_freq[i]. `inverse` applies the transposed rotation (the backward of the forward one).
// x is [B*T rows of `heads` heads of d], row stride ld; cos/sin tables are [pos, d/2].
void apply_rotary(float* x, int B, int T, int heads, int d, int ld, const float* cos_table, const float* sin_table,
                  bool inverse) {
  const int half = d / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* row = x + (static_cast<size_t>(b) * T + t) * ld;
      const float* cs = cos_table + static_cast<size_t>(t) * half;
      const float* sn = sin_table + static_cast<size_t>(t) * half;
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

// ---- causal grouped-query attention ---------------------------------------------------------

// The shape of one attention call: q and context rows hold num_heads heads, k and v rows kv_heads.
struct AttentionShape {
  int batch, seq, num_heads, kv_heads, head_dim;
  int q_width() const { return num_heads * head_dim; }
  int kv_width() const { return kv_heads * head_dim; }
  // Query head n reads key/value head n / (num_heads / kv_heads).
  int kv_head_of(int n) const { return n / (num_heads / kv_heads); }
  size_t q_at(int b, int n) const { return static_cast<size_t>(b) * seq * q_width() + static_cast<size_t>(n) * head_dim; }
  size_t kv_at(int b, int g) const {
    return static_cast<size_t>(b) * seq * kv_width() + static_cast<size_t>(g) * head_dim;
  }
  size_t probs_at(int b, int n) const {
    return (static_cast<size_t>(b) * num_heads + n) * static_cast<size_t>(seq) * seq;
  }
};

// probs[b,n] = softmax_j(q_i.k_j / sqrt(d)) over j <= i; context[b, :, head n] = probs V.
void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* probs,
                       float* context) {
  const int T = s.seq, d = s.head_dim, lq = s.q_width(), lkv = s.kv_width();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int b = 0; b < s.batch; ++b) {
    for (int n = 0; n < s.num_heads; ++n) {
      const int g = s.kv_head_of(n);
      float* p = probs + s.probs_at(b, n);
      cpu_gemm(false, true, T, T, d, scale, q + s.q_at(b, n), lq, k + s.kv_at(b, g), lkv, 0.0f, p, T);
      for (int i = 0; i < T; ++i) {
        float* row = p + static_cast<size_t>(i) * T;
        const float max_score = *std::max_element(row, row + i + 1);
        float total = 0.0f;
        for (int j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - max_score);
          total += row[j];
        }
        const float inv_total = 1.0f / total;
        for (int j = 0; j <= i; ++j) row[j] *= inv_total;
        for (int j = i + 1; j < T; ++j) row[j] = 0.0f;  // causal mask
      }
      cpu_gemm(false, false, T, d, T, 1.0f, p, T, v + s.kv_at(b, g), lkv, 0.0f, context + s.q_at(b, n), lq);
    }
  }
}

// dq (overwritten), dk and dv (overwritten; summed over the query heads sharing each kv head) from
// dcontext, through P V, the softmax and the scaled Q K^T. dscores is [T, T].
void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* probs,
                        const float* dcontext, float* dscores, float* dq, float* dk, float* dv) {
  const int T = s.seq, d = s.head_dim, lq = s.q_width(), lkv = s.kv_width();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const size_t kv_numel = static_cast<size_t>(s.batch) * T * lkv;
  std::memset(dk, 0, sizeof(float) * kv_numel);
  std::memset(dv, 0, sizeof(float) * kv_numel);
  for (int b = 0; b < s.batch; ++b) {
    for (int n = 0; n < s.num_heads; ++n) {
      const int g = s.kv_head_of(n);
      const float* qn = q + s.q_at(b, n);
      const float* kg = k + s.kv_at(b, g);
      const float* vg = v + s.kv_at(b, g);
      const float* p = probs + s.probs_at(b, n);
      const float* dctx = dcontext + s.q_at(b, n);
      // dP = dctx V^T, dV += P^T dctx.
      cpu_gemm(false, true, T, T, d, 1.0f, dctx, lq, vg, lkv, 0.0f, dscores, T);
      cpu_gemm(true, false, T, d, T, 1.0f, p, T, dctx, lq, 1.0f, dv + s.kv_at(b, g), lkv);
      // Softmax backward in place: dS = P * (dP - sum_j P dP); masked entries have P = 0.
      for (int i = 0; i < T; ++i) {
        const float* prow = p + static_cast<size_t>(i) * T;
        float* row = dscores + static_cast<size_t>(i) * T;
        float dot = 0.0f;
        for (int j = 0; j <= i; ++j) dot += prow[j] * row[j];
        for (int j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot);
        for (int j = i + 1; j < T; ++j) row[j] = 0.0f;
      }
      // S = scale * Q K^T: dQ = scale * dS K, dK += scale * dS^T Q.
      cpu_gemm(false, false, T, d, T, scale, dscores, T, kg, lkv, 0.0f, dq + s.q_at(b, n), lq);
      cpu_gemm(true, false, T, d, T, scale, dscores, T, qn, lq, 1.0f, dk + s.kv_at(b, g), lkv);
    }
  }
}

// ---- linear layers and SiLU -----------------------------------------------------------------

// y[rows, out] (=|+=) x[rows, in] W^T with W stored [out, in].
void linear(const float* x, int rows, int in, const float* weight, int out, bool accumulate, float* y) {
  cpu_gemm(false, true, rows, out, in, 1.0f, x, in, weight, in, accumulate ? 1.0f : 0.0f, y, out);
}

// dW[out, in] += dy^T x.
void linear_weight_backward(const float* x, const float* dy, int rows, int in, int out, float* dweight) {
  cpu_gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dweight, in);
}

// dx[rows, in] (=|+=) dy W.
void linear_input_backward(const float* dy, int rows, int in, const float* weight, int out, bool accumulate,
                           float* dx) {
  cpu_gemm(false, false, rows, in, out, 1.0f, dy, out, weight, in, accumulate ? 1.0f : 0.0f, dx, in);
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// ---- saved state ----------------------------------------------------------------------------

// What one block's forward keeps for its backward, sized for the largest micro-batch.
struct BlockActivations {
  Buffer<float> norm1_xhat, norm1_rstd;  // input RMSNorm (its output is rebuilt from xhat)
  Buffer<float> q, k, v;                 // projections, q and k after rotary: [N, nh*d], [N, nkv*d]
  Buffer<float> probs;                   // attention probabilities [B, heads, T, T]
  Buffer<float> context;                 // attention output before o_proj [N, nh*d]
  Buffer<float> norm2_xhat, norm2_rstd;  // post-attention RMSNorm
  Buffer<float> gate, up;                // [N, F]: gate_proj and up_proj outputs
  int batch = -1, seq = -1;              // shape of the forward these belong to
};

void check_tokens(const int32_t* tokens, size_t n, int vocab_size, const char* what) {
  for (size_t i = 0; i < n; ++i)
    SHARDLM_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size, "LlamaCpu::", what, ": token id ", tokens[i],
                  " at position ", i, " is outside the vocabulary [0, ", vocab_size, ")");
}

}  // namespace

struct LlamaCpu::Impl {
  int max_batch = 0, max_seq = 0;
  RootOffsets root;
  BlockOffsets block;
  std::vector<float> rope_cos, rope_sin;  // [max_seq, head_dim / 2]

  int embed_batch = -1, embed_seq = -1;
  std::vector<BlockActivations> layers;

  // Workspaces shared by every layer (only one forward or backward runs at a time).
  Buffer<float> hidden_work[2];  // [N, H]: the mid-block residual; in backward dx, and norm output / grads
  Buffer<float> wide_work[2];    // [N, F]: SiLU(gate) * up; in backward d(gate), d(up)
  Buffer<float> q_grad, k_grad, v_grad;
  Buffer<float> score_grad;      // [T, T] of one (sequence, head)

  // LM head over one chunk of tokens with a target.
  Buffer<int32_t> head_rows;  // positions of the chunk's tokens
  Buffer<float> head_xhat, head_rstd, head_out, head_grad, logits;

  // Greedy decoding: the key/value cache and per-call scratch, alive between decode_begin and decode_end.
  std::vector<float> inv_freq;  // rotary frequencies; decoding may run past max_seq, so angles are formed per row
  model_detail::KvCache cache;
  int decode_rows = 0;
  std::vector<float> dec_xhat, dec_rstd, dec_norm, dec_q, dec_k, dec_v, dec_context, dec_mid, dec_gate, dec_up;
  std::vector<float> dec_scores, dec_cos, dec_sin;

  void check_shape(const char* what, int B, int T) const {
    SHARDLM_CHECK(B >= 0 && T >= 0 && B <= max_batch && T <= max_seq, "LlamaCpu::", what, ": batch ", B, " x seq ",
                  T, " exceeds the sizes it was built for (", max_batch, " x ", max_seq, ")");
  }
  BlockActivations& layer(const char* what, int index) {
    SHARDLM_CHECK(index >= 0 && index < static_cast<int>(layers.size()), "LlamaCpu::", what, ": layer ", index,
                  " out of range [0, ", layers.size(), ")");
    return layers[index];
  }
};

LlamaCpu::LlamaCpu(const ModelConfig& cfg, int max_batch, int max_seq) : cfg_(cfg), impl_(nullptr) {
  SHARDLM_CHECK(cfg.is_llama(), "LlamaCpu: model.arch is '", cfg.arch, "', not llama");
  SHARDLM_CHECK(max_batch >= 0 && max_seq >= 0, "LlamaCpu: negative max_batch ", max_batch, " or max_seq ",
                max_seq);
  const std::vector<UnitLayout> layout = llama_layout(cfg);  // also validates the config
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.max_batch = max_batch;
  m.max_seq = max_seq;
  m.root = root_offsets(layout[0], cfg.tie_word_embeddings);
  if (cfg.num_layers > 0) m.block = block_offsets(layout[1]);

  // cos and sin of pos * inv_freq, the angle rounded to fp32 as transformers forms it.
  m.inv_freq = rope_inv_freq(cfg);
  const std::vector<float>& inv_freq = m.inv_freq;
  const size_t half = inv_freq.size();
  m.rope_cos.resize(static_cast<size_t>(max_seq) * half);
  m.rope_sin.resize(m.rope_cos.size());
  for (int t = 0; t < max_seq; ++t)
    for (size_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv_freq[i];
      m.rope_cos[t * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      m.rope_sin[t * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }

  const size_t H = cfg.hidden_size, V = cfg.vocab_size, heads = cfg.num_heads, F = cfg.ffn_size();
  const size_t QW = heads * cfg.head_dim(), KVW = static_cast<size_t>(cfg.kv_heads()) * cfg.head_dim();
  const size_t tokens = static_cast<size_t>(max_batch) * max_seq;
  const MemKind kind = MemKind::Activations;
  m.layers.resize(cfg.num_layers);
  for (BlockActivations& a : m.layers) {
    a.norm1_xhat.allocate(tokens * H, kind);
    a.norm1_rstd.allocate(tokens, kind);
    a.q.allocate(tokens * QW, kind);
    a.k.allocate(tokens * KVW, kind);
    a.v.allocate(tokens * KVW, kind);
    a.probs.allocate(tokens * heads * max_seq, kind);
    a.context.allocate(tokens * QW, kind);
    a.norm2_xhat.allocate(tokens * H, kind);
    a.norm2_rstd.allocate(tokens, kind);
    a.gate.allocate(tokens * F, kind);
    a.up.allocate(tokens * F, kind);
  }
  if (cfg.num_layers > 0) {
    // QW == H (head_dim is H / heads), so the [N, H] workspaces also hold d(context).
    for (Buffer<float>& w : m.hidden_work) w.allocate(tokens * H, kind);
    for (Buffer<float>& w : m.wide_work) w.allocate(tokens * F, kind);
    m.q_grad.allocate(tokens * QW, kind);
    m.k_grad.allocate(tokens * KVW, kind);
    m.v_grad.allocate(tokens * KVW, kind);
    m.score_grad.allocate(static_cast<size_t>(max_seq) * max_seq, kind);
  }
  const size_t chunk = std::min<size_t>(kHeadChunkTokens, tokens);
  m.head_rows.allocate(chunk, kind);
  m.head_xhat.allocate(chunk * H, kind);
  m.head_rstd.allocate(chunk, kind);
  m.head_out.allocate(chunk * H, kind);
  m.head_grad.allocate(chunk * H, kind);
  m.logits.allocate(chunk * V, kind);
  impl_ = impl.release();
}

LlamaCpu::~LlamaCpu() { delete impl_; }

size_t llama_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq) {
  SHARDLM_CHECK(max_batch >= 0 && max_seq >= 0, "llama_activation_bytes: negative max_batch ", max_batch,
                " or max_seq ", max_seq);
  // The allocations of the constructor above, buffer by buffer.
  const size_t H = cfg.hidden_size, V = cfg.vocab_size, heads = cfg.num_heads, L = cfg.num_layers;
  const size_t QW = heads * cfg.head_dim(), KVW = static_cast<size_t>(cfg.kv_heads()) * cfg.head_dim();
  const size_t F = cfg.ffn_size(), S = max_seq;
  const size_t tokens = static_cast<size_t>(max_batch) * S;
  const size_t per_layer = 2 * (tokens * H + tokens) + 2 * tokens * QW + 2 * tokens * KVW + tokens * heads * S +
                           2 * tokens * F;
  size_t floats = L * per_layer;
  if (L > 0) floats += 2 * tokens * H + 2 * tokens * F + tokens * QW + 2 * tokens * KVW + S * S;
  const size_t chunk = std::min<size_t>(kHeadChunkTokens, tokens);
  floats += 3 * chunk * H + chunk + chunk * V;
  return floats * sizeof(float) + chunk * sizeof(int32_t);
}

size_t LlamaCpu::activation_bytes() const {
  const Impl& m = *impl_;
  size_t floats = m.q_grad.size() + m.k_grad.size() + m.v_grad.size() + m.score_grad.size();
  for (const BlockActivations& a : m.layers)
    floats += a.norm1_xhat.size() + a.norm1_rstd.size() + a.q.size() + a.k.size() + a.v.size() + a.probs.size() +
              a.context.size() + a.norm2_xhat.size() + a.norm2_rstd.size() + a.gate.size() + a.up.size();
  for (const Buffer<float>& w : m.hidden_work) floats += w.size();
  for (const Buffer<float>& w : m.wide_work) floats += w.size();
  floats += m.head_xhat.size() + m.head_rstd.size() + m.head_out.size() + m.head_grad.size() + m.logits.size();
  return floats * sizeof(float) + m.head_rows.size() * sizeof(int32_t);
}

// ---- embedding ------------------------------------------------------------------------------

void LlamaCpu::embed_forward(const float* root, const int32_t* tokens, int B, int T, float* h0) {
  Impl& m = *impl_;
  m.check_shape("embed_forward", B, T);
  const size_t N = static_cast<size_t>(B) * T, H = cfg_.hidden_size;
  check_tokens(tokens, N, cfg_.vocab_size, "embed_forward");
  m.embed_batch = B;
  m.embed_seq = T;
  const float* embeddings = root + m.root.embeddings;
  for (size_t r = 0; r < N; ++r)
    std::memcpy(h0 + r * H, embeddings + static_cast<size_t>(tokens[r]) * H, sizeof(float) * H);
}

void LlamaCpu::embed_backward(const float* root, const int32_t* tokens, const float* dh0, float* droot, int B,
                              int T) {
  Impl& m = *impl_;
  SHARDLM_CHECK(B == m.embed_batch && T == m.embed_seq, "LlamaCpu::embed_backward: shape ", B, " x ", T,
                " does not match the last embed_forward (", m.embed_batch, " x ", m.embed_seq, ")");
  const size_t N = static_cast<size_t>(B) * T, H = cfg_.hidden_size;
  check_tokens(tokens, N, cfg_.vocab_size, "embed_backward");
  // A lookup's gradient is a scatter-add onto the token's row.
  for (size_t r = 0; r < N; ++r) {
    float* row = droot + m.root.embeddings + static_cast<size_t>(tokens[r]) * H;
    const float* g = dh0 + r * H;
    for (size_t c = 0; c < H; ++c) row[c] += g[c];
  }
}

// ---- decoder layer --------------------------------------------------------------------------

void LlamaCpu::block_forward(int layer, const float* params, const float* h_in, float* h_out, int B, int T) {
  Impl& m = *impl_;
  m.check_shape("block_forward", B, T);
  BlockActivations& a = m.layer("block_forward", layer);
  a.batch = B;
  a.seq = T;
  const int N = B * T, H = cfg_.hidden_size, F = cfg_.ffn_size(), d = cfg_.head_dim();
  if (N == 0) return;
  const BlockOffsets& o = m.block;
  const float eps = cfg_.rms_norm_eps;
  const AttentionShape shape{B, T, cfg_.num_heads, cfg_.kv_heads(), d};
  const int QW = shape.q_width(), KVW = shape.kv_width();
  float* normed = m.hidden_work[1].data();

  // Attention: x = h + o_proj(attention(rotary(q), rotary(k), v)) of the normed input.
  rms_norm_rows(h_in, N, H, params + o.input_norm, eps, a.norm1_xhat.data(), a.norm1_rstd.data(), normed);
  linear(normed, N, H, params + o.q, QW, false, a.q.data());
  linear(normed, N, H, params + o.k, KVW, false, a.k.data());
  linear(normed, N, H, params + o.v, KVW, false, a.v.data());
  apply_rotary(a.q.data(), B, T, shape.num_heads, d, QW, m.rope_cos.data(), m.rope_sin.data(), false);
  apply_rotary(a.k.data(), B, T, shape.kv_heads, d, KVW, m.rope_cos.data(), m.rope_sin.data(), false);
  attention_forward(shape, a.q.data(), a.k.data(), a.v.data(), a.probs.data(), a.context.data());
  float* x = m.hidden_work[0].data();
  std::memcpy(x, h_in, sizeof(float) * N * H);
  linear(a.context.data(), N, QW, params + o.o, H, true, x);

  // MLP: out = x + down_proj(silu(gate_proj(n)) * up_proj(n)), n = RMSNorm(x).
  rms_norm_rows(x, N, H, params + o.post_norm, eps, a.norm2_xhat.data(), a.norm2_rstd.data(), normed);
  linear(normed, N, H, params + o.gate, F, false, a.gate.data());
  linear(normed, N, H, params + o.up, F, false, a.up.data());
  float* act = m.wide_work[0].data();
  const size_t wide = static_cast<size_t>(N) * F;
  for (size_t i = 0; i < wide; ++i) act[i] = a.gate[i] * sigmoid(a.gate[i]) * a.up[i];
  std::memcpy(h_out, x, sizeof(float) * N * H);
  linear(act, N, F, params + o.down, H, true, h_out);
}

void LlamaCpu::block_backward(int layer, const float* params, const float* dh_out, float* dh_in, float* dparams,
                              int B, int T) {
  Impl& m = *impl_;
  BlockActivations& a = m.layer("block_backward", layer);
  SHARDLM_CHECK(B == a.batch && T == a.seq, "LlamaCpu::block_backward: layer ", layer, " shape ", B, " x ", T,
                " does not match its last block_forward (", a.batch, " x ", a.seq, ")");
  const int N = B * T, H = cfg_.hidden_size, F = cfg_.ffn_size(), d = cfg_.head_dim();
  if (N == 0) return;
  const BlockOffsets& o = m.block;
  const AttentionShape shape{B, T, cfg_.num_heads, cfg_.kv_heads(), d};
  const int QW = shape.q_width(), KVW = shape.kv_width();
  float* dx = m.hidden_work[0].data();
  float* scratch = m.hidden_work[1].data();  // a norm's output, then its gradient; d(context)
  float* dgate = m.wide_work[0].data();      // SiLU(gate) * up first (for d(down_proj))
  float* dup = m.wide_work[1].data();        // d(SiLU(gate) * up) first

  // MLP.
  const size_t wide = static_cast<size_t>(N) * F;
  for (size_t i = 0; i < wide; ++i) dgate[i] = a.gate[i] * sigmoid(a.gate[i]) * a.up[i];
  linear_weight_backward(dgate, dh_out, N, F, H, dparams + o.down);
  linear_input_backward(dh_out, N, F, params + o.down, H, false, dup);
  for (size_t i = 0; i < wide; ++i) {
    const float g = a.gate[i], s = sigmoid(g), dact = dup[i];
    dup[i] = dact * g * s;                                  // d(up) = dact * silu(gate)
    dgate[i] = dact * a.up[i] * s * (1.0f + g * (1.0f - s));  // silu'(g) = s (1 + g (1 - s))
  }
  rms_norm_output(a.norm2_xhat.data(), N, H, params + o.post_norm, scratch);
  linear_weight_backward(scratch, dgate, N, H, F, dparams + o.gate);
  linear_weight_backward(scratch, dup, N, H, F, dparams + o.up);
  linear_input_backward(dgate, N, H, params + o.gate, F, false, scratch);
  linear_input_backward(dup, N, H, params + o.up, F, true, scratch);
  // out = x + mlp(RMSNorm(x)): the residual passes dh_out straight through.
  std::memcpy(dx, dh_out, sizeof(float) * N * H);
  rms_norm_backward_rows(scratch, a.norm2_xhat.data(), a.norm2_rstd.data(), N, H, params + o.post_norm, dx,
                         dparams + o.post_norm);

  // Attention: o_proj, attention itself, rotary (its transpose), then the q/k/v projections.
  linear_weight_backward(a.context.data(), dx, N, QW, H, dparams + o.o);
  linear_input_backward(dx, N, QW, params + o.o, H, false, scratch);
  attention_backward(shape, a.q.data(), a.k.data(), a.v.data(), a.probs.data(), scratch, m.score_grad.data(),
                     m.q_grad.data(), m.k_grad.data(), m.v_grad.data());
  apply_rotary(m.q_grad.data(), B, T, shape.num_heads, d, QW, m.rope_cos.data(), m.rope_sin.data(), true);
  apply_rotary(m.k_grad.data(), B, T, shape.kv_heads, d, KVW, m.rope_cos.data(), m.rope_sin.data(), true);
  rms_norm_output(a.norm1_xhat.data(), N, H, params + o.input_norm, scratch);
  linear_weight_backward(scratch, m.q_grad.data(), N, H, QW, dparams + o.q);
  linear_weight_backward(scratch, m.k_grad.data(), N, H, KVW, dparams + o.k);
  linear_weight_backward(scratch, m.v_grad.data(), N, H, KVW, dparams + o.v);
  linear_input_backward(m.q_grad.data(), N, H, params + o.q, QW, false, scratch);
  linear_input_backward(m.k_grad.data(), N, H, params + o.k, KVW, true, scratch);
  linear_input_backward(m.v_grad.data(), N, H, params + o.v, KVW, true, scratch);
  // x = h_in + attention(RMSNorm(h_in)).
  std::memcpy(dh_in, dx, sizeof(float) * N * H);
  rms_norm_backward_rows(scratch, a.norm1_xhat.data(), a.norm1_rstd.data(), N, H, params + o.input_norm, dh_in,
                         dparams + o.input_norm);
}

// ---- final RMSNorm, LM head, cross-entropy --------------------------------------------------

double LlamaCpu::head_loss(const float* root, const float* h, const int32_t* targets, int B, int T, int64_t* count,
                           float grad_scale, float* dh, float* droot) {
  Impl& m = *impl_;
  m.check_shape("head_loss", B, T);
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  const size_t N = static_cast<size_t>(B) * T;
  // Validate every target before touching droot, so a bad batch leaves no partial gradient behind.
  for (size_t i = 0; i < N; ++i)
    SHARDLM_CHECK(targets[i] == -1 || (targets[i] >= 0 && targets[i] < V), "LlamaCpu::head_loss: target id ",
                  targets[i], " at position ", i, " is outside the vocabulary [0, ", V, ") and is not -1");
  const bool backward = dh != nullptr;
  SHARDLM_CHECK(!backward || droot != nullptr, "LlamaCpu::head_loss: dh given without droot");
  // Positions without a target get no gradient from the loss; the norm is per position, so their dh is 0.
  if (backward && N > 0) std::memset(dh, 0, sizeof(float) * N * H);

  const float* head = root + m.root.head;
  const float* norm_weight = root + m.root.final_norm;
  const int chunk = static_cast<int>(m.head_rows.size());
  double loss = 0.0;
  int64_t counted = 0;
  size_t next = 0;
  while (true) {
    // Gather the next chunk of positions that have a target.
    int rows = 0;
    for (; next < N && rows < chunk; ++next)
      if (targets[next] >= 0) m.head_rows[rows++] = static_cast<int32_t>(next);
    if (rows == 0) break;
    counted += rows;
    for (int r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(r) * H;
      rms_norm_row(h + static_cast<size_t>(m.head_rows[r]) * H, H, norm_weight, cfg_.rms_norm_eps,
                   m.head_xhat.data() + at, m.head_rstd.data() + r, m.head_out.data() + at);
    }
    float* logits = m.logits.data();
    cpu_gemm(false, true, rows, V, H, 1.0f, m.head_out.data(), H, head, H, 0.0f, logits, V);
    loss += model_detail::cross_entropy_rows(logits, rows, V, targets, m.head_rows.data(), grad_scale, backward);
    if (!backward) continue;
    // logits = hn W^T: dW += dlogits^T hn (into embed_tokens when tied), dhn = dlogits W.
    cpu_gemm(true, false, V, H, rows, 1.0f, logits, V, m.head_out.data(), H, 1.0f, droot + m.root.head, H);
    cpu_gemm(false, false, rows, H, V, 1.0f, logits, V, head, H, 0.0f, m.head_grad.data(), H);
    for (int r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(r) * H;
      rms_norm_backward_row(m.head_grad.data() + at, m.head_xhat.data() + at, m.head_rstd[r], H, norm_weight,
                            dh + static_cast<size_t>(m.head_rows[r]) * H, false, droot + m.root.final_norm);
    }
  }
  if (count) *count = counted;
  return loss;
}

void LlamaCpu::head_logits(const float* root, const float* h, int B, int T, float* logits) {
  Impl& m = *impl_;
  m.check_shape("head_logits", B, T);
  SHARDLM_CHECK(B == 0 || T > 0, "LlamaCpu::head_logits: sequences of length 0 have no last position");
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  // One sequence at a time: the last position's final RMSNorm, then its row of logits.
  for (int b = 0; b < B; ++b) {
    const float* last = h + (static_cast<size_t>(b) * T + (T - 1)) * H;
    rms_norm_row(last, H, root + m.root.final_norm, cfg_.rms_norm_eps, m.head_xhat.data(), m.head_rstd.data(),
                 m.head_out.data());
    cpu_gemm(false, true, 1, V, H, 1.0f, m.head_out.data(), H, root + m.root.head, H, 0.0f,
             logits + static_cast<size_t>(b) * V, V);
  }
}

// ---- greedy decoding with a key/value cache ------------------------------------------------

void LlamaCpu::decode_begin(int slots, int max_len, int max_rows) {
  Impl& m = *impl_;
  SHARDLM_CHECK(slots >= 0 && max_len >= 0 && max_rows >= 0, "LlamaCpu::decode_begin: negative size (slots ", slots,
                ", max_len ", max_len, ", max_rows ", max_rows, ")");
  const size_t H = cfg_.hidden_size, F = cfg_.ffn_size(), rows = max_rows, d = cfg_.head_dim();
  const size_t QW = cfg_.num_heads * d, KVW = cfg_.kv_heads() * d;
  m.cache.reset(cfg_.num_layers, slots, max_len, cfg_.kv_heads(), cfg_.head_dim());
  m.decode_rows = max_rows;
  m.dec_xhat.assign(rows * H, 0.0f);
  m.dec_rstd.assign(rows, 0.0f);
  m.dec_norm.assign(rows * H, 0.0f);
  m.dec_q.assign(rows * QW, 0.0f);
  m.dec_k.assign(rows * KVW, 0.0f);
  m.dec_v.assign(rows * KVW, 0.0f);
  m.dec_context.assign(rows * QW, 0.0f);
  m.dec_mid.assign(rows * H, 0.0f);
  m.dec_gate.assign(rows * F, 0.0f);
  m.dec_up.assign(rows * F, 0.0f);
  m.dec_scores.assign(max_len, 0.0f);
  m.dec_cos.assign(m.inv_freq.size(), 0.0f);
  m.dec_sin.assign(m.inv_freq.size(), 0.0f);
}

void LlamaCpu::decode_end() {
  Impl& m = *impl_;
  m.cache.clear();
  m.decode_rows = 0;
  for (std::vector<float>* v : {&m.dec_xhat, &m.dec_rstd, &m.dec_norm, &m.dec_q, &m.dec_k, &m.dec_v, &m.dec_context,
                                &m.dec_mid, &m.dec_gate, &m.dec_up, &m.dec_scores, &m.dec_cos, &m.dec_sin})
    std::vector<float>().swap(*v);
}

void LlamaCpu::block_decode(int layer, const float* params, const float* h_in, float* h_out, int n,
                            const int* slots, const int* positions) {
  Impl& m = *impl_;
  SHARDLM_CHECK(n >= 0 && n <= m.decode_rows, "LlamaCpu::block_decode: ", n, " rows exceed the ", m.decode_rows,
                " of decode_begin");
  m.cache.check_rows("LlamaCpu::block_decode", layer, n, slots, positions);
  if (n == 0) return;
  const BlockOffsets& o = m.block;
  const int H = cfg_.hidden_size, F = cfg_.ffn_size(), d = cfg_.head_dim();
  const int heads = cfg_.num_heads, kv_heads = cfg_.kv_heads(), group = heads / kv_heads;
  const int QW = heads * d, KVW = kv_heads * d;
  const float eps = cfg_.rms_norm_eps;
  float* normed = m.dec_norm.data();
  float* q = m.dec_q.data();
  float* k = m.dec_k.data();
  float* v = m.dec_v.data();

  rms_norm_rows(h_in, n, H, params + o.input_norm, eps, m.dec_xhat.data(), m.dec_rstd.data(), normed);
  linear(normed, n, H, params + o.q, QW, false, q);
  linear(normed, n, H, params + o.k, KVW, false, k);
  linear(normed, n, H, params + o.v, KVW, false, v);
  // Rotary at each row's own position (the angle formed in fp32 as block_forward's tables are).
  const size_t half = m.inv_freq.size();
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[r]) * m.inv_freq[i];
      m.dec_cos[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      m.dec_sin[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
    apply_rotary(q + static_cast<size_t>(r) * QW, 1, 1, heads, d, QW, m.dec_cos.data(), m.dec_sin.data(), false);
    apply_rotary(k + static_cast<size_t>(r) * KVW, 1, 1, kv_heads, d, KVW, m.dec_cos.data(), m.dec_sin.data(), false);
  }
  // Every row's key and value go in first, so a prompt's rows see each other within one call.
  for (int r = 0; r < n; ++r)
    for (int g = 0; g < kv_heads; ++g) {
      const size_t at = static_cast<size_t>(r) * KVW + static_cast<size_t>(g) * d;
      std::copy(k + at, k + at + d, m.cache.key(layer, slots[r], g, positions[r]));
      std::copy(v + at, v + at + d, m.cache.value(layer, slots[r], g, positions[r]));
    }
  for (int r = 0; r < n; ++r)
    for (int h = 0; h < heads; ++h) {
      const size_t at = static_cast<size_t>(r) * QW + static_cast<size_t>(h) * d;
      model_detail::cached_attention_head(m.cache, layer, slots[r], h / group, positions[r], q + at, d, 0.0f,
                                          m.dec_scores.data(), m.dec_context.data() + at);
    }
  float* x = m.dec_mid.data();
  std::memcpy(x, h_in, sizeof(float) * n * H);
  linear(m.dec_context.data(), n, QW, params + o.o, H, true, x);

  rms_norm_rows(x, n, H, params + o.post_norm, eps, m.dec_xhat.data(), m.dec_rstd.data(), normed);
  float* gate = m.dec_gate.data();
  float* up = m.dec_up.data();
  linear(normed, n, H, params + o.gate, F, false, gate);
  linear(normed, n, H, params + o.up, F, false, up);
  const size_t wide = static_cast<size_t>(n) * F;
  for (size_t i = 0; i < wide; ++i) gate[i] = gate[i] * sigmoid(gate[i]) * up[i];
  std::memcpy(h_out, x, sizeof(float) * n * H);
  linear(gate, n, F, params + o.down, H, true, h_out);
}

}  // namespace shardlm

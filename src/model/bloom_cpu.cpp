// BloomCpu: fp32 forward and backward of BLOOM's embedding, transformer blocks and tied LM head on the CPU.
// Every matrix product goes through cpu_gemm; the element-wise parts (LayerNorm, softmax, GELU) are loops.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "shardlm/device.hpp"
#include "model_internal.hpp"
#include "shardlm/model.hpp"

namespace shardlm {
namespace {

// Logits of at most this many tokens exist at once (the real vocabulary has 250,880 entries).
constexpr int kHeadChunkTokens = 128;

// BLOOM's tanh approximation of GELU: sqrt(2/pi) and the cubic coefficient.
constexpr float kGeluScale = 0.79788456f;
constexpr float kGeluCubic = 0.044715f;

// Where each tensor starts inside the root unit's flat parameter.
struct RootOffsets {
  size_t embeddings = 0, embed_ln_weight = 0, embed_ln_bias = 0, final_ln_weight = 0, final_ln_bias = 0;
};

// Where each tensor starts inside a block unit's flat parameter (the same for every block).
struct BlockOffsets {
  size_t ln1_weight = 0, ln1_bias = 0, qkv_weight = 0, qkv_bias = 0, dense_weight = 0, dense_bias = 0;
  size_t ln2_weight = 0, ln2_bias = 0, mlp_in_weight = 0, mlp_in_bias = 0, mlp_out_weight = 0, mlp_out_bias = 0;
};

size_t offset_of(const UnitLayout& unit, const std::string& name) {
  for (const TensorSpec& t : unit.tensors)
    if (t.name == name) return t.offset;
  throw Error(concat("BLOOM layout: unit ", unit.name, " has no tensor ", name));
}

// Offsets come from bloom_layout itself so the kernels can never disagree with the layout.
RootOffsets root_offsets(const UnitLayout& root) {
  RootOffsets o;
  o.embeddings = offset_of(root, "word_embeddings.weight");
  o.embed_ln_weight = offset_of(root, "word_embeddings_layernorm.weight");
  o.embed_ln_bias = offset_of(root, "word_embeddings_layernorm.bias");
  o.final_ln_weight = offset_of(root, "ln_f.weight");
  o.final_ln_bias = offset_of(root, "ln_f.bias");
  return o;
}

BlockOffsets block_offsets(const UnitLayout& block) {
  const std::string p = block.name + ".";
  BlockOffsets o;
  o.ln1_weight = offset_of(block, p + "input_layernorm.weight");
  o.ln1_bias = offset_of(block, p + "input_layernorm.bias");
  o.qkv_weight = offset_of(block, p + "self_attention.query_key_value.weight");
  o.qkv_bias = offset_of(block, p + "self_attention.query_key_value.bias");
  o.dense_weight = offset_of(block, p + "self_attention.dense.weight");
  o.dense_bias = offset_of(block, p + "self_attention.dense.bias");
  o.ln2_weight = offset_of(block, p + "post_attention_layernorm.weight");
  o.ln2_bias = offset_of(block, p + "post_attention_layernorm.bias");
  o.mlp_in_weight = offset_of(block, p + "mlp.dense_h_to_4h.weight");
  o.mlp_in_bias = offset_of(block, p + "mlp.dense_h_to_4h.bias");
  o.mlp_out_weight = offset_of(block, p + "mlp.dense_4h_to_h.weight");
  o.mlp_out_bias = offset_of(block, p + "mlp.dense_4h_to_h.bias");
  return o;
}

// ---- LayerNorm ------------------------------------------------------------------------------

// One row: y = xhat * weight + bias with xhat = (x - mean) * rstd; keeps xhat and rstd for backward.
void layer_norm_row(const float* x, int H, const float* weight, const float* bias, float eps, float* xhat,
                    float* rstd, float* y) {
  // Mean and variance in double: rows of large activations lose digits in a float sum.
  double sum = 0.0;
  for (int c = 0; c < H; ++c) sum += x[c];
  const double mean = sum / H;
  double squares = 0.0;
  for (int c = 0; c < H; ++c) squares += (x[c] - mean) * (x[c] - mean);
  const float inv_std = static_cast<float>(1.0 / std::sqrt(squares / H + eps));
  const float mean_f = static_cast<float>(mean);
  *rstd = inv_std;
  for (int c = 0; c < H; ++c) {
    xhat[c] = (x[c] - mean_f) * inv_std;
    y[c] = xhat[c] * weight[c] + bias[c];
  }
}

void layer_norm_rows(const float* x, int rows, int H, const float* weight, const float* bias, float eps,
                     float* xhat, float* rstd, float* y) {
  for (int r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * H;
    layer_norm_row(x + at, H, weight, bias, eps, xhat + at, rstd + r, y + at);
  }
}

// One row's backward: dx (+)= rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight;
// dweight += dy * xhat, dbias += dy. `accumulate` adds dx onto what is there (residuals, embeddings).
void layer_norm_backward_row(const float* dy, const float* xhat, float rstd, int H, const float* weight, float* dx,
                             bool accumulate, float* dweight, float* dbias) {
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int c = 0; c < H; ++c) {
    const float g = dy[c] * weight[c];
    sum_g += g;
    sum_g_xhat += g * xhat[c];
    dweight[c] += dy[c] * xhat[c];
    dbias[c] += dy[c];
  }
  const float mean_g = sum_g / H, mean_g_xhat = sum_g_xhat / H;
  for (int c = 0; c < H; ++c) {
    const float d = rstd * (dy[c] * weight[c] - mean_g - xhat[c] * mean_g_xhat);
    dx[c] = accumulate ? dx[c] + d : d;
  }
}

void layer_norm_backward_rows(const float* dy, const float* xhat, const float* rstd, int rows, int H,
                              const float* weight, float* dx, bool accumulate, float* dweight, float* dbias) {
  for (int r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * H;
    layer_norm_backward_row(dy + at, xhat + at, rstd[r], H, weight, dx + at, accumulate, dweight, dbias);
  }
}

// ---- linear layers --------------------------------------------------------------------------

// y[rows, out] = residual + x[rows, in] W^T + bias, with W stored [out, in]; residual may be null.
void linear_forward(const float* x, int rows, int in, const float* weight, const float* bias, int out,
                    const float* residual, float* y) {
  for (int r = 0; r < rows; ++r) {
    float* yr = y + static_cast<size_t>(r) * out;
    const float* rr = residual ? residual + static_cast<size_t>(r) * out : nullptr;
    for (int c = 0; c < out; ++c) yr[c] = rr ? rr[c] + bias[c] : bias[c];
  }
  cpu_gemm(false, true, rows, out, in, 1.0f, x, in, weight, in, 1.0f, y, out);
}

// Weight and bias gradients of a linear layer: dW[out, in] += dy^T x, dbias[out] += column sums of dy.
void linear_param_backward(const float* x, const float* dy, int rows, int in, int out, float* dweight,
                           float* dbias) {
  cpu_gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dweight, in);
  for (int r = 0; r < rows; ++r) {
    const float* dyr = dy + static_cast<size_t>(r) * out;
    for (int c = 0; c < out; ++c) dbias[c] += dyr[c];
  }
}

// ---- GELU -----------------------------------------------------------------------------------

// tanh through one expf: about 3x cheaper than std::tanh, within ~1e-7 absolute; saturates to +-1.
float fast_tanh(float x) { return 1.0f - 2.0f / (std::exp(2.0f * x) + 1.0f); }

float gelu_inner_tanh(float u) { return fast_tanh(kGeluScale * u * (1.0f + kGeluCubic * u * u)); }

float gelu_value(float u, float tanh_inner) { return 0.5f * u * (1.0f + tanh_inner); }

float gelu_derivative(float u, float tanh_inner) {
  const float inner_derivative = kGeluScale * (1.0f + 3.0f * kGeluCubic * u * u);
  return 0.5f * (1.0f + tanh_inner) + 0.5f * u * (1.0f - tanh_inner * tanh_inner) * inner_derivative;
}

// ---- causal ALiBi attention -----------------------------------------------------------------

// The shape of one attention call: qkv rows are [num_heads, 3, head_dim] (head-interleaved).
struct AttentionShape {
  int batch, seq, num_heads, head_dim;
  int hidden() const { return num_heads * head_dim; }
  int qkv_stride() const { return 3 * hidden(); }
  // Start of head n's query of sequence b; its key follows at +head_dim, its value at +2*head_dim.
  size_t qkv_at(int b, int n) const {
    return static_cast<size_t>(b) * seq * qkv_stride() + static_cast<size_t>(n) * 3 * head_dim;
  }
  size_t context_at(int b, int n) const {
    return static_cast<size_t>(b) * seq * hidden() + static_cast<size_t>(n) * head_dim;
  }
  size_t probs_at(int b, int n) const {
    return (static_cast<size_t>(b) * num_heads + n) * static_cast<size_t>(seq) * seq;
  }
};

// probs[b,n] = softmax_j(q_i.k_j / sqrt(d) + slope_n * j) over j <= i; context[b, :, head n] = probs V.
void attention_forward(const AttentionShape& s, const float* slopes, const float* qkv, float* probs,
                       float* context) {
  const int T = s.seq, d = s.head_dim, ld = s.qkv_stride();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int b = 0; b < s.batch; ++b) {
    for (int n = 0; n < s.num_heads; ++n) {
      const float* q = qkv + s.qkv_at(b, n);
      const float* k = q + d;
      const float* v = q + 2 * d;
      float* p = probs + s.probs_at(b, n);
      cpu_gemm(false, true, T, T, d, scale, q, ld, k, ld, 0.0f, p, T);
      for (int i = 0; i < T; ++i) {
        float* row = p + static_cast<size_t>(i) * T;
        float max_score = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          row[j] += slopes[n] * static_cast<float>(j);
          max_score = std::max(max_score, row[j]);
        }
        float total = 0.0f;
        for (int j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - max_score);
          total += row[j];
        }
        const float inv_total = 1.0f / total;
        for (int j = 0; j <= i; ++j) row[j] *= inv_total;
        for (int j = i + 1; j < T; ++j) row[j] = 0.0f;  // causal mask
      }
      cpu_gemm(false, false, T, d, T, 1.0f, p, T, v, ld, 0.0f, context + s.context_at(b, n), s.hidden());
    }
  }
}

// dqkv (overwritten) from dcontext, through P V, the softmax and the scaled Q K^T. dscores is [T, T].
void attention_backward(const AttentionShape& s, const float* qkv, const float* probs, const float* dcontext,
                        float* dscores, float* dqkv) {
  const int T = s.seq, d = s.head_dim, ld = s.qkv_stride();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int b = 0; b < s.batch; ++b) {
    for (int n = 0; n < s.num_heads; ++n) {
      const float* q = qkv + s.qkv_at(b, n);
      const float* k = q + d;
      const float* v = q + 2 * d;
      float* dq = dqkv + s.qkv_at(b, n);
      float* dk = dq + d;
      float* dv = dq + 2 * d;
      const float* p = probs + s.probs_at(b, n);
      const float* dctx = dcontext + s.context_at(b, n);
      // dP = dctx V^T, dV = P^T dctx.
      cpu_gemm(false, true, T, T, d, 1.0f, dctx, s.hidden(), v, ld, 0.0f, dscores, T);
      cpu_gemm(true, false, T, d, T, 1.0f, p, T, dctx, s.hidden(), 0.0f, dv, ld);
      // Softmax backward in place: dS = P * (dP - sum_j P dP); masked entries have P = 0.
      for (int i = 0; i < T; ++i) {
        const float* prow = p + static_cast<size_t>(i) * T;
        float* row = dscores + static_cast<size_t>(i) * T;
        float dot = 0.0f;
        for (int j = 0; j <= i; ++j) dot += prow[j] * row[j];
        for (int j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot);
        for (int j = i + 1; j < T; ++j) row[j] = 0.0f;
      }
      // S = scale * Q K^T: dQ = scale * dS K, dK = scale * dS^T Q.
      cpu_gemm(false, false, T, d, T, scale, dscores, T, k, ld, 0.0f, dq, ld);
      cpu_gemm(true, false, T, d, T, scale, dscores, T, q, ld, 0.0f, dk, ld);
    }
  }
}

// ---- saved state ----------------------------------------------------------------------------

// What one block's forward keeps for its backward, sized for the largest micro-batch.
struct BlockActivations {
  Buffer<float> ln1_xhat, ln1_rstd, ln1_out;  // input LayerNorm
  Buffer<float> qkv;                          // fused query/key/value [N, 3H]
  Buffer<float> probs;                        // attention probabilities [B, heads, T, T]
  Buffer<float> context;                      // attention output before the dense projection [N, H]
  Buffer<float> ln2_xhat, ln2_rstd, ln2_out;  // post-attention LayerNorm
  Buffer<float> mlp_pre_gelu;                 // [N, 4H]; GELU and its derivative are rebuilt from it
  int batch = -1, seq = -1;                   // shape of the forward these belong to
};

}  // namespace

struct BloomCpu::Impl {
  int max_batch = 0, max_seq = 0;
  RootOffsets root;
  BlockOffsets block;
  std::vector<float> slopes;

  // Embedding LayerNorm state kept for embed_backward.
  Buffer<float> embed_xhat, embed_rstd;
  int embed_batch = -1, embed_seq = -1;

  std::vector<BlockActivations> layers;

  // Workspaces shared by every layer (only one forward or backward runs at a time).
  Buffer<float> hidden_work[3];  // [N, H]: h_mid in forward; dln, dh_mid, dcontext in backward
  Buffer<float> wide_work[2];    // [N, 4H]: GELU output; dGELU and du in backward
  Buffer<float> qkv_grad;        // [N, 3H]
  Buffer<float> score_grad;      // [T, T] of one (sequence, head)

  // Tied LM head over one chunk of tokens with a target.
  Buffer<int32_t> head_rows;  // positions of the chunk's tokens
  Buffer<float> head_xhat, head_rstd, head_out, head_grad, logits;

  // Greedy decoding: the key/value cache and per-call scratch, alive between decode_begin and decode_end.
  model_detail::KvCache cache;
  int decode_rows = 0;
  std::vector<float> dec_xhat, dec_rstd, dec_norm, dec_qkv, dec_context, dec_mid, dec_wide, dec_scores;

  void check_shape(const char* what, int B, int T) const {
    SHARDLM_CHECK(B >= 0 && T >= 0 && B <= max_batch && T <= max_seq, "BloomCpu::", what, ": batch ", B, " x seq ",
                  T, " exceeds the sizes it was built for (", max_batch, " x ", max_seq, ")");
  }
  BlockActivations& layer(const char* what, int index) {
    SHARDLM_CHECK(index >= 0 && index < static_cast<int>(layers.size()), "BloomCpu::", what, ": layer ", index,
                  " out of range [0, ", layers.size(), ")");
    return layers[index];
  }
};

BloomCpu::BloomCpu(const ModelConfig& cfg, int max_batch, int max_seq) : cfg_(cfg), impl_(nullptr) {
  SHARDLM_CHECK(max_batch >= 0 && max_seq >= 0, "BloomCpu: negative max_batch ", max_batch, " or max_seq ",
                max_seq);
  const std::vector<UnitLayout> layout = bloom_layout(cfg);  // also validates the config
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.max_batch = max_batch;
  m.max_seq = max_seq;
  m.root = root_offsets(layout[0]);
  if (cfg.num_layers > 0) m.block = block_offsets(layout[1]);
  m.slopes = alibi_slopes(cfg.num_heads);

  const size_t H = cfg.hidden_size, V = cfg.vocab_size, heads = cfg.num_heads;
  const size_t tokens = static_cast<size_t>(max_batch) * max_seq;
  const MemKind kind = MemKind::Activations;
  m.embed_xhat.allocate(tokens * H, kind);
  m.embed_rstd.allocate(tokens, kind);
  m.layers.resize(cfg.num_layers);
  for (BlockActivations& a : m.layers) {
    a.ln1_xhat.allocate(tokens * H, kind);
    a.ln1_rstd.allocate(tokens, kind);
    a.ln1_out.allocate(tokens * H, kind);
    a.qkv.allocate(tokens * 3 * H, kind);
    a.probs.allocate(tokens * heads * max_seq, kind);
    a.context.allocate(tokens * H, kind);
    a.ln2_xhat.allocate(tokens * H, kind);
    a.ln2_rstd.allocate(tokens, kind);
    a.ln2_out.allocate(tokens * H, kind);
    a.mlp_pre_gelu.allocate(tokens * 4 * H, kind);
  }
  if (cfg.num_layers > 0) {
    for (Buffer<float>& w : m.hidden_work) w.allocate(tokens * H, kind);
    for (Buffer<float>& w : m.wide_work) w.allocate(tokens * 4 * H, kind);
    m.qkv_grad.allocate(tokens * 3 * H, kind);
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

BloomCpu::~BloomCpu() { delete impl_; }

size_t BloomCpu::activation_bytes() const {
  const Impl& m = *impl_;
  size_t floats = m.embed_xhat.size() + m.embed_rstd.size() + m.qkv_grad.size() + m.score_grad.size();
  for (const BlockActivations& a : m.layers)
    floats += a.ln1_xhat.size() + a.ln1_rstd.size() + a.ln1_out.size() + a.qkv.size() + a.probs.size() +
              a.context.size() + a.ln2_xhat.size() + a.ln2_rstd.size() + a.ln2_out.size() + a.mlp_pre_gelu.size();
  for (const Buffer<float>& w : m.hidden_work) floats += w.size();
  for (const Buffer<float>& w : m.wide_work) floats += w.size();
  floats += m.head_xhat.size() + m.head_rstd.size() + m.head_out.size() + m.head_grad.size() + m.logits.size();
  return floats * sizeof(float) + m.head_rows.size() * sizeof(int32_t);
}

size_t cpu_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq) {
  if (cfg.is_llama()) return llama_activation_bytes(cfg, max_batch, max_seq);
  SHARDLM_CHECK(cfg.arch == "bloom", "model.arch = '", cfg.arch,
                "': this build has no CPU model of it, so its activations cannot be sized");
  SHARDLM_CHECK(max_batch >= 0 && max_seq >= 0, "cpu_activation_bytes: negative max_batch ", max_batch,
                " or max_seq ", max_seq);
  // The allocations of BloomCpu's constructor, element by element.
  const size_t H = cfg.hidden_size, V = cfg.vocab_size, heads = cfg.num_heads, L = cfg.num_layers;
  const size_t tokens = static_cast<size_t>(max_batch) * max_seq;
  size_t floats = tokens * H + tokens;  // embedding LayerNorm
  const size_t per_layer = 2 * (2 * tokens * H + tokens) + tokens * 3 * H + tokens * heads * max_seq +
                           tokens * H + tokens * 4 * H;
  floats += L * per_layer;
  if (L > 0) floats += 3 * tokens * H + 2 * tokens * 4 * H + tokens * 3 * H + static_cast<size_t>(max_seq) * max_seq;
  const size_t chunk = std::min<size_t>(kHeadChunkTokens, tokens);
  floats += 3 * chunk * H + chunk + chunk * V;
  return floats * sizeof(float) + chunk * sizeof(int32_t);
}

// ---- embedding ------------------------------------------------------------------------------

namespace {

void check_tokens(const int32_t* tokens, size_t n, int vocab_size, const char* what) {
  for (size_t i = 0; i < n; ++i)
    SHARDLM_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size, "BloomCpu::", what, ": token id ", tokens[i],
                  " at position ", i, " is outside the vocabulary [0, ", vocab_size, ")");
}

}  // namespace

void BloomCpu::embed_forward(const float* root, const int32_t* tokens, int B, int T, float* h0) {
  Impl& m = *impl_;
  m.check_shape("embed_forward", B, T);
  const size_t N = static_cast<size_t>(B) * T, H = cfg_.hidden_size;
  check_tokens(tokens, N, cfg_.vocab_size, "embed_forward");
  m.embed_batch = B;
  m.embed_seq = T;
  const float* embeddings = root + m.root.embeddings;
  for (size_t r = 0; r < N; ++r)
    layer_norm_row(embeddings + static_cast<size_t>(tokens[r]) * H, static_cast<int>(H),
                   root + m.root.embed_ln_weight, root + m.root.embed_ln_bias, cfg_.layer_norm_eps,
                   m.embed_xhat.data() + r * H, m.embed_rstd.data() + r, h0 + r * H);
}

void BloomCpu::embed_backward(const float* root, const int32_t* tokens, const float* dh0, float* droot, int B,
                              int T) {
  Impl& m = *impl_;
  SHARDLM_CHECK(B == m.embed_batch && T == m.embed_seq, "BloomCpu::embed_backward: shape ", B, " x ", T,
                " does not match the last embed_forward (", m.embed_batch, " x ", m.embed_seq, ")");
  const size_t N = static_cast<size_t>(B) * T, H = cfg_.hidden_size;
  check_tokens(tokens, N, cfg_.vocab_size, "embed_backward");
  // The LayerNorm's input gradient lands directly on the token's embedding row (a scatter-add).
  for (size_t r = 0; r < N; ++r)
    layer_norm_backward_row(dh0 + r * H, m.embed_xhat.data() + r * H, m.embed_rstd[r], static_cast<int>(H),
                            root + m.root.embed_ln_weight,
                            droot + m.root.embeddings + static_cast<size_t>(tokens[r]) * H, true,
                            droot + m.root.embed_ln_weight, droot + m.root.embed_ln_bias);
}

// ---- transformer block ----------------------------------------------------------------------

void BloomCpu::block_forward(int layer, const float* params, const float* h_in, float* h_out, int B, int T) {
  Impl& m = *impl_;
  m.check_shape("block_forward", B, T);
  BlockActivations& a = m.layer("block_forward", layer);
  a.batch = B;
  a.seq = T;
  const int N = B * T, H = cfg_.hidden_size;
  if (N == 0) return;
  const BlockOffsets& o = m.block;
  const float eps = cfg_.layer_norm_eps;
  const AttentionShape shape{B, T, cfg_.num_heads, cfg_.head_dim()};

  layer_norm_rows(h_in, N, H, params + o.ln1_weight, params + o.ln1_bias, eps, a.ln1_xhat.data(),
                  a.ln1_rstd.data(), a.ln1_out.data());
  linear_forward(a.ln1_out.data(), N, H, params + o.qkv_weight, params + o.qkv_bias, 3 * H, nullptr, a.qkv.data());
  attention_forward(shape, m.slopes.data(), a.qkv.data(), a.probs.data(), a.context.data());
  float* h_mid = m.hidden_work[0].data();
  linear_forward(a.context.data(), N, H, params + o.dense_weight, params + o.dense_bias, H, h_in, h_mid);

  layer_norm_rows(h_mid, N, H, params + o.ln2_weight, params + o.ln2_bias, eps, a.ln2_xhat.data(),
                  a.ln2_rstd.data(), a.ln2_out.data());
  linear_forward(a.ln2_out.data(), N, H, params + o.mlp_in_weight, params + o.mlp_in_bias, 4 * H, nullptr,
                 a.mlp_pre_gelu.data());
  float* gelu = m.wide_work[0].data();
  const size_t wide = static_cast<size_t>(N) * 4 * H;
  for (size_t i = 0; i < wide; ++i) {
    const float u = a.mlp_pre_gelu[i];
    gelu[i] = gelu_value(u, gelu_inner_tanh(u));
  }
  linear_forward(gelu, N, 4 * H, params + o.mlp_out_weight, params + o.mlp_out_bias, H, h_mid, h_out);
}

void BloomCpu::block_backward(int layer, const float* params, const float* dh_out, float* dh_in, float* dparams,
                              int B, int T) {
  Impl& m = *impl_;
  BlockActivations& a = m.layer("block_backward", layer);
  SHARDLM_CHECK(B == a.batch && T == a.seq, "BloomCpu::block_backward: layer ", layer, " shape ", B, " x ", T,
                " does not match its last block_forward (", a.batch, " x ", a.seq, ")");
  const int N = B * T, H = cfg_.hidden_size;
  if (N == 0) return;
  const BlockOffsets& o = m.block;
  const AttentionShape shape{B, T, cfg_.num_heads, cfg_.head_dim()};
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
  linear_param_backward(gelu, dh_out, N, 4 * H, H, dparams + o.mlp_out_weight, dparams + o.mlp_out_bias);
  cpu_gemm(false, false, N, 4 * H, H, 1.0f, dh_out, H, params + o.mlp_out_weight, 4 * H, 0.0f, gelu, 4 * H);
  for (size_t i = 0; i < wide; ++i) dmlp[i] *= gelu[i];
  linear_param_backward(a.ln2_out.data(), dmlp, N, H, 4 * H, dparams + o.mlp_in_weight, dparams + o.mlp_in_bias);
  cpu_gemm(false, false, N, H, 4 * H, 1.0f, dmlp, 4 * H, params + o.mlp_in_weight, H, 0.0f, dln, H);
  // h_out = h_mid + mlp(LN2(h_mid)): the residual passes dh_out straight through.
  std::memcpy(dh_mid, dh_out, sizeof(float) * N * H);
  layer_norm_backward_rows(dln, a.ln2_xhat.data(), a.ln2_rstd.data(), N, H, params + o.ln2_weight, dh_mid, true,
                           dparams + o.ln2_weight, dparams + o.ln2_bias);

  // Attention: dense projection, then attention itself, then the fused qkv projection.
  linear_param_backward(a.context.data(), dh_mid, N, H, H, dparams + o.dense_weight, dparams + o.dense_bias);
  cpu_gemm(false, false, N, H, H, 1.0f, dh_mid, H, params + o.dense_weight, H, 0.0f, dcontext, H);
  attention_backward(shape, a.qkv.data(), a.probs.data(), dcontext, m.score_grad.data(), m.qkv_grad.data());
  linear_param_backward(a.ln1_out.data(), m.qkv_grad.data(), N, H, 3 * H, dparams + o.qkv_weight,
                        dparams + o.qkv_bias);
  cpu_gemm(false, false, N, H, 3 * H, 1.0f, m.qkv_grad.data(), 3 * H, params + o.qkv_weight, H, 0.0f, dln, H);
  // h_mid = h_in + attention(LN1(h_in)).
  std::memcpy(dh_in, dh_mid, sizeof(float) * N * H);
  layer_norm_backward_rows(dln, a.ln1_xhat.data(), a.ln1_rstd.data(), N, H, params + o.ln1_weight, dh_in, true,
                           dparams + o.ln1_weight, dparams + o.ln1_bias);
}

// ---- final LayerNorm, tied LM head, cross-entropy -------------------------------------------

double BloomCpu::head_loss(const float* root, const float* h, const int32_t* targets, int B, int T, int64_t* count,
                           float grad_scale, float* dh, float* droot) {
  Impl& m = *impl_;
  m.check_shape("head_loss", B, T);
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  const size_t N = static_cast<size_t>(B) * T;
  // Validate every target before touching droot, so a bad batch leaves no partial gradient behind.
  for (size_t i = 0; i < N; ++i)
    SHARDLM_CHECK(targets[i] == -1 || (targets[i] >= 0 && targets[i] < V), "BloomCpu::head_loss: target id ",
                  targets[i], " at position ", i, " is outside the vocabulary [0, ", V, ") and is not -1");
  const bool backward = dh != nullptr;
  SHARDLM_CHECK(!backward || droot != nullptr, "BloomCpu::head_loss: dh given without droot");
  // Positions without a target get no gradient from the loss; LN_f is per position, so their dh is 0.
  if (backward && N > 0) std::memset(dh, 0, sizeof(float) * N * H);

  const float* embeddings = root + m.root.embeddings;
  const float* ln_weight = root + m.root.final_ln_weight;
  const float* ln_bias = root + m.root.final_ln_bias;
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
      layer_norm_row(h + static_cast<size_t>(m.head_rows[r]) * H, H, ln_weight, ln_bias, cfg_.layer_norm_eps,
                     m.head_xhat.data() + at, m.head_rstd.data() + r, m.head_out.data() + at);
    }
    float* logits = m.logits.data();
    cpu_gemm(false, true, rows, V, H, 1.0f, m.head_out.data(), H, embeddings, H, 0.0f, logits, V);
    loss += model_detail::cross_entropy_rows(logits, rows, V, targets, m.head_rows.data(), grad_scale, backward);
    if (!backward) continue;
    // Tied head: logits = hf E^T, so dE += dlogits^T hf and dhf = dlogits E.
    cpu_gemm(true, false, V, H, rows, 1.0f, logits, V, m.head_out.data(), H, 1.0f, droot + m.root.embeddings, H);
    cpu_gemm(false, false, rows, H, V, 1.0f, logits, V, embeddings, H, 0.0f, m.head_grad.data(), H);
    for (int r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(r) * H;
      layer_norm_backward_row(m.head_grad.data() + at, m.head_xhat.data() + at, m.head_rstd[r], H, ln_weight,
                              dh + static_cast<size_t>(m.head_rows[r]) * H, false, droot + m.root.final_ln_weight,
                              droot + m.root.final_ln_bias);
    }
  }
  if (count) *count = counted;
  return loss;
}

void BloomCpu::head_logits(const float* root, const float* h, int B, int T, float* logits) {
  Impl& m = *impl_;
  m.check_shape("head_logits", B, T);
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  // One sequence at a time: the last position's final LayerNorm, then its row of the tied head.
  for (int b = 0; b < B; ++b) {
    const float* last = h + (static_cast<size_t>(b) * T + (T - 1)) * H;
    layer_norm_row(last, H, root + m.root.final_ln_weight, root + m.root.final_ln_bias, cfg_.layer_norm_eps,
                   m.head_xhat.data(), m.head_rstd.data(), m.head_out.data());
    cpu_gemm(false, true, 1, V, H, 1.0f, m.head_out.data(), H, root + m.root.embeddings, H, 0.0f,
             logits + static_cast<size_t>(b) * V, V);
  }
}

// ---- greedy decoding with a key/value cache ------------------------------------------------

void BloomCpu::decode_begin(int slots, int max_len, int max_rows) {
  Impl& m = *impl_;
  SHARDLM_CHECK(slots >= 0 && max_len >= 0 && max_rows >= 0, "BloomCpu::decode_begin: negative size (slots ", slots,
                ", max_len ", max_len, ", max_rows ", max_rows, ")");
  const size_t H = cfg_.hidden_size, rows = max_rows;
  m.cache.reset(cfg_.num_layers, slots, max_len, cfg_.num_heads, cfg_.head_dim());
  m.decode_rows = max_rows;
  m.dec_xhat.assign(rows * H, 0.0f);
  m.dec_rstd.assign(rows, 0.0f);
  m.dec_norm.assign(rows * H, 0.0f);
  m.dec_qkv.assign(rows * 3 * H, 0.0f);
  m.dec_context.assign(rows * H, 0.0f);
  m.dec_mid.assign(rows * H, 0.0f);
  m.dec_wide.assign(rows * 4 * H, 0.0f);
  m.dec_scores.assign(max_len, 0.0f);
}

void BloomCpu::decode_end() {
  Impl& m = *impl_;
  m.cache.clear();
  m.decode_rows = 0;
  for (std::vector<float>* v : {&m.dec_xhat, &m.dec_rstd, &m.dec_norm, &m.dec_qkv, &m.dec_context, &m.dec_mid,
                                &m.dec_wide, &m.dec_scores})
    std::vector<float>().swap(*v);
}

void BloomCpu::block_decode(int layer, const float* params, const float* h_in, float* h_out, int n,
                            const int* slots, const int* positions) {
  Impl& m = *impl_;
  SHARDLM_CHECK(n >= 0 && n <= m.decode_rows, "BloomCpu::block_decode: ", n, " rows exceed the ", m.decode_rows,
                " of decode_begin");
  m.cache.check_rows("BloomCpu::block_decode", layer, n, slots, positions);
  if (n == 0) return;
  const BlockOffsets& o = m.block;
  const int H = cfg_.hidden_size, heads = cfg_.num_heads, d = cfg_.head_dim();
  const float eps = cfg_.layer_norm_eps;

  layer_norm_rows(h_in, n, H, params + o.ln1_weight, params + o.ln1_bias, eps, m.dec_xhat.data(), m.dec_rstd.data(),
                  m.dec_norm.data());
  float* qkv = m.dec_qkv.data();
  linear_forward(m.dec_norm.data(), n, H, params + o.qkv_weight, params + o.qkv_bias, 3 * H, nullptr, qkv);
  // Every row's key and value go in first, so a prompt's rows see each other within one call.
  for (int r = 0; r < n; ++r)
    for (int h = 0; h < heads; ++h) {
      const float* row = qkv + static_cast<size_t>(r) * 3 * H + static_cast<size_t>(h) * 3 * d;
      std::copy(row + d, row + 2 * d, m.cache.key(layer, slots[r], h, positions[r]));
      std::copy(row + 2 * d, row + 3 * d, m.cache.value(layer, slots[r], h, positions[r]));
    }
  for (int r = 0; r < n; ++r)
    for (int h = 0; h < heads; ++h)
      model_detail::cached_attention_head(m.cache, layer, slots[r], h, positions[r],
                                          qkv + static_cast<size_t>(r) * 3 * H + static_cast<size_t>(h) * 3 * d, d,
                                          m.slopes[h], m.dec_scores.data(),
                                          m.dec_context.data() + static_cast<size_t>(r) * H + static_cast<size_t>(h) * d);
  float* h_mid = m.dec_mid.data();
  linear_forward(m.dec_context.data(), n, H, params + o.dense_weight, params + o.dense_bias, H, h_in, h_mid);

  layer_norm_rows(h_mid, n, H, params + o.ln2_weight, params + o.ln2_bias, eps, m.dec_xhat.data(), m.dec_rstd.data(),
                  m.dec_norm.data());
  float* wide = m.dec_wide.data();
  linear_forward(m.dec_norm.data(), n, H, params + o.mlp_in_weight, params + o.mlp_in_bias, 4 * H, nullptr, wide);
  const size_t wide_n = static_cast<size_t>(n) * 4 * H;
  for (size_t i = 0; i < wide_n; ++i) wide[i] = gelu_value(wide[i], gelu_inner_tanh(wide[i]));
  linear_forward(wide, n, 4 * H, params + o.mlp_out_weight, params + o.mlp_out_bias, H, h_mid, h_out);
}

}  // namespace shardlm

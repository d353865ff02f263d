// LlamaCuda: the Llama decoder layer's forward and backward as cuBLASLt GEMMs (q|k|v and gate|up
// each one GEMM over adjacent weights) and the kernels of device/cuda (rmsnorm, rotary, swiglu,
// gqa_attention, ...), on the caller's stream.
// The hidden-state gradient is updated in place through a block (the residual adds onto it); norm
// outputs, SiLU(gate) * up and the attention probabilities (from the softmax's saved log-sum-exp)
// are recomputed in backward rather than kept per block (SiLU(gate) * up by the activation's backward
// kernel, which reads gate|up anyway: down_backward).
#include "llama_cuda.hpp"

#include <algorithm>
#include <string>

#include "device_setup.hpp"
#include "elementwise.hpp"
#include "embedding.hpp"
#include "gqa_attention.hpp"
#include "lm_head.hpp"
#include "matmul.hpp"
#include "rmsnorm.hpp"
#include "rotary.hpp"
#include "swiglu.hpp"

namespace shardlm::cuda {

LlamaCuda::LlamaCuda(const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool activation_checkpointing,
                     const LlamaBlock& options)
    : CudaModelBase("LlamaCuda", cfg, dt, max_batch, max_seq, activation_checkpointing, false),
      qw_(cfg.num_heads * cfg.head_dim()),
      kvw_(cfg.kv_heads() * cfg.head_dim()),
      ffn_(cfg.ffn_size()),
      sizes_(llama_cuda_sizes(cfg, dt, max_batch, max_seq, activation_checkpointing, attention_.fused(),
                              options.qk_norm, options.sandwich_norms)) {
  const std::vector<UnitLayout> layout = llama_layout(cfg, options);  // also validates the config
  const LlamaRootOffsets root = llama_root_offsets(layout[0], cfg.tie_word_embeddings);
  root_ = {model_detail::root_tensor(cfg, root.embeddings), model_detail::root_tensor(cfg, root.norm),
           model_detail::root_tensor(cfg, root.head)};
  if (cfg.num_layers > 0) {
    const LlamaBlockOffsets o = llama_block_offsets(layout[1], options);
    const size_t H = cfg.hidden_size;
    block_ = {o.input_norm, o.q,      o.q_bias, o.o,           o.post_norm,
              o.gate,       o.down,   o.q_norm, o.k_norm,      o.attn_out_norm, o.mlp_out_norm};
    tail_begin_ = llama_backward_tail_begin(layout[1], o);
    written_whole(layout[1].numel,
                  {{o.q, (qw_ + 2 * kvw_) * H}, {o.o, H * qw_}, {o.gate, 2 * ffn_ * H}, {o.down, H * ffn_}});
    // The fused GEMMs read [q; k; v] and [gate; up] as one weight matrix each, and the bias
    // epilogue [q; k; v] biases as one vector.
    SHARDLM_CHECK(o.k == o.q + qw_ * H && o.v == o.q + (qw_ + kvw_) * H && o.up == o.gate + ffn_ * H,
                  "LlamaCuda: q/k/v or gate/up projections are not adjacent in the block layout");
    SHARDLM_CHECK(!o.qkv_bias || (o.k_bias == o.q_bias + qw_ && o.v_bias == o.q_bias + qw_ + kvw_),
                  "LlamaCuda: q/k/v biases are not adjacent in the block layout");
  }
  qkv_bias_ = options.qkv_bias;
  qk_norm_ = options.qk_norm;
  sandwich_ = options.sandwich_norms;
  geglu_ = options.gelu_tanh;
  norm_offset_ = options.unit_offset_norms ? 1.0f : 0.0f;
  // transformers casts the scale to the embedding's dtype before the product.
  embed_scale_ = round_to(dt, llama_embed_scale(cfg, options));

  rotary_dim_ = cfg.rotary_dim();
  rope_scale_ = rope_attention_factor(cfg);
  lora_slots_ = llama_lora_slots(cfg, options);
  std::vector<float> inv_freq;
  for (int table = 0; table < cfg.rope_tables(); ++table) {
    const std::vector<float> t = rope_inv_freq(cfg, table);
    inv_freq.insert(inv_freq.end(), t.begin(), t.end());
  }
  if (cfg.longrope.enabled()) {
    const std::vector<float> long_freq = rope_inv_freq(cfg, 0, true);
    inv_freq.insert(inv_freq.end(), long_freq.begin(), long_freq.end());
  }
  inv_freq_.allocate(sizes_.inv_freq / sizeof(float));
  SHARDLM_CHECK(inv_freq.size() * sizeof(float) == sizes_.inv_freq, "LlamaCuda: rotary tables of ",
                inv_freq.size(), " frequencies, ", sizes_.inv_freq, " bytes planned");
  copy_to_device_now(inv_freq_.data(), inv_freq.data(), inv_freq.size() * sizeof(float));
  allocate_step_buffers(sizes_.hidden, sizes_.attention_workspace, sizes_.head_workspace, sizes_.fp8);
  final_rstd_.allocate(sizes_.final_rstd / sizeof(float));
  saved_.resize(sizes_.saved_blocks);
  for (Saved& sv : saved_) {
    sv.rstd1.allocate(sizes_.rstd / sizeof(float));
    sv.rstd2.allocate(sizes_.rstd / sizeof(float));
    sv.qkv.allocate(sizes_.qkv);
    sv.lse.allocate(sizes_.lse / sizeof(float));
    sv.context.allocate(sizes_.context);
    sv.h2.allocate(sizes_.h2);
    sv.gate_up.allocate(sizes_.gate_up);
    sv.qk_raw.allocate(sizes_.qk_raw);
    sv.qk_rstd.allocate(sizes_.qk_rstd / sizeof(float));
    sv.attn_out.allocate(sizes_.sandwich_out);
    sv.mlp_out.allocate(sizes_.sandwich_out);
    sv.rstd3.allocate(sizes_.sandwich_rstd / sizeof(float));
    sv.rstd4.allocate(sizes_.sandwich_rstd / sizeof(float));
  }
  qk_work_.allocate(sizes_.qk_work);
  norm_.allocate(sizes_.norm);
  grad_.allocate(sizes_.grad);
  dh_.allocate(sizes_.dh);
  wide_.allocate(sizes_.wide);
  dqkv_.allocate(sizes_.dqkv);
  dgate_up_.allocate(sizes_.dgate_up);

  const int H = cfg.hidden_size, F = ffn_, QKV = qw_ + 2 * kvw_;
  describe_fp8({{"q|k|v", QKV, H}, {"o", H, qw_}, {"gate|up", 2 * F, H}, {"down", H, F}}, "");
}

size_t LlamaCuda::activation_bytes() const {
  size_t n = step_buffer_bytes() + inv_freq_.bytes() + final_rstd_.bytes() + norm_.bytes() + grad_.bytes() +
             dh_.bytes() + wide_.bytes() + dqkv_.bytes() + dgate_up_.bytes() + qk_work_.bytes();
  for (const Saved& sv : saved_)
    n += sv.rstd1.bytes() + sv.rstd2.bytes() + sv.qkv.bytes() + sv.lse.bytes() + sv.context.bytes() +
         sv.h2.bytes() + sv.gate_up.bytes() + sv.qk_raw.bytes() + sv.qk_rstd.bytes() + sv.attn_out.bytes() +
         sv.mlp_out.bytes() + sv.rstd3.bytes() + sv.rstd4.bytes();
  return n;
}

const float* LlamaCuda::inv_freq(int layer) const {
  return inv_freq_.data() + static_cast<size_t>(cfg_.layer_rope_table(layer)) * (rotary_dim_ / 2);
}

const float* LlamaCuda::long_inv_freq(int layer) const {
  if (!cfg_.longrope.enabled() || cfg_.layer_rope_table(layer) != 0) return nullptr;
  return inv_freq_.data() + static_cast<size_t>(cfg_.rope_tables()) * (rotary_dim_ / 2);
}

void LlamaCuda::gated_forward(const void* gate_up, void* out, int n, cudaStream_t s, unsigned* amax_bits) const {
  if (geglu_)
    geglu_tanh_forward(gate_up, out, n, ffn_, dt_, s, amax_bits);
  else
    swiglu_forward(gate_up, out, n, ffn_, dt_, s, amax_bits);
}

void LlamaCuda::gated_backward(const void* dout, const void* gate_up, void* dgate_up, int n, cudaStream_t s,
                               unsigned* amax_bits, void* act_out) const {
  if (geglu_)
    geglu_tanh_backward(dout, gate_up, dgate_up, n, ffn_, dt_, s, amax_bits, act_out);
  else
    swiglu_backward(dout, gate_up, dgate_up, n, ffn_, dt_, s, amax_bits, act_out);
}

void LlamaCuda::add_normed(const char* base, const char* out, const char* weight, float* rstd, char* y, int n,
                           cudaStream_t s) {
  const int H = cfg_.hidden_size;
  rmsnorm_forward(out, weight, norm_.data(), rstd, n, H, cfg_.rms_norm_eps, dt_, s, norm_offset_);
  add(base, norm_.data(), y, static_cast<size_t>(n) * H, dt_, s);
}

// Columns [col, col + width) of n rows of stride ld (elements of dsize bytes) to or from a contiguous [n, width].
static void copy_columns(void* dst, size_t dst_ld, const void* src, size_t src_ld, int n, size_t width, size_t dsize,
                         cudaStream_t s) {
  SHARDLM_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_ld * dsize, src, src_ld * dsize, width * dsize, n,
                                       cudaMemcpyDeviceToDevice, s));
}

void LlamaCuda::qk_norm_forward(char* qkv, int n, const char* q_weight, const char* k_weight, char* raw, float* rstd,
                                char* work, cudaStream_t s) const {
  const int d = cfg_.head_dim(), heads = cfg_.num_heads, kv_heads = cfg_.kv_heads();
  const size_t QKV = qw_ + 2 * kvw_;
  char* raw_k = raw + static_cast<size_t>(n) * qw_ * dsize_;
  // q: its heads are rows of d once copied out of the q|k|v rows; normed into work and copied back.
  copy_columns(raw, qw_, qkv, QKV, n, qw_, dsize_, s);
  rmsnorm_forward(raw, q_weight, work, rstd, n * heads, d, cfg_.rms_norm_eps, dt_, s, norm_offset_);
  copy_columns(qkv, QKV, work, qw_, n, qw_, dsize_, s);
  char* k = qkv + qw_ * dsize_;
  copy_columns(raw_k, kvw_, k, QKV, n, kvw_, dsize_, s);
  rmsnorm_forward(raw_k, k_weight, work, rstd + static_cast<size_t>(n) * heads, n * kv_heads, d, cfg_.rms_norm_eps, dt_,
                  s, norm_offset_);
  copy_columns(k, QKV, work, kvw_, n, kvw_, dsize_, s);
}

void LlamaCuda::qk_norm_backward(char* dqkv, int n, const char* q_weight, const char* k_weight, const char* raw,
                                 const float* rstd, float* dq_weight, float* dk_weight, char* work,
                                 cudaStream_t s) const {
  const int d = cfg_.head_dim(), heads = cfg_.num_heads, kv_heads = cfg_.kv_heads();
  const size_t QKV = qw_ + 2 * kvw_;
  char* dy = work;
  char* dx = work + static_cast<size_t>(n) * qw_ * dsize_;
  copy_columns(dy, qw_, dqkv, QKV, n, qw_, dsize_, s);
  rmsnorm_backward(dy, raw, q_weight, rstd, dx, dq_weight, n * heads, d, false, dt_, s, norm_offset_);
  copy_columns(dqkv, QKV, dx, qw_, n, qw_, dsize_, s);
  char* dk = dqkv + qw_ * dsize_;
  copy_columns(dy, kvw_, dk, QKV, n, kvw_, dsize_, s);
  rmsnorm_backward(dy, raw + static_cast<size_t>(n) * qw_ * dsize_, k_weight, rstd + static_cast<size_t>(n) * heads, dx,
                   dk_weight, n * kv_heads, d, false, dt_, s, norm_offset_);
  copy_columns(dk, QKV, dx, kvw_, n, kvw_, dsize_, s);
}

std::vector<std::pair<int, int>> LlamaCuda::lora_columns(
    std::initializer_list<std::pair<Module, int>> projections) const {
  std::vector<std::pair<int, int>> calls;
  for (const auto& [projection, column] : projections) {
    const int module = lora_slots_[projection].module;
    if (calls.empty() || calls.back().first != module) calls.emplace_back(module, column);
  }
  return calls;
}

const float* LlamaCuda::rope_freq(int layer, int T) const {
  const float* long_freq = long_inv_freq(layer);
  return long_freq && rope_uses_long(cfg_, T - 1) ? long_freq : inv_freq(layer);
}

void LlamaCuda::embed_forward(UnitParams root, const int32_t* tokens, int B, int T, cudaStream_t s) {
  check_shape("embed_forward", B, T);
  embedding_forward(tokens, root_.embeddings.at(root, dsize_), hidden(0), B * T, cfg_.hidden_size, cfg_.vocab_size, dt_,
                    s);
  if (embed_scale_ != 1.0f)  // Gemma: the embeddings times sqrt(hidden_size)
    scale_values(hidden(0), static_cast<size_t>(B) * T * cfg_.hidden_size, embed_scale_, dt_, s);
}

void LlamaCuda::forward_into(int layer, UnitParams params, Saved& sv, int B, int T, cudaStream_t s, bool recompute) {
  const int N = B * T, H = cfg_.hidden_size, F = ffn_, QKV = qw_ + 2 * kvw_, d = cfg_.head_dim();
  const int heads = cfg_.num_heads, kv_heads = cfg_.kv_heads();
  const char* p = static_cast<const char*>(params.base);
  auto w = [&](size_t offset) { return p + offset * dsize_; };
  MatMul mm{gemm_, s, 1, fp8_.scratch()};
  // A linear layer's LoRA term onto its output columns (row stride ld), when it is adapted.
  auto lora = [&](int mod, const void* x, char* y, int ld) {
    lora_.forward(layer, mod, params.adapter, x, N, T, y, ld, gemm_, s);
  };
  const RotaryOptions rope{rotary_dim_, rope_scale_};
  const char* x = hidden(layer);
  char* out = hidden(layer + 1);
  const float eps = cfg_.rms_norm_eps;

  // Attention: h2 = x + o_proj(attention(rotary(q), rotary(k), v)) of RMSNorm(x). In FP8 each norm before a
  // projection reduces its output's amax as it writes it, as the gated activation does before down_proj.
  const MatMul qkv_mm = mm.projection(fp8_slot(layer, kFp8Qkv));
  unsigned* qkv_amax = qkv_mm.fp8_forward_x_amax(N, QKV, H, QKV, dt_);
  rmsnorm_forward(x, w(block_.input_norm), norm_.data(), sv.rstd1.data(), N, H, eps, dt_, s, norm_offset_, qkv_amax);
  qkv_mm.input_amax_in(qkv_amax)(false, true, N, QKV, H, norm_.data(), H, w(block_.qkv), H, sv.qkv.data(), QKV, dt_,
                                 dt_, 0, qkv_bias_ ? Epilogue::Bias : Epilogue::None,
                                 qkv_bias_ ? w(block_.qkv_bias) : nullptr);
  for (const auto& [mod, col] : lora_columns({{kQProj, 0}, {kKProj, qw_}, {kVProj, qw_ + kvw_}}))
    lora(mod, norm_.data(), sv.qkv.data() + col * dsize_, QKV);
  // Qwen3: each head of q and k RMSNormed before rotary.
  if (qk_norm_)
    qk_norm_forward(sv.qkv.data(), N, w(block_.q_norm), w(block_.k_norm), sv.qk_raw.data(), sv.qk_rstd.data(),
                    qk_work_.data(), s);
  rotary_apply(sv.qkv.data(), N, T, heads + kv_heads, d, QKV, rope_freq(layer, T), false, dt_, s, starts_, rope);  // q, k
  // The layer's window (Gemma 3's global layers have none) and the model's score scale.
  if (attention_.fused())
    attention_.forward(sv.qkv.data(), sv.context.data(), sv.lse.data(), nullptr, starts_, attn_ws_.data(), B, T, s,
                       layer);
  else
    gqa_attention_forward(gemm_, sv.qkv.data(), sv.context.data(), sv.lse.data(), B, T, heads, kv_heads, d, dt_,
                          attn_ws_.data(), s, starts_, cfg_.layer_sliding_window(layer), attention_scale());
  const size_t NH = static_cast<size_t>(N) * H * dsize_;
  if (sandwich_) {  // Gemma 3: h2 = x + RMSNorm(o_proj(...))
    mm.projection(fp8_slot(layer, kFp8O))(false, true, N, H, qw_, sv.context.data(), qw_, w(block_.o), qw_,
                                          sv.attn_out.data(), H, dt_, dt_);
    lora(lora_slots_[kOProj].module, sv.context.data(), sv.attn_out.data(), H);
    add_normed(x, sv.attn_out.data(), w(block_.attn_out_norm), sv.rstd3.data(), sv.h2.data(), N, s);
  } else {
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(sv.h2.data(), x, NH, cudaMemcpyDeviceToDevice, s));
    mm.projection(fp8_slot(layer, kFp8O))(false, true, N, H, qw_, sv.context.data(), qw_, w(block_.o), qw_,
                                          sv.h2.data(), H, dt_, dt_, 1);
    lora(lora_slots_[kOProj].module, sv.context.data(), sv.h2.data(), H);
  }

  // MLP: out = h2 + down_proj(silu(gate_proj(n)) * up_proj(n)), n = RMSNorm(h2) (GeGLU: gelu_tanh for silu;
  // sandwich norms: down_proj's output normed before the add).
  const MatMul gate_up_mm = mm.projection(fp8_slot(layer, kFp8GateUp));
  unsigned* gate_up_amax = gate_up_mm.fp8_forward_x_amax(N, 2 * F, H, 2 * F, dt_);
  rmsnorm_forward(sv.h2.data(), w(block_.post_norm), norm_.data(), sv.rstd2.data(), N, H, eps, dt_, s, norm_offset_,
                  gate_up_amax);
  gate_up_mm.input_amax_in(gate_up_amax)(false, true, N, 2 * F, H, norm_.data(), H, w(block_.gate_up), H,
                                         sv.gate_up.data(), 2 * F, dt_, dt_);
  for (const auto& [mod, col] : lora_columns({{kGateProj, 0}, {kUpProj, F}}))
    lora(mod, norm_.data(), sv.gate_up.data() + col * dsize_, 2 * F);
  const int down = lora_slots_[kDownProj].module;
  // The backward forms SiLU(gate) * up itself; with sandwich norms it needs down_proj's output too.
  if (recompute && !lora_.on(down) && !sandwich_) return;
  // In FP8 the activation's kernel reduces its amax as it writes it: down_proj's quantization reads it once.
  const MatMul down_mm = mm.projection(fp8_slot(layer, kFp8Down));
  unsigned* act_amax = down_mm.fp8_forward_x_amax(N, H, F, H, dt_);
  gated_forward(sv.gate_up.data(), wide_.data(), N, s, act_amax);
  if (sandwich_) {
    down_mm.input_amax_in(act_amax)(false, true, N, H, F, wide_.data(), F, w(block_.down), F, sv.mlp_out.data(), H,
                                    dt_, dt_);
    lora(down, wide_.data(), sv.mlp_out.data(), H);
    if (recompute)  // the norm's 1/rms only: out is the kept h_{layer+1}
      rmsnorm_forward(sv.mlp_out.data(), w(block_.mlp_out_norm), norm_.data(), sv.rstd4.data(), N, H, eps, dt_, s,
                      norm_offset_);
    else
      add_normed(sv.h2.data(), sv.mlp_out.data(), w(block_.mlp_out_norm), sv.rstd4.data(), out, N, s);
    return;
  }
  if (recompute) {  // down_proj's x A^T only: out is the kept h_{layer+1}
    lora_.forward(layer, down, params.adapter, wide_.data(), N, T, nullptr, H, gemm_, s);
    return;
  }
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(out, sv.h2.data(), NH, cudaMemcpyDeviceToDevice, s));
  down_mm.input_amax_in(act_amax)(false, true, N, H, F, wide_.data(), F, w(block_.down), F, out, H, dt_, dt_, 1);
  lora(down, wide_.data(), out, H);
}

void LlamaCuda::block_forward(int layer, UnitParams params, int B, int T, cudaStream_t s) {
  check_shape("block_forward", B, T);
  check_layer("block_forward", layer);
  if (B * T == 0) return;
  forward_into(layer, params, saved(layer), B, T, s);
}

void LlamaCuda::head(UnitParams root, const int32_t* targets, int B, int T, float grad_scale, bool backward,
                     float* loss_sum, long long* count, UnitGrads droot, cudaStream_t s) {
  check_shape("head", B, T);
  const int N = B * T, H = cfg_.hidden_size;
  if (N == 0) return;
  const char* hL = hidden(cfg_.num_layers);
  // A null gradient: that tensor is frozen.
  auto dr = [&](const model_detail::RootTensor& t) { return backward ? t.grad(droot) : nullptr; };
  const char* norm_w = root_.norm.at(root, dsize_);
  rmsnorm_forward(hL, norm_w, norm_.data(), final_rstd_.data(), N, H, cfg_.rms_norm_eps, dt_, s, norm_offset_);
  lm_head_loss(gemm_, norm_.data(), root_.head.at(root, dsize_), targets, N, H, cfg_.vocab_size, sizes_.head_chunk,
               grad_scale, loss_sum, count, backward ? grad_.data() : nullptr, dr(root_.head), dt_, head_scratch(), s);
  if (!backward) return;
  rmsnorm_backward(grad_.data(), hL, norm_w, final_rstd_.data(), dh_.data(), dr(root_.norm), N, H, false, dt_, s,
                   norm_offset_);
}

void LlamaCuda::down_backward(int layer, UnitParams params, UnitGrads grads, const Saved& sv, const char* dmlp, int B,
                              int T, const MatMul& down_mm, unsigned* dgate_up_amax, cudaStream_t s) {
  const int N = B * T, H = cfg_.hidden_size, F = ffn_, down = lora_slots_[kDownProj].module;
  const char* W = static_cast<const char*>(params.base) + block_.down * dsize_;
  float* dW = grads.base_at(block_.down);  // null: frozen, no weight GEMM
  char* act = wide_.data();  // act, or d(act) written over it
  // out = h2 + act W_down^T, act = SiLU(gate) * up (GeGLU's gelu_tanh(gate) * up), recomputed. With FP8 the two
  // GEMMs run together (dy quantized once, act's amax the forward's): act first, by the forward's kernel.
  if (down_mm.fp8) {
    gated_forward(sv.gate_up.data(), act, N, s);
    lora_.param_backward(layer, down, params.adapter, act, dmlp, H, N, T, grads.adapter, gemm_, s);
    down_mm.linear_backward(N, H, F, dmlp, H, act, F, W, dW, act, F, dt_);
    lora_.input_backward(layer, down, params.adapter, N, T, act, gemm_, s);
    gated_backward(act, sv.gate_up.data(), dgate_up_.data(), N, s, dgate_up_amax);
    return;
  }
  // Otherwise d(act) first; the activation's backward then writes act over it from the gate|up it reads anyway, for
  // the gradients that read act (gate|up read once, not again for a recomputation).
  lora_.b_backward(layer, down, params.adapter, dmlp, H, N, grads.adapter, gemm_, s);
  down_mm.input_backward(N, H, F, dmlp, H, W, act, F, dt_);
  lora_.input_backward(layer, down, params.adapter, N, T, act, gemm_, s);
  gated_backward(act, sv.gate_up.data(), dgate_up_.data(), N, s, dgate_up_amax, act);
  lora_.a_backward(layer, down, params.adapter, act, N, T, grads.adapter, gemm_, s);
  down_mm.weight_backward(N, H, F, dmlp, H, act, F, dW, dt_);
}

void LlamaCuda::block_backward(int layer, UnitParams params, UnitGrads grads, int B, int T, cudaStream_t s) {
  check_shape("block_backward", B, T);
  check_layer("block_backward", layer);
  const int N = B * T, H = cfg_.hidden_size, F = ffn_, QKV = qw_ + 2 * kvw_, d = cfg_.head_dim();
  const int heads = cfg_.num_heads, kv_heads = cfg_.kv_heads();
  zero_unwritten(grads, s, N == 0);  // UnitGrads::fresh: what no kernel below writes whole
  if (N == 0) return;
  Saved& sv = saved(layer);
  if (checkpointing_) forward_into(layer, params, sv, B, T, s, true);  // recompute this block's activations
  const char* p = static_cast<const char*>(params.base);
  auto w = [&](size_t offset) { return p + offset * dsize_; };
  // A base tensor's gradient, null when the base is frozen (no weight, bias or norm gradient at all).
  auto g = [&](size_t offset) { return grads.base_at(offset); };
  MatMul mm{gemm_, s, 1, fp8_.scratch()};
  mm.weight_beta = grads.gemm_beta();
  // A linear layer's LoRA parameter gradients from its output's (columns of row stride ld), and its
  // input gradient's LoRA term, when it is adapted.
  auto lora_params = [&](int mod, const void* x, const char* dy, int ld) {
    lora_.param_backward(layer, mod, params.adapter, x, dy, ld, N, T, grads.adapter, gemm_, s);
  };
  auto lora_input = [&](int mod, char* dx) { lora_.input_backward(layer, mod, params.adapter, N, T, dx, gemm_, s); };
  const int o_mod = lora_slots_[kOProj].module;
  const auto qkv_lora = lora_columns({{kQProj, 0}, {kKProj, qw_}, {kVProj, qw_ + kvw_}});
  const auto gate_up_lora = lora_columns({{kGateProj, 0}, {kUpProj, F}});
  const char* x = hidden(layer);
  char* dh = dh_.data();  // d(out) on entry, d(h2) after the MLP, d(x) on exit
  const float eps = cfg_.rms_norm_eps;

  // Sandwich norms: d(down_proj's output) through the norm on it, into norm_ (free until the recomputation below).
  const char* dmlp = dh;
  if (sandwich_) {
    rmsnorm_backward(dh, sv.mlp_out.data(), w(block_.mlp_out_norm), sv.rstd4.data(), norm_.data(),
                     g(block_.mlp_out_norm), N, H, false, dt_, s, norm_offset_);
    dmlp = norm_.data();
  }
  // In FP8 the activation's backward reduces its output's amax as it writes it, for gate|up's quantization (nothing
  // between the two runs an FP8 GEMM: the LoRA terms run in 16 bits).
  const MatMul gate_up_mm = mm.projection(fp8_slot(layer, kFp8GateUp));
  unsigned* dgate_up_amax =
      gate_up_mm.fp8_backward_dy_amax(N, 2 * F, H, 2 * F, H, g(block_.gate_up) != nullptr, H, dt_);
  down_backward(layer, params, grads, sv, dmlp, B, T, mm.projection(fp8_slot(layer, kFp8Down)), dgate_up_amax, s);
  // gate|up = n W_gu^T with n = RMSNorm(h2) (recomputed; rstd2 is rewritten with the same values).
  rmsnorm_forward(sv.h2.data(), w(block_.post_norm), norm_.data(), sv.rstd2.data(), N, H, eps, dt_, s, norm_offset_);
  for (const auto& [mod, col] : gate_up_lora) lora_params(mod, norm_.data(), dgate_up_.data() + col * dsize_, 2 * F);
  gate_up_mm.input_amax_in(dgate_up_amax)
      .linear_backward(N, 2 * F, H, dgate_up_.data(), 2 * F, norm_.data(), H, w(block_.gate_up), g(block_.gate_up),
                       grad_.data(), H, dt_);
  for (const auto& [mod, col] : gate_up_lora) lora_input(mod, grad_.data());
  // The residual carries d(out) through: d(h2) = d(out) + RMSNorm backward.
  rmsnorm_backward(grad_.data(), sv.h2.data(), w(block_.post_norm), sv.rstd2.data(), dh, g(block_.post_norm), N, H,
                   true, dt_, s, norm_offset_);
  backward_tail_done();  // the MLP's gradients are queued: from tail_begin_ on the unit's are final

  // h2 = x + context W_o^T (sandwich norms: x + RMSNorm(context W_o^T), its gradient into norm_ first).
  const char* dattn = dh;
  if (sandwich_) {
    rmsnorm_backward(dh, sv.attn_out.data(), w(block_.attn_out_norm), sv.rstd3.data(), norm_.data(),
                     g(block_.attn_out_norm), N, H, false, dt_, s, norm_offset_);
    dattn = norm_.data();
  }
  lora_params(o_mod, sv.context.data(), dattn, H);
  mm.projection(fp8_slot(layer, kFp8O))
      .linear_backward(N, H, qw_, dattn, H, sv.context.data(), qw_, w(block_.o), g(block_.o), grad_.data(), qw_, dt_);
  lora_input(o_mod, grad_.data());
  if (attention_.fused())
    attention_.backward(grad_.data(), sv.qkv.data(), sv.context.data(), sv.lse.data(), dqkv_.data(), nullptr,
                        starts_, attn_ws_.data(), B, T, s, layer);
  else
    gqa_attention_backward(gemm_, grad_.data(), sv.qkv.data(), sv.lse.data(), dqkv_.data(), B, T, heads, kv_heads, d,
                           dt_, attn_ws_.data(), s, starts_, cfg_.layer_sliding_window(layer), attention_scale());
  rotary_apply(dqkv_.data(), N, T, heads + kv_heads, d, QKV, rope_freq(layer, T), true, dt_, s, starts_,
               RotaryOptions{rotary_dim_, rope_scale_});
  if (qk_norm_)
    qk_norm_backward(dqkv_.data(), N, w(block_.q_norm), w(block_.k_norm), sv.qk_raw.data(), sv.qk_rstd.data(),
                     g(block_.q_norm), g(block_.k_norm), qk_work_.data(), s);
  // q|k|v = n W_qkv^T with n = RMSNorm(x) (recomputed).
  rmsnorm_forward(x, w(block_.input_norm), norm_.data(), sv.rstd1.data(), N, H, eps, dt_, s, norm_offset_);
  if (grads.base && qkv_bias_) bias_grad(dqkv_.data(), g(block_.qkv_bias), N, QKV, dt_, s);
  for (const auto& [mod, col] : qkv_lora) lora_params(mod, norm_.data(), dqkv_.data() + col * dsize_, QKV);
  mm.projection(fp8_slot(layer, kFp8Qkv))
      .linear_backward(N, QKV, H, dqkv_.data(), QKV, norm_.data(), H, w(block_.qkv), g(block_.qkv), grad_.data(), H,
                       dt_);
  for (const auto& [mod, col] : qkv_lora) lora_input(mod, grad_.data());
  // d(x) = d(h2) + RMSNorm backward.
  rmsnorm_backward(grad_.data(), x, w(block_.input_norm), sv.rstd1.data(), dh, g(block_.input_norm), N, H, true, dt_,
                   s, norm_offset_);
}

void LlamaCuda::embed_backward(UnitParams, const int32_t* tokens, UnitGrads droot, int B, int T, cudaStream_t s) {
  check_shape("embed_backward", B, T);
  float* dtable = root_.embeddings.grad(droot);
  if (!dtable) return;  // a frozen embedding: nothing below h_0 is trained
  // d(h_0) is read only here: scaled in place by the embedding's scale.
  if (embed_scale_ != 1.0f)
    scale_values(dh_.data(), static_cast<size_t>(B) * T * cfg_.hidden_size, embed_scale_, dt_, s);
  embedding_backward(tokens, dh_.data(), dtable, B * T, cfg_.hidden_size, cfg_.vocab_size, dt_, s);
}

std::unique_ptr<CudaModel> make_llama_cuda(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                           bool activation_checkpointing, const LlamaBlock& block) {
  return std::make_unique<LlamaCuda>(cfg, dt, max_batch, max_seq, activation_checkpointing, block);
}

}  // namespace shardlm::cuda

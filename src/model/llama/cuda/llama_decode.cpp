// LlamaCuda's greedy decoding: the embedding, each block and the LM head on the rows of one step,
// with every layer's keys and values (kv heads only) kept in a cache on the GPU so that a step runs
// only its new tokens. The block is forward_into's math on rows of many sequences; rotary takes each
// row's own position and attention reads the slot's cache (decode_attention.cu, no ALiBi). Logits
// exist for at most sizes_.head_chunk rows at once, in the training head's workspace, which is idle
// while decoding. LlamaCpu::block_decode is the reference.
#include "decode_attention.hpp"
#include "elementwise.hpp"
#include "embedding.hpp"
#include "llama_cuda.hpp"
#include "rmsnorm.hpp"
#include "rotary.hpp"
#include "swiglu.hpp"

namespace shardlm::cuda {

void LlamaCuda::decode_allocate(int slots, int max_len, int max_rows) {
  SHARDLM_CHECK(sizes_.head_chunk >= 1, "LlamaCuda::decode_allocate: built for micro-batches of no tokens (",
                max_batch_, " x ", max_seq_, "): no LM head workspace");
  decode_free();
  allocate_cache(slots, max_len, max_rows, cfg_.kv_heads());
  const size_t H = cfg_.hidden_size, rows = static_cast<size_t>(max_rows);
  decode_.hidden.allocate(rows * H * dsize_);
  decode_.h2.allocate(rows * H * dsize_);
  decode_.norm.allocate(rows * H * dsize_);
  decode_.qkv.allocate(rows * (qw_ + 2 * kvw_) * dsize_);
  decode_.ctx.allocate(rows * qw_ * dsize_);
  decode_.gate_up.allocate(rows * 2 * ffn_ * dsize_);
  decode_.wide.allocate(rows * ffn_ * dsize_);
  decode_.rstd.allocate(rows);
  if (sandwich_) decode_.out.allocate(rows * H * dsize_);
  if (qk_norm_) {
    decode_.qk.allocate(rows * (qw_ + kvw_ + qw_) * dsize_);
    decode_.qk_rstd.allocate(rows * (cfg_.num_heads + cfg_.kv_heads()));
  }
}

void LlamaCuda::decode_free() {
  decode_ = DecodeBuffers{};
  free_cache();
}

void LlamaCuda::decode_embed(UnitParams root, const int32_t* tokens, int n, cudaStream_t s) {
  if (!check_step_rows("decode_embed", n)) return;
  embedding_forward(tokens, root_.embeddings.at(root, dsize_), decode_.hidden.data(), n, cfg_.hidden_size,
                    cfg_.vocab_size, dt_, s);
  if (embed_scale_ != 1.0f)
    scale_values(decode_.hidden.data(), static_cast<size_t>(n) * cfg_.hidden_size, embed_scale_, dt_, s);
}

void LlamaCuda::decode_block(int layer, UnitParams params, const int32_t* slots, const int32_t* positions, int n,
                             cudaStream_t s) {
  check_layer("decode_block", layer);
  if (!check_step_rows("decode_block", n)) return;
  const int H = cfg_.hidden_size, F = ffn_, QKV = qw_ + 2 * kvw_, d = cfg_.head_dim();
  const int heads = cfg_.num_heads, kv_heads = cfg_.kv_heads();
  const float eps = cfg_.rms_norm_eps;
  const size_t NH = static_cast<size_t>(n) * H * dsize_;
  const char* p = static_cast<const char*>(params.base);
  auto w = [&](size_t offset) { return p + offset * dsize_; };
  // A linear layer's LoRA term onto its output columns (row stride ld), when it is adapted.
  auto lora = [&](int mod, const void* x, char* y, int ld) {
    lora_.decode_forward(layer, mod, params.adapter, x, n, y, ld, gemm_, s);
  };
  DecodeBuffers& b = decode_;
  char* keys = layer_keys(layer);
  char* values = layer_values(layer);
  const int max_len = cache_max_len();

  // Attention: h2 = x + o_proj(attention(rotary(q), rotary(k), v)) of RMSNorm(x).
  rmsnorm_forward(b.hidden.data(), w(block_.input_norm), b.norm.data(), b.rstd.data(), n, H, eps, dt_, s, norm_offset_);
  linear_rows(gemm_, b.norm.data(), n, H, w(block_.qkv), qkv_bias_ ? w(block_.qkv_bias) : nullptr, QKV, b.qkv.data(),
              false, dt_, s);
  for (const auto& [mod, col] : lora_columns({{kQProj, 0}, {kKProj, qw_}, {kVProj, qw_ + kvw_}}))
    lora(mod, b.norm.data(), b.qkv.data() + col * dsize_, QKV);
  if (qk_norm_)  // Qwen3's per-head q/k RMSNorms: the raw heads and the normed scratch side by side in b.qk
    qk_norm_forward(b.qkv.data(), n, w(block_.q_norm), w(block_.k_norm), b.qk.data(), b.qk_rstd.data(),
                    b.qk.data() + static_cast<size_t>(n) * (qw_ + kvw_) * dsize_, s);
  // q and k heads; LongRoPE's factors by the largest position of each row's sequence in the step.
  RotaryOptions rope{rotary_dim_, rope_scale_};
  if (const float* long_freq = long_inv_freq(layer)) {
    rope.long_inv_freq = long_freq;
    rope.slots = slots;
    rope.original_max = cfg_.longrope.original_max_position_embeddings;
  }
  rotary_apply_at(b.qkv.data(), n, positions, heads + kv_heads, d, QKV, inv_freq(layer), dt_, s, rope);
  // Every row's key and value are cached before any row attends: rows of one slot see each other.
  DecodeQkv qkv = grouped_qkv(heads, kv_heads, d);
  qkv.scale = attention_scale();
  kv_cache_write(b.qkv.data(), qkv, slots, positions, n, max_len, keys, values, dt_, s);
  decode_attention(b.qkv.data(), qkv, keys, values, slots, positions, n, nullptr, b.ctx.data(), max_len, dt_, s,
                   cfg_.layer_sliding_window(layer));
  // A sandwich norm: y = base + RMSNorm(out), through b.norm.
  auto add_normed_rows = [&](const char* base, const char* out, size_t weight, char* y) {
    rmsnorm_forward(out, w(weight), b.norm.data(), b.rstd.data(), n, H, eps, dt_, s, norm_offset_);
    add(base, b.norm.data(), y, static_cast<size_t>(n) * H, dt_, s);
  };
  if (sandwich_) {
    linear_rows(gemm_, b.ctx.data(), n, qw_, w(block_.o), nullptr, H, b.out.data(), false, dt_, s);
    lora(lora_slots_[kOProj].module, b.ctx.data(), b.out.data(), H);
    add_normed_rows(b.hidden.data(), b.out.data(), block_.attn_out_norm, b.h2.data());
  } else {
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(b.h2.data(), b.hidden.data(), NH, cudaMemcpyDeviceToDevice, s));
    linear_rows(gemm_, b.ctx.data(), n, qw_, w(block_.o), nullptr, H, b.h2.data(), true, dt_, s);
    lora(lora_slots_[kOProj].module, b.ctx.data(), b.h2.data(), H);
  }

  // MLP: out = h2 + down_proj(silu(gate_proj(m)) * up_proj(m)), m = RMSNorm(h2), written over the
  // step's hidden states.
  rmsnorm_forward(b.h2.data(), w(block_.post_norm), b.norm.data(), b.rstd.data(), n, H, eps, dt_, s, norm_offset_);
  linear_rows(gemm_, b.norm.data(), n, H, w(block_.gate_up), nullptr, 2 * F, b.gate_up.data(), false, dt_, s);
  for (const auto& [mod, col] : lora_columns({{kGateProj, 0}, {kUpProj, F}}))
    lora(mod, b.norm.data(), b.gate_up.data() + col * dsize_, 2 * F);
  gated_forward(b.gate_up.data(), b.wide.data(), n, s);
  if (sandwich_) {
    linear_rows(gemm_, b.wide.data(), n, F, w(block_.down), nullptr, H, b.out.data(), false, dt_, s);
    lora(lora_slots_[kDownProj].module, b.wide.data(), b.out.data(), H);
    add_normed_rows(b.h2.data(), b.out.data(), block_.mlp_out_norm, b.hidden.data());
    return;
  }
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(b.hidden.data(), b.h2.data(), NH, cudaMemcpyDeviceToDevice, s));
  linear_rows(gemm_, b.wide.data(), n, F, w(block_.down), nullptr, H, b.hidden.data(), true, dt_, s);
  lora(lora_slots_[kDownProj].module, b.wide.data(), b.hidden.data(), H);
}

void LlamaCuda::decode_head(UnitParams root, const int32_t* rows, int m, int32_t* next, float* logits,
                            cudaStream_t s) {
  DecodeBuffers& b = decode_;
  // h2 is free between blocks: it takes the rows whose logits are wanted.
  if (!gather_head_rows(b.hidden.data(), rows, m, b.h2.data(), s)) return;
  rmsnorm_forward(b.h2.data(), root_.norm.at(root, dsize_), b.norm.data(), b.rstd.data(), m, cfg_.hidden_size,
                  cfg_.rms_norm_eps, dt_, s, norm_offset_);
  // lm_head.weight, or embed_tokens.weight when tied.
  head_argmax(b.norm.data(), m, root_.head.at(root, dsize_), sizes_.head_chunk, next, logits, s);
}

}  // namespace shardlm::cuda

// BloomCuda: the BLOOM block's forward and backward as cuBLASLt GEMMs (bias and GELU fused into
// their epilogues) and the kernels of device/cuda (layernorm, alibi_attention, ...), on
// the caller's stream.
#include "bloom_cuda.hpp"

#include <algorithm>
#include <string>

#include "../bloom_layout.hpp"
#include "alibi_attention.hpp"
#include "device_setup.hpp"
#include "elementwise.hpp"
#include "embedding.hpp"
#include "layernorm.hpp"
#include "lm_head.hpp"
#include "matmul.hpp"

namespace shardlm::cuda {

BloomCuda::BloomCuda(const ModelConfig& cfg, DType dt, int max_batch, int max_seq, bool activation_checkpointing)
    : CudaModelBase("BloomCuda", cfg, dt, max_batch, max_seq, activation_checkpointing, true),
      sizes_(bloom_cuda_sizes(cfg, dt, max_batch, max_seq, activation_checkpointing, attention_.fused())) {
  const std::vector<UnitLayout> layout = bloom_layout(cfg);  // also validates the config
  const BloomRootOffsets root = bloom_root_offsets(layout[0]);
  auto place = [&](size_t offset) { return model_detail::root_tensor(cfg, offset); };
  root_ = {place(root.embeddings), place(root.embed_norm_weight), place(root.embed_norm_bias),
           place(root.final_norm_weight), place(root.final_norm_bias)};
  if (cfg.num_layers > 0) {
    block_ = bloom_block_offsets(layout[1]);
    const size_t H = cfg.hidden_size;
    written_whole(layout[1].numel, {{block_.qkv_weight, 3 * H * H}, {block_.dense_weight, H * H},
                                    {block_.mlp_in_weight, 4 * H * H}, {block_.mlp_out_weight, 4 * H * H}});
  }
  std::vector<float> slopes = alibi_slopes(cfg.num_heads);
  slopes_.allocate(slopes.size());
  copy_to_device_now(slopes_.data(), slopes.data(), slopes.size() * sizeof(float));

  // Every size from bloom_cuda_sizes, which `shardlm plan` reads too.
  const BloomCudaSizes& z = sizes_;
  allocate_step_buffers(z.hidden, z.attention_workspace, z.head_workspace, z.fp8);
  emb_.allocate(z.norm_out);
  lnf_.allocate(z.norm_out);
  for (DeviceBuffer<float>* b : {&emb_mean_, &emb_rstd_, &lnf_mean_, &lnf_rstd_}) b->allocate(z.row_stats / sizeof(float));
  saved_.resize(z.saved_blocks);
  for (Saved& sv : saved_) {
    sv.ln1.allocate(z.ln);
    sv.qkv.allocate(z.qkv);
    sv.probs.allocate(z.probs);
    sv.ctx.allocate(z.context);
    sv.h2.allocate(z.h2);
    sv.ln2.allocate(z.ln);
    sv.pre.allocate(z.wide);
    sv.act.allocate(z.wide);
    for (DeviceBuffer<float>* b : {&sv.mean1, &sv.rstd1, &sv.mean2, &sv.rstd2}) b->allocate(z.row_stats / sizeof(float));
  }
  for (auto& b : dh_) b.allocate(z.dh);
  dln_.allocate(z.dln);
  dqkv_.allocate(z.dqkv);
  dctx_.allocate(z.dctx);
  dh2_.allocate(z.dh2);
  dpre_.allocate(z.dpre);

  const int H = cfg.hidden_size;
  describe_fp8(
      {{"query_key_value", 3 * H, H}, {"dense", H, H}, {"dense_h_to_4h", 4 * H, H}, {"dense_4h_to_h", H, 4 * H}},
      "dense_h_to_4h's forward and dense_4h_to_h's input gradient, which carry GELU in their epilogue (each in FP8 "
      "where a LoRA adapter on that layer moves the GELU out)");
}

size_t BloomCuda::activation_bytes() const {
  size_t n = step_buffer_bytes() + emb_.bytes() + lnf_.bytes();
  n += dh_[0].bytes() * 2 + dln_.bytes() + dqkv_.bytes() + dctx_.bytes() + dh2_.bytes() + dpre_.bytes();
  for (const Saved& sv : saved_)
    n += sv.ln1.bytes() + sv.qkv.bytes() + sv.probs.bytes() + sv.ctx.bytes() + sv.h2.bytes() + sv.ln2.bytes() +
         sv.pre.bytes() + sv.act.bytes() + 4 * sv.mean1.bytes();
  return n;
}

void BloomCuda::embed_forward(UnitParams root, const int32_t* tokens, int B, int T, cudaStream_t s) {
  const int N = B * T, H = cfg_.hidden_size, V = cfg_.vocab_size;
  embedding_forward(tokens, root_.embeddings.at(root, dsize_), emb_.data(), N, H, V, dt_, s);
  layernorm_forward(emb_.data(), root_.embed_norm_weight.at(root, dsize_), root_.embed_norm_bias.at(root, dsize_),
                    hidden(0), emb_mean_.data(), emb_rstd_.data(), N, H, cfg_.layer_norm_eps, dt_, s);
}

void BloomCuda::forward_into(int layer, UnitParams params, Saved& sv, int B, int T, cudaStream_t s, bool recompute) {
  const int N = B * T, H = cfg_.hidden_size;
  const char* p = static_cast<const char*>(params.base);
  auto w = [&](size_t offset) { return p + offset * dsize_; };
  MatMul mm{gemm_, s, 1, fp8_.scratch()};
  // A linear layer's LoRA term onto its output (row stride ld), when it is adapted.
  auto lora = [&](Module mod, const void* x, char* y, int ld) {
    lora_.forward(layer, mod, params.adapter, x, N, T, y, ld, gemm_, s);
  };
  char* x = hidden(layer);
  char* out = hidden(layer + 1);
  const float eps = cfg_.layer_norm_eps;

  layernorm_forward(x, w(block_.ln1_weight), w(block_.ln1_bias), sv.ln1.data(), sv.mean1.data(),
                    sv.rstd1.data(), N, H, eps, dt_, s);
  mm(false, true, N, 3 * H, H, sv.ln1.data(), H, w(block_.qkv_weight), H, sv.qkv.data(), 3 * H, dt_, dt_, 0,
     Epilogue::Bias, w(block_.qkv_bias));
  lora(kQueryKeyValue, sv.ln1.data(), sv.qkv.data(), 3 * H);
  if (attention_.fused())
    attention_.forward(sv.qkv.data(), sv.ctx.data(), reinterpret_cast<float*>(sv.probs.data()), slopes_.data(),
                       starts_, attn_ws_.data(), B, T, s);
  else
    alibi_attention_forward(gemm_, sv.qkv.data(), sv.ctx.data(), sv.probs.data(), slopes_.data(), B, T, cfg_.num_heads,
                            cfg_.head_dim(), dt_, attn_ws_.data(), s, starts_);
  // h2 = x + ctx Wd^T + bd: the residual is copied in and the GEMM accumulates onto it.
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(sv.h2.data(), x, static_cast<size_t>(N) * H * dsize_, cudaMemcpyDeviceToDevice, s));
  mm(false, true, N, H, H, sv.ctx.data(), H, w(block_.dense_weight), H, sv.h2.data(), H, dt_, dt_, 1,
     Epilogue::Bias, w(block_.dense_bias));
  lora(kDense, sv.ctx.data(), sv.h2.data(), H);
  layernorm_forward(sv.h2.data(), w(block_.ln2_weight), w(block_.ln2_bias),
                    sv.ln2.data(), sv.mean2.data(), sv.rstd2.data(), N, H, eps, dt_, s);
  if (lora_.on(kDenseHTo4H)) {  // pre = ln2 W1^T + b1 + its LoRA term, then GELU
    mm(false, true, N, 4 * H, H, sv.ln2.data(), H, w(block_.mlp_in_weight), H, sv.pre.data(), 4 * H, dt_, dt_, 0,
       Epilogue::Bias, w(block_.mlp_in_bias));
    lora(kDenseHTo4H, sv.ln2.data(), sv.pre.data(), 4 * H);
    gelu_forward(sv.pre.data(), sv.act.data(), static_cast<size_t>(N) * 4 * H, dt_, s);
  } else {
    mm(false, true, N, 4 * H, H, sv.ln2.data(), H, w(block_.mlp_in_weight), H, sv.act.data(), 4 * H, dt_, dt_, 0,
       Epilogue::BiasGelu, w(block_.mlp_in_bias), sv.pre.data());
  }
  if (recompute) {  // dense_4h_to_h's x A^T only: out is the kept h_{layer+1}
    lora_.forward(layer, kDense4HToH, params.adapter, sv.act.data(), N, T, nullptr, H, gemm_, s);
    return;
  }
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(out, sv.h2.data(), static_cast<size_t>(N) * H * dsize_, cudaMemcpyDeviceToDevice, s));
  mm(false, true, N, H, 4 * H, sv.act.data(), 4 * H, w(block_.mlp_out_weight), 4 * H, out, H, dt_, dt_, 1,
     Epilogue::Bias, w(block_.mlp_out_bias));
  lora(kDense4HToH, sv.act.data(), out, H);
}

void BloomCuda::block_forward(int layer, UnitParams params, int B, int T, cudaStream_t s) {
  forward_into(layer, params, saved(layer), B, T, s);
}

void BloomCuda::head(UnitParams root, const int32_t* targets, int B, int T, float grad_scale, bool backward,
                     float* loss_sum, long long* count, UnitGrads droot, cudaStream_t s) {
  const int N = B * T, H = cfg_.hidden_size, V = cfg_.vocab_size, L = cfg_.num_layers;
  const char* hL = hidden(L);
  // A null gradient: that tensor is frozen.
  auto dr = [&](const model_detail::RootTensor& t) { return backward ? t.grad(droot) : nullptr; };
  const char* lnf_w = root_.final_norm_weight.at(root, dsize_);
  layernorm_forward(hL, lnf_w, root_.final_norm_bias.at(root, dsize_), lnf_.data(),
                    lnf_mean_.data(), lnf_rstd_.data(), N, H, cfg_.layer_norm_eps, dt_, s);
  lm_head_loss(gemm_, lnf_.data(), root_.embeddings.at(root, dsize_), targets, N, H, V, sizes_.head_chunk,
               grad_scale, loss_sum, count, backward ? dln_.data() : nullptr, dr(root_.embeddings), dt_,
               head_scratch(), s);
  if (!backward) return;
  dcur_ = 0;
  layernorm_backward(dln_.data(), hL, lnf_w, lnf_mean_.data(), lnf_rstd_.data(),
                     dh_[dcur_].data(), dr(root_.final_norm_weight), dr(root_.final_norm_bias), N, H, false, dt_, s);
}

void BloomCuda::block_backward(int layer, UnitParams params, UnitGrads grads, int B, int T, cudaStream_t s) {
  const int N = B * T, H = cfg_.hidden_size;
  const size_t NH = static_cast<size_t>(N) * H;
  zero_unwritten(grads, s, N == 0);  // UnitGrads::fresh: what no kernel below writes whole
  Saved& sv = saved(layer);
  if (checkpointing_) forward_into(layer, params, sv, B, T, s, true);  // recompute this block's activations
  const char* p = static_cast<const char*>(params.base);
  auto w = [&](size_t offset) { return p + offset * dsize_; };
  const bool train_base = grads.base != nullptr;  // else frozen: no weight, bias or norm gradient at all
  auto g = [&](size_t offset) { return grads.base_at(offset); };
  MatMul mm{gemm_, s, 1, fp8_.scratch()};
  // A linear layer's weight and bias gradients (unless frozen) and its LoRA parameter gradients, from
  // the gradient of its output [N, out]; then, after its input gradient, that gradient's LoRA term.
  auto param_backward = [&](Module mod, const void* x, const char* dy, int in, int out, size_t weight, size_t bias) {
    if (train_base) {
      mm(true, false, out, in, N, dy, out, x, in, g(weight), in, dt_, DType::F32, grads.gemm_beta());
      bias_grad(dy, g(bias), N, out, dt_, s);
    }
    lora_.param_backward(layer, mod, params.adapter, x, dy, out, N, T, grads.adapter, gemm_, s);
  };
  auto lora_input = [&](Module mod, char* dx) {
    lora_.input_backward(layer, mod, params.adapter, N, T, dx, gemm_, s);
  };
  const char* x = hidden(layer);
  char* dout = dh_[dcur_].data();
  char* dx = dh_[1 - dcur_].data();

  // out = h2 + act W2^T + b2
  param_backward(kDense4HToH, sv.act.data(), dout, 4 * H, H, block_.mlp_out_weight, block_.mlp_out_bias);
  if (lora_.on(kDense4HToH)) {  // d(act) with its LoRA term, then GELU's backward
    mm(false, false, N, 4 * H, H, dout, H, w(block_.mlp_out_weight), 4 * H, dpre_.data(), 4 * H, dt_, dt_);
    lora_input(kDense4HToH, dpre_.data());
    gelu_backward(dpre_.data(), sv.pre.data(), dpre_.data(), NH * 4, dt_, s);
  } else {
    mm(false, false, N, 4 * H, H, dout, H, w(block_.mlp_out_weight), 4 * H, dpre_.data(), 4 * H, dt_, dt_, 0,
       Epilogue::DGelu, nullptr, sv.pre.data());
  }
  // pre = ln2 W1^T + b1
  param_backward(kDenseHTo4H, sv.ln2.data(), dpre_.data(), H, 4 * H, block_.mlp_in_weight, block_.mlp_in_bias);
  mm(false, false, N, H, 4 * H, dpre_.data(), 4 * H, w(block_.mlp_in_weight), H, dln_.data(), H, dt_, dt_);
  lora_input(kDenseHTo4H, dln_.data());
  // dh2 = dout + LayerNorm2 backward
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dh2_.data(), dout, NH * dsize_, cudaMemcpyDeviceToDevice, s));
  layernorm_backward(dln_.data(), sv.h2.data(), w(block_.ln2_weight), sv.mean2.data(),
                     sv.rstd2.data(), dh2_.data(), g(block_.ln2_weight),
                     g(block_.ln2_bias), N, H, true, dt_, s);
  // h2 = x + ctx Wd^T + bd
  param_backward(kDense, sv.ctx.data(), dh2_.data(), H, H, block_.dense_weight, block_.dense_bias);
  mm(false, false, N, H, H, dh2_.data(), H, w(block_.dense_weight), H, dctx_.data(), H, dt_, dt_);
  lora_input(kDense, dctx_.data());
  if (attention_.fused())
    attention_.backward(dctx_.data(), sv.qkv.data(), sv.ctx.data(), reinterpret_cast<const float*>(sv.probs.data()),
                        dqkv_.data(), slopes_.data(), starts_, attn_ws_.data(), B, T, s);
  else
    alibi_attention_backward(gemm_, dctx_.data(), sv.qkv.data(), sv.probs.data(), dqkv_.data(), slopes_.data(), B, T,
                             cfg_.num_heads, cfg_.head_dim(), dt_, attn_ws_.data(), s);
  // qkv = ln1 Wqkv^T + bqkv
  param_backward(kQueryKeyValue, sv.ln1.data(), dqkv_.data(), H, 3 * H, block_.qkv_weight, block_.qkv_bias);
  mm(false, false, N, H, 3 * H, dqkv_.data(), 3 * H, w(block_.qkv_weight), H, dln_.data(), H, dt_, dt_);
  lora_input(kQueryKeyValue, dln_.data());
  // dx = dh2 + LayerNorm1 backward
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dx, dh2_.data(), NH * dsize_, cudaMemcpyDeviceToDevice, s));
  layernorm_backward(dln_.data(), x, w(block_.ln1_weight), sv.mean1.data(), sv.rstd1.data(), dx,
                     g(block_.ln1_weight), g(block_.ln1_bias), N, H, true, dt_, s);
  dcur_ = 1 - dcur_;
}

void BloomCuda::embed_backward(UnitParams root, const int32_t* tokens, UnitGrads droot, int B, int T, cudaStream_t s) {
  float* dtable = root_.embeddings.grad(droot);
  float* dnorm_w = root_.embed_norm_weight.grad(droot);
  if (!dtable && !dnorm_w) return;  // nothing below h_0 is trained
  const int N = B * T, H = cfg_.hidden_size, V = cfg_.vocab_size;
  // dln_ is free here: it takes the gradient of the embedding output.
  layernorm_backward(dh_[dcur_].data(), emb_.data(), root_.embed_norm_weight.at(root, dsize_), emb_mean_.data(),
                     emb_rstd_.data(), dln_.data(), dnorm_w, root_.embed_norm_bias.grad(droot), N, H, false, dt_, s);
  if (dtable) embedding_backward(tokens, dln_.data(), dtable, N, H, V, dt_, s);
}

std::unique_ptr<CudaModel> make_bloom_cuda(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                           bool activation_checkpointing) {
  return std::make_unique<BloomCuda>(cfg, dt, max_batch, max_seq, activation_checkpointing);
}

}  // namespace shardlm::cuda

// BloomCuda's greedy decoding: the embedding, each block and the tied head on the rows of one step,
// with every layer's keys and values kept in a cache on the GPU so that a step runs only its new
// tokens. The block is forward_into's math on rows of many sequences; only attention differs (it
// reads the slot's cache, decode_attention.cu). Logits exist for at most sizes_.head_chunk rows at once,
// in the training head's workspace, which is idle while decoding.
#include "bloom_cuda.hpp"
#include "decode_attention.hpp"
#include "elementwise.hpp"
#include "embedding.hpp"
#include "layernorm.hpp"

namespace shardlm::cuda {

void BloomCuda::decode_allocate(int slots, int max_len, int max_rows) {
  decode_free();
  allocate_cache(slots, max_len, max_rows, cfg_.num_heads);
  const size_t H = cfg_.hidden_size, rows = static_cast<size_t>(max_rows);
  decode_.hidden.allocate(rows * H * dsize_);
  decode_.h2.allocate(rows * H * dsize_);
  decode_.ln.allocate(rows * H * dsize_);
  decode_.qkv.allocate(rows * 3 * H * dsize_);
  decode_.ctx.allocate(rows * H * dsize_);
  decode_.wide.allocate(rows * 4 * H * dsize_);
  decode_.mean.allocate(rows);
  decode_.rstd.allocate(rows);
}

void BloomCuda::decode_free() {
  decode_ = DecodeBuffers{};
  free_cache();
}

void BloomCuda::decode_embed(UnitParams root, const int32_t* tokens, int n, cudaStream_t s) {
  if (!check_step_rows("decode_embed", n)) return;
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  // ln takes the raw embeddings; the LayerNorm writes the step's hidden states.
  embedding_forward(tokens, root_.embeddings.at(root, dsize_), decode_.ln.data(), n, H, V, dt_, s);
  layernorm_forward(decode_.ln.data(), root_.embed_norm_weight.at(root, dsize_), root_.embed_norm_bias.at(root, dsize_),
                    decode_.hidden.data(), decode_.mean.data(), decode_.rstd.data(), n, H, cfg_.layer_norm_eps, dt_,
                    s);
}

void BloomCuda::decode_block(int layer, UnitParams params, const int32_t* slots, const int32_t* positions, int n,
                             cudaStream_t s) {
  check_layer("decode_block", layer);
  if (!check_step_rows("decode_block", n)) return;
  const int H = cfg_.hidden_size, heads = cfg_.num_heads, d = cfg_.head_dim();
  const float eps = cfg_.layer_norm_eps;
  const size_t NH = static_cast<size_t>(n) * H;
  const char* p = static_cast<const char*>(params.base);
  auto w = [&](size_t offset) { return p + offset * dsize_; };
  // A linear layer's LoRA term onto its output (row stride ld), when it is adapted.
  auto lora = [&](Module mod, const void* x, char* y, int ld) {
    lora_.decode_forward(layer, mod, params.adapter, x, n, y, ld, gemm_, s);
  };
  DecodeBuffers& b = decode_;
  const BloomBlockOffsets& o = block_;
  char* keys = layer_keys(layer);
  char* values = layer_values(layer);
  const int max_len = cache_max_len();

  layernorm_forward(b.hidden.data(), w(o.ln1_weight), w(o.ln1_bias), b.ln.data(), b.mean.data(), b.rstd.data(), n,
                    H, eps, dt_, s);
  linear_rows(gemm_, b.ln.data(), n, H, w(o.qkv_weight), w(o.qkv_bias), 3 * H, b.qkv.data(), false, dt_, s);
  lora(kQueryKeyValue, b.ln.data(), b.qkv.data(), 3 * H);
  // Every row's key and value are cached before any row attends: rows of one slot see each other.
  const DecodeQkv qkv = interleaved_qkv(heads, d);
  kv_cache_write(b.qkv.data(), qkv, slots, positions, n, max_len, keys, values, dt_, s);
  decode_attention(b.qkv.data(), qkv, keys, values, slots, positions, n, slopes_.data(), b.ctx.data(), max_len, dt_,
                   s);
  // h2 = x + ctx Wd^T + bd
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(b.h2.data(), b.hidden.data(), NH * dsize_, cudaMemcpyDeviceToDevice, s));
  linear_rows(gemm_, b.ctx.data(), n, H, w(o.dense_weight), w(o.dense_bias), H, b.h2.data(), true, dt_, s);
  lora(kDense, b.ctx.data(), b.h2.data(), H);
  // out = h2 + gelu(LayerNorm(h2) W1^T + b1) W2^T + b2, written over the step's hidden states.
  layernorm_forward(b.h2.data(), w(o.ln2_weight), w(o.ln2_bias), b.ln.data(), b.mean.data(), b.rstd.data(), n, H,
                    eps, dt_, s);
  linear_rows(gemm_, b.ln.data(), n, H, w(o.mlp_in_weight), w(o.mlp_in_bias), 4 * H, b.wide.data(), false, dt_, s);
  lora(kDenseHTo4H, b.ln.data(), b.wide.data(), 4 * H);
  gelu_forward(b.wide.data(), b.wide.data(), NH * 4, dt_, s);
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(b.hidden.data(), b.h2.data(), NH * dsize_, cudaMemcpyDeviceToDevice, s));
  linear_rows(gemm_, b.wide.data(), n, 4 * H, w(o.mlp_out_weight), w(o.mlp_out_bias), H, b.hidden.data(), true, dt_,
              s);
  lora(kDense4HToH, b.wide.data(), b.hidden.data(), H);
}

void BloomCuda::decode_head(UnitParams root, const int32_t* rows, int m, int32_t* next, float* logits,
                            cudaStream_t s) {
  DecodeBuffers& b = decode_;
  if (!gather_head_rows(b.hidden.data(), rows, m, b.ctx.data(), s)) return;
  layernorm_forward(b.ctx.data(), root_.final_norm_weight.at(root, dsize_), root_.final_norm_bias.at(root, dsize_), b.ln.data(),
                    b.mean.data(), b.rstd.data(), m, cfg_.hidden_size, cfg_.layer_norm_eps, dt_, s);
  // The LM head is tied: its weight is the embedding table.
  head_argmax(b.ln.data(), m, root_.embeddings.at(root, dsize_), sizes_.head_chunk, next, logits, s);
}

}  // namespace shardlm::cuda

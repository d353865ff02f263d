// AttentionPath (attention_path.hpp): the choice between cuDNN's fused attention and the native kernels.
#include "attention_path.hpp"

#include <algorithm>

#include "packed_bias.hpp"
#include "workspace_sizes.hpp"

#ifdef SHARDLM_HAVE_CUDNN
#include "cudnn_attention.hpp"
#endif

namespace shardlm::cuda {

#ifdef SHARDLM_HAVE_CUDNN
namespace {
// A sliding window (`window`, the layer's) is the graph's own mask, or, in packed rows, part of their bias
// (packed_bias). The scores' scale is the model's where it sets one (query_pre_attn_scalar).
AttentionLayout layout_of(const ModelConfig& cfg, DType dt, int B, int T, bool alibi, bool packed, int window) {
  AttentionLayout l = alibi ? AttentionLayout::interleaved_alibi(B, T, cfg.num_heads, cfg.head_dim(), dt)
                            : AttentionLayout::grouped(B, T, cfg.num_heads, cfg.kv_heads(), cfg.head_dim(), dt);
  l.bias = packed;
  l.window = packed ? 0 : window;
  if (cfg.query_pre_attn_scalar > 0) l.scale = cfg.attention_scale();
  return l;
}
}  // namespace
#endif

AttentionPath::AttentionPath(const char* model, const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                             bool alibi)
    : model_(model), cfg_(cfg), dt_(dt), alibi_(alibi) {
  if (cfg.attention == AttentionImpl::Native) {
    description_ = "native (model.attention = native)";
    return;
  }
  std::string why = fused_attention_refusal(cfg, dt);
#ifdef SHARDLM_HAVE_CUDNN
  if (why.empty()) why = CudnnAttention::unavailable_reason();
  if (why.empty() && cfg.num_layers > 0 && max_batch > 0 && max_seq > 0) {
    cudnn_ = std::make_shared<CudnnAttention>();
    // Plans for the largest micro-batch now, before any step; other shapes get theirs on first use.
    // A packed run's micro-batches may be packed or not (eval): both graphs must be taken.
    const AttentionLayout l = layout_of(cfg, dt, max_batch, max_seq, alibi, false, cfg.sliding_window);
    why = cudnn_->prepare(l);
    size_t engine_bytes = why.empty() ? cudnn_->workspace_bytes(l) : 0;
    // Layers without the window (Gemma 3's global ones) run the graph without its mask: planned too.
    if (why.empty() && cfg.sliding_window > 0 && cfg.sliding_window_pattern > 0) {
      const AttentionLayout global = layout_of(cfg, dt, max_batch, max_seq, alibi, false, 0);
      why = cudnn_->prepare(global);
      if (why.empty()) engine_bytes = std::max(engine_bytes, cudnn_->workspace_bytes(global));
    }
    if (why.empty() && cfg.packed) {
      const AttentionLayout packed = layout_of(cfg, dt, max_batch, max_seq, alibi, true, cfg.sliding_window);
      why = cudnn_->prepare(packed);
      if (!why.empty()) why = concat("packed rows (data.packing): ", why);
      else engine_bytes = std::max(engine_bytes, cudnn_->workspace_bytes(packed));
    }
    if (why.empty()) {
      // What the plan counted, or cuDNN's own figure where that is larger; packed rows' bias first.
      const int kv_heads = alibi ? cfg.num_heads : cfg.kv_heads();
      bias_bytes_ = cfg.packed ? packed_attention_bias_bytes(max_batch, max_seq) : 0;
      capacity_ = bias_bytes_ + std::max(engine_bytes, cudnn_attention_workspace_bytes(max_batch, max_seq, cfg.num_heads,
                                                                                       kv_heads, cfg.head_dim()));
    } else {
      cudnn_.reset();
    }
  }
#endif
  if (why.empty()) {
#ifdef SHARDLM_HAVE_CUDNN
    fused_ = true;
    description_ = concat("cudnn (cuDNN ", CudnnAttention::version(), " fused flash attention)");
#endif
    return;
  }
  SHARDLM_CHECK(cfg.attention != AttentionImpl::Cudnn, model,
                ": model.attention = cudnn, but cuDNN's fused attention cannot run here: ", why,
                " (set model.attention = auto or native)");
  description_ = concat("native (cuDNN's fused attention not used: ", why, ")");
}

AttentionPath::~AttentionPath() = default;

#ifdef SHARDLM_HAVE_CUDNN
// Layout of a B x T micro-batch, its plans built on first use; a shape cuDNN refuses, or one whose
// workspace would exceed the largest shape's (what the model allocated), is an Error.
static AttentionLayout ready(CudnnAttention& cudnn, const char* model, const ModelConfig& cfg, DType dt, int B, int T,
                             bool alibi, bool packed, size_t capacity, int window) {
  const AttentionLayout l = layout_of(cfg, dt, B, T, alibi, packed, window);
  const std::string refused = cudnn.prepare(l);
  SHARDLM_CHECK(refused.empty(), model, ": cuDNN attention refused a ", B, " x ", T, " micro-batch: ", refused);
  SHARDLM_CHECK(cudnn.workspace_bytes(l) <= capacity, model, ": cuDNN attention wants ", cudnn.workspace_bytes(l),
                " bytes of workspace for a ", B, " x ", T, " micro-batch, more than the ", capacity, " planned");
  return l;
}
#endif

int AttentionPath::window_of(int layer) const {
  return layer >= 0 ? cfg_.layer_sliding_window(layer) : cfg_.sliding_window;
}

void* AttentionPath::packed_bias(const int32_t* starts, void* workspace, int B, int T, int window,
                                 cudaStream_t s) const {
  if (!starts) return nullptr;
  SHARDLM_CHECK(bias_bytes_ > 0, model_, ": packed rows for a model built without data.packing");
  packed_attention_bias(starts, B, T, window, workspace, dt_, s);
  return workspace;
}

void AttentionPath::forward(const void* qkv, void* ctx, float* lse, const float* slopes, const int32_t* starts,
                            void* workspace, int B, int T, cudaStream_t s, int layer) {
  SHARDLM_CHECK(fused_, model_, ": the fused attention path is not in use");
#ifdef SHARDLM_HAVE_CUDNN
  const int window = window_of(layer);
  const void* bias = packed_bias(starts, workspace, B, T, window, s);
  cudnn_->forward(ready(*cudnn_, model_, cfg_, dt_, B, T, alibi_, bias != nullptr, capacity_ - bias_bytes_, window), qkv,
                  ctx, lse, slopes, bias, static_cast<char*>(workspace) + bias_bytes_, s);
#endif
}

void AttentionPath::backward(const void* dctx, const void* qkv, const void* ctx, const float* lse, void* dqkv,
                             const float* slopes, const int32_t* starts, void* workspace, int B, int T,
                             cudaStream_t s, int layer) {
  SHARDLM_CHECK(fused_, model_, ": the fused attention path is not in use");
#ifdef SHARDLM_HAVE_CUDNN
  const int window = window_of(layer);
  const void* bias = packed_bias(starts, workspace, B, T, window, s);
  cudnn_->backward(ready(*cudnn_, model_, cfg_, dt_, B, T, alibi_, bias != nullptr, capacity_ - bias_bytes_, window),
                   dctx, qkv, ctx, lse, dqkv, slopes, bias, static_cast<char*>(workspace) + bias_bytes_, s);
#endif
}

}  // namespace shardlm::cuda

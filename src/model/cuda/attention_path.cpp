// AttentionPath (attention_path.hpp): the choice between cuDNN's fused attention and the native kernels.
#include "attention_path.hpp"

#include <algorithm>

#include "workspace_sizes.hpp"

#ifdef SHARDLM_HAVE_CUDNN
#include "cudnn_attention.hpp"
#endif

namespace shardlm::cuda {

#ifdef SHARDLM_HAVE_CUDNN
namespace {
AttentionLayout layout_of(const ModelConfig& cfg, DType dt, int B, int T, bool bloom) {
  return bloom ? AttentionLayout::bloom(B, T, cfg.num_heads, cfg.head_dim(), dt)
               : AttentionLayout::grouped(B, T, cfg.num_heads, cfg.kv_heads(), cfg.head_dim(), dt);
}
}  // namespace
#endif

AttentionPath::AttentionPath(const char* model, const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                             bool bloom)
    : model_(model), cfg_(cfg), dt_(dt), bloom_(bloom) {
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
    const AttentionLayout l = layout_of(cfg, dt, max_batch, max_seq, bloom);
    why = cudnn_->prepare(l);
    if (why.empty()) {
      // What the plan counted, or cuDNN's own figure where that is larger.
      const int kv_heads = bloom ? cfg.num_heads : cfg.kv_heads();
      capacity_ =
          std::max(cudnn_->workspace_bytes(l),
                   cudnn_attention_workspace_bytes(max_batch, max_seq, cfg.num_heads, kv_heads, cfg.head_dim()));
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
                             bool bloom, size_t capacity) {
  const AttentionLayout l = layout_of(cfg, dt, B, T, bloom);
  const std::string refused = cudnn.prepare(l);
  SHARDLM_CHECK(refused.empty(), model, ": cuDNN attention refused a ", B, " x ", T, " micro-batch: ", refused);
  SHARDLM_CHECK(cudnn.workspace_bytes(l) <= capacity, model, ": cuDNN attention wants ", cudnn.workspace_bytes(l),
                " bytes of workspace for a ", B, " x ", T, " micro-batch, more than the ", capacity, " planned");
  return l;
}
#endif

void AttentionPath::forward(const void* qkv, void* ctx, float* lse, const float* slopes, void* workspace, int B, int T,
                            cudaStream_t s) {
  SHARDLM_CHECK(fused_, model_, ": the fused attention path is not in use");
#ifdef SHARDLM_HAVE_CUDNN
  cudnn_->forward(ready(*cudnn_, model_, cfg_, dt_, B, T, bloom_, capacity_), qkv, ctx, lse, slopes, workspace, s);
#endif
}

void AttentionPath::backward(const void* dctx, const void* qkv, const void* ctx, const float* lse, void* dqkv,
                             const float* slopes, void* workspace, int B, int T, cudaStream_t s) {
  SHARDLM_CHECK(fused_, model_, ": the fused attention path is not in use");
#ifdef SHARDLM_HAVE_CUDNN
  cudnn_->backward(ready(*cudnn_, model_, cfg_, dt_, B, T, bloom_, capacity_), dctx, qkv, ctx, lse, dqkv, slopes,
                   workspace, s);
#endif
}

}  // namespace shardlm::cuda

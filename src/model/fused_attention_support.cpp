// Which attention the CUDA models run, as far as the build and the shape tell (model.hpp).
#include "shardlm/model.hpp"

namespace shardlm {

std::string fused_attention_refusal(const ModelConfig& cfg, DType dt) {
#ifndef SHARDLM_HAVE_CUDNN
  (void)cfg, (void)dt;
  return "this build has no cuDNN: SHARDLM_CUDNN=OFF, or cuDNN was not found";
#else
  if (dt == DType::F32) return "the compute dtype is fp32 (cuDNN's fused attention takes bf16 or fp16)";
  const int d = cfg.num_heads > 0 ? cfg.head_dim() : 0;
  if (d % 8 != 0 || d <= 0 || d > 256)
    return concat("head dimension ", d, " (cuDNN's fused attention takes multiples of 8 up to 256)");
  return "";
#endif
}

bool plans_fused_attention(const ModelConfig& cfg, DType dt) {
  return cfg.attention != AttentionImpl::Native && fused_attention_refusal(cfg, dt).empty();
}

}  // namespace shardlm

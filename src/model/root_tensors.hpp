// Private to src/model: where a model reads each tensor of the root unit (embeddings, final norm, LM
// head) and accumulates its gradient, for every family on both backends. Without LoRA the root is one
// flat parameter (UnitParams::base); with LoRA the modules of lora.modules_to_save are trained in the
// trainable root (UnitParams::adapter, lora_layout's) and the rest is frozen in the base
// (lora_frozen_layout's), whose gradients are never formed.
#pragma once

#include <cstddef>

#include "shardlm/model.hpp"

namespace shardlm::model_detail {

struct RootTensor {
  bool saved = false;  // in the trainable root of a LoRA run (a module of modules_to_save)
  size_t offset = 0;   // elements, inside the flat parameter that holds it

  // The flat parameter (and its gradient) that holds the tensor; a null gradient is a frozen tensor.
  template <class T>
  const T* buffer(UnitParamsOf<T> root) const { return saved ? root.adapter : root.base; }
  float* grad_buffer(UnitGrads droot) const { return saved ? droot.adapter : droot.base; }

  const float* at(CpuParams root) const { return buffer(root) + offset; }
  // In a flat parameter of `elem_size`-byte values (the compute dtype).
  const char* at(UnitParams root, size_t elem_size) const {
    return static_cast<const char*>(buffer(root)) + offset * elem_size;
  }
  float* grad(UnitGrads droot) const {
    float* g = grad_buffer(droot);
    return g ? g + offset : nullptr;
  }
};

// The place of the model_layout root tensor at element `model_offset` (a family's root offsets) in a
// run of cfg: with LoRA, in lora_layout's root when its module is saved, else in lora_frozen_layout's.
RootTensor root_tensor(const ModelConfig& cfg, size_t model_offset);

}  // namespace shardlm::model_detail

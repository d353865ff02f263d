// root_tensor: a root tensor's place in the split root of a LoRA run (root_tensors.hpp).
#include "root_tensors.hpp"

#include "model_internal.hpp"

namespace shardlm::model_detail {

RootTensor root_tensor(const ModelConfig& cfg, size_t model_offset) {
  const UnitLayout root = model_layout(cfg).front();
  const TensorSpec* spec = nullptr;
  for (const TensorSpec& t : root.tensors)
    if (t.offset == model_offset) spec = &t;
  SHARDLM_CHECK(spec, "root_tensor: no tensor of the ", cfg.arch, " root starts at element ", model_offset);
  if (!cfg.lora.enabled()) return {false, model_offset};
  const UnitLayout saved = lora_layout(cfg).front();
  for (const TensorSpec& t : saved.tensors)
    if (t.name == spec->name) return {true, t.offset};
  return {false, tensor_offset(lora_frozen_layout(cfg).front(), spec->name, "root_tensor")};
}

}  // namespace shardlm::model_detail

// Private to src/model: the UnitModel adapters make_unit_model builds around a backend's model.
#pragma once

#include <memory>

#include "shardlm/model.hpp"

namespace shardlm::model_detail {

// The CPU adapter: owns `model` and the hidden states and their gradients, [max_batch * max_seq,
// hidden_size] in fp32 twice each (ping-pong), counted as activations.
std::unique_ptr<UnitModel> make_cpu_unit_model(std::unique_ptr<CpuModel> model, int max_batch, int max_seq);

#ifdef SHARDLM_HAVE_CUDA
// The CUDA adapter: owns `model` (computing in dt), the loss and target-count device scalars and
// a pinned host scalar for reading the loss back.
std::unique_ptr<UnitModel> make_cuda_unit_model(std::unique_ptr<cuda::CudaModel> model, DType dt);
#endif

}  // namespace shardlm::model_detail

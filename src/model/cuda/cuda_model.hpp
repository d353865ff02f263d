// CudaModel: what the CUDA engine asks of a model on the GPU (forward and backward of each FSDP
// unit on the caller's stream, activations in buffers planned up front; greedy decoding with a
// key/value cache), and the factory that picks the model of cfg.arch's family.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

namespace shardlm::cuda {

// Parameters are a unit's gathered flat parameters in the compute dtype (UnitParams: the base in the
// layout of model_layout or lora_frozen_layout, the LoRA adapters in lora_layout's or null; the root's
// tensors read where root_tensor places them); parameter gradients are fp32 in
// the same layouts (UnitGrads), accumulated (+=), and a null base gradient is a frozen base: none of its
// gradients is formed, only the input gradients. Hidden states live inside the model: h_0 from
// embed_forward, h_{l+1} from block_forward(l), their gradients likewise.
class CudaModel {
 public:
  virtual ~CudaModel() = default;

  // UnitModel::set_sample_starts (device memory [B*T]), or null for one sample per row.
  virtual void set_sample_starts(const int32_t* starts) = 0;
  // UnitModel::set_dropout: training forwards with LoRA dropout masks of `seed`, or evaluation (nullopt).
  virtual void set_dropout(std::optional<uint64_t> seed) = 0;
  // h_0 from the token ids (device memory [B*T]).
  virtual void embed_forward(UnitParams root, const int32_t* tokens, int B, int T, cudaStream_t s) = 0;
  // h_{l+1} = block_l(h_l) with the gathered parameters of block l.
  virtual void block_forward(int layer, UnitParams params, int B, int T, cudaStream_t s) = 0;
  // Final norm, LM head and cross-entropy on h_L: adds the loss sum and target count to loss_sum /
  // count (device scalars). With backward: the gradient of grad_scale * sum flows to the gradient
  // of h_L and into droot's trained tensors (fp32, +=; a frozen tensor forms none).
  virtual void head(UnitParams root, const int32_t* targets, int B, int T, float grad_scale, bool backward,
                    float* loss_sum, long long* count, UnitGrads droot, cudaStream_t s) = 0;
  // The gradient of h_l from that of h_{l+1}; grads += the block's parameter gradients.
  virtual void block_backward(int layer, UnitParams params, UnitGrads grads, int B, int T, cudaStream_t s) = 0;
  // droot += the embedding path's gradient given the gradient of h_0 (nothing when none of its
  // tensors is trained).
  virtual void embed_backward(UnitParams root, const int32_t* tokens, UnitGrads droot, int B, int T,
                              cudaStream_t s) = 0;

  // Bytes of the device buffers counted as activations in the run's memory records.
  virtual size_t activation_bytes() const = 0;
  // The attention path and why (AttentionPath::description).
  virtual std::string attention_description() const = 0;
  virtual int length_multiple() const = 0;  // UnitModel::length_multiple
  virtual std::string fp8_description() const = 0;  // UnitModel::fp8_description
  virtual void frozen_weights_changed() = 0;        // UnitModel::frozen_weights_changed
  virtual size_t head_scratch_bytes() const = 0;    // UnitModel::head_scratch_bytes
  virtual void* share_head_scratch(size_t bytes) = 0;  // UnitModel::share_head_scratch
  virtual void* lend_head_scratch(size_t bytes, const UnitModel::LendScratch& allocate) = 0;  // UnitModel's
  virtual size_t backward_tail_begin() const = 0;   // UnitModel::backward_tail_begin
  virtual void set_backward_tail_hook(std::function<void()> hook) = 0;  // UnitModel::set_backward_tail_hook
  virtual const ModelConfig& config() const = 0;

  // ---- greedy decoding with a key/value cache (UnitModel::decode_*) ----
  // The cache of `slots` sequences of up to `max_len` positions and the scratch of steps of up to
  // `max_rows` rows, alive from decode_allocate to decode_free.
  virtual void decode_allocate(int slots, int max_len, int max_rows) = 0;
  virtual void decode_free() = 0;
  // The step's hidden states from n token ids (device memory).
  virtual void decode_embed(UnitParams root, const int32_t* tokens, int n, cudaStream_t s) = 0;
  // Block `layer` on the step's n rows: row r's key and value are cached at (slots[r], positions[r])
  // and it attends to its slot's positions 0..positions[r] (device arrays, checked by the caller).
  virtual void decode_block(int layer, UnitParams params, const int32_t* slots, const int32_t* positions, int n,
                            cudaStream_t s) = 0;
  // UnitModel::decode_head: next[i] = the argmax of step row rows[i]'s logits and/or those fp32 logits
  // [m, vocab_size], i < m (device arrays; either output may be null).
  virtual void decode_head(UnitParams root, const int32_t* rows, int m, int32_t* next, float* logits,
                           cudaStream_t s) = 0;
};

// The GPU model of cfg.arch in compute dtype dt, for micro-batches of up to max_batch x max_seq
// tokens; with activation_checkpointing each block's activations are recomputed for its backward.
std::unique_ptr<CudaModel> make_cuda_model(const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                                           bool activation_checkpointing);

}  // namespace shardlm::cuda

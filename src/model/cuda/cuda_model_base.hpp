// Private to the CUDA models: what every family's CudaModel shares (its shape, dtype and GEMM
// handle, its attention path, the checks of shapes and layers, the hidden states, workspaces and FP8
// scratch of a step, greedy decoding's key/value cache); a family adds its units' forward, backward
// and decoding.
#pragma once

#include "../fp8_linear_note.hpp"
#include "attention_path.hpp"
#include "cuda_lora.hpp"
#include "cuda_model.hpp"
#include "device_memory.hpp"
#include "fp8_gemm.hpp"
#include "gemm.hpp"

namespace shardlm::cuda {

class CudaModelBase : public CudaModel {
 public:
  const ModelConfig& config() const override { return cfg_; }
  void set_sample_starts(const int32_t* starts) override { starts_ = starts; }
  void set_dropout(std::optional<uint64_t> seed) override { lora_.set_dropout(seed); }
  std::string attention_description() const override { return attention_.description(); }
  // The attention path's multiple, with FP8 also a multiple of 16 tokens (the FP8 GEMMs' token dimension).
  int length_multiple() const override;
  std::string fp8_description() const override { return fp8_note_; }
  void frozen_weights_changed() override { fp8_.forget_kept(); }
  size_t head_scratch_bytes() const override { return head_scratch_bytes_; }
  void* share_head_scratch(size_t bytes) override;
  void* lend_head_scratch(size_t bytes, const UnitModel::LendScratch& allocate) override;
  size_t backward_tail_begin() const override { return 0; }  // a family that splits its backward says where
  void set_backward_tail_hook(std::function<void()> hook) override { tail_hook_ = std::move(hook); }

 protected:
  // `name` prefixes every error ("LlamaCuda::block_forward: ..."). alibi: the family's attention is BLOOM's
  // (AttentionPath).
  CudaModelBase(const char* name, const ModelConfig& cfg, DType dt, int max_batch, int max_seq,
                bool activation_checkpointing, bool alibi);
  // name::what errors when B x T exceeds the sizes built for, or the layer does not exist.
  void check_shape(const char* what, int B, int T) const;
  void check_layer(const char* what, int layer) const;
  // model.fp8_linear's note (fp8_description; empty without FP8), said once by the family's constructor: the
  // block's linear layers and its other GEMMs that stay 16-bit (fp8_linear_note's `also`).
  void describe_fp8(const std::vector<model_detail::Fp8Linear>& linears, const std::string& also);

  // What every family's training step holds besides its own buffers, of the family's planned sizes
  // (its *_cuda_sizes): the hidden states h_0 .. h_L, each [max_tokens, H] in the compute dtype (h_l
  // is block l's input, kept for its backward), attention's workspace (the planned native one, or the
  // fused path's when larger) and the LM head's, model.fp8_linear's E4M3 operands; and LoRA's buffers
  // (lora_, allocated with the model).
  void allocate_step_buffers(size_t hidden_bytes, size_t attention_workspace_bytes, size_t head_workspace_bytes,
                             const Fp8ScratchSize& fp8);
  size_t step_buffer_bytes() const {
    return hidden_.bytes() + attn_ws_.bytes() + head_ws_.bytes() + (head_lent_ ? head_lent_->bytes() : 0) +
           fp8_.bytes() + lora_.bytes();
  }
  char* hidden(int l) { return hidden_.data() + static_cast<size_t>(l) * max_tokens_ * cfg_.hidden_size * dsize_; }

  // Greedy decoding's cache, [layers, slots, kv_heads, max_len, head_dim] in the compute dtype for
  // keys and for values, and the number of rows a step may have (LoRA's scratch for them too), from
  // decode_allocate to decode_free.
  void allocate_cache(int slots, int max_len, int max_rows, int kv_heads);
  void free_cache();
  char* layer_keys(int layer) { return keys_.data() + layer * layer_cache_bytes_; }
  char* layer_values(int layer) { return values_.data() + layer * layer_cache_bytes_; }
  int cache_max_len() const { return max_len_; }
  // name::what errors for a step of more rows than decode_allocate's; else whether the step has any rows
  // (an empty step does nothing).
  bool check_step_rows(const char* what, int n) const;
  // decode_head's steps around the family's final norm. gather_head_rows: `hidden`'s rows rows[i] (i < m, the
  // step's rows whose next token is wanted) into `out` ([m, H]), false for none (checked as check_step_rows);
  // head_argmax: next[i] = argmax of the logits of `normed` row i over the LM head's [V, H] `head` (written to
  // `logits` too unless null), `chunk` rows at a time through head_ws_.
  bool gather_head_rows(const void* hidden, const int32_t* rows, int m, void* out, cudaStream_t s) const;
  void head_argmax(const void* normed, int m, const void* head, int chunk, int32_t* next, float* logits,
                   cudaStream_t s);

  const char* name_;
  ModelConfig cfg_;
  DType dt_;
  size_t dsize_;
  int max_tokens_, max_seq_, max_batch_;
  bool checkpointing_;
  Gemm gemm_;
  AttentionPath attention_;  // cuDNN's fused attention or the family's native kernels, chosen before its sizes_
  const int32_t* starts_ = nullptr;  // set_sample_starts: the micro-batch's packed rows (device), or null
  DeviceBuffer<char> attn_ws_, head_ws_;  // see allocate_step_buffers; the head's also holds decoding's logits
  // The head's scratch: head_ws_, or the memory lent in its place (lend_head_scratch).
  char* head_scratch() const { return head_lent_ ? static_cast<char*>(head_lent_->data()) : head_ws_.data(); }
  CudaLoraBlocks lora_;  // the blocks' adapted linear layers (nothing without LoRA)
  Fp8Buffer fp8_;        // model.fp8_linear: the block GEMMs' E4M3 operands (see allocate_step_buffers)
  // block_backward between its MLP and its attention (UnitModel::backward_tail_begin).
  void backward_tail_done() const {
    if (tail_hook_) tail_hook_();
  }
  // UnitGrads::fresh: the family's constructor says what its block_backward writes whole (written_whole: its
  // projections' weights, [offset, offset + count) in the block's layout of `numel` elements), and
  // block_backward calls zero_unwritten first: the rest of the block's gradient, which its kernels add to
  // (norms, biases), zeroed; with none_written (a backward of no tokens) all of it. Nothing without fresh (or for
  // a frozen base).
  void written_whole(size_t numel, std::vector<std::pair<size_t, size_t>> regions);
  void zero_unwritten(const UnitGrads& grads, cudaStream_t s, bool none_written = false) const;

 private:
  DeviceBuffer<char> hidden_;
  DeviceBuffer<char> keys_, values_;
  std::string fp8_note_;
  size_t head_scratch_bytes_ = 0;  // what the head writes of head_ws_ (share_head_scratch may have grown it)
  std::unique_ptr<DeviceMemory> head_lent_;  // lend_head_scratch's memory, in head_ws_'s place
  std::function<void()> tail_hook_;  // set_backward_tail_hook
  size_t block_numel_ = 0;                                // written_whole
  std::vector<std::pair<size_t, size_t>> block_written_;  // written_whole's regions, in order
  size_t layer_cache_bytes_ = 0;
  int max_len_ = 0, max_rows_ = 0;
};

}  // namespace shardlm::cuda

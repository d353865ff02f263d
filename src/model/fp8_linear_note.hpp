// Private to src/model: the start-up note of model.fp8_linear (the run's log line "fp8: ..."), built
// by each CUDA family from its blocks' linear layers.
#pragma once

#include <string>
#include <vector>

#include "../device/cuda/workspace_sizes.hpp"

namespace shardlm::model_detail {

using cuda::kFp8SizeMultiple;  // the FP8 GEMMs' size multiple (fp8_gemm_fits)

// The micro-batch length multiple a CUDA family asks for: its attention path's, and with model.fp8_linear
// also a multiple of kFp8SizeMultiple tokens (the FP8 GEMMs' token dimension).
int fp8_length_multiple(bool fp8_linear, int attention_multiple);

// A linear layer of a block as the note names it, y[n, out] = x[n, in] W[out, in]^T.
struct Fp8Linear {
  std::string name;
  int out = 0, in = 0;
};

// Which linear layers run their GEMMs in FP8 and which stay 16-bit because out or in is not a multiple
// of 16 (cuBLASLt's FP8 GEMMs need it), then `also` (a family's own 16-bit GEMMs, e.g. those with a
// GELU epilogue), then, when max_seq is not a multiple of 16, that a micro-batch of that many tokens
// a sequence stays 16-bit unless its token count is one.
std::string fp8_linear_note(const std::vector<Fp8Linear>& linears, const std::string& also, int max_seq);

}  // namespace shardlm::model_detail

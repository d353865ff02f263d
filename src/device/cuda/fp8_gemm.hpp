// A linear layer's three GEMMs in FP8 (model.fp8_linear): the 16-bit operands of a GemmDesc quantized
// to E4M3 with per-tensor current scaling (fp8_quantize), transposed where cuBLASLt's FP8 form needs
// it, then one FP8 GEMM with fp32 accumulation into C in its own dtype (the forward with cuBLASLt's
// fast accumulation, the two gradients without, as torchao's float8 training does).
//
//   forward  y[n, out]  = x[n, in] W[out, in]^T     (trans_a 0, trans_b 1): x and W as they are
//   dgrad    dx[n, in]  = dy[n, out] W[out, in]     (trans_a 0, trans_b 0): W transposed
//   wgrad    dW[out, in] += dy[n, out]^T x[n, in]   (trans_a 1, trans_b 0): dy and x transposed
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "device_memory.hpp"
#include "gemm.hpp"
#include "workspace_sizes.hpp"

namespace shardlm::cuda {

// Device scratch of the quantized operands: `a` and `b` hold the largest A and B of the GEMMs run
// through it (elements = bytes), `g` as many as `a` (a linear layer's output gradient untransposed
// while `a` holds its transpose), a_scale and b_scale their inverse scales (16-byte aligned each:
// cuBLASLt refuses the FP8 GEMM, CUBLAS_STATUS_NOT_SUPPORTED, for a scale pointer that is not),
// `amax` two unsigned, `saved_amax` two per slot (a linear layer's x and W amaxes from its forward,
// read again by its backward: run_fp8_gemm, run_fp8_linear_backward), and with model.fp8_keep_weights
// `kept`, one Fp8KeptWeight per slot.
// A linear layer's weight W [out, in] kept in E4M3 from its forward to its backward: `t` its transpose
// [in, out] (dgrad's B in cuBLASLt's FP8 form) of up to `elements` bytes, `inv_scale` its inverse scale
// (device, 16-byte aligned). The forward writes both with the copy it multiplies by (one read of W), the
// backward reads them instead of quantizing W again. A frozen weight (LoRA's base) also keeps that
// forward copy in `w` [out, in]: once `filled` (its first forward), forwards multiply by `w` without
// reading W at all, until Fp8Buffer::forget_kept. `filled` is host state set as the quantization is
// queued: right because a model runs every GEMM in order on one stream, without graph capture. A filled
// slot's W amax (saved_amax) is then never written again; nothing reads it, since dgrad takes `t`.
struct Fp8KeptWeight {
  uint8_t* t = nullptr;
  size_t elements = 0;
  float* inv_scale = nullptr;
  uint8_t* w = nullptr;
  bool filled = false;
};
struct Fp8Scratch {
  uint8_t* a = nullptr;
  size_t a_bytes = 0;
  uint8_t* g = nullptr;
  uint8_t* b = nullptr;
  size_t b_bytes = 0;
  float* a_scale = nullptr;
  float* b_scale = nullptr;
  unsigned* amax = nullptr;
  unsigned* saved_amax = nullptr;
  int slots = 0;
  Fp8KeptWeight* kept = nullptr;  // host array of `slots` entries, or null: no weight kept
  // The parts of one allocation of fp8_scratch_bytes(a_elements, b_elements, slots) (workspace_sizes.hpp) at base.
  static Fp8Scratch at(void* base, size_t a_elements, size_t b_elements, size_t slots = 0);
};

// The scratch a model holds for its FP8 GEMMs, allocated once (nothing for an empty size).
class Fp8Buffer {
 public:
  void allocate(const Fp8ScratchSize& size);
  // Null without FP8: MatMul then runs every GEMM in 16 bits.
  const Fp8Scratch* scratch() const { return buffer_.bytes() ? &scratch_ : nullptr; }
  size_t bytes() const { return buffer_.bytes(); }
  size_t kept_bytes() const { return size_.kept_bytes(); }  // of that, the kept weights
  bool kept_frozen() const { return size_.frozen && !size_.kept.empty(); }  // kept for the whole run (LoRA)
  // The frozen weights changed (loaded again): their kept copies are made again by their next forwards.
  void forget_kept() {
    for (Fp8KeptWeight& k : kept_) k.filled = false;
  }

 private:
  DeviceBuffer<char> buffer_;
  Fp8Scratch scratch_{};
  std::vector<Fp8KeptWeight> kept_;  // scratch_.kept
  Fp8ScratchSize size_;              // what allocate carved
};

// Whether d (16-bit A and B, no batch, epilogue None or Bias) can run as an FP8 GEMM: every size a
// multiple of 16, the transposed copies fitting the scratch, C's row stride a multiple of 16 bytes.
bool fp8_gemm_fits(const GemmDesc& d, const Fp8Scratch& w);
// Runs d in FP8 through w (fp8_gemm_fits must hold). With a slot (>= 0, below w.slots) the amaxes of A and
// B (a linear layer's forward: x and W) are kept in it, A's first, for the layer's backward, and so is W's
// transposed E4M3 copy where the slot keeps one (w.kept).
// With `a_amax_known` the word fp8_gemm_a_amax(w, slot) already holds A's amax (the kernel that wrote A
// reduced it, fp8_amax.cuh): A is quantized without a pass of its own.
void run_fp8_gemm(Gemm& gemm, const GemmDesc& d, const Fp8Scratch& w, cudaStream_t stream, int slot = -1,
                  bool a_amax_known = false);
// The word run_fp8_gemm reduces A's amax into: slot's first (x's) with a slot, else w's scratch word.
unsigned* fp8_gemm_a_amax(const Fp8Scratch& w, int slot);
// A linear layer's two backward GEMMs in FP8 with its output gradient dy quantized once (one amax, both
// layouts): wgrad dW += dy^T x (null: a frozen weight) and dgrad dx = dy W, in that order (dx may be x's
// buffer). Both must fit (fp8_gemm_fits) and share dy: wgrad's A is dgrad's A, transposed. With a slot
// the layer's forward ran through run_fp8_gemm with it on the same bits of x and W, so their amaxes are
// read from it instead of reduced again (the same copies, two amax passes fewer), and dgrad multiplies by
// the W^T copy that forward kept, where it kept one (the same bytes, W's transposing copy skipped).
// With `dy_amax_known` the word fp8_linear_backward_dy_amax(w) already holds dy's amax (reduced by the
// kernel that wrote dy): dy is quantized without a pass of its own.
void run_fp8_linear_backward(Gemm& gemm, const GemmDesc* wgrad, const GemmDesc& dgrad, const Fp8Scratch& w,
                             cudaStream_t stream, int slot = -1, bool dy_amax_known = false);
// The word run_fp8_linear_backward reduces dy's amax into (w's scratch word).
unsigned* fp8_linear_backward_dy_amax(const Fp8Scratch& w);

}  // namespace shardlm::cuda

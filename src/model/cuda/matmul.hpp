// Private to the CUDA models: one row-major cuBLASLt GEMM call with its operands spelled out, as
// the families' blocks write them.
#pragma once

#include <cuda_runtime_api.h>

#include "fp8_gemm.hpp"
#include "gemm.hpp"

namespace shardlm::cuda {

// C[M, N] (row-major) = alpha op(A) op(B) (+ beta C) with the given epilogue; dtypes: A and B in ab, C in c.
struct MatMul {
  Gemm& gemm;
  cudaStream_t s;
  float alpha = 1;  // LoRA's scale
  // model.fp8_linear: the scratch through which every call that fp8_gemm_fits runs in FP8 (null: none).
  const Fp8Scratch* fp8 = nullptr;
  // With fp8: the block's amax slot of the linear layer this call is (Fp8Scratch::saved_amax; -1: none),
  // which its forward fills and its linear_backward reads instead of reducing x's and W's amax again.
  int fp8_slot = -1;
  // linear_backward's weight gradient: dW = weight_beta dW + dy^T x (0: written, UnitGrads::fresh).
  float weight_beta = 1;
  // With fp8: the call's input (a forward's x, linear_backward's dy) has its amax already in the word that
  // fp8_forward_x_amax / fp8_backward_dy_amax named, reduced by the kernel that wrote it (swiglu.hpp).
  bool input_amax_known = false;
  // This MatMul for the linear layer of amax slot `slot`.
  MatMul projection(int slot) const {
    MatMul m = *this;
    m.fp8_slot = slot;
    return m;
  }
  // This MatMul with input_amax_known where `word` (from fp8_forward_x_amax or fp8_backward_dy_amax) is not null.
  MatMul input_amax_in(const unsigned* word) const {
    MatMul m = *this;
    m.input_amax_known = word != nullptr;
    return m;
  }
  // The word a forward y[n, out] = x[n, in] W[out, in]^T (row strides in, in and ldc; no epilogue) in FP8
  // reduces x's amax into, for the kernel that writes x to fill; null when that call would not run in FP8.
  unsigned* fp8_forward_x_amax(int n, int out, int in, int ldc, DType dt) const {
    if (!fp8) return nullptr;
    const GemmDesc d = desc(false, true, n, out, in, nullptr, in, nullptr, in, nullptr, ldc, dt, dt, 0);
    return fp8_gemm_fits(d, *fp8) ? fp8_gemm_a_amax(*fp8, fp8_slot) : nullptr;
  }
  // The word linear_backward with these sizes and strides (dW: whether the weight has a gradient) reduces dy's
  // amax into in FP8, for the kernel that writes dy to fill; null when it would not run in FP8.
  unsigned* fp8_backward_dy_amax(int n, int out, int in, int ld_dy, int ld_x, bool dW, int ld_dx, DType dt) const {
    const GemmDesc wgrad = wgrad_desc(n, out, in, nullptr, ld_dy, nullptr, ld_x, nullptr, dt);
    const GemmDesc dgrad = dgrad_desc(n, out, in, nullptr, ld_dy, nullptr, nullptr, ld_dx, dt);
    return backward_in_fp8(wgrad, dgrad, dW) ? fp8_linear_backward_dy_amax(*fp8) : nullptr;
  }
  void operator()(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb, void* C,
                  int ldc, DType ab, DType c, float beta = 0, Epilogue ep = Epilogue::None,
                  const void* bias = nullptr, void* aux = nullptr) const {
    GemmDesc d = desc(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, ab, c, beta);
    d.epilogue = ep, d.bias = bias, d.aux = aux;
    run(d, fp8_slot);
  }

  // A linear layer y[n, out] = x[n, in] W[out, in]^T, backward: dW += dy^T x in fp32 (dW = dy^T x with
  // weight_beta 0; dW null: a frozen weight), then dx = dy W (dx may be x's buffer): weight_backward, then
  // input_backward, unless both GEMMs fit FP8 (fp8 given). Then dy is quantized
  // once for both, and with fp8_slot x's and W's amaxes are the forward's (same bits) when that forward ran
  // in FP8 (it fit: its output taken as whole rows of `out`).
  void linear_backward(int n, int out, int in, const void* dy, int ld_dy, const void* x, int ld_x, const void* W,
                       void* dW, void* dx, int ld_dx, DType dt) const {
    const GemmDesc wgrad = wgrad_desc(n, out, in, dy, ld_dy, x, ld_x, dW, dt);
    const GemmDesc dgrad = dgrad_desc(n, out, in, dy, ld_dy, W, dx, ld_dx, dt);
    if (backward_in_fp8(wgrad, dgrad, dW != nullptr)) {
      const bool forward_fp8 =
          fp8_slot >= 0 && fp8_gemm_fits(desc(false, true, n, out, in, x, ld_x, W, in, nullptr, out, dt, dt, 0), *fp8);
      run_fp8_linear_backward(gemm, dW ? &wgrad : nullptr, dgrad, *fp8, s, forward_fp8 ? fp8_slot : -1,
                              input_amax_known);
      return;
    }
    if (dW) run(wgrad, -1);  // weight_backward's GEMM, then input_backward's, from the descriptors above
    run(dgrad, -1);
  }
  // linear_backward's two GEMMs apart, as it runs them without fp8: dW += dy^T x in fp32 (weight_beta as above;
  // nothing for a null dW, a frozen weight) ...
  void weight_backward(int n, int out, int in, const void* dy, int ld_dy, const void* x, int ld_x, void* dW,
                       DType dt) const {
    if (dW) run(wgrad_desc(n, out, in, dy, ld_dy, x, ld_x, dW, dt), -1);
  }
  // ... and dx = dy W.
  void input_backward(int n, int out, int in, const void* dy, int ld_dy, const void* W, void* dx, int ld_dx,
                      DType dt) const {
    run(dgrad_desc(n, out, in, dy, ld_dy, W, dx, ld_dx, dt), -1);
  }

 private:
  GemmDesc wgrad_desc(int n, int out, int in, const void* dy, int ld_dy, const void* x, int ld_x, void* dW,
                      DType dt) const {
    return desc(true, false, out, in, n, dy, ld_dy, x, ld_x, dW, in, dt, DType::F32, weight_beta);
  }
  GemmDesc dgrad_desc(int n, int out, int in, const void* dy, int ld_dy, const void* W, void* dx, int ld_dx,
                      DType dt) const {
    return desc(false, false, n, in, out, dy, ld_dy, W, in, dx, ld_dx, dt, dt, 0);
  }
  bool backward_in_fp8(const GemmDesc& wgrad, const GemmDesc& dgrad, bool dW) const {
    return fp8 && fp8_gemm_fits(dgrad, *fp8) && (!dW || fp8_gemm_fits(wgrad, *fp8));
  }
  GemmDesc desc(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb, void* C, int ldc,
                DType ab, DType c, float beta) const {
    GemmDesc d;
    d.trans_a = ta, d.trans_b = tb, d.M = M, d.N = N, d.K = K, d.alpha = alpha;
    d.A = A, d.lda = lda, d.B = B, d.ldb = ldb, d.C = C, d.ldc = ldc;
    d.ab_dtype = ab, d.c_dtype = c, d.beta = beta;
    return d;
  }
  void run(const GemmDesc& d, int slot) const {
    if (fp8 && fp8_gemm_fits(d, *fp8))
      run_fp8_gemm(gemm, d, *fp8, s, slot, input_amax_known);
    else
      gemm.run(d, s);
  }
};

}  // namespace shardlm::cuda

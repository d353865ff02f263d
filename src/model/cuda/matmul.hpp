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
  // This MatMul for the linear layer of amax slot `slot`.
  MatMul projection(int slot) const {
    MatMul m = *this;
    m.fp8_slot = slot;
    return m;
  }
  void operator()(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb, void* C,
                  int ldc, DType ab, DType c, float beta = 0, Epilogue ep = Epilogue::None,
                  const void* bias = nullptr, void* aux = nullptr) const {
    GemmDesc d = desc(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, ab, c, beta);
    d.epilogue = ep, d.bias = bias, d.aux = aux;
    run(d, fp8_slot);
  }

  // A linear layer y[n, out] = x[n, in] W[out, in]^T, backward: dW += dy^T x in fp32 (dW = dy^T x with
  // weight_beta 0; dW null: a frozen weight), then dx = dy W (dx may be x's buffer). In FP8 dy is quantized
  // once for both, and with fp8_slot x's and W's amaxes are the forward's (same bits) when that forward ran
  // in FP8 (it fit: its output taken as whole rows of `out`).
  void linear_backward(int n, int out, int in, const void* dy, int ld_dy, const void* x, int ld_x, const void* W,
                       void* dW, void* dx, int ld_dx, DType dt) const {
    const GemmDesc wgrad = desc(true, false, out, in, n, dy, ld_dy, x, ld_x, dW, in, dt, DType::F32, weight_beta);
    const GemmDesc dgrad = desc(false, false, n, in, out, dy, ld_dy, W, in, dx, ld_dx, dt, dt, 0);
    if (fp8 && fp8_gemm_fits(dgrad, *fp8) && (!dW || fp8_gemm_fits(wgrad, *fp8))) {
      const bool forward_fp8 =
          fp8_slot >= 0 && fp8_gemm_fits(desc(false, true, n, out, in, x, ld_x, W, in, nullptr, out, dt, dt, 0), *fp8);
      run_fp8_linear_backward(gemm, dW ? &wgrad : nullptr, dgrad, *fp8, s, forward_fp8 ? fp8_slot : -1);
      return;
    }
    if (dW) run(wgrad, -1);
    run(dgrad, -1);
  }

 private:
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
      run_fp8_gemm(gemm, d, *fp8, s, slot);
    else
      gemm.run(d, s);
  }
};

}  // namespace shardlm::cuda

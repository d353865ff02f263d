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
  void operator()(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb, void* C,
                  int ldc, DType ab, DType c, float beta = 0, Epilogue ep = Epilogue::None,
                  const void* bias = nullptr, void* aux = nullptr) const {
    GemmDesc d;
    d.trans_a = ta, d.trans_b = tb, d.M = M, d.N = N, d.K = K, d.alpha = alpha;
    d.A = A, d.lda = lda, d.B = B, d.ldb = ldb, d.C = C, d.ldc = ldc;
    d.ab_dtype = ab, d.c_dtype = c, d.beta = beta, d.epilogue = ep, d.bias = bias, d.aux = aux;
    if (fp8 && fp8_gemm_fits(d, *fp8))
      run_fp8_gemm(gemm, d, *fp8, s);
    else
      gemm.run(d, s);
  }
};

}  // namespace shardlm::cuda

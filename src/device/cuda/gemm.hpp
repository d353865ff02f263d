// GEMMs through cuBLASLt, in the row-major convention of cpu_gemm, with the epilogues that save
// passes over the output (bias, bias + GELU keeping the pre-activation, GELU backward).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

enum class Epilogue {
  None,
  Bias,       // C = alpha op(A) op(B) + beta C + bias[N] (bias in C's dtype)
  BiasGelu,   // aux = alpha op(A) op(B) + bias (pre-activation, C's dtype); C = gelu(aux)
  DGelu,      // C = (alpha op(A) op(B)) * gelu'(aux): the GELU backward fused into dW2^T-side GEMM
};
const char* epilogue_name(Epilogue e);  // "none", "bias", "bias+gelu", "dgelu" (in errors and test labels)

struct GemmDesc {
  bool trans_a = false;
  bool trans_b = false;
  int M = 0, N = 0, K = 0;       // C is M x N (row-major), op(A) M x K, op(B) K x N
  float alpha = 1, beta = 0;
  const void* A = nullptr;
  int lda = 0;                   // row stride of A as stored
  const void* B = nullptr;
  int ldb = 0;
  void* C = nullptr;
  int ldc = 0;
  DType ab_dtype = DType::F32;   // dtype of A and B
  DType c_dtype = DType::F32;    // dtype of C (F32 with 16-bit inputs: fp32 gradients)
  Epilogue epilogue = Epilogue::None;
  const void* bias = nullptr;    // [N]
  void* aux = nullptr;           // [M, N] in c_dtype, row stride ldc (BiasGelu writes, DGelu reads)
  int batch = 1;                 // strided batch (attention)
  long long stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch members
  // FP8: A and B hold E4M3 bytes (fp8_quantize's copies; ab_dtype is not read), each multiplied back by
  // the device float a_scale / b_scale points to. cuBLASLt runs FP8 in its "TN" form only: trans_a
  // false, trans_b true (both operands K-contiguous), batch 1, epilogue None or Bias, C in BF16, F16
  // or F32, M, N, K multiples of 16, and each scale on a 16-byte boundary (cuBLASLt 13 answers
  // CUBLAS_STATUS_NOT_SUPPORTED otherwise); fp8_gemm.hpp makes the copies that reach this form.
  bool fp8 = false;
  // FP8 only: cuBLASLt's fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM: the tensor cores' partial
  // sums are not promoted to fp32 at intervals). Faster; torchao uses it for the forward only.
  bool fast_accum = false;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

// A strided batched GEMM without epilogue: `batch` products C_i = alpha op(A_i) op(B_i) + beta C_i, member
// i at A + i * stride_a elements, likewise B and C (attention's per-head products).
inline GemmDesc batched_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
                             long long stride_a, const void* B, int ldb, long long stride_b, float beta, void* C,
                             int ldc, long long stride_c, DType ab, DType c, int batch) {
  GemmDesc g;
  g.trans_a = trans_a, g.trans_b = trans_b;
  g.M = M, g.N = N, g.K = K;
  g.alpha = alpha, g.beta = beta;
  g.A = A, g.lda = lda, g.stride_a = stride_a;
  g.B = B, g.ldb = ldb, g.stride_b = stride_b;
  g.C = C, g.ldc = ldc, g.stride_c = stride_c;
  g.ab_dtype = ab, g.c_dtype = c;
  g.batch = batch;
  return g;
}

// One per device and stream user: the cuBLASLt handle, a workspace, and the cache of chosen
// algorithms per shape (heuristics are asked once per shape, never in the steady state).
class Gemm {
 public:
  explicit Gemm(size_t workspace_bytes = 32u << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  // Throws Error naming the shape if cuBLASLt has no algorithm for it or the call fails.
  void run(const GemmDesc& d, cudaStream_t stream);

 private:
  struct Plan;
  // The cached plan of d's shape, made (descriptor, layouts, algorithm or fallback) on first use.
  Plan& plan_for(const GemmDesc& d);
  // The plan's epilogue and cuBLASLt's algorithm; false when the epilogue needs the fallback.
  bool choose_algorithm(Plan& plan, const GemmDesc& d);
  // d through a simpler epilogue (its own plan) plus a small pass: when cuBLASLt offers no algorithm.
  void run_fallback(const GemmDesc& d, cudaStream_t stream);
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int, int, int, int, int, int, int, int, int, int, int>, Plan*> plans_;
};

// y[n, out] = x[n, in] W^T (+ bias[out] when bias is not null) (+ y when accumulate: a residual
// already in y); W is [out, in]; x, W, bias and y in dt. The decoding paths' linear layers.
void linear_rows(Gemm& gemm, const void* x, int n, int in, const void* weight, const void* bias, int out, void* y,
                 bool accumulate, DType dt, cudaStream_t stream);

}  // namespace shardlm::cuda

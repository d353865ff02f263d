// bench_gemm_candidates: for the block and LM-head GEMMs of a Llama shape, every algorithm cuBLASLt's heuristic
// offers (up to 8), timed on the GPU: the first one (the one shardlm's Gemm takes) against the fastest.
// Says how much a per-shape autotuner could win. Operands are pseudo-random bf16 (activations in [-1, 1),
// weights in [-0.05, 0.05)), the outputs bf16 or, for the weight gradients, fp32 (beta 0, and beta 1 where
// shardlm accumulates); each algorithm runs 43 times back to back, the median of the last 30 is its time,
// best of two passes over the list (the GPU at its power limit, as in training, not at its boost clock).
//
//   bench_gemm_candidates [--shape 8b|3b|1b] [--tokens N]
//
// 8b: Llama-3.1-8B's block (hidden 4096, MLP 14336, q|k|v 6144), 3b: Llama-3.2-3B's (3072, 8192, 5120), 1b:
// Llama-3.2-1B's (2048, 8192, 3072); each with the 128,256-row head over 4,096 tokens. --tokens: the block GEMMs'
// tokens (default 4096 for 8b, 8192 for 3b and 1b, the benchmark rows' micro-batches: docs/PERFORMANCE.md).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void check(int rc, const char* what) {
  if (rc != 0) {
    std::fprintf(stderr, "bench_gemm_candidates: %s failed (%d)\n", what, rc);
    std::exit(1);
  }
}

__global__ void fill(__nv_bfloat16* p, size_t n, float scale, unsigned seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffffu) / 32768.0f - 1.0f) * scale);
  }
}

// cuBLASLt's column-major problem: D (m x n) = op(A) (m x k) op(B) (k x n) + beta D.
struct Problem {
  const char* name;
  bool trans_a, trans_b;
  int m, n, k;
  bool fp32_out;
  float beta;
};

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "8b";
  int tokens = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) shape = argv[++i];
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_gemm_candidates [--shape 8b|3b|1b] [--tokens N]\n");
      return 2;
    }
  }
  struct Shape {
    const char* name;
    int hidden, mlp, qkv, tokens;
  };
  const Shape shapes[] = {{"8b", 4096, 14336, 6144, 4096}, {"3b", 3072, 8192, 5120, 8192}, {"1b", 2048, 8192, 3072, 8192}};
  const Shape* sh = nullptr;
  for (const Shape& s : shapes)
    if (shape == s.name) sh = &s;
  if (!sh) {
    std::fprintf(stderr, "bench_gemm_candidates: --shape is 8b, 3b or 1b\n");
    return 2;
  }
  const int H = sh->hidden, I = sh->mlp, QKV = sh->qkv, V = 128256, HT = 4096;
  const int T = tokens > 0 ? tokens : sh->tokens;
  // Forward y = x W^T ("TN"), the input's gradient dx = dy W ("NN"), the weight's dW = dy^T x ("NT", fp32).
  const std::vector<Problem> problems = {
      {"forward q|k|v", true, false, QKV, T, H, false, 0},
      {"forward o", true, false, H, T, H, false, 0},
      {"forward gate|up", true, false, 2 * I, T, H, false, 0},
      {"forward down", true, false, H, T, I, false, 0},
      {"dx q|k|v", false, false, H, T, QKV, false, 0},
      {"dx o", false, false, H, T, H, false, 0},
      {"dx gate|up", false, false, H, T, 2 * I, false, 0},
      {"dx down", false, false, I, T, H, false, 0},
      {"dW q|k|v (fp32)", false, true, H, QKV, T, true, 0},
      {"dW o (fp32)", false, true, H, H, T, true, 0},
      {"dW gate|up (fp32)", false, true, H, 2 * I, T, true, 0},
      {"dW down (fp32)", false, true, I, H, T, true, 0},
      {"dW gate|up (fp32, beta 1)", false, true, H, 2 * I, T, true, 1},
      {"head logits", true, false, V, HT, H, false, 0},
      {"head dx", false, false, H, HT, V, false, 0},
      {"head dW (fp32, beta 1)", false, true, H, V, HT, true, 1},
  };
  size_t most = 0;
  for (const Problem& p : problems)
    most = std::max({most, static_cast<size_t>(p.m) * p.k, static_cast<size_t>(p.k) * p.n,
                     static_cast<size_t>(p.m) * p.n * 2});
  cublasLtHandle_t lt;
  check(cublasLtCreate(&lt), "cublasLtCreate");
  void *a = nullptr, *b = nullptr, *c = nullptr, *workspace = nullptr;
  const size_t workspace_bytes = 32u << 20;  // as shardlm's Gemm
  check(cudaMalloc(&a, most * 2), "cudaMalloc");
  check(cudaMalloc(&b, most * 2), "cudaMalloc");
  check(cudaMalloc(&c, most * 4), "cudaMalloc");
  check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc");
  fill<<<4096, 256>>>(static_cast<__nv_bfloat16*>(a), most, 1.0f, 1u);
  fill<<<4096, 256>>>(static_cast<__nv_bfloat16*>(b), most, 0.05f, 7u);
  check(cudaMemset(c, 0, most * 4), "cudaMemset");
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s, Llama %s shape, %d tokens: cuBLASLt's first algorithm against the fastest of its candidates\n\n",
              prop.name, shape.c_str(), T);
  std::printf("| GEMM | m x n x k | candidates | first, ms | TFLOP/s | fastest, ms | TFLOP/s | first / fastest |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  double total_first = 0, total_best = 0;
  for (const Problem& p : problems) {
    cublasLtMatmulDesc_t desc;
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t op_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), "TRANSA");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), "TRANSB");
    const int a_rows = p.trans_a ? p.k : p.m, a_cols = p.trans_a ? p.m : p.k;
    const int b_rows = p.trans_b ? p.n : p.k, b_cols = p.trans_b ? p.k : p.n;
    cublasLtMatrixLayout_t la, lb, lc;
    check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, a_rows, a_cols, a_rows), "layout A");
    check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, b_rows, b_cols, b_rows), "layout B");
    check(cublasLtMatrixLayoutCreate(&lc, p.fp32_out ? CUDA_R_32F : CUDA_R_16BF, p.m, p.n, p.m), "layout C");
    cublasLtMatmulPreference_t pref;
    check(cublasLtMatmulPreferenceCreate(&pref), "MatmulPreferenceCreate");
    const uint64_t max_workspace = workspace_bytes;
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                               sizeof max_workspace),
          "MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t results[8];
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 8, results, &found), "AlgoGetHeuristic");
    const float alpha = 1.0f, beta = p.beta;
    std::vector<float> best_ms(found, 1e30f);
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < found; ++i) {
        std::vector<float> times;
        for (int it = 0; it < 43; ++it) {
          cudaEventRecord(start, stream);
          const cublasStatus_t rc = cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &results[i].algo,
                                                   workspace, workspace_bytes, stream);
          cudaEventRecord(stop, stream);
          cudaEventSynchronize(stop);
          if (rc != CUBLAS_STATUS_SUCCESS) {
            times.clear();
            break;
          }
          float ms = 0;
          cudaEventElapsedTime(&ms, start, stop);
          if (it >= 13) times.push_back(ms);
        }
        if (times.empty()) continue;
        std::sort(times.begin(), times.end());
        best_ms[i] = std::min(best_ms[i], times[times.size() / 2]);
      }
    }
    const int best = static_cast<int>(std::min_element(best_ms.begin(), best_ms.end()) - best_ms.begin());
    const double flop = 2.0 * p.m * p.n * static_cast<double>(p.k);
    std::printf("| %s | %d x %d x %d | %d | %.3f | %.0f | %.3f (#%d) | %.0f | %.3f |\n", p.name, p.m, p.n, p.k, found,
                best_ms[0], flop / best_ms[0] / 1e9, best_ms[best], best, flop / best_ms[best] / 1e9,
                best_ms[0] / best_ms[best]);
    total_first += best_ms[0];
    total_best += best_ms[best];
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
  }
  std::printf("\nAll of them once: %.3f ms with the first algorithms, %.3f ms with the fastest (%.3fx)\n", total_first,
              total_best, total_first / total_best);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(workspace);
  cublasLtDestroy(lt);
  return 0;
}

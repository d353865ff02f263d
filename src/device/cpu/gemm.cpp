// CPU backend GEMM: row-major single-precision matrix products through OpenBLAS, and its thread count.
#include <cblas.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "shardlm/core.hpp"
#include "shardlm/device.hpp"

namespace shardlm {

void cpu_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
  SHARDLM_CHECK(M >= 0 && N >= 0 && K >= 0, "cpu_gemm: negative size M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  // Row strides must cover a stored row; OpenBLAS would only print a warning and skip the product.
  const int a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  SHARDLM_CHECK(lda >= std::max(1, a_cols) && ldb >= std::max(1, b_cols) && ldc >= N,
                "cpu_gemm: row stride too small (lda=", lda, " ldb=", ldb, " ldc=", ldc, " for M=", M, " N=", N,
                " K=", K, ")");
  if (K == 0) {
    // An empty sum: C = beta * C, where beta == 0 clears C without reading it (as BLAS does).
    for (int i = 0; i < M; ++i) {
      float* row = C + static_cast<size_t>(i) * ldc;
      if (beta == 0.0f)
        std::fill(row, row + N, 0.0f);
      else if (beta != 1.0f)
        for (int j = 0; j < N; ++j) row[j] *= beta;
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

void cpu_set_threads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

int cpu_default_threads(int ranks_on_node) {
  // An explicit OPENBLAS_NUM_THREADS / OMP_NUM_THREADS wins; the user knows the machine.
  for (const char* var : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) return std::atoi(v);
  // A rank bound by the launcher (mpirun --bind-to, srun --cpu-bind) already owns its cores alone.
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  int threads = std::max(1, online / std::max(1, ranks_on_node));
  if (sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) < online) threads = std::max(1, CPU_COUNT(&mask));
  // Slurm's --cpus-per-task is the task's share even where the launcher did not bind it.
  if (const char* v = std::getenv("SLURM_CPUS_PER_TASK"); v && std::atoi(v) > 0) threads = std::min(threads, std::atoi(v));
  return threads;
}

}  // namespace shardlm

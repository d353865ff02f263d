// device: the compute backends. The CPU backend (OpenBLAS GEMM, plain C++ kernels) and the CUDA
// backend (cuBLASLt, cuDNN, kernels of our own; src/device/cuda) behind the same small interface.
#pragma once

#include <cstddef>

namespace shardlm {

// Which backend runs the model and the FSDP schedule (deck key run.backend).
enum class BackendKind { Cpu, Cuda };

// A backend's stream of work: a cudaStream_t on the CUDA backend; nullptr on the CPU backend,
// which runs everything synchronously on the calling thread.
using Stream = void*;

// Row-major GEMM: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, op = transpose when set.
// lda/ldb/ldc are the row strides of A, B and C as stored.
void cpu_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);

// Threads the CPU backend's BLAS may use in this process (ranks sharing a node split the cores).
void cpu_set_threads(int threads);

// BLAS threads for one of `ranks_on_node` ranks on a node: the user's OPENBLAS_NUM_THREADS or
// OMP_NUM_THREADS if set, the cores the rank is bound to if bound, else a fair share of the node.
int cpu_default_threads(int ranks_on_node);

}  // namespace shardlm

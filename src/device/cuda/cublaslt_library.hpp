// cuBLASLt opened on first use (dlopen) instead of linked: loading libcublasLt runs about half a second
// of its static initialisation in every process that links it, while most processes (the CPU backend,
// help, plan, report, every CPU test) never multiply a matrix on a GPU. Gemm calls it through cublaslt().
#pragma once

#include <cublasLt.h>

namespace shardlm::cuda {

// The cuBLASLt entry points shardlm calls, each named once: X(name) for cublasLt<name>.
#define SHARDLM_CUBLASLT_ENTRY_POINTS(X)                                                              \
  X(Create) X(Destroy) X(Matmul) X(MatmulAlgoGetHeuristic) X(MatmulDescCreate) X(MatmulDescDestroy) \
  X(MatmulDescSetAttribute) X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy)                    \
  X(MatmulPreferenceSetAttribute) X(MatrixLayoutCreate) X(MatrixLayoutDestroy) X(MatrixLayoutSetAttribute)

// Those entry points, resolved from the library this build was compiled against
// (libcublasLt.so.<CUBLAS_VER_MAJOR>): cublaslt().Matmul(...) is cublasLtMatmul(...).
struct CublasLt {
#define SHARDLM_CUBLASLT_MEMBER(name) decltype(&::cublasLt##name) name;
  SHARDLM_CUBLASLT_ENTRY_POINTS(SHARDLM_CUBLASLT_MEMBER)
#undef SHARDLM_CUBLASLT_MEMBER
};

// Opens the library the first time (thread-safe; the dynamic loader's search path first, then the folder
// of the CUDA runtime this process loaded) and returns its entry points; throws std::runtime_error naming
// the library and what to do when it cannot be opened or lacks an entry point.
const CublasLt& cublaslt();

}  // namespace shardlm::cuda

// cuBLASLt opened on first use (dlopen) instead of linked: loading libcublasLt runs about half a second
// of its static initialisation in every process that links it, while most processes (the CPU backend,
// help, plan, report, every CPU test) never multiply a matrix on a GPU. Gemm calls it through cublaslt().
#pragma once

#include <cublasLt.h>

namespace shardlm::cuda {

// The cuBLASLt entry points shardlm calls, resolved from the library this build was compiled against
// (libcublasLt.so.<CUBLAS_VER_MAJOR>).
struct CublasLt {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtDestroy) Destroy;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
};

// Opens the library the first time (thread-safe; the dynamic loader's search path first, then the folder
// of the CUDA runtime this process loaded) and returns its entry points; throws std::runtime_error naming
// the library and what to do when it cannot be opened or lacks an entry point.
const CublasLt& cublaslt();

}  // namespace shardlm::cuda

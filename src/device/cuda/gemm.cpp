// Gemm: row-major GEMMs on cuBLASLt (column-major) with fused epilogues and a plan cache per shape.
//
// Row-major C[M,N] with row stride ldc is, read column-major, C^T[N,M] with leading dimension ldc.
// So C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" is our A,
// with the same transpose flags (a row-major [K,N] B is a column-major [N,K] matrix, already B^T).
// cuBLASLt's bias has one entry per row of its D = per column of our C, which is the bias[N] we want;
// its aux matrix has D's shape, so our row-major [M,N] aux with row stride ldc has leading dimension ldc.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cublaslt_library.hpp"
#include "cuda_check.hpp"
#include "device_setup.hpp"
#include "elementwise.hpp"
#include "gemm.hpp"

namespace shardlm::cuda {
namespace {

// Rows of C one rank-1 bias GEMM covers in the Bias fallback (the ones vector's length).
constexpr int kOnesRows = 1024;

cudaDataType_t cuda_type(DType t) { return by_dtype(t, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F); }

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::BiasGelu: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Largest power of two (at most 256, cuBLASLt's default assumption) dividing the address of every
// batch member: the heuristic picks vectorised kernels from it, so it is part of the plan's key.
uint32_t alignment_of(const void* p, long long stride_elements, int batch, size_t element_size) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) bits |= static_cast<uint64_t>(stride_elements) * element_size;
  uint32_t align = 256;
  while (align > 1 && (bits & (align - 1)) != 0) align >>= 1;
  return align;
}

int log2_of(uint32_t v) {
  int l = 0;
  while ((1u << l) < v) ++l;
  return l;
}

// Everything a plan depends on; kept in the plan to rule out collisions of the (narrower) map key.
struct Signature {
  bool trans_a, trans_b;
  int M, N, K, lda, ldb, ldc, batch;
  long long stride_a, stride_b, stride_c;
  DType ab, c;
  bool fp8, fast_accum;
  Epilogue epilogue;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;

  auto tied() const {
    return std::tie(trans_a, trans_b, M, N, K, lda, ldb, ldc, batch, stride_a, stride_b, stride_c, ab, c, fp8,
                    fast_accum, epilogue, align_a, align_b, align_c, align_bias, align_aux);
  }
  bool operator==(const Signature& o) const { return tied() == o.tied(); }
};

std::string describe(const GemmDesc& d) {
  return concat("M=", d.M, " N=", d.N, " K=", d.K, " trans_a=", d.trans_a, " trans_b=", d.trans_b, " lda=", d.lda,
                " ldb=", d.ldb, " ldc=", d.ldc, " batch=", d.batch, " A/B ", d.fp8 ? "fp8 e4m3" : dtype_name(d.ab_dtype), " C ",
                dtype_name(d.c_dtype), " epilogue ", epilogue_name(d.epilogue));
}

void validate(const GemmDesc& d) {
  SHARDLM_CHECK(d.M >= 0 && d.N >= 0 && d.K >= 0 && d.batch >= 1, "Gemm: bad size (", describe(d), ")");
  const int a_cols = d.trans_a ? d.M : d.K, b_cols = d.trans_b ? d.K : d.N;
  SHARDLM_CHECK(d.lda >= std::max(1, a_cols) && d.ldb >= std::max(1, b_cols) && d.ldc >= std::max(1, d.N),
                "Gemm: row stride too small (", describe(d), ")");
  SHARDLM_CHECK(d.stride_a >= 0 && d.stride_b >= 0 && d.stride_c >= 0, "Gemm: negative batch stride (", describe(d),
                ")");
  if (d.fp8) {
    SHARDLM_CHECK(!d.trans_a && d.trans_b && d.batch == 1 &&
                      (d.epilogue == Epilogue::None || d.epilogue == Epilogue::Bias) && d.a_scale && d.b_scale &&
                      d.M % 16 == 0 && d.N % 16 == 0 && d.K % 16 == 0 && d.lda % 16 == 0 && d.ldb % 16 == 0 &&
                      d.ldc * dtype_size(d.c_dtype) % 16 == 0 && reinterpret_cast<uintptr_t>(d.a_scale) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(d.b_scale) % 16 == 0,
                  "Gemm: FP8 takes trans_a = false, trans_b = true, batch 1, no epilogue but a bias, both scales on ",
                  "16-byte boundaries, and M, N, K, lda, ldb multiples of 16 (", describe(d), ")");
  } else {
    SHARDLM_CHECK(d.c_dtype == DType::F32 || d.c_dtype == d.ab_dtype,
                  "Gemm: C must be F32 or the A/B dtype (", describe(d), ")");
  }
  if (d.epilogue == Epilogue::Bias || d.epilogue == Epilogue::BiasGelu)
    SHARDLM_CHECK(d.bias != nullptr, "Gemm: epilogue ", epilogue_name(d.epilogue), " needs a bias (", describe(d),
                  ")");
  if (d.epilogue == Epilogue::BiasGelu || d.epilogue == Epilogue::DGelu)
    SHARDLM_CHECK(d.aux != nullptr, "Gemm: epilogue ", epilogue_name(d.epilogue), " needs aux (", describe(d), ")");
  // The GELU epilogues' outputs are never accumulated into, and how cuBLASLt folds beta C into the
  // pre-activation or the gradient is not what the contract promises: they take beta == 0.
  if (d.epilogue == Epilogue::BiasGelu || d.epilogue == Epilogue::DGelu)
    SHARDLM_CHECK(d.beta == 0.0f, "Gemm: epilogue ", epilogue_name(d.epilogue), " needs beta == 0 (", describe(d),
                  ")");
}

// Applies f(offset, count) to the contiguous runs of the row-major [M, N] matrices of all batch members.
template <typename F>
void for_each_run(const GemmDesc& d, F f) {
  const size_t rows = static_cast<size_t>(d.M), cols = static_cast<size_t>(d.N), ld = static_cast<size_t>(d.ldc);
  for (int b = 0; b < d.batch; ++b) {
    const size_t base = static_cast<size_t>(b) * static_cast<size_t>(d.stride_c);
    if (ld == cols) {
      f(base, rows * cols);
    } else {
      for (size_t r = 0; r < rows; ++r) f(base + r * ld, cols);
    }
  }
}

}  // namespace

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::None: return "none";
    case Epilogue::Bias: return "bias";
    case Epilogue::BiasGelu: return "bias+gelu";
    case Epilogue::DGelu: return "dgelu";
  }
  return "?";
}

struct Gemm::Plan {
  Signature signature{};
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLASLt's A: our B
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLASLt's B: our A
  cublasLtMatrixLayout_t layout_c = nullptr;  // C and D
  cublasLtMatmulAlgo_t algo{};
  // cuBLASLt has no algorithm for this epilogue here: run the GEMM with a simpler one plus a kernel.
  bool fallback = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (layout_c) cublaslt().MatrixLayoutDestroy(layout_c);
    if (layout_b) cublaslt().MatrixLayoutDestroy(layout_b);
    if (layout_a) cublaslt().MatrixLayoutDestroy(layout_a);
    if (desc) cublaslt().MatmulDescDestroy(desc);
  }
};

namespace {

cublasLtMatrixLayout_t make_layout(cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld, int batch,
                                   long long stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  SHARDLM_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&layout, t, rows, cols, ld));
  if (batch > 1) {
    const int32_t count = batch;
    const int64_t offset = stride;
    SHARDLM_CUBLAS_CHECK(
        cublaslt().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    SHARDLM_CUBLAS_CHECK(
        cublaslt().MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof offset));
  }
  return layout;
}

void set_epilogue_pointers(cublasLtMatmulDesc_t desc, const GemmDesc& d) {
  if (d.fp8) {  // cuBLASLt's A is our B
    SHARDLM_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &d.b_scale, sizeof d.b_scale));
    SHARDLM_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &d.a_scale, sizeof d.a_scale));
  }
  if (d.epilogue == Epilogue::Bias || d.epilogue == Epilogue::BiasGelu)
    SHARDLM_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d.bias, sizeof d.bias));
  if (d.epilogue == Epilogue::BiasGelu || d.epilogue == Epilogue::DGelu)
    SHARDLM_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &d.aux, sizeof d.aux));
}

}  // namespace

Gemm::Gemm(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  SHARDLM_CUBLAS_CHECK(cublaslt().Create(&handle_));
  // The cuBLASLt workspace, then (256-byte aligned) vectors of ones in F32, BF16 and F16 for the Bias fallback.
  const size_t ones_at = (workspace_bytes_ + 255) / 256 * 256;
  const size_t total = ones_at + kOnesRows * (sizeof(float) + 2 * sizeof(uint16_t));
  const cudaError_t rc = cudaMalloc(&workspace_, total);
  if (rc != cudaSuccess) {
    cublaslt().Destroy(handle_);
    throw_cuda(rc, "cudaMalloc(Gemm workspace)", __FILE__, __LINE__);
  }
  std::vector<unsigned char> ones(kOnesRows * (sizeof(float) + 2 * sizeof(uint16_t)));
  const float one = 1.0f;
  const uint16_t one_bf16 = float_to_bf16(1.0f), one_fp16 = float_to_fp16(1.0f);
  for (int i = 0; i < kOnesRows; ++i) {
    std::memcpy(ones.data() + i * sizeof(float), &one, sizeof one);
    std::memcpy(ones.data() + kOnesRows * sizeof(float) + i * 2, &one_bf16, 2);
    std::memcpy(ones.data() + kOnesRows * (sizeof(float) + 2) + i * 2, &one_fp16, 2);
  }
  copy_to_device_now(static_cast<char*>(workspace_) + ones_at, ones.data(), ones.size());
}

Gemm::~Gemm() {
  for (auto& entry : plans_) delete entry.second;
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublaslt().Destroy(handle_);
}

namespace {

// C = beta C for an empty sum (K = 0): cuBLASLt takes no k = 0; clearing is all the model ever needs here.
void run_empty_sum(const GemmDesc& d, cudaStream_t stream) {
  SHARDLM_CHECK(d.epilogue == Epilogue::None && (d.beta == 0.0f || d.beta == 1.0f),
                "Gemm: K = 0 is supported only without epilogue and with beta 0 or 1 (", describe(d), ")");
  const size_t c_size = dtype_size(d.c_dtype);
  if (d.beta == 0.0f)
    for (int b = 0; b < d.batch; ++b)
      SHARDLM_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(d.C) + static_cast<size_t>(b) * d.stride_c * c_size,
                                           static_cast<size_t>(d.ldc) * c_size, 0, static_cast<size_t>(d.N) * c_size,
                                           d.M, stream));
}

bool has_bias(const GemmDesc& d) { return d.epilogue == Epilogue::Bias || d.epilogue == Epilogue::BiasGelu; }
bool has_aux(const GemmDesc& d) { return d.epilogue == Epilogue::BiasGelu || d.epilogue == Epilogue::DGelu; }

Signature signature_of(const GemmDesc& d) {
  const size_t ab_size = d.fp8 ? 1 : dtype_size(d.ab_dtype), c_size = dtype_size(d.c_dtype);
  Signature sig{};
  sig.trans_a = d.trans_a;
  sig.trans_b = d.trans_b;
  sig.M = d.M, sig.N = d.N, sig.K = d.K, sig.lda = d.lda, sig.ldb = d.ldb, sig.ldc = d.ldc, sig.batch = d.batch;
  sig.stride_a = d.batch > 1 ? d.stride_a : 0;
  sig.stride_b = d.batch > 1 ? d.stride_b : 0;
  sig.stride_c = d.batch > 1 ? d.stride_c : 0;
  sig.ab = d.fp8 ? DType::F32 : d.ab_dtype, sig.c = d.c_dtype, sig.fp8 = d.fp8, sig.epilogue = d.epilogue;
  sig.fast_accum = d.fp8 && d.fast_accum;
  sig.align_a = alignment_of(d.A, d.stride_a, d.batch, ab_size);
  sig.align_b = alignment_of(d.B, d.stride_b, d.batch, ab_size);
  sig.align_c = alignment_of(d.C, d.stride_c, d.batch, c_size);
  sig.align_bias = has_bias(d) ? alignment_of(d.bias, 0, 1, c_size) : 0;
  sig.align_aux = has_aux(d) ? alignment_of(d.aux, d.stride_c, d.batch, c_size) : 0;
  return sig;
}

// The epilogue on the descriptor; false when cuBLASLt cannot take it (the GELU aux leading dimension
// and batch stride must be divisible by 8).
bool set_native_epilogue(cublasLtMatmulDesc_t desc, const GemmDesc& d) {
  if (has_aux(d) && (d.ldc % 8 != 0 || (d.batch > 1 && d.stride_c % 8 != 0))) return false;
  set_epilogue_pointers(desc, d);  // the FP8 scales, the bias and aux: the heuristic reads their alignment
  if (d.epilogue == Epilogue::None) return true;
  const cublasLtEpilogue_t epi = lt_epilogue(d.epilogue);
  SHARDLM_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (has_aux(d)) {
    const int64_t aux_ld = d.ldc;
    SHARDLM_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    if (d.batch > 1) {
      const int64_t aux_stride = d.stride_c;
      SHARDLM_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                                                          &aux_stride, sizeof aux_stride));
    }
  }
  return true;
}

}  // namespace

bool Gemm::choose_algorithm(Plan& plan, const GemmDesc& d) {
  if (!set_native_epilogue(plan.desc, d)) return false;
  cublasLtMatmulPreference_t pref = nullptr;
  SHARDLM_CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&pref));
  const Signature& sig = plan.signature;
  const uint64_t max_workspace = workspace_bytes_;
  const uint32_t align_lt_a = sig.align_b, align_lt_b = sig.align_a, align_c = sig.align_c;
  struct PreferenceValue {
    cublasLtMatmulPreferenceAttributes_t attribute;
    const void* value;
    size_t size;
  };
  const PreferenceValue preferences[] = {
      {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof max_workspace},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_lt_a, sizeof align_lt_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_lt_b, sizeof align_lt_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c},
  };
  cublasStatus_t rc = CUBLAS_STATUS_SUCCESS;
  for (const PreferenceValue& v : preferences)  // in order, up to the first failure
    if (rc == CUBLAS_STATUS_SUCCESS) rc = cublaslt().MatmulPreferenceSetAttribute(pref, v.attribute, v.value, v.size);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (rc == CUBLAS_STATUS_SUCCESS)
    rc = cublaslt().MatmulAlgoGetHeuristic(handle_, plan.desc, plan.layout_a, plan.layout_b, plan.layout_c, plan.layout_c,
                                        pref, 1, &result, &found);
  cublaslt().MatmulPreferenceDestroy(pref);
  if (rc == CUBLAS_STATUS_SUCCESS && found > 0) {
    plan.algo = result.algo;
    return true;
  }
  if (d.epilogue != Epilogue::None &&
      (rc == CUBLAS_STATUS_SUCCESS || rc == CUBLAS_STATUS_NOT_SUPPORTED || rc == CUBLAS_STATUS_INVALID_VALUE))
    return false;  // this epilogue is not offered for these dtypes / this version: fallback
  if (rc == CUBLAS_STATUS_SUCCESS || rc == CUBLAS_STATUS_NOT_SUPPORTED)
    throw Error(concat("Gemm: cuBLASLt has no algorithm for ", describe(d)));
  throw_cublas(rc, concat("cublasLtMatmulAlgoGetHeuristic for ", describe(d)).c_str(), __FILE__, __LINE__);
}

Gemm::Plan& Gemm::plan_for(const GemmDesc& d) {
  const Signature sig = signature_of(d);
  const int flags = int(sig.trans_a) | int(sig.trans_b) << 1 | int(sig.epilogue) << 2 | int(sig.ab) << 4 |
                    int(sig.c) << 6 | int(sig.fp8) << 8 | int(sig.fast_accum) << 9;
  const int aligns = log2_of(sig.align_a) | log2_of(sig.align_b) << 4 | log2_of(sig.align_c) << 8 |
                     log2_of(sig.align_bias) << 12 | log2_of(sig.align_aux) << 16;
  const auto key = std::make_tuple(flags, aligns, sig.M, sig.N, sig.K, sig.lda, sig.ldb, sig.ldc, sig.batch,
                                   static_cast<int>(sig.stride_a), static_cast<int>(sig.stride_b),
                                   static_cast<int>(sig.stride_c));
  Plan*& slot = plans_[key];
  if (slot && !(slot->signature == sig)) {  // a key collision (strides beyond 32 bits): plan again
    delete slot;
    slot = nullptr;
  }
  if (slot) return *slot;
  auto plan = std::make_unique<Plan>();
  plan->signature = sig;
  SHARDLM_CUBLAS_CHECK(cublaslt().MatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const cublasOperation_t op_b = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  SHARDLM_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  SHARDLM_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (sig.fast_accum) {
    const int8_t fast = 1;
    SHARDLM_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  }
  // Stored shapes, column-major: our B is [N,K] (or [K,N] when trans_b), our A is [K,M] (or [M,K] when trans_a).
  const cudaDataType_t ab = d.fp8 ? CUDA_R_8F_E4M3 : cuda_type(d.ab_dtype);
  plan->layout_a = make_layout(ab, d.trans_b ? d.K : d.N, d.trans_b ? d.N : d.K, d.ldb, d.batch, d.stride_b);
  plan->layout_b = make_layout(ab, d.trans_a ? d.M : d.K, d.trans_a ? d.K : d.M, d.lda, d.batch, d.stride_a);
  plan->layout_c = make_layout(cuda_type(d.c_dtype), d.N, d.M, d.ldc, d.batch, d.stride_c);
  plan->fallback = !choose_algorithm(*plan, d);
  slot = plan.release();
  return *slot;
}

void Gemm::run_fallback(const GemmDesc& d, cudaStream_t stream) {
  // Correctness first: the product with a simpler epilogue (itself planned and cached), then a small pass.
  const size_t c_size = dtype_size(d.c_dtype);
  GemmDesc inner = d;
  if (d.epilogue == Epilogue::Bias) {
    inner.epilogue = Epilogue::None;
    run(inner, stream);
    // C += ones[M,1] bias[1,N], a rank-1 GEMM per block of rows: A/B and C all in C's dtype.
    const size_t ones_at = (workspace_bytes_ + 255) / 256 * 256;
    const char* ones_base = static_cast<const char*>(workspace_) + ones_at;
    const void* ones = d.c_dtype == DType::F32    ? ones_base
                       : d.c_dtype == DType::BF16 ? ones_base + kOnesRows * sizeof(float)
                                                  : ones_base + kOnesRows * (sizeof(float) + 2);
    for (int b = 0; b < d.batch; ++b) {
      for (int r0 = 0; r0 < d.M; r0 += kOnesRows) {
        GemmDesc rank1;
        rank1.M = std::min(kOnesRows, d.M - r0), rank1.N = d.N, rank1.K = 1;
        rank1.alpha = 1.0f, rank1.beta = 1.0f;
        rank1.A = ones, rank1.lda = 1;
        rank1.B = d.bias, rank1.ldb = d.N;
        const size_t at = static_cast<size_t>(b) * d.stride_c + static_cast<size_t>(r0) * d.ldc;
        rank1.C = static_cast<char*>(d.C) + at * c_size;
        rank1.ldc = d.ldc;
        rank1.ab_dtype = rank1.c_dtype = d.c_dtype;
        run(rank1, stream);
      }
    }
  } else if (d.epilogue == Epilogue::BiasGelu) {
    // aux = alpha op(A) op(B) + bias, then C = gelu(aux).
    inner.epilogue = Epilogue::Bias;
    inner.C = d.aux;
    run(inner, stream);
    for_each_run(d, [&](size_t at, size_t count) {
      gelu_forward(static_cast<const char*>(d.aux) + at * c_size, static_cast<char*>(d.C) + at * c_size, count,
                   d.c_dtype, stream);
    });
  } else if (d.epilogue == Epilogue::DGelu) {
    // C = alpha op(A) op(B), then C *= gelu'(aux) in place.
    inner.epilogue = Epilogue::None;
    run(inner, stream);
    for_each_run(d, [&](size_t at, size_t count) {
      void* c = static_cast<char*>(d.C) + at * c_size;
      gelu_backward(c, static_cast<const char*>(d.aux) + at * c_size, c, count, d.c_dtype, stream);
    });
  } else {
    throw Error(concat("Gemm: no algorithm for ", describe(d)));
  }
}

void Gemm::run(const GemmDesc& d, cudaStream_t stream) {
  validate(d);
  if (d.M == 0 || d.N == 0) return;
  if (d.K == 0) return run_empty_sum(d, stream);
  Plan& plan = plan_for(d);
  if (plan.fallback) return run_fallback(d, stream);
  if (d.epilogue != Epilogue::None || d.fp8) set_epilogue_pointers(plan.desc, d);
  const float alpha = d.alpha, beta = d.beta;
  const cublasStatus_t rc =
      cublaslt().Matmul(handle_, plan.desc, &alpha, d.B, plan.layout_a, d.A, plan.layout_b, &beta, d.C, plan.layout_c,
                     d.C, plan.layout_c, &plan.algo, workspace_, workspace_bytes_, stream);
  if (rc != CUBLAS_STATUS_SUCCESS)
    throw_cublas(rc, concat("cublasLtMatmul for ", describe(d)).c_str(), __FILE__, __LINE__);
}

void linear_rows(Gemm& gemm, const void* x, int n, int in, const void* weight, const void* bias, int out, void* y,
                 bool accumulate, DType dt, cudaStream_t stream) {
  GemmDesc d;
  d.trans_b = true;
  d.M = n, d.N = out, d.K = in;
  d.A = x, d.lda = in;
  d.B = weight, d.ldb = in;
  d.C = y, d.ldc = out;
  d.ab_dtype = dt, d.c_dtype = dt;
  d.beta = accumulate ? 1.0f : 0.0f;
  if (bias) d.epilogue = Epilogue::Bias, d.bias = bias;
  gemm.run(d, stream);
}

}  // namespace shardlm::cuda

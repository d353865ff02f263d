#define BOOST_TEST_MODULE test_cuda_gemm
#include <boost/test/unit_test.hpp>
// Tests of the cuBLASLt GEMM (label gpu): row-major products in every transpose combination, odd sizes,
// padded row strides, F32/BF16/F16 inputs with F32 and 16-bit outputs, beta accumulation, the bias, bias+GELU
// and GELU-backward epilogues (the fused path and the fallback), strided batches, misaligned pointers
// against cached plans, and argument errors, all against a double-precision loop on the host; the FP8
// path (model.fp8_linear): fp8_quantize's copies, scales and its handling of zeros, infs and NaNs, and the
// forward, dgrad and wgrad forms through run_fp8_gemm against the host product of the same E4M3 values
// (tight) and of the unquantized inputs (within FP8's error); the linear backward sharing its output
// gradient, reading its forward's amaxes from a slot and multiplying by the transposed weight its forward
// kept (model.fp8_keep_weights), bit for bit against the GEMMs it replaces; without FP8, the linear backward
// against its two halves (MatMul's weight_backward and input_backward) run apart.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_support.hpp"
#include "fp8_cast.hpp"
#include "fp8_gemm.hpp"
#include "gemm.hpp"
#include "matmul.hpp"
#include "workspace_sizes.hpp"
#include "shardlm/core.hpp"

using namespace shardlm;
using shardlm::cuda::Epilogue;
using shardlm::cuda::epilogue_name;
using shardlm::cuda::Gemm;
using shardlm::cuda::GemmDesc;

namespace {

using namespace cuda_test;

// ---- host helpers ---------------------------------------------------------------------------

// A device copy of v in dt, starting `offset` elements into the buffer (to misalign it on purpose).
struct TestArray {
  DeviceBuffer buffer;
  size_t offset;
  DType dt;
  TestArray(const std::vector<float>& v, DType dtype, size_t elem_offset = 0)
      : buffer((v.size() + elem_offset) * dtype_size(dtype) + 16), offset(elem_offset), dt(dtype) {
    const std::vector<unsigned char> bytes = to_bytes(v, dt);
    check_cuda(cudaMemcpy(data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  char* data() const { return buffer.get() + offset * dtype_size(dt); }
  std::vector<float> download(size_t n) const {
    std::vector<unsigned char> bytes(n * dtype_size(dt));
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check_cuda(cudaMemcpy(bytes.data(), data(), bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return from_bytes(bytes, dt);
  }
};

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(0.79788456 * x * (1.0 + 0.044715 * x * x))); }

double gelu_derivative(double x) {
  const double t = std::tanh(0.79788456 * x * (1.0 + 0.044715 * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.79788456 * (1.0 + 3.0 * 0.044715 * x * x);
}

// ---- one GEMM case against the host --------------------------------------------------------

struct Case {
  bool trans_a = false, trans_b = false;
  int M = 1, N = 1, K = 1;
  int pad_a = 0, pad_b = 0, pad_c = 0;  // extra elements per stored row
  float alpha = 1.0f, beta = 0.0f;
  DType ab = DType::F32, c = DType::F32;
  Epilogue epilogue = Epilogue::None;
  int batch = 1;
  int pad_batch = 0;       // extra elements between batch members
  size_t misalign = 0;     // elements by which A, B and C start past an allocation's start
};

double tolerance_for(const Case& cs) {
  if (cs.c == DType::BF16) return 1e-2;
  if (cs.c == DType::F16) return 2e-3;
  return 2e-5;  // exact fp32 products (no TF32), fp32 accumulation
}

// Largest |got - ref| over the matrix, relative to the largest |ref|.
double relative_error(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<bool>& inside) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!inside[i]) continue;
    worst = std::max(worst, std::abs(got[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return worst / std::max(scale, 1e-20);
}

void run_case(Gemm& gemm, const Case& cs, std::mt19937& rng) {
  BOOST_TEST_CONTEXT("M=" << cs.M << " N=" << cs.N << " K=" << cs.K << " trans_a=" << cs.trans_a
                          << " trans_b=" << cs.trans_b << " ab=" << dtype_name(cs.ab) << " c=" << dtype_name(cs.c)
                          << " epilogue=" << epilogue_name(cs.epilogue) << " batch=" << cs.batch
                          << " beta=" << cs.beta << " misalign=" << cs.misalign) {
    const int a_rows = cs.trans_a ? cs.K : cs.M, a_cols = cs.trans_a ? cs.M : cs.K;
    const int b_rows = cs.trans_b ? cs.N : cs.K, b_cols = cs.trans_b ? cs.K : cs.N;
    const int lda = a_cols + cs.pad_a, ldb = b_cols + cs.pad_b, ldc = cs.N + cs.pad_c;
    const long long stride_a = static_cast<long long>(a_rows) * lda + cs.pad_batch;
    const long long stride_b = static_cast<long long>(b_rows) * ldb + cs.pad_batch;
    const long long stride_c = static_cast<long long>(cs.M) * ldc + cs.pad_batch;
    const size_t size_a = static_cast<size_t>(stride_a) * cs.batch, size_b = static_cast<size_t>(stride_b) * cs.batch;
    const size_t size_c = static_cast<size_t>(stride_c) * cs.batch;

    const std::vector<float> a = random_values(size_a, rng, cs.ab);
    const std::vector<float> b = random_values(size_b, rng, cs.ab);
    const std::vector<float> c0 = random_values(size_c, rng, cs.c);
    const std::vector<float> bias = random_values(cs.N, rng, cs.c);
    const std::vector<float> aux0 = random_values(size_c, rng, cs.c, 1.5f);
    TestArray da(a, cs.ab, cs.misalign), db(b, cs.ab, cs.misalign), dc(c0, cs.c, cs.misalign);
    TestArray dbias(bias, cs.c), daux(aux0, cs.c);

    GemmDesc d;
    d.trans_a = cs.trans_a, d.trans_b = cs.trans_b;
    d.M = cs.M, d.N = cs.N, d.K = cs.K;
    d.alpha = cs.alpha, d.beta = cs.beta;
    d.A = da.data(), d.lda = lda;
    d.B = db.data(), d.ldb = ldb;
    d.C = dc.data(), d.ldc = ldc;
    d.ab_dtype = cs.ab, d.c_dtype = cs.c;
    d.epilogue = cs.epilogue;
    if (cs.epilogue == Epilogue::Bias || cs.epilogue == Epilogue::BiasGelu) d.bias = dbias.data();
    if (cs.epilogue == Epilogue::BiasGelu || cs.epilogue == Epilogue::DGelu) d.aux = daux.data();
    d.batch = cs.batch;
    if (cs.batch > 1) d.stride_a = stride_a, d.stride_b = stride_b, d.stride_c = stride_c;
    BOOST_REQUIRE_NO_THROW(gemm.run(d, nullptr));
    const std::vector<float> c = dc.download(size_c);
    const std::vector<float> aux = daux.download(size_c);

    // The reference, and which elements of C's storage belong to the matrices (the rest must stay as they were).
    std::vector<double> ref_c(c0.begin(), c0.end()), ref_aux(aux0.begin(), aux0.end());
    std::vector<bool> inside(size_c, false);
    for (int bt = 0; bt < cs.batch; ++bt) {
      const float* A = a.data() + bt * stride_a;
      const float* B = b.data() + bt * stride_b;
      for (int i = 0; i < cs.M; ++i)
        for (int j = 0; j < cs.N; ++j) {
          double sum = 0.0;
          for (int k = 0; k < cs.K; ++k) {
            const double av = cs.trans_a ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
            const double bv = cs.trans_b ? B[static_cast<size_t>(j) * ldb + k] : B[static_cast<size_t>(k) * ldb + j];
            sum += av * bv;
          }
          const size_t at = bt * stride_c + static_cast<size_t>(i) * ldc + j;
          inside[at] = true;
          const double product = cs.alpha * sum + cs.beta * c0[at];
          switch (cs.epilogue) {
            case Epilogue::None: ref_c[at] = product; break;
            case Epilogue::Bias: ref_c[at] = product + bias[j]; break;
            case Epilogue::BiasGelu:
              ref_aux[at] = product + bias[j];
              ref_c[at] = gelu(ref_aux[at]);
              break;
            case Epilogue::DGelu: ref_c[at] = product * gelu_derivative(aux0[at]); break;
          }
        }
    }
    const double tol = tolerance_for(cs);
    BOOST_TEST(relative_error(c, ref_c, inside) <= tol);
    if (cs.epilogue == Epilogue::BiasGelu) BOOST_TEST(relative_error(aux, ref_aux, inside) <= tol);
    // Padding between rows and between batch members is never written.
    size_t touched = 0;
    for (size_t i = 0; i < size_c; ++i)
      if (!inside[i] && (c[i] != c0[i] || aux[i] != aux0[i])) ++touched;
    BOOST_TEST(touched == 0u);
  }
}

// The dtype pairs the contract allows: C in F32 or in the A/B dtype.
const std::vector<std::pair<DType, DType>>& dtype_pairs() {
  static const std::vector<std::pair<DType, DType>> pairs = {{DType::F32, DType::F32},   {DType::BF16, DType::F32},
                                                             {DType::BF16, DType::BF16}, {DType::F16, DType::F32},
                                                             {DType::F16, DType::F16}};
  return pairs;
}

// (trans_a, trans_b) of the sweeps below.
using Transposes = std::vector<std::pair<bool, bool>>;
const Transposes kEveryTranspose = {{false, false}, {false, true}, {true, false}, {true, true}};

// `shape` for each dtype pair and, within it, each of `transposes` in turn; after each run, when
// `again` is given, the case it makes of that one (another stride, beta, width) runs too.
void sweep_dtypes(Gemm& gemm, std::mt19937& rng, const Transposes& transposes, const Case& shape,
                  void (*again)(Case&) = nullptr) {
  for (const auto& [ab, c] : dtype_pairs())
    for (const auto& [trans_a, trans_b] : transposes) {
      Case cs = shape;
      cs.trans_a = trans_a, cs.trans_b = trans_b;
      cs.ab = ab, cs.c = c;
      run_case(gemm, cs, rng);
      if (!again) continue;
      again(cs);
      run_case(gemm, cs, rng);
    }
}

// The same on a Gemm of its own, one rng seeded with `seed` feeding every run.
void sweep_dtypes(uint32_t seed, const Transposes& transposes, const Case& shape, void (*again)(Case&) = nullptr) {
  require_device("test_cuda_gemm");
  Gemm gemm;
  std::mt19937 rng(seed);
  sweep_dtypes(gemm, rng, transposes, shape, again);
}

}  // namespace

BOOST_AUTO_TEST_CASE(device_present) { require_device("test_cuda_gemm"); }

BOOST_AUTO_TEST_CASE(transposes_odd_sizes_padded_strides_all_dtypes) {
  Case cs;
  cs.M = 37, cs.N = 29, cs.K = 53;
  cs.pad_a = 3, cs.pad_b = 5, cs.pad_c = 7;
  cs.alpha = 0.75f;
  // Tight strides, the same shape again (the cached plan of another shape must not be reused).
  sweep_dtypes(1, kEveryTranspose, cs, [](Case& tight) {
    tight.pad_a = tight.pad_b = tight.pad_c = 0;
    tight.alpha = 1.0f;
  });
}

BOOST_AUTO_TEST_CASE(beta_one_accumulates) {
  Case cs;
  cs.M = 33, cs.N = 47, cs.K = 21;
  cs.pad_c = 2;
  cs.beta = 1.0f;
  sweep_dtypes(2, {{false, true}, {true, false}}, cs, [](Case& scaled) { scaled.alpha = -0.5f, scaled.beta = 0.25f; });
}

BOOST_AUTO_TEST_CASE(larger_shapes_on_tensor_cores) {
  Case cs;
  cs.M = 256, cs.N = 384, cs.K = 512;
  sweep_dtypes(3, {{false, true}}, cs);
}

BOOST_AUTO_TEST_CASE(bias_epilogue) {
  Case cs;
  cs.M = 19, cs.N = 45, cs.K = 24;
  cs.pad_c = 3;
  cs.epilogue = Epilogue::Bias;
  // Then the bias on top of accumulation.
  sweep_dtypes(4, {{false, true}, {true, true}}, cs, [](Case& accumulate) { accumulate.beta = 1.0f; });
}

BOOST_AUTO_TEST_CASE(bias_gelu_epilogue) {
  Case cs;
  cs.M = 23, cs.N = 40, cs.K = 32;
  cs.pad_c = 8;  // ldc = 48: divisible by 8, cuBLASLt's fused GELU can take it
  cs.alpha = 0.5f;
  cs.epilogue = Epilogue::BiasGelu;
  // Then ldc = 31: the fallback (GEMM with bias, then a GELU pass).
  sweep_dtypes(5, {{false, true}, {true, true}}, cs, [](Case& odd) { odd.N = 29, odd.pad_c = 2; });
}

BOOST_AUTO_TEST_CASE(dgelu_epilogue) {
  Case cs;
  cs.M = 31, cs.N = 64, cs.K = 40;
  cs.epilogue = Epilogue::DGelu;
  // Then ldc = 28: not divisible by 8, the fallback.
  sweep_dtypes(6, {{false, false}, {false, true}}, cs, [](Case& odd) { odd.N = 27, odd.pad_c = 1; });
}

BOOST_AUTO_TEST_CASE(strided_batch) {
  require_device("test_cuda_gemm");
  Gemm gemm;
  std::mt19937 rng(7);
  Case batched;
  batched.M = 17, batched.N = 23, batched.K = 19;
  batched.pad_a = 1, batched.pad_c = 2;
  batched.batch = 3;
  batched.pad_batch = 5;
  sweep_dtypes(gemm, rng, {{false, false}, {true, false}, {false, true}, {true, true}}, batched);
  // Epilogues over a batch: one bias for every member; aux strided like C.
  for (Epilogue e : {Epilogue::Bias, Epilogue::BiasGelu, Epilogue::DGelu}) {
    Case cs;
    cs.M = 12, cs.N = 24, cs.K = 16;
    cs.batch = 4;
    cs.pad_batch = 8;
    cs.ab = DType::BF16, cs.c = DType::BF16;
    cs.epilogue = e;
    run_case(gemm, cs, rng);
    cs.ab = DType::F32, cs.c = DType::F32;
    run_case(gemm, cs, rng);
  }
}

BOOST_AUTO_TEST_CASE(misaligned_pointers_and_plan_cache) {
  require_device("test_cuda_gemm");
  Gemm gemm;
  std::mt19937 rng(8);
  // The same shape with aligned, then misaligned, then aligned pointers: each needs a plan for its alignment.
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (size_t misalign : {0, 1, 3, 0}) {
      Case cs;
      cs.M = 64, cs.N = 72, cs.K = 96;
      cs.trans_b = true;
      cs.ab = dt, cs.c = dt;
      cs.misalign = misalign;
      run_case(gemm, cs, rng);
      cs.epilogue = Epilogue::Bias;
      run_case(gemm, cs, rng);
    }
}

BOOST_AUTO_TEST_CASE(empty_and_k_zero) {
  require_device("test_cuda_gemm");
  Gemm gemm;
  std::vector<float> c0(6, 3.0f);
  TestArray dc(c0, DType::F32);
  GemmDesc d;
  d.M = 2, d.N = 3, d.K = 0;
  d.lda = 1, d.ldb = 3, d.ldc = 3;
  d.C = dc.data();
  d.beta = 1.0f;
  BOOST_REQUIRE_NO_THROW(gemm.run(d, nullptr));
  BOOST_TEST(dc.download(6) == c0);
  d.beta = 0.0f;
  BOOST_REQUIRE_NO_THROW(gemm.run(d, nullptr));
  BOOST_TEST(dc.download(6) == std::vector<float>(6, 0.0f));
  d.M = 0;
  BOOST_CHECK_NO_THROW(gemm.run(d, nullptr));
}

BOOST_AUTO_TEST_CASE(bad_arguments_throw) {
  require_device("test_cuda_gemm");
  Gemm gemm;
  std::vector<float> v(64, 1.0f);
  TestArray a(v, DType::F32), b(v, DType::F32), c(v, DType::F32);
  GemmDesc d;
  d.M = 4, d.N = 4, d.K = 4;
  d.A = a.data(), d.lda = 4;
  d.B = b.data(), d.ldb = 4;
  d.C = c.data(), d.ldc = 4;
  BOOST_REQUIRE_NO_THROW(gemm.run(d, nullptr));
  GemmDesc bad = d;
  bad.c_dtype = DType::F16;  // 16-bit C from fp32 inputs
  BOOST_CHECK_THROW(gemm.run(bad, nullptr), Error);
  bad = d;
  bad.lda = 3;
  BOOST_CHECK_THROW(gemm.run(bad, nullptr), Error);
  bad = d;
  bad.epilogue = Epilogue::Bias;  // no bias pointer
  BOOST_CHECK_THROW(gemm.run(bad, nullptr), Error);
  bad = d;
  bad.epilogue = Epilogue::DGelu;  // no aux pointer
  BOOST_CHECK_THROW(gemm.run(bad, nullptr), Error);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// ---- FP8 ------------------------------------------------------------------------------------

namespace {

// E4M3's value nearest to v (ties to even mantissa), saturating at 448: the host's fp8_quantize.
float nearest_e4m3(float v) {
  if (std::isnan(v)) return v;
  const float a = std::min(std::fabs(v), cuda::kFp8E4M3Max);
  float best = 0.0f;
  for (int code = 0; code < 0x7f; ++code) {  // every finite non-negative E4M3 value
    const float c = cuda::fp8_e4m3_to_float(static_cast<uint8_t>(code));
    if (std::fabs(c - a) < std::fabs(best - a) ||
        (std::fabs(c - a) == std::fabs(best - a) && (code & 1) == 0))
      best = c;
  }
  return v < 0 ? -best : best;
}

struct Quantized {
  std::vector<uint8_t> out, out_t;
  float inv_scale = 0;
};

Quantized quantize_on_device(const std::vector<float>& x, int rows, int cols, int ld) {
  TestArray dx(x, DType::BF16);
  DeviceBuffer out(static_cast<size_t>(rows) * cols + 16), out_t(static_cast<size_t>(rows) * cols + 16);
  DeviceBuffer scratch(2 * sizeof(float));
  float* inv = reinterpret_cast<float*>(scratch.get());
  unsigned* amax = reinterpret_cast<unsigned*>(scratch.get() + sizeof(float));
  cuda::fp8_quantize(dx.data(), rows, cols, ld, DType::BF16, reinterpret_cast<uint8_t*>(out.get()),
                     reinterpret_cast<uint8_t*>(out_t.get()), inv, amax, nullptr);
  check_cuda(cudaDeviceSynchronize(), "fp8_quantize");
  Quantized q;
  q.out = from_device_raw<uint8_t>(out.get(), static_cast<size_t>(rows) * cols);
  q.out_t = from_device_raw<uint8_t>(out_t.get(), static_cast<size_t>(rows) * cols);
  q.inv_scale = from_device_raw<float>(inv, 1)[0];
  return q;
}

// A bf16 linear layer's backward GEMMs over [n, out] dy, [n, in] x and [out, in] W: wgrad dW += dy^T x
// (fp32 dW) and dgrad dx = dy W (bf16 dx, which may be x's buffer).
std::pair<GemmDesc, GemmDesc> linear_backward_descs(int n, int out, int in, const void* dy, const void* x,
                                                    const void* W, void* dW, void* dx) {
  GemmDesc wg, dg;
  wg.trans_a = true, wg.M = out, wg.N = in, wg.K = n, wg.beta = 1;
  wg.A = dy, wg.lda = out, wg.B = x, wg.ldb = in, wg.C = dW, wg.ldc = in;
  wg.ab_dtype = DType::BF16, wg.c_dtype = DType::F32;
  dg.M = n, dg.N = in, dg.K = out;
  dg.A = dy, dg.lda = out, dg.B = W, dg.ldb = in, dg.C = dx, dg.ldc = in;
  dg.ab_dtype = DType::BF16, dg.c_dtype = DType::BF16;
  return {wg, dg};
}

// FP8 scratch on the device for A and B operands of up to a_el and b_el elements, with `slots` amax slots.
struct DeviceFp8Scratch {
  DeviceBuffer buffer;
  cuda::Fp8Scratch w;
  DeviceFp8Scratch(size_t a_el, size_t b_el, size_t slots = 0)
      : buffer(cuda::fp8_scratch_bytes(a_el, b_el, slots)), w(cuda::Fp8Scratch::at(buffer.get(), a_el, b_el, slots)) {}
};

// A bf16 linear layer on the device, random dy [n, out], x [n, in], W [out, in] and fp32 dW0 from `rng`,
// run through the FP8 path with an amax slot (or -1): forward y = x W^T (run_fp8_gemm) and backward
// (run_fp8_linear_backward: dW = dW0 + dy^T x unless frozen, then dx = dy W).
struct Fp8LinearCase {
  int n, out, in;
  std::vector<float> dy, x, W, dw0;
  TestArray ddy, dx_in, dweight;
  Gemm gemm;
  Fp8LinearCase(int n_, int out_, int in_, std::mt19937 rng)
      : n(n_), out(out_), in(in_), dy(random_values(static_cast<size_t>(n) * out, rng, DType::BF16, 1.0f)),
        x(random_values(static_cast<size_t>(n) * in, rng, DType::BF16, 2.0f)),
        W(random_values(static_cast<size_t>(out) * in, rng, DType::BF16, 0.5f)),
        dw0(random_values(static_cast<size_t>(out) * in, rng, DType::F32)), ddy(dy, DType::BF16),
        dx_in(x, DType::BF16), dweight(W, DType::BF16) {}
  // Scratch for this layer's three GEMMs, with `slots` amax slots.
  DeviceFp8Scratch scratch(int slots) const {
    return DeviceFp8Scratch(static_cast<size_t>(n) * out, static_cast<size_t>(n) * in, slots);
  }
  std::vector<float> forward(const cuda::Fp8Scratch& w, int slot) {
    TestArray y(std::vector<float>(static_cast<size_t>(n) * out, 0.0f), DType::BF16);
    GemmDesc fw;
    fw.trans_b = true, fw.M = n, fw.N = out, fw.K = in;
    fw.A = dx_in.data(), fw.lda = in, fw.B = dweight.data(), fw.ldb = in, fw.C = y.data(), fw.ldc = out;
    fw.ab_dtype = DType::BF16, fw.c_dtype = DType::BF16;
    cuda::run_fp8_gemm(gemm, fw, w, nullptr, slot);
    return y.download(static_cast<size_t>(n) * out);
  }
  // dW (empty when frozen) and dx.
  std::pair<std::vector<float>, std::vector<float>> backward(const cuda::Fp8Scratch& w, int slot, bool frozen = false) {
    TestArray dW(dw0, DType::F32), dx(std::vector<float>(static_cast<size_t>(n) * in, 0.0f), DType::BF16);
    const auto [wg, dg] = linear_backward_descs(n, out, in, ddy.data(), dx_in.data(), dweight.data(), dW.data(), dx.data());
    cuda::run_fp8_linear_backward(gemm, frozen ? nullptr : &wg, dg, w, nullptr, slot);
    return {frozen ? std::vector<float>{} : dW.download(static_cast<size_t>(out) * in),
            dx.download(static_cast<size_t>(n) * in)};
  }
};

}  // namespace

// Odd sizes with a padded row stride (32 x 32 tiles element by element, partial tiles), and multiples of
// 8 with a padded row stride and partial 64 x 64 tiles (the vectorised tiles).
BOOST_AUTO_TEST_CASE(fp8_quantize_scales_rounds_and_transposes) {
  struct Shape {
    int rows, cols, ld;
  };
  for (const Shape sh : {Shape{37, 45, 50}, Shape{72, 136, 144}, Shape{128, 64, 64}}) {
    BOOST_TEST_CONTEXT(sh.rows << " x " << sh.cols << " ld " << sh.ld) {
      const int rows = sh.rows, cols = sh.cols, ld = sh.ld;
      std::mt19937 rng(21);
      std::vector<float> x = random_values(static_cast<size_t>(rows) * ld, rng, DType::BF16, 3.0f);
      x[5 * ld + 7] = -100.0f;  // the largest magnitude (random_values' normal draws stay far below), exact in bf16
      if (ld > cols) x[6 * ld + cols + 2] = 1000.0f;  // in the row stride's padding: not the matrix's, not its amax
      const Quantized q = quantize_on_device(x, rows, cols, ld);
      BOOST_TEST(q.inv_scale == 100.0f / 448.0f);
      const float scale = 448.0f / 100.0f;
      size_t wrong = 0, wrong_t = 0;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const float want = nearest_e4m3(bf16_to_float(float_to_bf16(x[static_cast<size_t>(r) * ld + c])) * scale);
          wrong += cuda::fp8_e4m3_to_float(q.out[static_cast<size_t>(r) * cols + c]) != want;
          wrong_t += q.out_t[static_cast<size_t>(c) * rows + r] != q.out[static_cast<size_t>(r) * cols + c];
        }
      BOOST_TEST(wrong == 0u);
      BOOST_TEST(wrong_t == 0u);
      BOOST_TEST(cuda::fp8_e4m3_to_float(q.out[5 * cols + 7]) == -448.0f);
    }
  }
}

BOOST_AUTO_TEST_CASE(fp8_quantize_zeros_infs_and_nans) {
  const int rows = 16, cols = 32;
  const Quantized zeros = quantize_on_device(std::vector<float>(rows * cols, 0.0f), rows, cols, cols);
  BOOST_TEST(zeros.inv_scale == 1.0f);  // no division by a zero amax
  BOOST_TEST(std::all_of(zeros.out.begin(), zeros.out.end(), [](uint8_t v) { return (v & 0x7f) == 0; }));
  for (const float bad : {INFINITY, -INFINITY, NAN}) {
    std::vector<float> x(rows * cols, 0.25f);
    x[3 * cols + 9] = bad;
    const Quantized q = quantize_on_device(x, rows, cols, cols);
    BOOST_TEST_CONTEXT("bad value " << bad) {
      BOOST_TEST(!std::isfinite(q.inv_scale));  // amax inf or NaN: the GEMM's result is not finite
      BOOST_TEST(std::isnan(cuda::fp8_e4m3_to_float(q.out[3 * cols + 9])));
    }
  }
}

// run_fp8_gemm on one form against (1) the host product of the E4M3 values the device made, times
// their scales (what the GEMM must compute, up to fp32 accumulation and C's rounding) and (2) the
// product of the unquantized inputs (FP8's own error: about 2^-4 per factor, averaging over K).
void check_fp8_form(bool trans_a, bool trans_b, DType c_dtype, float beta) {
  BOOST_TEST_CONTEXT("trans_a=" << trans_a << " trans_b=" << trans_b << " C " << dtype_name(c_dtype) << " beta "
                                << beta) {
    std::mt19937 rng(5 + trans_a + 2 * trans_b);
    const int M = 64, N = 48, K = 96;
    const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K, b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    const std::vector<float> a = random_values(static_cast<size_t>(a_rows) * a_cols, rng, DType::BF16, 2.0f);
    const std::vector<float> b = random_values(static_cast<size_t>(b_rows) * b_cols, rng, DType::BF16, 0.5f);
    const std::vector<float> c0 = random_values(static_cast<size_t>(M) * N, rng, c_dtype);
    TestArray da(a, DType::BF16), db(b, DType::BF16), dc(c0, c_dtype);
    const size_t a_el = static_cast<size_t>(M) * K, b_el = static_cast<size_t>(N) * K;
    const DeviceFp8Scratch scratch(a_el, b_el);
    const cuda::Fp8Scratch& w = scratch.w;
    GemmDesc d;
    d.trans_a = trans_a, d.trans_b = trans_b, d.M = M, d.N = N, d.K = K, d.beta = beta;
    d.A = da.data(), d.lda = a_cols, d.B = db.data(), d.ldb = b_cols, d.C = dc.data(), d.ldc = N;
    d.ab_dtype = DType::BF16, d.c_dtype = c_dtype;
    BOOST_TEST_REQUIRE(cuda::fp8_gemm_fits(d, w));
    Gemm gemm;
    BOOST_REQUIRE_NO_THROW(cuda::run_fp8_gemm(gemm, d, w, nullptr));
    const std::vector<float> c = dc.download(static_cast<size_t>(M) * N);
    const std::vector<uint8_t> qa = from_device_raw<uint8_t>(w.a, a_el), qb = from_device_raw<uint8_t>(w.b, b_el);
    const std::vector<float> inv = {from_device_raw<float>(w.a_scale, 1)[0], from_device_raw<float>(w.b_scale, 1)[0]};
    double worst_exact = 0, worst_fp8 = 0, scale = 0, sum_ab = 0;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double exact = 0, plain = 0, abs_sum = 0;
        for (int k = 0; k < K; ++k) {
          // the quantized operands: A as [M, K], B as [N, K]
          exact += double(cuda::fp8_e4m3_to_float(qa[static_cast<size_t>(i) * K + k])) * inv[0] *
                   cuda::fp8_e4m3_to_float(qb[static_cast<size_t>(j) * K + k]) * inv[1];
          const double av = trans_a ? a[static_cast<size_t>(k) * a_cols + i] : a[static_cast<size_t>(i) * a_cols + k];
          const double bv = trans_b ? b[static_cast<size_t>(j) * b_cols + k] : b[static_cast<size_t>(k) * b_cols + j];
          plain += av * bv;
          abs_sum += std::fabs(av * bv);
        }
        const double base = beta * c0[static_cast<size_t>(i) * N + j];
        worst_exact = std::max(worst_exact, std::fabs(c[static_cast<size_t>(i) * N + j] - (base + exact)));
        worst_fp8 = std::max(worst_fp8, std::fabs(c[static_cast<size_t>(i) * N + j] - (base + plain)));
        scale = std::max(scale, std::fabs(base + plain));
        sum_ab = std::max(sum_ab, abs_sum);
      }
    // (1): the tensor cores' accumulation of exact products (Hopper's FP8 MMA adds with fewer bits than
    // fp32: measured 1.8e-4 of the largest value at K = 96), then C's rounding (bf16: 2^-8 of the value).
    BOOST_TEST(worst_exact <= (c_dtype == DType::BF16 ? 8e-3 : 1e-3) * scale,
               "against the E4M3 values: " << worst_exact << " of " << scale);
    // (2): each factor within 2^-4 relative (E4M3's 3 mantissa bits), errors of random sign.
    BOOST_TEST(worst_fp8 <= 0.06 * sum_ab, "against the bf16 inputs: " << worst_fp8 << " of sum |a b| " << sum_ab);
    BOOST_TEST(worst_fp8 > 0.0, "FP8 changed nothing: the inputs were not quantized");
  }
}

BOOST_AUTO_TEST_CASE(fp8_forward_dgrad_wgrad_forms) {
  check_fp8_form(false, true, DType::BF16, 0.0f);   // forward: x W^T
  check_fp8_form(false, true, DType::BF16, 1.0f);   // forward onto a residual
  check_fp8_form(false, false, DType::BF16, 0.0f);  // dgrad: dy W
  check_fp8_form(true, false, DType::F32, 1.0f);    // wgrad: dW += dy^T x
  check_fp8_form(true, true, DType::F32, 0.0f);     // both transposed
}

// run_fp8_linear_backward (the output gradient quantized once, in both layouts) gives the bits of the
// two GEMMs run one at a time through run_fp8_gemm: the same E4M3 copies and scales, the same GEMMs;
// with a frozen weight (no wgrad) too, and with dx written over x's buffer after wgrad has read it.
BOOST_AUTO_TEST_CASE(fp8_linear_backward_shares_dy_and_matches_the_separate_gemms) {
  std::mt19937 rng(17);
  const int n = 96, out = 64, in = 48;
  const std::vector<float> dy = random_values(static_cast<size_t>(n) * out, rng, DType::BF16, 1.0f);
  const std::vector<float> x = random_values(static_cast<size_t>(n) * in, rng, DType::BF16, 2.0f);
  const std::vector<float> W = random_values(static_cast<size_t>(out) * in, rng, DType::BF16, 0.5f);
  const std::vector<float> dw0 = random_values(static_cast<size_t>(out) * in, rng, DType::F32);
  const size_t a_el = static_cast<size_t>(n) * out, b_el = static_cast<size_t>(n) * in;
  const DeviceFp8Scratch scratch(a_el, b_el);
  const cuda::Fp8Scratch& w = scratch.w;
  Gemm gemm;
  // wgrad dW += dy^T x and dgrad dx = dy W over these buffers.
  auto descs = [&](const TestArray& ddy, const TestArray& dx_in, const TestArray& dweight, const TestArray& dW,
                   void* dx) {
    return linear_backward_descs(n, out, in, ddy.data(), dx_in.data(), dweight.data(), dW.data(), dx);
  };
  for (const bool frozen : {false, true}) {
    BOOST_TEST_CONTEXT("frozen weight " << frozen) {
      // Separately: wgrad through run_fp8_gemm, then dgrad into its own buffer.
      TestArray ddy(dy, DType::BF16), dx_sep(x, DType::BF16), dW_w(W, DType::BF16), dW_sep(dw0, DType::F32);
      TestArray dx_out(std::vector<float>(static_cast<size_t>(n) * in, 0.0f), DType::BF16);
      const auto [wg, dg] = descs(ddy, dx_sep, dW_w, dW_sep, dx_out.data());
      if (!frozen) cuda::run_fp8_gemm(gemm, wg, w, nullptr);
      cuda::run_fp8_gemm(gemm, dg, w, nullptr);
      check_cuda(cudaDeviceSynchronize(), "separate FP8 GEMMs");
      const std::vector<float> want_dx = dx_out.download(static_cast<size_t>(n) * in);
      const std::vector<float> want_dw = dW_sep.download(static_cast<size_t>(out) * in);
      // Shared: dx written over x's buffer.
      TestArray dx_shared(x, DType::BF16), dW_shared(dw0, DType::F32);
      const auto [wg2, dg2] = descs(ddy, dx_shared, dW_w, dW_shared, dx_shared.data());
      BOOST_REQUIRE_NO_THROW(cuda::run_fp8_linear_backward(gemm, frozen ? nullptr : &wg2, dg2, w, nullptr));
      check_cuda(cudaDeviceSynchronize(), "run_fp8_linear_backward");
      BOOST_TEST(dx_shared.download(static_cast<size_t>(n) * in) == want_dx, boost::test_tools::per_element());
      BOOST_TEST(dW_shared.download(static_cast<size_t>(out) * in) == want_dw, boost::test_tools::per_element());
    }
  }
}

// A linear layer's amax slot: the forward through run_fp8_gemm with a slot gives the bits it gives without
// one and leaves max |x| and max |W| there; the backward reading them (no amax pass over x or W) gives the
// bits of the backward that reduces them again, and it does read the slot (a different W amax changes
// dgrad's scale). A slot outside the scratch is refused.
BOOST_AUTO_TEST_CASE(fp8_linear_backward_with_the_forward_amax_matches_recomputing_it) {
  Fp8LinearCase c(96, 64, 48, std::mt19937(23));
  const int slots = 3, slot = 1;
  const DeviceFp8Scratch scratch = c.scratch(slots);
  const cuda::Fp8Scratch& w = scratch.w;
  BOOST_TEST_REQUIRE(w.slots == slots);
  // The forward y = x W^T, with and without the slot.
  const std::vector<float> y_plain = c.forward(w, -1);
  std::vector<float> y_slot;
  BOOST_REQUIRE_NO_THROW(y_slot = c.forward(w, slot));
  BOOST_TEST(y_slot == y_plain, boost::test_tools::per_element());
  const std::vector<unsigned> saved = from_device_raw<unsigned>(w.saved_amax + 2 * slot, 2);
  float amax_x = 0, amax_w = 0;
  for (const float v : c.x) amax_x = std::max(amax_x, std::fabs(v));
  for (const float v : c.W) amax_w = std::max(amax_w, std::fabs(v));
  float saved_x, saved_w;
  std::memcpy(&saved_x, &saved[0], sizeof(float));
  std::memcpy(&saved_w, &saved[1], sizeof(float));
  BOOST_TEST(saved_x == amax_x);
  BOOST_TEST(saved_w == amax_w);
  // The backward: wgrad dW += dy^T x, dgrad dx = dy W, recomputing the amaxes (-1) or reading the slot.
  const auto [want_dw, want_dx] = c.backward(w, -1);
  const auto [dw, dx] = c.backward(w, slot);
  BOOST_TEST(dw == want_dw, boost::test_tools::per_element());
  BOOST_TEST(dx == want_dx, boost::test_tools::per_element());
  // dgrad's B (W) scale comes from the slot: a larger saved amax gives its scale, not W's own.
  const float poison = 4 * amax_w;
  check_cuda(cudaMemcpy(w.saved_amax + 2 * slot + 1, &poison, sizeof(float), cudaMemcpyHostToDevice), "poison");
  c.backward(w, slot);
  const float b_scale = from_device_raw<float>(w.b_scale, 1)[0];
  BOOST_TEST(std::fabs(b_scale - poison / cuda::kFp8E4M3Max) <= 1e-6f * b_scale, b_scale << " for amax " << poison);
  BOOST_CHECK_THROW(c.backward(w, slots), Error);
}

// An input's amax reduced by the kernel that wrote it (swiglu.hpp, rmsnorm.hpp) into the word MatMul names for
// it: a linear layer's forward (x, the slot's word) and backward (dy) read it instead of reducing their own,
// with the bits of reducing it when it holds max |x| (max |dy|), and they do read it (3 max |x| there gives
// other bits: a power of two would only move E4M3's exponents). A call that would not run in FP8 has no word.
BOOST_AUTO_TEST_CASE(fp8_input_amax_reduced_by_its_producer_gives_the_same_bits) {
  Fp8LinearCase c(96, 64, 48, std::mt19937(31));
  const int slots = 2, slot = 1;
  const DeviceFp8Scratch scratch = c.scratch(slots);
  const cuda::Fp8Scratch& w = scratch.w;
  const cuda::MatMul plain{c.gemm, nullptr}, mm = cuda::MatMul{c.gemm, nullptr, 1, &w}.projection(slot);
  const DType bf = DType::BF16;
  unsigned* x_word = mm.fp8_forward_x_amax(c.n, c.out, c.in, c.out, bf);
  unsigned* dy_word = mm.fp8_backward_dy_amax(c.n, c.out, c.in, c.out, c.in, true, c.in, bf);
  BOOST_TEST_REQUIRE(x_word == w.saved_amax + 2 * slot);
  BOOST_TEST_REQUIRE(dy_word == w.amax);
  BOOST_TEST(!plain.fp8_forward_x_amax(c.n, c.out, c.in, c.out, bf));
  BOOST_TEST(!mm.fp8_forward_x_amax(c.n, c.out, c.in - 8, c.out, bf));  // in not a multiple of 16: 16 bits
  BOOST_TEST(!mm.fp8_backward_dy_amax(c.n, c.out + 8, c.in, c.out + 8, c.in, true, c.in, bf));
  auto put_amax = [](unsigned* word, const std::vector<float>& v, float factor) {
    float m = 0;
    for (const float e : v) m = std::max(m, std::fabs(e));
    m *= factor;
    check_cuda(cudaMemcpy(word, &m, sizeof m, cudaMemcpyHostToDevice), "amax word");
  };
  // The forward: reducing x's amax (c.forward), then reading it from the word.
  const std::vector<float> want_y = c.forward(w, slot);
  auto forward_known = [&] {
    TestArray y(std::vector<float>(static_cast<size_t>(c.n) * c.out, 0.0f), bf);
    mm.input_amax_in(x_word)(false, true, c.n, c.out, c.in, c.dx_in.data(), c.in, c.dweight.data(), c.in, y.data(),
                             c.out, bf, bf);
    return y.download(static_cast<size_t>(c.n) * c.out);
  };
  put_amax(x_word, c.x, 1.0f);
  BOOST_TEST(forward_known() == want_y, boost::test_tools::per_element());
  put_amax(x_word, c.x, 3.0f);
  BOOST_TEST((forward_known() != want_y));
  put_amax(x_word, c.x, 1.0f);  // the slot's x amax again, for the backward's wgrad
  // The backward: dy's amax reduced (c.backward), then read from the word.
  const auto [want_dw, want_dx] = c.backward(w, slot);
  auto backward_known = [&] {
    TestArray dW(c.dw0, DType::F32), dx(std::vector<float>(static_cast<size_t>(c.n) * c.in, 0.0f), bf);
    mm.input_amax_in(dy_word).linear_backward(c.n, c.out, c.in, c.ddy.data(), c.out, c.dx_in.data(), c.in,
                                              c.dweight.data(), dW.data(), dx.data(), c.in, bf);
    return std::make_pair(dW.download(static_cast<size_t>(c.out) * c.in), dx.download(static_cast<size_t>(c.n) * c.in));
  };
  put_amax(dy_word, c.dy, 1.0f);
  const auto [dw, dx] = backward_known();
  BOOST_TEST(dw == want_dw, boost::test_tools::per_element());
  BOOST_TEST(dx == want_dx, boost::test_tools::per_element());
  put_amax(dy_word, c.dy, 3.0f);
  BOOST_TEST((backward_known().second != want_dx));
}

// model.fp8_keep_weights: a slot that keeps its weight. The forward writes W^T in E4M3 beside the copy it
// multiplies by (the bytes and scale of quantizing W transposed on its own) and gives the bits it gives
// without keeping; the backward then multiplies by that kept copy (poisoning it changes dx, not dW) and
// gives the bits of the backward that quantizes W again. A slot whose kept room is smaller than W is
// quantized again, as without one.
BOOST_AUTO_TEST_CASE(fp8_kept_transposed_weight_gives_the_bits_of_quantizing_it_again) {
  Fp8LinearCase c(64, 48, 80, std::mt19937(29));
  const int slot = 1;
  const size_t a_el = static_cast<size_t>(c.n) * std::max(c.out, c.in), b_el = static_cast<size_t>(c.n) * c.in;
  const size_t w_el = static_cast<size_t>(c.out) * c.in;
  cuda::Fp8Buffer plain, keeping, too_small;
  plain.allocate({a_el, b_el, 3, {}});
  keeping.allocate({a_el, b_el, 3, {16, w_el, 16}});
  too_small.allocate({a_el, b_el, 3, {w_el, w_el - 16, w_el}});
  BOOST_TEST_REQUIRE(keeping.bytes() == cuda::Fp8ScratchSize({a_el, b_el, 3, {16, w_el, 16}}).bytes());
  BOOST_TEST_REQUIRE(keeping.scratch()->kept != nullptr);
  BOOST_TEST_REQUIRE(plain.scratch()->kept == nullptr);
  const cuda::Fp8Scratch& k = *keeping.scratch();
  const std::vector<float> want_y = c.forward(*plain.scratch(), slot);
  BOOST_TEST(c.forward(k, slot) == want_y, boost::test_tools::per_element());
  // The kept copy is W transposed in E4M3 with W's own scale.
  DeviceBuffer alone(w_el), alone_scale(sizeof(float)), alone_amax(sizeof(unsigned));
  cuda::fp8_quantize(c.dweight.data(), c.out, c.in, c.in, DType::BF16, nullptr, reinterpret_cast<uint8_t*>(alone.get()),
                     reinterpret_cast<float*>(alone_scale.get()), reinterpret_cast<unsigned*>(alone_amax.get()), nullptr);
  BOOST_TEST(from_device_raw<uint8_t>(k.kept[slot].t, w_el) == from_device_raw<uint8_t>(alone.get(), w_el),
             boost::test_tools::per_element());
  BOOST_TEST(from_device_raw<float>(k.kept[slot].inv_scale, 1)[0] == from_device_raw<float>(alone_scale.get(), 1)[0]);
  const auto [want_dw, want_dx] = c.backward(*plain.scratch(), slot);
  const auto [dw, dx] = c.backward(k, slot);
  BOOST_TEST(dw == want_dw, boost::test_tools::per_element());
  BOOST_TEST(dx == want_dx, boost::test_tools::per_element());
  // dgrad reads the kept bytes: zeroed, dx is zero and dW unchanged.
  check_cuda(cudaMemset(k.kept[slot].t, 0, w_el), "zero the kept weight");
  const auto [dw_zeroed, dx_zeroed] = c.backward(k, slot);
  BOOST_TEST(dw_zeroed == want_dw, boost::test_tools::per_element());
  BOOST_TEST(dx_zeroed == std::vector<float>(b_el, 0.0f), boost::test_tools::per_element());
  // Room for fewer than out x in bytes: W is quantized again, the same bits.
  BOOST_TEST(c.forward(*too_small.scratch(), slot) == want_y, boost::test_tools::per_element());
  check_cuda(cudaMemset(too_small.scratch()->kept[slot].t, 0, w_el - 16), "zero the small room");
  BOOST_TEST(c.backward(*too_small.scratch(), slot).second == want_dx, boost::test_tools::per_element());
}

// A frozen kept weight (LoRA's base): the first forward fills both copies; later forwards multiply by them
// without reading W (W changed behind it leaves the output as it was), with the bits of quantizing W
// each time, and the backward too; after forget_kept the next forward reads W again.
BOOST_AUTO_TEST_CASE(fp8_frozen_kept_weight_is_quantized_once) {
  Fp8LinearCase c(32, 64, 48, std::mt19937(31));
  const int slot = 0;
  const size_t a_el = static_cast<size_t>(c.n) * c.out, b_el = static_cast<size_t>(c.out) * c.in;
  cuda::Fp8ScratchSize size{a_el, b_el, 1, {b_el}};
  const size_t unfrozen = size.bytes();
  size.frozen = true;
  BOOST_TEST(size.bytes() > unfrozen);
  cuda::Fp8Buffer plain, frozen;
  plain.allocate({a_el, b_el, 1, {}});
  frozen.allocate(size);
  BOOST_TEST_REQUIRE(frozen.scratch()->kept[slot].w != nullptr);
  const cuda::Fp8Scratch& k = *frozen.scratch();
  const std::vector<float> want_y = c.forward(*plain.scratch(), slot);
  const std::vector<float> want_dx = c.backward(*plain.scratch(), slot, true).second;
  BOOST_TEST(!k.kept[slot].filled);
  BOOST_TEST(c.forward(k, slot) == want_y, boost::test_tools::per_element());
  BOOST_TEST(k.kept[slot].filled);
  BOOST_TEST(c.backward(k, slot, true).second == want_dx, boost::test_tools::per_element());
  // W rewritten: the frozen copies still hold the first W.
  const std::vector<unsigned char> W2 = to_bytes(std::vector<float>(c.W.size(), 0.25f), DType::BF16);
  check_cuda(cudaMemcpy(c.dweight.data(), W2.data(), W2.size(), cudaMemcpyHostToDevice), "rewrite W");
  BOOST_TEST(c.forward(k, slot) == want_y, boost::test_tools::per_element());
  BOOST_TEST(c.backward(k, slot, true).second == want_dx, boost::test_tools::per_element());
  frozen.forget_kept();
  BOOST_TEST(c.forward(k, slot) == c.forward(*plain.scratch(), slot), boost::test_tools::per_element());
  BOOST_TEST(c.forward(k, slot) != want_y);
}

BOOST_AUTO_TEST_CASE(fp8_refuses_what_it_cannot_run) {
  const size_t a_el = 64 * 96, b_el = 48 * 96;
  const DeviceFp8Scratch scratch(a_el, b_el);
  const cuda::Fp8Scratch& w = scratch.w;
  GemmDesc d;
  d.trans_b = true, d.M = 64, d.N = 48, d.K = 96, d.lda = 96, d.ldb = 96, d.ldc = 48;
  d.ab_dtype = DType::BF16, d.c_dtype = DType::BF16;
  BOOST_TEST(cuda::fp8_gemm_fits(d, w));
  GemmDesc odd = d;
  odd.K = 90;  // not a multiple of 16: stays 16-bit
  BOOST_TEST(!cuda::fp8_gemm_fits(odd, w));
  GemmDesc big = d;
  big.M = 128;  // beyond the scratch
  BOOST_TEST(!cuda::fp8_gemm_fits(big, w));
  GemmDesc gelu = d;
  gelu.epilogue = Epilogue::BiasGelu;
  BOOST_TEST(!cuda::fp8_gemm_fits(gelu, w));
  GemmDesc f32 = d;
  f32.ab_dtype = DType::F32;
  BOOST_TEST(!cuda::fp8_gemm_fits(f32, w));
}

// Without FP8 a linear layer's backward is its two halves, weight_backward and input_backward, which a caller may run
// apart and in the other order (LlamaCuda's down_proj: dx first, then dW from an x written after it): the same bits
// for dW (accumulated, written with weight_beta 0, none when frozen) and dx, with dx in place over x too.
BOOST_AUTO_TEST_CASE(linear_backward_is_weight_backward_and_input_backward) {
  Fp8LinearCase c(40, 24, 56, std::mt19937(37));
  const DType bf = DType::BF16;
  const size_t wide = static_cast<size_t>(c.n) * c.in, weights = static_cast<size_t>(c.out) * c.in;
  for (const float beta : {1.0f, 0.0f})
    for (const bool frozen : {false, true})
      for (const bool in_place : {false, true}) {
        BOOST_TEST_CONTEXT("weight_beta " << beta << (frozen ? " frozen" : "") << (in_place ? " dx over x" : "")) {
          cuda::MatMul mm{c.gemm, nullptr};
          mm.weight_beta = beta;
          auto run = [&](bool whole) {
            TestArray dW(c.dw0, DType::F32), x(c.x, bf), dx(std::vector<float>(wide, 0.0f), bf);
            char* dx_at = in_place ? x.data() : dx.data();
            void* dw_at = frozen ? nullptr : dW.data();
            if (whole) {
              mm.linear_backward(c.n, c.out, c.in, c.ddy.data(), c.out, x.data(), c.in, c.dweight.data(), dw_at,
                                 dx_at, c.in, bf);
            } else if (in_place) {  // dx over x: x read first
              mm.weight_backward(c.n, c.out, c.in, c.ddy.data(), c.out, x.data(), c.in, dw_at, bf);
              mm.input_backward(c.n, c.out, c.in, c.ddy.data(), c.out, c.dweight.data(), dx_at, c.in, bf);
            } else {
              mm.input_backward(c.n, c.out, c.in, c.ddy.data(), c.out, c.dweight.data(), dx_at, c.in, bf);
              mm.weight_backward(c.n, c.out, c.in, c.ddy.data(), c.out, x.data(), c.in, dw_at, bf);
            }
            return std::make_pair(dW.download(weights), (in_place ? x : dx).download(wide));
          };
          const auto [want_dw, want_dx] = run(true);
          const auto [dw, dx] = run(false);
          BOOST_TEST(dw == want_dw, boost::test_tools::per_element());
          BOOST_TEST(dx == want_dx, boost::test_tools::per_element());
          if (frozen) BOOST_TEST(dw == c.dw0, boost::test_tools::per_element());  // no weight GEMM at all
        }
      }
}

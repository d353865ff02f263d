// Tests of the CUDA kernels of src/device/cuda (embedding, LayerNorm, element-wise ops,
// casts, LoRA dropout, the optimizer's reductions, AdamW) against plain host references in double, in fp32, bf16
// and fp16 wherever a launcher takes a dtype. Runs only on a machine with a GPU (label "gpu").
#define BOOST_TEST_MODULE test_cuda_kernels
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "adamw.hpp"
#include "cuda_test_support.hpp"
#include "elementwise.hpp"
#include "embedding.hpp"
#include "layernorm.hpp"
#include "lora_dropout.hpp"
#include "token_rows_check.hpp"
#include "shardlm/core.hpp"
#include "shardlm/device.hpp"
#include "shardlm/optim.hpp"

using namespace shardlm;

namespace {

using namespace cuda_test;

// ---- host helpers ---------------------------------------------------------------------------

const DType kAllDtypes[] = {DType::F32, DType::BF16, DType::F16};

// Uniform values in [lo, hi), rounded to dt so host and device see the same numbers.
std::vector<float> random_values(size_t n, DType dt, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = round_to(dt, dist(rng));
  return v;
}

std::vector<int32_t> random_tokens(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = dist(rng);
  return t;
}

struct Tolerance {
  double rtol;
  double atol;
};

// Activation outputs stored in dt: a few units in the last place of dt around O(1) values.
Tolerance tolerance_for(DType dt) {
  switch (dt) {
    case DType::F32: return {1e-5, 1e-5};
    case DType::BF16: return {1e-2, 1e-2};
    case DType::F16: return {2e-3, 2e-3};
  }
  return {0, 0};
}

// |got - want| <= atol + rtol |want| everywhere (equal values, infinities included, always pass);
// one check per call, naming the first offender and the worst ratio.
void check_close(const std::vector<float>& got, const std::vector<double>& want, Tolerance tol,
                 const std::string& what) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (static_cast<double>(got[i]) == want[i]) continue;
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double limit = tol.atol + tol.rtol * std::fabs(want[i]);
    if (!(err <= limit)) {
      if (bad == 0) first = i;
      ++bad;
    }
    if (limit > 0) worst = std::max(worst, err / limit);
  }
  BOOST_CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.size() << " values out of tolerance (rtol "
                                     << tol.rtol << ", atol " << tol.atol << "); first at " << first << ": got "
                                     << (got.empty() ? 0.f : got[first]) << ", want "
                                     << (want.empty() ? 0.0 : want[first]) << "; worst error/limit " << worst);
}

std::string label(const char* op, DType dt, const std::string& shape) {
  return concat(op, " ", dtype_name(dt), " ", shape);
}

// Every test case runs with this: a GPU must be there, and the kernels run on a non-default stream.
struct GpuFixture {
  cudaStream_t stream = nullptr;
  GpuFixture() {
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0)
      BOOST_FAIL("test_cuda_kernels needs a CUDA GPU, but cudaGetDeviceCount "
                 << (rc != cudaSuccess ? concat("failed: ", cudaGetErrorString(rc)) : std::string("found no device"))
                 << ". Run this suite on a GPU machine (label gpu, `make test-gpu`).");
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~GpuFixture() {
    if (stream) cudaStreamDestroy(stream);
  }
  void sync() {
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaGetLastError());
  }
};

// ---- host references (double; BLOOM's formulas as in src/model/bloom_cpu.cpp) -------------------

constexpr double kGeluScale = 0.79788456;
constexpr double kGeluCubic = 0.044715;

double gelu_ref(double u) { return 0.5 * u * (1.0 + std::tanh(kGeluScale * u * (1.0 + kGeluCubic * u * u))); }

double gelu_derivative_ref(double u) {
  const double t = std::tanh(kGeluScale * u * (1.0 + kGeluCubic * u * u));
  return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * kGeluScale * (1.0 + 3.0 * kGeluCubic * u * u);
}

// Mean and 1/sqrt(var + eps) of each row, two-pass in double (as layer_norm_row), stored as fp32.
void layernorm_stats_ref(const std::vector<float>& x, int n, int H, float eps, std::vector<float>& mean,
                         std::vector<float>& rstd) {
  mean.assign(n, 0.f);
  rstd.assign(n, 0.f);
  for (int r = 0; r < n; ++r) {
    const float* row = x.data() + static_cast<size_t>(r) * H;
    double sum = 0.0;
    for (int c = 0; c < H; ++c) sum += row[c];
    const double mu = sum / H;
    double squares = 0.0;
    for (int c = 0; c < H; ++c) squares += (row[c] - mu) * (row[c] - mu);
    mean[r] = static_cast<float>(mu);
    rstd[r] = static_cast<float>(1.0 / std::sqrt(squares / H + eps));
  }
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(cuda_kernels, GpuFixture)

BOOST_AUTO_TEST_CASE(device_is_present) {
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, device));
  BOOST_TEST_MESSAGE("running on " << prop.name << " (sm_" << prop.major << prop.minor << ", "
                                   << prop.multiProcessorCount << " SMs)");
  BOOST_TEST(prop.multiProcessorCount > 0);
}

// n = 0 launches nothing and touches no pointer, so null pointers are fine.
BOOST_AUTO_TEST_CASE(empty_sizes_launch_nothing) {
  for (DType dt : kAllDtypes) {
    cuda::embedding_forward(nullptr, nullptr, nullptr, 0, 16, 10, dt, stream);
    cuda::embedding_backward(nullptr, nullptr, nullptr, 0, 16, 10, dt, stream);
    cuda::layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 64, 1e-5f, dt, stream);
    cuda::layernorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 64, true, dt,
                             stream);
    cuda::gelu_forward(nullptr, nullptr, 0, dt, stream);
    cuda::gelu_backward(nullptr, nullptr, nullptr, 0, dt, stream);
    cuda::add(nullptr, nullptr, nullptr, 0, dt, stream);
    cuda::bias_grad(nullptr, nullptr, 0, 64, dt, stream);
    cuda::check_finite(nullptr, 0, dt, nullptr, stream);
    for (DType out : kAllDtypes) cuda::cast(nullptr, dt, nullptr, out, 0, stream);
    cuda::adamw_step(nullptr, nullptr, nullptr, nullptr, 0, cuda::AdamWArgs{}, nullptr, dt, stream);
  }
  for (DType dt : kAllDtypes) cuda::lora_dropout(nullptr, nullptr, 0, 0, 16, DropoutMask{}, true, dt, stream);
  cuda::scale(nullptr, 0, 2.0f, stream);
  for (DType dt : kAllDtypes) cuda::accumulate(nullptr, nullptr, dt, 0, stream);
  cuda::sum_squares(nullptr, 0, nullptr, stream);
  sync();
}

// The backend's allocate() returns memory that is zero for every stream: a copy queued on the compute stream
// right after it keeps its values. cudaMemset alone runs on the legacy default stream, which the backend's
// non-blocking streams do not wait for; queued behind other work there (here a 2 GiB memset; in a run, work of
// NCCL's), it wiped what such a copy had written first: LoRA's initial adapters on ranks sharing a GPU.
BOOST_AUTO_TEST_CASE(allocated_memory_is_zero_before_any_stream_writes_it) {
  std::unique_ptr<Backend> gpu = make_cuda_backend();
  DeviceBuffer busy(size_t{2} << 30);
  const size_t bytes = size_t{64} << 20, n = 4096;
  float* values = nullptr;
  CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&values), n * sizeof(float)));  // page-locked: the copy is queued, not staged
  for (size_t i = 0; i < n; ++i) values[i] = 1.0f + static_cast<float>(i);
  std::vector<float> back(n);
  for (int trial = 0; trial < 4; ++trial) {
    CUDA_OK(cudaMemsetAsync(busy.get(), trial, busy.bytes(), cudaStreamLegacy));
    DeviceArray a = gpu->allocate(bytes, MemKind::Other);
    gpu->copy(a.data(), values, n * sizeof(float), CopyKind::HostToDevice, gpu->compute_stream());
    CUDA_OK(cudaDeviceSynchronize());  // whatever is still queued anywhere has run
    gpu->copy(back.data(), a.data(), n * sizeof(float), CopyKind::DeviceToHost, gpu->compute_stream());
    float tail = -1.0f;
    gpu->copy(&tail, a.as<char>() + bytes - sizeof(float), sizeof(float), CopyKind::DeviceToHost, gpu->compute_stream());
    gpu->synchronize(gpu->compute_stream());
    BOOST_TEST_CONTEXT("trial " << trial) {
      BOOST_TEST(std::equal(back.begin(), back.end(), values));
      BOOST_TEST(tail == 0.0f);  // and zero where nothing was written
    }
  }
  cudaFreeHost(values);
}

// ---- embedding ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(embedding_forward_gathers_rows) {
  struct Shape {
    int n, H, V;
  };
  const Shape shapes[] = {{1, 8, 5}, {37, 1024, 50}, {13, 100, 7}, {5, 33, 4}, {10000, 8, 3}, {3, 1, 2}};
  uint32_t seed = 100;
  for (DType dt : kAllDtypes) {
    for (const Shape& s : shapes) {
      const std::string what = label("embedding_forward", dt, concat(s.n, "x", s.H, " V=", s.V));
      const std::vector<float> table = random_values(static_cast<size_t>(s.V) * s.H, dt, -2.f, 2.f, ++seed);
      std::vector<int32_t> tokens = random_tokens(s.n, s.V, ++seed);
      // Out-of-range ids read row 0 (documented clamp).
      if (s.n >= 3) {
        tokens[1] = -3;
        tokens[2] = s.V;
      }
      DeviceBuffer d_table = to_device(table, dt);
      DeviceBuffer d_tokens = to_device_raw(tokens);
      DeviceBuffer d_out(static_cast<size_t>(s.n) * s.H * dtype_size(dt));
      cuda::embedding_forward(d_tokens.as<int32_t>(), d_table.get(), d_out.get(), s.n, s.H, s.V, dt, stream);
      sync();
      std::vector<double> want(static_cast<size_t>(s.n) * s.H);
      for (int i = 0; i < s.n; ++i) {
        const int t = (tokens[i] >= 0 && tokens[i] < s.V) ? tokens[i] : 0;
        for (int c = 0; c < s.H; ++c) want[static_cast<size_t>(i) * s.H + c] = table[static_cast<size_t>(t) * s.H + c];
      }
      check_close(download(d_out.get(), want.size(), dt), want, {0, 0}, what);
    }
  }
}

BOOST_AUTO_TEST_CASE(embedding_backward_adds_repeated_tokens) {
  struct Shape {
    int n, H, V;
  };
  // Small vocabularies: every id repeats many times. H = 129 covers the unrolled loop and its tail.
  const Shape shapes[] = {{1, 8, 5}, {300, 100, 5}, {64, 1024, 3}, {50, 129, 4}, {10000, 8, 3}, {7, 33, 1000}};
  uint32_t seed = 200;
  for (DType dt : kAllDtypes) {
    for (const Shape& s : shapes) {
      const std::string what = label("embedding_backward", dt, concat(s.n, "x", s.H, " V=", s.V));
      const std::vector<float> dout = random_values(static_cast<size_t>(s.n) * s.H, dt, -1.f, 1.f, ++seed);
      const std::vector<int32_t> tokens = random_tokens(s.n, s.V, ++seed);
      const std::vector<float> dtable0 =
          random_values(static_cast<size_t>(s.V) * s.H, DType::F32, -1.f, 1.f, ++seed);  // += onto this
      DeviceBuffer d_dout = to_device(dout, dt);
      DeviceBuffer d_tokens = to_device_raw(tokens);
      DeviceBuffer d_dtable = to_device(dtable0, DType::F32);
      cuda::embedding_backward(d_tokens.as<int32_t>(), d_dout.get(), d_dtable.as<float>(), s.n, s.H, s.V, dt, stream);
      sync();
      std::vector<double> want(dtable0.begin(), dtable0.end());
      std::vector<int> count(s.V, 0);
      for (int i = 0; i < s.n; ++i) {
        ++count[tokens[i]];
        for (int c = 0; c < s.H; ++c)
          want[static_cast<size_t>(tokens[i]) * s.H + c] += dout[static_cast<size_t>(i) * s.H + c];
      }
      // fp32 atomics in any order: the rounding error grows with the number of terms per row.
      const int most = *std::max_element(count.begin(), count.end());
      check_close(download(d_dtable.get(), want.size(), DType::F32), want, {1e-5, 1e-5 + 2e-6 * most}, what);
    }
  }
}

// ---- LayerNorm ------------------------------------------------------------------------------

namespace {

struct LnShape {
  int n, H;
};
// Between them: the unrolled register paths (H a multiple of 8 up to 1024, forward up to 2048, rows
// that are not a whole number of warp-wide packs), the generic paths (odd H; long rows, vectorised or
// not, with the column-parallel dgamma/dbeta kernel over many row slices), one column, and more rows
// than the grid has warps.
const LnShape kLnShapes[] = {{1, 8},     {1, 1},    {37, 1024}, {5, 100},   {3, 1000}, {9, 2048},
                             {4, 6000},  {2, 7000}, {700, 1040}, {3000, 64}, {9000, 24}, {17, 768},
                             {6, 33},    {300, 257}};

// x with a common offset per row (the two-pass variance must cope), gamma near 1, small beta.
std::vector<float> ln_input(int n, int H, DType dt, uint32_t seed) {
  std::vector<float> x = random_values(static_cast<size_t>(n) * H, DType::F32, -2.f, 2.f, seed);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < H; ++c) {
      float& v = x[static_cast<size_t>(r) * H + c];
      v = round_to(dt, v + 0.5f + 0.25f * static_cast<float>(r % 7));
    }
  return x;
}

}  // namespace

BOOST_AUTO_TEST_CASE(layernorm_forward_matches_reference) {
  const float eps = 1e-5f;
  uint32_t seed = 300;
  for (DType dt : kAllDtypes) {
    for (const LnShape& s : kLnShapes) {
      const std::string shape = concat(s.n, "x", s.H);
      const size_t size = static_cast<size_t>(s.n) * s.H;
      const std::vector<float> x = ln_input(s.n, s.H, dt, ++seed);
      const std::vector<float> gamma = random_values(s.H, dt, 0.8f, 1.2f, ++seed);
      const std::vector<float> beta = random_values(s.H, dt, -0.1f, 0.1f, ++seed);
      DeviceBuffer d_x = to_device(x, dt), d_gamma = to_device(gamma, dt), d_beta = to_device(beta, dt);
      DeviceBuffer d_y(size * dtype_size(dt)), d_mean(s.n * sizeof(float)), d_rstd(s.n * sizeof(float));
      cuda::layernorm_forward(d_x.get(), d_gamma.get(), d_beta.get(), d_y.get(), d_mean.as<float>(),
                              d_rstd.as<float>(), s.n, s.H, eps, dt, stream);
      sync();

      std::vector<float> mean, rstd;
      layernorm_stats_ref(x, s.n, s.H, eps, mean, rstd);
      std::vector<double> want_y(size), want_mean(s.n), want_rstd(s.n);
      for (int r = 0; r < s.n; ++r) {
        const float* row = x.data() + static_cast<size_t>(r) * s.H;
        double sum = 0.0;
        for (int c = 0; c < s.H; ++c) sum += row[c];
        const double mu = sum / s.H;
        double squares = 0.0;
        for (int c = 0; c < s.H; ++c) squares += (row[c] - mu) * (row[c] - mu);
        const double rs = 1.0 / std::sqrt(squares / s.H + eps);
        want_mean[r] = mu;
        want_rstd[r] = rs;
        for (int c = 0; c < s.H; ++c)
          want_y[static_cast<size_t>(r) * s.H + c] = (row[c] - mu) * rs * gamma[c] + beta[c];
      }
      check_close(download(d_y.get(), size, dt), want_y, tolerance_for(dt), label("layernorm_forward y", dt, shape));
      // Statistics are fp32 outputs computed in fp32 from the same inputs, whatever dt is.
      check_close(download(d_mean.get(), s.n, DType::F32), want_mean, {1e-5, 1e-5},
                  label("layernorm_forward mean", dt, shape));
      check_close(download(d_rstd.get(), s.n, DType::F32), want_rstd, {2e-5, 0},
                  label("layernorm_forward rstd", dt, shape));
    }
  }
}

BOOST_AUTO_TEST_CASE(layernorm_backward_matches_reference) {
  const float eps = 1e-5f;
  uint32_t seed = 400;
  for (DType dt : kAllDtypes) {
    for (const LnShape& s : kLnShapes) {
      for (bool accumulate : {false, true}) {
        const std::string shape = concat(s.n, "x", s.H, accumulate ? " accumulate" : " write");
        const size_t size = static_cast<size_t>(s.n) * s.H;
        const std::vector<float> x = ln_input(s.n, s.H, dt, ++seed);
        const std::vector<float> dy = random_values(size, dt, -1.f, 1.f, ++seed);
        const std::vector<float> gamma = random_values(s.H, dt, 0.8f, 1.2f, ++seed);
        const std::vector<float> dx0 = random_values(size, dt, -1.f, 1.f, ++seed);
        const std::vector<float> dgamma0 = random_values(s.H, DType::F32, -1.f, 1.f, ++seed);
        const std::vector<float> dbeta0 = random_values(s.H, DType::F32, -1.f, 1.f, ++seed);
        std::vector<float> mean, rstd;
        layernorm_stats_ref(x, s.n, s.H, eps, mean, rstd);

        DeviceBuffer d_x = to_device(x, dt), d_dy = to_device(dy, dt), d_gamma = to_device(gamma, dt);
        DeviceBuffer d_mean = to_device(mean, DType::F32), d_rstd = to_device(rstd, DType::F32);
        DeviceBuffer d_dx = to_device(dx0, dt);
        DeviceBuffer d_dgamma = to_device(dgamma0, DType::F32), d_dbeta = to_device(dbeta0, DType::F32);
        cuda::layernorm_backward(d_dy.get(), d_x.get(), d_gamma.get(), d_mean.as<float>(), d_rstd.as<float>(),
                                 d_dx.get(), d_dgamma.as<float>(), d_dbeta.as<float>(), s.n, s.H, accumulate, dt,
                                 stream);
        sync();

        // As layer_norm_backward_row, in double from the same fp32 mean and rstd.
        std::vector<double> want_dx(size), want_dgamma(dgamma0.begin(), dgamma0.end()),
            want_dbeta(dbeta0.begin(), dbeta0.end());
        std::vector<double> xhat(s.H);
        for (int r = 0; r < s.n; ++r) {
          const size_t at = static_cast<size_t>(r) * s.H;
          double sum_g = 0.0, sum_g_xhat = 0.0;
          for (int c = 0; c < s.H; ++c) {
            xhat[c] = (static_cast<double>(x[at + c]) - mean[r]) * rstd[r];
            const double g = static_cast<double>(dy[at + c]) * gamma[c];
            sum_g += g;
            sum_g_xhat += g * xhat[c];
            want_dgamma[c] += static_cast<double>(dy[at + c]) * xhat[c];
            want_dbeta[c] += dy[at + c];
          }
          const double mean_g = sum_g / s.H, mean_g_xhat = sum_g_xhat / s.H;
          for (int c = 0; c < s.H; ++c) {
            const double d =
                static_cast<double>(rstd[r]) * (static_cast<double>(dy[at + c]) * gamma[c] - mean_g - xhat[c] * mean_g_xhat);
            want_dx[at + c] = accumulate ? dx0[at + c] + d : d;
          }
        }
        check_close(download(d_dx.get(), size, dt), want_dx, tolerance_for(dt), label("layernorm_backward dx", dt, shape));
        // fp32 sums over the rows: the error grows like sqrt(rows).
        const Tolerance sums{1e-5, 1e-5 * (1.0 + std::sqrt(static_cast<double>(s.n)))};
        check_close(download(d_dgamma.get(), s.H, DType::F32), want_dgamma, sums,
                    label("layernorm_backward dgamma", dt, shape));
        check_close(download(d_dbeta.get(), s.H, DType::F32), want_dbeta, sums,
                    label("layernorm_backward dbeta", dt, shape));
      }
    }
  }
}

// ---- element-wise ---------------------------------------------------------------------------

namespace {

// Sizes for element-wise launchers: single elements, a vector tail, and one beyond the grid's cap
// (so threads loop); `misaligned` runs the same size one element past a 16-byte boundary.
struct Span {
  size_t n;
  bool misaligned;
};
const Span kSpans[] = {{1, false}, {7, false}, {4099, false}, {4099, true}, {5000003, false}};

std::string span_name(const Span& s) { return concat("n=", s.n, s.misaligned ? " misaligned" : ""); }

}  // namespace

BOOST_AUTO_TEST_CASE(gelu_forward_and_backward_match_reference) {
  uint32_t seed = 500;
  for (DType dt : kAllDtypes) {
    for (const Span& s : kSpans) {
      const size_t off = s.misaligned ? dtype_size(dt) : 0;
      const std::vector<float> x = random_values(s.n, dt, -6.f, 6.f, ++seed);
      const std::vector<float> dy = random_values(s.n, dt, -2.f, 2.f, ++seed);
      DeviceBuffer d_x((s.n + 1) * dtype_size(dt)), d_dy((s.n + 1) * dtype_size(dt));
      DeviceBuffer d_y((s.n + 1) * dtype_size(dt)), d_dx((s.n + 1) * dtype_size(dt));
      upload(d_x.offset(off), x, dt);
      upload(d_dy.offset(off), dy, dt);
      cuda::gelu_forward(d_x.offset(off), d_y.offset(off), s.n, dt, stream);
      cuda::gelu_backward(d_dy.offset(off), d_x.offset(off), d_dx.offset(off), s.n, dt, stream);
      sync();
      std::vector<double> want_y(s.n), want_dx(s.n);
      for (size_t i = 0; i < s.n; ++i) {
        want_y[i] = gelu_ref(x[i]);
        want_dx[i] = dy[i] * gelu_derivative_ref(x[i]);
      }
      // fp32: 1 - t^2 and 1 + t cancel for large |x|, which costs a few 1e-7 absolute.
      const Tolerance fwd = dt == DType::F32 ? Tolerance{1e-5, 1e-6} : tolerance_for(dt);
      const Tolerance bwd = dt == DType::F32 ? Tolerance{1e-5, 1e-5} : tolerance_for(dt);
      check_close(download(d_y.offset(off), s.n, dt), want_y, fwd, label("gelu_forward", dt, span_name(s)));
      check_close(download(d_dx.offset(off), s.n, dt), want_dx, bwd, label("gelu_backward", dt, span_name(s)));
    }
  }
}

BOOST_AUTO_TEST_CASE(add_is_exact_and_may_alias) {
  uint32_t seed = 600;
  for (DType dt : kAllDtypes) {
    for (const Span& s : kSpans) {
      const size_t off = s.misaligned ? dtype_size(dt) : 0;
      const std::vector<float> a = random_values(s.n, dt, -4.f, 4.f, ++seed);
      const std::vector<float> b = random_values(s.n, dt, -4.f, 4.f, ++seed);
      // fp32 sum, then one rounding to dt: exactly what the kernel does.
      std::vector<double> want(s.n);
      for (size_t i = 0; i < s.n; ++i) want[i] = round_to(dt, a[i] + b[i]);
      DeviceBuffer d_a((s.n + 1) * dtype_size(dt)), d_b((s.n + 1) * dtype_size(dt)), d_out((s.n + 1) * dtype_size(dt));
      upload(d_a.offset(off), a, dt);
      upload(d_b.offset(off), b, dt);
      cuda::add(d_a.offset(off), d_b.offset(off), d_out.offset(off), s.n, dt, stream);
      sync();
      check_close(download(d_out.offset(off), s.n, dt), want, {0, 0}, label("add", dt, span_name(s)));
      // In place: out aliases a, then b.
      cuda::add(d_a.offset(off), d_b.offset(off), d_a.offset(off), s.n, dt, stream);
      sync();
      check_close(download(d_a.offset(off), s.n, dt), want, {0, 0}, label("add out=a", dt, span_name(s)));
      upload(d_a.offset(off), a, dt);
      cuda::add(d_a.offset(off), d_b.offset(off), d_b.offset(off), s.n, dt, stream);
      sync();
      check_close(download(d_b.offset(off), s.n, dt), want, {0, 0}, label("add out=b", dt, span_name(s)));
    }
  }
}

BOOST_AUTO_TEST_CASE(bias_grad_sums_columns) {
  struct Shape {
    int rows, cols;
    bool misaligned;
  };
  const Shape shapes[] = {{1, 1, false},     {1, 8, false},      {37, 192, false}, {513, 1000, false}, {64, 4096, false},
                          {5000, 40, false}, {33, 77, false},    {20, 64, true},   {2, 3000, false}};
  uint32_t seed = 700;
  for (DType dt : kAllDtypes) {
    for (const Shape& s : shapes) {
      const std::string what = label("bias_grad", dt, concat(s.rows, "x", s.cols, s.misaligned ? " misaligned" : ""));
      const size_t size = static_cast<size_t>(s.rows) * s.cols;
      const size_t off = s.misaligned ? dtype_size(dt) : 0;
      const std::vector<float> dy = random_values(size, dt, -1.f, 1.f, ++seed);
      const std::vector<float> dbias0 = random_values(s.cols, DType::F32, -1.f, 1.f, ++seed);
      DeviceBuffer d_dy((size + 1) * dtype_size(dt));
      upload(d_dy.offset(off), dy, dt);
      DeviceBuffer d_dbias = to_device(dbias0, DType::F32);
      cuda::bias_grad(d_dy.offset(off), d_dbias.as<float>(), s.rows, s.cols, dt, stream);
      sync();
      std::vector<double> want(dbias0.begin(), dbias0.end());
      for (int r = 0; r < s.rows; ++r)
        for (int c = 0; c < s.cols; ++c) want[c] += dy[static_cast<size_t>(r) * s.cols + c];
      check_close(download(d_dbias.get(), s.cols, DType::F32), want,
                  {1e-5, 1e-5 * (1.0 + std::sqrt(static_cast<double>(s.rows)))}, what);
    }
  }
}

BOOST_AUTO_TEST_CASE(cast_rounds_to_nearest_even_between_all_dtypes) {
  // Specials and edges: fp16 overflow (65520 rounds to inf, 65504 is its largest finite value),
  // fp16 subnormals and a tie to zero (2^-25), bf16's top of range, infinities.
  const std::vector<float> specials = {0.0f,         -0.0f,        1.0f,         -2.5f,
                                       65504.0f,     65519.0f,     65520.0f,     -70000.0f,
                                       1e-8f,        std::ldexp(1.0f, -25), 3 * std::ldexp(1.0f, -26), 3e38f,
                                       -3.3e38f,     std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(), 1.0f + std::ldexp(1.0f, -11),
                                       1.0f + 3 * std::ldexp(1.0f, -8), 123.456f};
  uint32_t seed = 800;
  for (DType in_dt : kAllDtypes) {
    for (DType out_dt : kAllDtypes) {
      for (const Span& s : {Span{1, false}, Span{18, false}, Span{1001, false}, Span{1001, true}, Span{4096, false}}) {
        const std::string what = concat("cast ", dtype_name(in_dt), "->", dtype_name(out_dt), " ", span_name(s));
        std::vector<float> in = random_values(s.n, DType::F32, -100.f, 100.f, ++seed);
        for (size_t i = 0; i < std::min(s.n, specials.size()); ++i) in[i] = specials[i];
        for (float& v : in) v = round_to(in_dt, v);
        std::vector<double> want(s.n);
        for (size_t i = 0; i < s.n; ++i) want[i] = round_to(out_dt, in[i]);
        const size_t in_off = s.misaligned ? dtype_size(in_dt) : 0, out_off = s.misaligned ? dtype_size(out_dt) : 0;
        DeviceBuffer d_in((s.n + 1) * dtype_size(in_dt)), d_out((s.n + 1) * dtype_size(out_dt));
        upload(d_in.offset(in_off), in, in_dt);
        cuda::cast(d_in.offset(in_off), in_dt, d_out.offset(out_off), out_dt, s.n, stream);
        sync();
        check_close(download(d_out.offset(out_off), s.n, out_dt), want, {0, 0}, what);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(scale_and_accumulate_are_exact) {
  uint32_t seed = 900;
  for (const Span& s : kSpans) {
    const size_t off = s.misaligned ? sizeof(float) : 0;
    const std::vector<float> x = random_values(s.n, DType::F32, -3.f, 3.f, ++seed);
    const std::vector<float> y = random_values(s.n, DType::F32, -3.f, 3.f, ++seed);
    DeviceBuffer d_x((s.n + 1) * sizeof(float)), d_y((s.n + 1) * sizeof(float));
    float* px = static_cast<float*>(d_x.offset(off));
    float* py = static_cast<float*>(d_y.offset(off));
    upload(px, x, DType::F32);
    upload(py, y, DType::F32);
    const float factor = 0.37f;
    cuda::scale(px, s.n, factor, stream);
    sync();
    std::vector<double> want(s.n);
    for (size_t i = 0; i < s.n; ++i) want[i] = x[i] * factor;  // one fp32 multiply
    check_close(download(px, s.n, DType::F32), want, {0, 0}, concat("scale ", span_name(s)));
    upload(px, x, DType::F32);
    cuda::accumulate(px, py, DType::F32, s.n, stream);
    sync();
    for (size_t i = 0; i < s.n; ++i) want[i] = x[i] + y[i];  // one fp32 add
    check_close(download(px, s.n, DType::F32), want, {0, 0}, concat("accumulate ", span_name(s)));
    // A 16-bit y (a reduced gradient slice): widened exactly, then one fp32 add.
    for (DType dt : {DType::BF16, DType::F16}) {
      const std::vector<float> y16 = random_values(s.n, dt, -3.f, 3.f, ++seed);  // values dt holds exactly
      DeviceBuffer d_y16((s.n + 1) * dtype_size(dt));
      void* py16 = d_y16.offset(s.misaligned ? dtype_size(dt) : 0);
      upload(py16, y16, dt);
      upload(px, x, DType::F32);
      cuda::accumulate(px, py16, dt, s.n, stream);
      sync();
      for (size_t i = 0; i < s.n; ++i) want[i] = x[i] + y16[i];
      check_close(download(px, s.n, DType::F32), want, {0, 0}, concat("accumulate ", dtype_name(dt), " ", span_name(s)));
    }
  }
}

// scale_values (Gemma's embedding scale) in every dtype: one fp32 product of the stored value and the factor,
// then one rounding to dt, so equal bit for bit to round_to(dt, x * factor); aligned and misaligned spans.
BOOST_AUTO_TEST_CASE(scale_values_is_one_product_then_one_rounding) {
  uint32_t seed = 950;
  for (DType dt : kAllDtypes)
    for (const Span& s : kSpans) {
      const size_t off = s.misaligned ? dtype_size(dt) : 0;
      const std::vector<float> x = random_values(s.n, dt, -3.f, 3.f, ++seed);  // values dt holds exactly
      DeviceBuffer d_x((s.n + 1) * dtype_size(dt));
      upload(d_x.offset(off), x, dt);
      const float factor = round_to(dt, 33.941125f);  // sqrt(1152) as the compute dtype holds it
      cuda::scale_values(d_x.offset(off), s.n, factor, dt, stream);
      sync();
      std::vector<double> want(s.n);
      for (size_t i = 0; i < s.n; ++i) want[i] = round_to(dt, x[i] * factor);
      check_close(download(d_x.offset(off), s.n, dt), want, {0, 0}, concat("scale_values ", dtype_name(dt), " ",
                                                                             span_name(s)));
    }
}

// ---- LoRA dropout ----------------------------------------------------------------------------------

// lora_dropout against the host's masks (DropoutMask::factor, as the CPU models apply them): an fp32
// product (and sum) then one rounding to dt, so equal bit for bit, on packed and unpacked rows.
BOOST_AUTO_TEST_CASE(lora_dropout_matches_the_host_masks) {
  struct Shape {
    int seqs, seq, cols;
    bool misaligned;
  };
  const Shape shapes[] = {{2, 5, 64, false}, {3, 7, 40, false}, {1, 9, 37, false}, {2, 3, 64, true}, {4, 33, 1000, false}};
  uint32_t seed = 950;
  for (DType dt : kAllDtypes) {
    for (const Shape& s : shapes) {
      for (const double p : {0.1, 0.5}) {
        const std::string what =
            label("lora_dropout", dt, concat(s.seqs, "x", s.seq, "x", s.cols, s.misaligned ? " misaligned" : "", " p=", p));
        const int rows = s.seqs * s.seq;
        const size_t n = static_cast<size_t>(rows) * s.cols, off = s.misaligned ? dtype_size(dt) : 0;
        const DropoutMask mask = dropout_mask(1234 + seed, p, 1, 3);
        const std::vector<float> x = random_values(n, dt, -2.f, 2.f, ++seed);
        const std::vector<float> dx = random_values(n, dt, -2.f, 2.f, ++seed);
        std::vector<double> dropped(n), accumulated(n);
        size_t kept = 0;
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < s.cols; ++c) {
            const size_t i = static_cast<size_t>(r) * s.cols + c;
            const float v = x[i] * mask.factor(r / s.seq, r % s.seq, c);
            kept += v != 0.0f;
            dropped[i] = round_to(dt, v);
            accumulated[i] = round_to(dt, dx[i] + v);
          }
        BOOST_TEST(kept > 0u, what);
        BOOST_TEST(kept < n, what);
        DeviceBuffer d_x((n + 1) * dtype_size(dt)), d_out((n + 1) * dtype_size(dt));
        upload(d_x.offset(off), x, dt);
        cuda::lora_dropout(d_x.offset(off), d_out.offset(off), rows, s.seq, s.cols, mask, false, dt, stream);
        sync();
        check_close(download(d_out.offset(off), n, dt), dropped, {0, 0}, what + " dropout(x)");
        upload(d_out.offset(off), dx, dt);
        cuda::lora_dropout(d_x.offset(off), d_out.offset(off), rows, s.seq, s.cols, mask, true, dt, stream);
        sync();
        check_close(download(d_out.offset(off), n, dt), accumulated, {0, 0}, what + " dx += masked");
      }
    }
  }
}

// ---- reductions for the optimizer step ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(sum_squares_adds_to_double) {
  uint32_t seed = 1000;
  for (const Span& s : kSpans) {
    const size_t off = s.misaligned ? sizeof(float) : 0;
    const std::vector<float> x = random_values(s.n, DType::F32, -2.f, 2.f, ++seed);
    DeviceBuffer d_x((s.n + 1) * sizeof(float));
    const float* px = static_cast<const float*>(d_x.offset(off));
    upload(d_x.offset(off), x, DType::F32);
    const double start = 1.25;  // the launcher adds to what is there
    DeviceBuffer d_out = to_device_raw(std::vector<double>{start});
    cuda::sum_squares(px, s.n, d_out.as<double>(), stream);
    sync();
    double want = start;
    for (float v : x) want += static_cast<double>(v) * v;
    const double got = from_device_raw<double>(d_out.get(), 1)[0];
    BOOST_CHECK_MESSAGE(std::fabs(got - want) <= 1e-6 * want, "sum_squares " << span_name(s) << ": got " << got
                                                                               << ", want " << want);
  }
}

BOOST_AUTO_TEST_CASE(check_finite_flags_inf_and_nan) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  uint32_t seed = 1100;
  for (DType dt : kAllDtypes) {
    // The largest finite value of each dtype must not be flagged.
    const float largest = dt == DType::F16 ? 65504.0f : (dt == DType::BF16 ? bf16_to_float(0x7f7f) : 3.4028235e38f);
    for (const Span& s : kSpans) {
      const size_t off = s.misaligned ? dtype_size(dt) : 0;
      std::vector<float> x = random_values(s.n, dt, -10.f, 10.f, ++seed);
      x[s.n / 2] = largest;
      x[0] = -largest;
      DeviceBuffer d_x((s.n + 1) * dtype_size(dt));
      DeviceBuffer d_flag(sizeof(int));
      auto run = [&](const std::vector<float>& values, int flag_before) {
        upload(d_x.offset(off), values, dt);
        CUDA_OK(cudaMemcpy(d_flag.get(), &flag_before, sizeof(int), cudaMemcpyHostToDevice));
        cuda::check_finite(d_x.offset(off), values.size(), dt, d_flag.as<int>(), stream);
        sync();
        return from_device_raw<int>(d_flag.get(), 1)[0];
      };
      const std::string what = label("check_finite", dt, span_name(s));
      BOOST_CHECK_MESSAGE(run(x, 0) == 0, what << ": finite data flagged");
      BOOST_CHECK_MESSAGE(run(x, 1) == 1, what << ": the flag was cleared");
      std::vector<float> planted = x;
      planted[s.n - 1] = nan;  // last element: the scalar tail
      BOOST_CHECK_MESSAGE(run(planted, 0) == 1, what << ": NaN at the end not flagged");
      planted = x;
      planted[0] = inf;
      BOOST_CHECK_MESSAGE(run(planted, 0) == 1, what << ": inf at the start not flagged");
      planted = x;
      planted[(s.n * 2) / 3] = -inf;
      BOOST_CHECK_MESSAGE(run(planted, 0) == 1, what << ": -inf in the middle not flagged");
    }
  }
}

// ---- AdamW ----------------------------------------------------------------------------------

// torch.optim.AdamW's single-tensor update, in double: three steps with weight decay must match.
BOOST_AUTO_TEST_CASE(adamw_matches_torch_for_three_steps) {
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.5f;
  const DType none = DType::F32;  // out_dt when param_out is null (ignored)
  struct Case {
    size_t n;
    bool misaligned;
    bool with_out;
    DType out_dt;
  };
  const Case cases[] = {{1, false, false, none},        {1003, false, false, none},    {1003, true, false, none},
                        {1003, false, true, DType::F32}, {1003, false, true, DType::BF16}, {1003, true, true, DType::BF16},
                        {1003, false, true, DType::F16}, {4099, true, true, DType::F16},  {5000003, false, true, DType::BF16}};
  uint32_t seed = 1200;
  for (const Case& c : cases) {
    const std::string what = concat("adamw n=", c.n, c.misaligned ? " misaligned" : "",
                                    c.with_out ? concat(" out=", dtype_name(c.out_dt)) : std::string(" no out"));
    const size_t off = c.misaligned ? sizeof(float) : 0;
    const size_t out_off = c.misaligned ? dtype_size(c.out_dt) : 0;
    const std::vector<float> p0 = random_values(c.n, DType::F32, -1.f, 1.f, ++seed);
    DeviceBuffer d_p((c.n + 1) * sizeof(float)), d_g((c.n + 1) * sizeof(float));
    DeviceBuffer d_m((c.n + 1) * sizeof(float)), d_v((c.n + 1) * sizeof(float));
    DeviceBuffer d_out((c.n + 1) * dtype_size(c.out_dt));
    float* p = static_cast<float*>(d_p.offset(off));
    float* g = static_cast<float*>(d_g.offset(off));
    float* m = static_cast<float*>(d_m.offset(off));
    float* v = static_cast<float*>(d_v.offset(off));
    upload(p, p0, DType::F32);
    CUDA_OK(cudaMemset(d_m.get(), 0, d_m.bytes()));
    CUDA_OK(cudaMemset(d_v.get(), 0, d_v.bytes()));

    std::vector<double> ref_p(p0.begin(), p0.end()), ref_m(c.n, 0.0), ref_v(c.n, 0.0);
    for (int step = 1; step <= 3; ++step) {
      const std::vector<float> grad = random_values(c.n, DType::F32, -1.f, 1.f, ++seed);
      upload(g, grad, DType::F32);
      cuda::AdamWArgs args;
      args.lr = lr;
      args.beta1 = beta1;
      args.beta2 = beta2;
      args.eps = eps;
      args.weight_decay = weight_decay;
      args.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
      args.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
      args.grad_scale = grad_scale;
      cuda::adamw_step(p, g, m, v, c.n, args, c.with_out ? d_out.offset(out_off) : nullptr, c.out_dt, stream);
      sync();
      // torch: p.mul_(1 - lr wd); m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, 1 - b2);
      // p.addcdiv_(m, v.sqrt() / sqrt(bc2) + eps, value=-lr / bc1).
      for (size_t i = 0; i < c.n; ++i) {
        const double gi = static_cast<double>(grad[i]) * grad_scale;
        ref_p[i] *= 1.0 - static_cast<double>(lr) * weight_decay;
        ref_m[i] += (1.0 - beta1) * (gi - ref_m[i]);
        ref_v[i] = ref_v[i] * beta2 + (1.0 - beta2) * gi * gi;
        const double denom = std::sqrt(ref_v[i]) / std::sqrt(static_cast<double>(args.bias_correction2)) + eps;
        ref_p[i] -= static_cast<double>(lr) / args.bias_correction1 * (ref_m[i] / denom);
      }
    }
    const std::vector<float> got_p = download(p, c.n, DType::F32);
    check_close(got_p, ref_p, {1e-5, 1e-6}, what + " param");
    check_close(download(m, c.n, DType::F32), ref_m, {1e-5, 1e-8}, what + " exp_avg");
    check_close(download(v, c.n, DType::F32), ref_v, {1e-5, 1e-10}, what + " exp_avg_sq");
    if (c.with_out) {
      // The compute-dtype copy is the updated fp32 parameter rounded once.
      std::vector<double> want_out(c.n);
      for (size_t i = 0; i < c.n; ++i) want_out[i] = round_to(c.out_dt, got_p[i]);
      check_close(download(d_out.offset(out_off), c.n, c.out_dt), want_out, {0, 0}, what + " param_out");
    }
  }
}

// The host AdamW that offloaded runs use (src/device/cpu/host_adamw.cpp) against the CUDA backend's
// on the same data: five steps over ranges with and without decay, a clipping factor, the bf16 copy.
// Within 1e-6 relative (the vector's rms the floor where a value crosses zero): the two differ only
// where nvcc fuses a multiply and an add; a bf16 copy differs at most by one unit, and rarely.
// The token-row primitives of the root's split reduction, as the CPU backend's (test_token_rows).
BOOST_AUTO_TEST_CASE(token_rows_match_the_reference_in_every_dtype) {
  std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (DType dt : kAllDtypes) {
    BOOST_TEST_CONTEXT(dtype_name(dt)) { token_rows_test::check_token_rows(*gpu, dt); }
  }
}

BOOST_AUTO_TEST_CASE(host_adamw_matches_the_cuda_backend) {
  std::unique_ptr<Backend> gpu = make_cuda_backend();
  const size_t n = 300007;
  std::vector<float> hp = random_values(n, DType::F32, -1.f, 1.f, 1700), hm(n, 0.f), hv(n, 0.f), hg(n);
  std::vector<uint16_t> hout(n, 0);
  DeviceBuffer dp(n * 4), dg(n * 4), dm(n * 4), dv(n * 4), dout(n * 2);
  upload(dp.get(), hp, DType::F32);
  CUDA_OK(cudaMemset(dm.get(), 0, dm.bytes()));
  CUDA_OK(cudaMemset(dv.get(), 0, dv.bytes()));
  // [0, 1000) decays, [1000, 1017) does not (a bias), [1017, n) decays.
  auto ranges = [&](float* p, float* g, float* m, float* v, uint16_t* out) {
    const size_t cut[] = {0, 1000, 1017, n};
    std::vector<AdamWRange> r;
    for (int k = 0; k < 3; ++k)
      r.push_back({p + cut[k], g + cut[k], m + cut[k], v + cut[k], cut[k + 1] - cut[k], k == 1 ? 0.0 : 0.1,
                   out + cut[k]});
    return r;
  };
  const std::vector<AdamWRange> on_gpu = ranges(reinterpret_cast<float*>(dp.get()), reinterpret_cast<float*>(dg.get()),
                                                reinterpret_cast<float*>(dm.get()), reinterpret_cast<float*>(dv.get()),
                                                reinterpret_cast<uint16_t*>(dout.get()));
  const std::vector<AdamWRange> on_host = ranges(hp.data(), hg.data(), hm.data(), hv.data(), hout.data());
  for (int step = 1; step <= 5; ++step) {
    // Into hg's own storage: on_host points at it.
    const std::vector<float> g = random_values(n, DType::F32, -1.f, 1.f, 1800 + step);
    std::copy(g.begin(), g.end(), hg.begin());
    upload(dg.get(), hg, DType::F32);
    AdamWHyper h;
    h.lr = 1e-3 * step, h.beta2 = 0.95, h.step = step;
    h.grad_scale = step == 2 ? 0.3f : 1.0f;
    h.out_dtype = DType::BF16;
    gpu->adamw(on_gpu, h, gpu->compute_stream());
    gpu->synchronize(gpu->compute_stream());
    host_adamw(on_host, h, 4, host_simd_best());
  }
  auto relative = [&](const void* device, const std::vector<float>& host, const char* what) {
    const std::vector<float> got = download(device, n, DType::F32);
    double ss = 0;
    for (float x : host) ss += static_cast<double>(x) * x;
    const double rms = std::sqrt(ss / n);
    check_close(got, std::vector<double>(host.begin(), host.end()), {1e-6, 1e-6 * rms}, what);
  };
  relative(dp.get(), hp, "host AdamW param");
  relative(dm.get(), hm, "host AdamW exp_avg");
  relative(dv.get(), hv, "host AdamW exp_avg_sq");
  std::vector<uint16_t> got_out(n);
  CUDA_OK(cudaMemcpy(got_out.data(), dout.get(), n * 2, cudaMemcpyDeviceToHost));
  size_t differ = 0, far = 0;
  for (size_t i = 0; i < n; ++i) {
    differ += got_out[i] != hout[i];
    far += std::abs(static_cast<int>(got_out[i]) - static_cast<int>(hout[i])) > 1;
  }
  BOOST_TEST(far == 0u);
  BOOST_TEST(differ <= n / 1000, differ << " of " << n << " bf16 copies differ by one unit");
}

// train.optim = adamw_8bit on the GPU (adamw_8bit.cu) against the CPU backend's (host_adamw_8bit.cpp,
// itself checked against a reference in test_optim_8bit): the same bits in the parameters, the bf16 copy
// and the dequantised moments, over six steps whose gradients are 3000x apart in turn, with no-decay
// ranges, clipping and a partial last block.
BOOST_AUTO_TEST_CASE(adamw_8bit_gives_the_host_bits) {
  std::unique_ptr<Backend> gpu = make_cuda_backend();
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  const size_t n = 70001;
  std::vector<float> hp = random_values(n, DType::F32, -1.f, 1.f, 2100), hg(n, 0.f);
  std::vector<uint16_t> hout(n, 0), got_out(n, 1);
  DeviceBuffer dp(n * 4), dg(n * 4), dout(n * 2);
  upload(dp.get(), hp, DType::F32);
  const std::vector<std::pair<size_t, size_t>> no_decay = {{10, 300}, {40000, 40017}};
  const AdamWOptions opt{0.9, 0.95, 1e-8, 0.1};
  AdamW8bit host(*cpu, {{hp.data(), hg.data(), n, no_decay, hout.data()}}, opt, DType::BF16);
  AdamW8bit device(*gpu, {{reinterpret_cast<float*>(dp.get()), reinterpret_cast<const float*>(dg.get()), n, no_decay,
                           dout.get()}},
                   opt, DType::BF16);
  for (int step = 1; step <= 6; ++step) {
    const float scale = step % 2 ? 1e-3f : 3.0f;
    const std::vector<float> g = random_values(n, DType::F32, -scale, scale, 2200 + step);
    std::copy(g.begin(), g.end(), hg.begin());  // in place: the host optimizer holds hg's address
    upload(dg.get(), hg, DType::F32);
    const float clip = step == 3 ? 0.4f : 1.0f;
    host.step(1e-2 * step, clip);
    device.step(1e-2 * step, clip, gpu->compute_stream());
    gpu->synchronize(gpu->compute_stream());
    BOOST_TEST_CONTEXT("step " << step) {
      const std::vector<float> got = download(dp.get(), n, DType::F32);
      BOOST_TEST(std::memcmp(got.data(), hp.data(), n * sizeof(float)) == 0);
      CUDA_OK(cudaMemcpy(got_out.data(), dout.get(), n * 2, cudaMemcpyDeviceToHost));
      BOOST_TEST(got_out == hout);
      for (size_t k = 0; k < 2; ++k) {
        std::vector<float> a(n), b(n);
        host.read_state(0, k, a.data());
        device.read_state(0, k, b.data());
        BOOST_TEST(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0, "moment " << k);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

#define BOOST_TEST_MODULE test_cuda_attention
#include <boost/test/unit_test.hpp>
// Tests of the CUDA attention and LM-head kernels (label gpu): BLOOM's causal ALiBi attention forward and
// backward against a double-precision host reference that mirrors bloom_cpu.cpp (and, on a tiny case,
// against finite differences of that reference), the chunked LM head + cross-entropy's loss, count and
// gradients against a host reference for several chunk sizes, ignored targets, F32 and 16-bit dtypes, and
// both cross-entropy row kernels (two-pass, cluster) against a host reference at vocabularies up to 262,145.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "alibi_attention.hpp"
#include "cross_entropy_rows.hpp"
#include "cuda_test_support.hpp"
#include "gemm.hpp"
#include "gpu_info.hpp"
#include "lm_head.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

using namespace shardlm;
using shardlm::cuda::Gemm;

namespace {

using namespace cuda_test;

// ---- host helpers ---------------------------------------------------------------------------


// ---- attention reference (bloom_cpu.cpp's math, in double) ------------------------------------

struct Shape {
  int B, T, heads, d;
  int H() const { return heads * d; }
  int ld() const { return 3 * H(); }
  size_t qkv_size() const { return static_cast<size_t>(B) * T * ld(); }
  size_t ctx_size() const { return static_cast<size_t>(B) * T * H(); }
  size_t probs_size() const { return static_cast<size_t>(B) * heads * T * T; }
  // Element e of part (0 q, 1 k, 2 v) of head h at position i of sequence b.
  size_t qkv_at(int b, int i, int h, int part, int e) const {
    return (static_cast<size_t>(b) * T + i) * ld() + static_cast<size_t>(h) * 3 * d + static_cast<size_t>(part) * d + e;
  }
  size_t ctx_at(int b, int i, int h, int e) const {
    return (static_cast<size_t>(b) * T + i) * H() + static_cast<size_t>(h) * d + e;
  }
  size_t probs_at(int b, int h, int i, int j) const {
    return ((static_cast<size_t>(b) * heads + h) * T + i) * T + j;
  }
};

void reference_forward(const Shape& s, const std::vector<float>& slopes, const std::vector<double>& qkv,
                       std::vector<double>& probs, std::vector<double>& ctx) {
  probs.assign(s.probs_size(), 0.0);
  ctx.assign(s.ctx_size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> row(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.T; ++i) {
        double max_score = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int e = 0; e < s.d; ++e) dot += qkv[s.qkv_at(b, i, h, 0, e)] * qkv[s.qkv_at(b, j, h, 1, e)];
          row[j] = scale * dot + static_cast<double>(slopes[h]) * j;
          max_score = std::max(max_score, row[j]);
        }
        double total = 0.0;
        for (int j = 0; j <= i; ++j) total += std::exp(row[j] - max_score);
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(row[j] - max_score) / total;
          probs[s.probs_at(b, h, i, j)] = p;
          for (int e = 0; e < s.d; ++e) ctx[s.ctx_at(b, i, h, e)] += p * qkv[s.qkv_at(b, j, h, 2, e)];
        }
      }
}

std::vector<double> reference_backward(const Shape& s, const std::vector<double>& qkv, const std::vector<double>& probs,
                                       const std::vector<double>& dctx) {
  std::vector<double> dqkv(s.qkv_size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> ds(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.T; ++i) {
        // dP_ij = dctx_i . v_j; dv_j += P_ij dctx_i; dS = P (dP - sum P dP).
        double dot = 0.0;
        for (int j = 0; j <= i; ++j) {
          double dp = 0.0;
          for (int e = 0; e < s.d; ++e) dp += dctx[s.ctx_at(b, i, h, e)] * qkv[s.qkv_at(b, j, h, 2, e)];
          ds[j] = dp;
          dot += probs[s.probs_at(b, h, i, j)] * dp;
        }
        for (int j = 0; j <= i; ++j) {
          const double p = probs[s.probs_at(b, h, i, j)];
          const double g = p * (ds[j] - dot) * scale;
          for (int e = 0; e < s.d; ++e) {
            dqkv[s.qkv_at(b, j, h, 2, e)] += p * dctx[s.ctx_at(b, i, h, e)];
            dqkv[s.qkv_at(b, i, h, 0, e)] += g * qkv[s.qkv_at(b, j, h, 1, e)];
            dqkv[s.qkv_at(b, j, h, 1, e)] += g * qkv[s.qkv_at(b, i, h, 0, e)];
          }
        }
      }
  return dqkv;
}

// The GPU's forward and backward on values already representable in dt.
struct GpuAttention {
  std::vector<float> probs, ctx, dqkv;
};

GpuAttention run_gpu_attention(Gemm& gemm, const Shape& s, const std::vector<float>& slopes,
                               const std::vector<float>& qkv, const std::vector<float>& dctx, DType dt) {
  const size_t es = dtype_size(dt);
  DeviceBuffer d_qkv(s.qkv_size() * es), d_ctx(s.ctx_size() * es), d_probs(s.probs_size() * es);
  DeviceBuffer d_dctx(s.ctx_size() * es), d_dqkv(s.qkv_size() * es), d_slopes(slopes.size() * sizeof(float));
  DeviceBuffer d_work(cuda::alibi_attention_workspace_bytes(s.B, s.T, s.heads, s.d, dt));
  upload(d_qkv.get(), qkv, dt);
  upload(d_dctx.get(), dctx, dt);
  upload(d_slopes.get(), slopes, DType::F32);
  // Garbage in the outputs: everything must be written, masked probabilities too.
  check_cuda(cudaMemset(d_probs.get(), 0x7f, s.probs_size() * es), "cudaMemset");
  check_cuda(cudaMemset(d_dqkv.get(), 0x7f, s.qkv_size() * es), "cudaMemset");
  check_cuda(cudaMemset(d_ctx.get(), 0x7f, s.ctx_size() * es), "cudaMemset");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  BOOST_REQUIRE_NO_THROW(cuda::alibi_attention_forward(gemm, d_qkv.get(), d_ctx.get(), d_probs.get(),
                                                       d_slopes.as<float>(), s.B, s.T, s.heads, s.d, dt, d_work.get(),
                                                       stream));
  BOOST_REQUIRE_NO_THROW(cuda::alibi_attention_backward(gemm, d_dctx.get(), d_qkv.get(), d_probs.get(), d_dqkv.get(),
                                                        d_slopes.as<float>(), s.B, s.T, s.heads, s.d, dt, d_work.get(),
                                                        stream));
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  GpuAttention out;
  out.probs = download(d_probs.get(), s.probs_size(), dt);
  out.ctx = download(d_ctx.get(), s.ctx_size(), dt);
  out.dqkv = download(d_dqkv.get(), s.qkv_size(), dt);
  return out;
}

void check_attention(const Shape& s, DType dt, double tol_forward, double tol_backward, unsigned seed) {
  BOOST_TEST_CONTEXT("B=" << s.B << " T=" << s.T << " heads=" << s.heads << " head_dim=" << s.d
                          << " dt=" << dtype_name(dt)) {
    std::mt19937 rng(seed);
    const std::vector<float> slopes = alibi_slopes(s.heads);
    const std::vector<float> qkv = random_values(s.qkv_size(), rng, dt);
    const std::vector<float> dctx = random_values(s.ctx_size(), rng, dt);
    Gemm gemm;
    const GpuAttention gpu = run_gpu_attention(gemm, s, slopes, qkv, dctx, dt);

    std::vector<double> probs, ctx;
    reference_forward(s, slopes, to_double(qkv), probs, ctx);
    const std::vector<double> dqkv = reference_backward(s, to_double(qkv), probs, to_double(dctx));
    BOOST_TEST(relative_error(gpu.probs, probs) <= tol_forward);
    BOOST_TEST(relative_error(gpu.ctx, ctx) <= tol_forward);
    BOOST_TEST(relative_error(gpu.dqkv, dqkv) <= tol_backward);
    // Causal: probabilities above the diagonal are exactly zero; each row sums to one.
    double worst_row = 0.0;
    size_t above = 0;
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.heads; ++h)
        for (int i = 0; i < s.T; ++i) {
          double sum = 0.0;
          for (int j = 0; j < s.T; ++j) {
            const float p = gpu.probs[s.probs_at(b, h, i, j)];
            if (j > i && p != 0.0f) ++above;
            sum += p;
          }
          worst_row = std::max(worst_row, std::abs(sum - 1.0));
        }
    BOOST_TEST(above == 0u);
    BOOST_TEST(worst_row <= (dt == DType::F32 ? 1e-5 : 2e-2));
  }
}

// ---- LM head reference ---------------------------------------------------------------------

struct HeadReference {
  double loss = 0.0;
  long long count = 0;
  std::vector<double> dh, dtable_increment;
};

HeadReference reference_head(const std::vector<float>& h, const std::vector<float>& table,
                             const std::vector<int32_t>& targets, int n, int H, int V, float grad_scale) {
  HeadReference ref;
  ref.dh.assign(static_cast<size_t>(n) * H, 0.0);
  ref.dtable_increment.assign(static_cast<size_t>(V) * H, 0.0);
  std::vector<double> logits(V);
  for (int r = 0; r < n; ++r) {
    const int32_t target = targets[r];
    if (target < 0) continue;
    const float* hr = h.data() + static_cast<size_t>(r) * H;
    for (int v = 0; v < V; ++v) {
      const float* tv = table.data() + static_cast<size_t>(v) * H;
      double dot = 0.0;
      for (int c = 0; c < H; ++c) dot += static_cast<double>(hr[c]) * tv[c];
      logits[v] = dot;
    }
    const double max_logit = *std::max_element(logits.begin(), logits.end());
    double total = 0.0;
    for (int v = 0; v < V; ++v) total += std::exp(logits[v] - max_logit);
    ref.loss += max_logit + std::log(total) - logits[target];
    ++ref.count;
    for (int v = 0; v < V; ++v) {
      const double g = grad_scale * (std::exp(logits[v] - max_logit) / total - (v == target ? 1.0 : 0.0));
      for (int c = 0; c < H; ++c) {
        ref.dh[static_cast<size_t>(r) * H + c] += g * table[static_cast<size_t>(v) * H + c];
        ref.dtable_increment[static_cast<size_t>(v) * H + c] += g * h[static_cast<size_t>(r) * H + c];
      }
    }
  }
  return ref;
}

void check_lm_head(int n, int H, int V, int chunk, DType dt, bool backward, unsigned seed) {
  BOOST_TEST_CONTEXT("n=" << n << " H=" << H << " V=" << V << " chunk=" << chunk << " dt=" << dtype_name(dt)
                          << " backward=" << backward) {
    std::mt19937 rng(seed);
    const std::vector<float> h = random_values(static_cast<size_t>(n) * H, rng, dt);
    const std::vector<float> table = random_values(static_cast<size_t>(V) * H, rng, dt, 0.3f);
    const std::vector<float> dtable0 = random_values(static_cast<size_t>(V) * H, rng, DType::F32, 0.01f);
    // About a quarter of the positions have no target, including a run longer than small chunks.
    std::vector<int32_t> targets(n);
    std::uniform_int_distribution<int32_t> token(0, V - 1);
    std::uniform_real_distribution<float> coin(0.0f, 1.0f);
    for (int r = 0; r < n; ++r) targets[r] = coin(rng) < 0.25f ? -1 : token(rng);
    for (int r = 5; r < std::min(n, 13); ++r) targets[r] = -1;
    targets[0] = 0;
    if (n > 1) targets[n - 1] = V - 1;
    const float grad_scale = 0.37f;

    const size_t es = dtype_size(dt);
    DeviceBuffer d_h(h.size() * es), d_table(table.size() * es), d_targets(n * sizeof(int32_t));
    DeviceBuffer d_dh(h.size() * es), d_dtable(dtable0.size() * sizeof(float));
    DeviceBuffer d_loss(sizeof(float)), d_count(sizeof(long long));
    DeviceBuffer d_work(cuda::lm_head_workspace_bytes(chunk, V, dt));
    upload(d_h.get(), h, dt);
    upload(d_table.get(), table, dt);
    upload(d_dtable.get(), dtable0, DType::F32);
    check_cuda(cudaMemcpy(d_targets.get(), targets.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
    check_cuda(cudaMemset(d_dh.get(), 0x7f, h.size() * es), "cudaMemset");  // every row must be written
    // loss_sum and count are accumulated into (+=).
    const float loss0 = 1.25f;
    const long long count0 = 5;
    check_cuda(cudaMemcpy(d_loss.get(), &loss0, sizeof loss0, cudaMemcpyHostToDevice), "cudaMemcpy");
    check_cuda(cudaMemcpy(d_count.get(), &count0, sizeof count0, cudaMemcpyHostToDevice), "cudaMemcpy");

    Gemm gemm;
    BOOST_REQUIRE_NO_THROW(cuda::lm_head_loss(gemm, d_h.get(), d_table.get(), d_targets.as<int32_t>(), n, H, V, chunk,
                                              grad_scale, d_loss.as<float>(), d_count.as<long long>(),
                                              backward ? d_dh.get() : nullptr,
                                              backward ? d_dtable.as<float>() : nullptr, dt, d_work.get(), nullptr));
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    float loss = 0.0f;
    long long count = 0;
    check_cuda(cudaMemcpy(&loss, d_loss.get(), sizeof loss, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check_cuda(cudaMemcpy(&count, d_count.get(), sizeof count, cudaMemcpyDeviceToHost), "cudaMemcpy");

    const HeadReference ref = reference_head(h, table, targets, n, H, V, grad_scale);
    BOOST_TEST(count == count0 + ref.count);
    BOOST_TEST(std::abs((static_cast<double>(loss) - loss0) - ref.loss) <= 2e-5 * std::max(1.0, ref.loss));
    if (!backward) return;

    const std::vector<float> dh = download(d_dh.get(), h.size(), dt);
    const std::vector<float> dtable = download(d_dtable.get(), dtable0.size(), DType::F32);
    const double tol = dt == DType::F32 ? 2e-5 : (dt == DType::BF16 ? 1.5e-2 : 3e-3);
    BOOST_TEST(relative_error(dh, ref.dh) <= tol);
    std::vector<float> increment(dtable.size());
    for (size_t i = 0; i < dtable.size(); ++i) increment[i] = dtable[i] - dtable0[i];
    BOOST_TEST(relative_error(increment, ref.dtable_increment) <= tol);
    // Positions without a target get exactly zero gradient.
    size_t nonzero = 0;
    for (int r = 0; r < n; ++r)
      if (targets[r] < 0)
        for (int c = 0; c < H; ++c) nonzero += dh[static_cast<size_t>(r) * H + c] != 0.0f;
    BOOST_TEST(nonzero == 0u);
  }
}

// ---- cross-entropy rows: both kernels against a host reference ---------------------------------

struct RowsResult {
  std::vector<float> loss, grad;  // grad: [rows, V] (row r's gradient at dt-offset r * 2V for 16-bit dt)
  std::vector<int> has_target;
  std::vector<float> logits_after;  // the fp32 buffer after a loss-only call
};

RowsResult run_rows(const std::vector<float>& logits, const std::vector<int32_t>& targets, int V, DType dt,
                    bool backward, float grad_scale, cuda::CrossEntropyPath path) {
  const int rows = static_cast<int>(targets.size());
  DeviceBuffer d_logits(logits.size() * sizeof(float)), d_targets(targets.size() * sizeof(int32_t));
  DeviceBuffer d_loss(rows * sizeof(float)), d_has(rows * sizeof(int));
  upload(d_logits.get(), logits, DType::F32);
  check_cuda(cudaMemcpy(d_targets.get(), targets.data(), targets.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
             "cudaMemcpy");
  check_cuda(cudaMemset(d_loss.get(), 0x7f, rows * sizeof(float)), "cudaMemset");  // every row must be written
  check_cuda(cudaMemset(d_has.get(), 0x7f, rows * sizeof(int)), "cudaMemset");
  cuda::cross_entropy_rows(d_logits.as<float>(), rows, V, d_targets.as<int32_t>(), grad_scale, backward,
                           d_loss.as<float>(), d_has.as<int>(), dt, nullptr, path);
  RowsResult out;
  out.loss = download(d_loss.get(), rows, DType::F32);
  out.has_target = from_device_raw<int>(d_has.get(), rows);
  if (!backward) {
    out.logits_after = download(d_logits.get(), logits.size(), DType::F32);
    return out;
  }
  const size_t stride = sizeof(float) / dtype_size(dt) * static_cast<size_t>(V);  // a row in dt elements
  const std::vector<float> all = download(d_logits.get(), stride * rows, dt);
  for (int r = 0; r < rows; ++r)
    out.grad.insert(out.grad.end(), all.begin() + static_cast<long>(r * stride),
                    all.begin() + static_cast<long>(r * stride + V));
  return out;
}

void check_rows(int V, DType dt, unsigned seed, bool expect_cluster) {
  BOOST_TEST_CONTEXT("V=" << V << " dt=" << dtype_name(dt)) {
    std::mt19937 rng(seed);
    // Targets at both ends, none (-1), an id past V (treated as none) and two inside.
    std::uniform_int_distribution<int32_t> token(1, V - 2 > 1 ? V - 2 : 1);
    const std::vector<int32_t> targets = {0, V - 1, -1, V, token(rng), token(rng)};
    const int rows = static_cast<int>(targets.size());
    std::vector<float> logits = random_values(static_cast<size_t>(rows) * V, rng, DType::F32, 3.0f);
    logits[static_cast<size_t>(4) * V + targets[4]] = 40.0f;  // one row with a dominant logit
    const float grad_scale = 0.37f;

    std::vector<double> ref_loss(rows, 0.0), ref_grad(static_cast<size_t>(rows) * V, 0.0);
    for (int r = 0; r < rows; ++r) {
      if (targets[r] < 0 || targets[r] >= V) continue;
      const float* x = logits.data() + static_cast<size_t>(r) * V;
      const double m = *std::max_element(x, x + V);
      double total = 0.0;
      for (int j = 0; j < V; ++j) total += std::exp(x[j] - m);
      ref_loss[r] = m + std::log(total) - x[targets[r]];
      for (int j = 0; j < V; ++j)
        ref_grad[static_cast<size_t>(r) * V + j] =
            grad_scale * (std::exp(x[j] - m) / total - (j == targets[r] ? 1.0 : 0.0));
    }

    std::vector<cuda::CrossEntropyPath> paths = {cuda::CrossEntropyPath::kTwoPass};
    if (expect_cluster) paths.push_back(cuda::CrossEntropyPath::kCluster);
    BOOST_TEST((cuda::cross_entropy_auto_path(V) == paths.back()));
    if (!expect_cluster)
      BOOST_CHECK_THROW(run_rows(logits, targets, V, dt, true, grad_scale, cuda::CrossEntropyPath::kCluster), Error);
    std::vector<RowsResult> results;
    for (cuda::CrossEntropyPath path : paths) {
      BOOST_TEST_CONTEXT("path=" << (path == cuda::CrossEntropyPath::kCluster ? "cluster" : "two-pass")) {
        const RowsResult got = run_rows(logits, targets, V, dt, true, grad_scale, path);
        for (int r = 0; r < rows; ++r) {
          const bool has = targets[r] >= 0 && targets[r] < V;
          BOOST_TEST(got.has_target[r] == (has ? 1 : 0));
          BOOST_TEST(std::abs(got.loss[r] - ref_loss[r]) <= 2e-6 * std::max(1.0, ref_loss[r]));
        }
        BOOST_TEST(relative_error(got.grad, ref_grad) <= (dt == DType::F32 ? 1e-6 : 4e-3));
        size_t nonzero = 0;  // rows without a target: exactly zero
        for (int j = 0; j < V; ++j)
          nonzero += (got.grad[static_cast<size_t>(2) * V + j] != 0.0f) + (got.grad[static_cast<size_t>(3) * V + j] != 0.0f);
        BOOST_TEST(nonzero == 0u);
        const RowsResult loss_only = run_rows(logits, targets, V, dt, false, grad_scale, path);
        BOOST_TEST(loss_only.loss == got.loss);  // the same kernel, the same state
        BOOST_TEST((loss_only.logits_after == logits));  // loss only: the logits stay as they were
        results.push_back(got);
      }
    }
    // The two kernels merge in different orders: they agree to rounding.
    if (results.size() == 2) {
      for (int r = 0; r < rows; ++r)
        BOOST_TEST(std::abs(results[0].loss[r] - results[1].loss[r]) <= 1e-6 * std::max(1.0f, std::abs(results[0].loss[r])));
      BOOST_TEST(relative_error(results[1].grad, results[0].grad) <= (dt == DType::F32 ? 1e-6 : 1e-2));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(device_present) { require_device("test_cuda_attention"); }

BOOST_AUTO_TEST_CASE(attention_matches_reference_fp32) {
  require_device("test_cuda_attention");
  check_attention(Shape{2, 13, 3, 8}, DType::F32, 1e-5, 1e-4, 11);
  check_attention(Shape{1, 77, 2, 64}, DType::F32, 1e-5, 1e-4, 12);
  check_attention(Shape{3, 7, 2, 5}, DType::F32, 1e-5, 1e-4, 13);  // odd head_dim: views off 16-byte alignment
  check_attention(Shape{1, 1, 4, 8}, DType::F32, 1e-5, 1e-4, 14);  // one position
}

BOOST_AUTO_TEST_CASE(attention_matches_reference_16bit) {
  require_device("test_cuda_attention");
  // Probabilities and outputs are rounded to 16 bits; the reference keeps them exact.
  check_attention(Shape{2, 13, 3, 8}, DType::BF16, 1.5e-2, 4e-2, 21);
  check_attention(Shape{1, 77, 2, 64}, DType::BF16, 1.5e-2, 4e-2, 22);
  check_attention(Shape{2, 13, 3, 8}, DType::F16, 2e-3, 6e-3, 23);
  check_attention(Shape{3, 7, 2, 5}, DType::F16, 2e-3, 6e-3, 24);
}

BOOST_AUTO_TEST_CASE(attention_backward_matches_finite_differences) {
  require_device("test_cuda_attention");
  const Shape s{1, 5, 2, 3};
  std::mt19937 rng(31);
  const std::vector<float> slopes = alibi_slopes(s.heads);
  const std::vector<float> qkv = random_values(s.qkv_size(), rng, DType::F32);
  const std::vector<float> weights = random_values(s.ctx_size(), rng, DType::F32);  // L = sum(ctx * weights)
  Gemm gemm;
  const GpuAttention gpu = run_gpu_attention(gemm, s, slopes, qkv, weights, DType::F32);

  auto loss = [&](const std::vector<double>& x) {
    std::vector<double> probs, ctx;
    reference_forward(s, slopes, x, probs, ctx);
    double sum = 0.0;
    for (size_t i = 0; i < ctx.size(); ++i) sum += ctx[i] * weights[i];
    return sum;
  };
  const std::vector<double> x = to_double(qkv);
  const std::vector<double> numeric = numeric_gradient(loss, x);
  std::vector<double> probs, ctx;
  reference_forward(s, slopes, x, probs, ctx);
  BOOST_TEST(relative_error(reference_backward(s, x, probs, to_double(weights)), numeric) <= 1e-7);
  BOOST_TEST(relative_error(gpu.dqkv, numeric) <= 1e-4);
}

BOOST_AUTO_TEST_CASE(attention_rejects_bad_shapes) {
  require_device("test_cuda_attention");
  Gemm gemm;
  BOOST_CHECK_THROW(
      cuda::alibi_attention_forward(gemm, nullptr, nullptr, nullptr, nullptr, 1, 4, 0, 8, DType::F32, nullptr, nullptr),
      Error);
  // Nothing to do: no throw, no launch.
  BOOST_CHECK_NO_THROW(cuda::alibi_attention_forward(gemm, nullptr, nullptr, nullptr, nullptr, 0, 4, 2, 8, DType::F32,
                                                     nullptr, nullptr));
}

BOOST_AUTO_TEST_CASE(lm_head_loss_and_gradients_fp32) {
  require_device("test_cuda_attention");
  for (int chunk : {1, 4, 7, 19, 32}) check_lm_head(19, 24, 53, chunk, DType::F32, true, 41);
  check_lm_head(37, 64, 3001, 16, DType::F32, true, 42);
  check_lm_head(19, 24, 53, 6, DType::F32, false, 43);  // loss only
}

BOOST_AUTO_TEST_CASE(lm_head_loss_and_gradients_16bit) {
  require_device("test_cuda_attention");
  for (int chunk : {1, 4, 7, 19, 32}) check_lm_head(19, 24, 53, chunk, DType::BF16, true, 51);
  check_lm_head(37, 64, 3001, 16, DType::BF16, true, 52);  // the row kernel narrows rows in place over many strides
  check_lm_head(37, 64, 3001, 10, DType::F16, true, 53);
  check_lm_head(19, 24, 53, 6, DType::BF16, false, 54);
}

BOOST_AUTO_TEST_CASE(cross_entropy_rows_both_kernels_match_reference) {
  require_device("test_cuda_attention");
  int device = 0, major = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  // The cluster kernel where the GPU is a Hopper or later and this binary has sm_90 code or PTX for it.
  const std::string archs = cuda::built_cuda_archs();
  const bool hopper = major >= 9 && archs.find("90") != std::string::npos;
  BOOST_TEST_MESSAGE("compute capability " << major << ", built for " << archs << ": cluster kernel "
                                           << (hopper ? "expected" : "not expected"));
  // 1 to 8 blocks of 32 logits a thread, then 5 to 8 of 64 (the largest 262,144 = 8 x 512 x 64), then none.
  unsigned seed = 61;
  for (int V : {53, 16384, 16385, 40000, 131072, 128256, 131073, 250880, 262144})
    for (DType dt : {DType::F32, DType::BF16}) check_rows(V, dt, seed++, hopper);
  check_rows(3001, DType::F16, seed++, hopper);
  check_rows(cuda::kClusterMaxVocab + 1, DType::BF16, seed++, false);
}

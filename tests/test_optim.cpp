// Tests of optim: AdamW against a double-precision transcription of torch.optim.AdamW, LR schedules, clipping;
// the host AdamW's paths against the GPU kernel's formula, and its thread count.
#define BOOST_TEST_MODULE test_optim
#include <boost/test/unit_test.hpp>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shardlm/optim.hpp"

using namespace shardlm;

BOOST_AUTO_TEST_CASE(adamw_matches_reference_over_steps) {
  const size_t n = 37;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> p(n), g(n);
  for (auto& x : p) x = normal(rng);
  std::vector<double> ref(p.begin(), p.end()), m(n, 0.0), v(n, 0.0);
  ParamSlice slice{p.data(), g.data(), n, {{3, 9}, {20, 21}}};
  AdamWOptions opt{0.9, 0.95, 1e-8, 0.1};
  auto cpu = make_cpu_backend();
  AdamW adam(*cpu, {slice}, opt);
  auto decays = [&](size_t i) { return !((i >= 3 && i < 9) || i == 20); };
  for (int step = 1; step <= 6; ++step) {
    for (auto& x : g) x = normal(rng);
    const double lr = 1e-2 * step;
    adam.step(lr);
    for (size_t i = 0; i < n; ++i) {
      if (decays(i)) ref[i] *= 1.0 - lr * opt.weight_decay;
      m[i] = opt.beta1 * m[i] + (1 - opt.beta1) * g[i];
      v[i] = opt.beta2 * v[i] + (1 - opt.beta2) * double(g[i]) * g[i];
      double mhat = m[i] / (1 - std::pow(opt.beta1, step));
      double vhat = v[i] / (1 - std::pow(opt.beta2, step));
      ref[i] -= lr * mhat / (std::sqrt(vhat) + opt.eps);
    }
  }
  for (size_t i = 0; i < n; ++i) BOOST_TEST(p[i] == ref[i], boost::test_tools::tolerance(1e-5));
  BOOST_TEST(adam.steps_taken() == 6);
  BOOST_TEST(adam.state_bytes() == 2 * n * sizeof(float));
}

BOOST_AUTO_TEST_CASE(adamw_first_step_is_sign_step) {
  // After one step the bias-corrected update is lr * g / |g| (plus decay): a known closed form.
  std::vector<float> p = {1.0f, 2.0f}, g = {0.5f, -4.0f};
  auto cpu = make_cpu_backend();
  AdamW adam(*cpu, {ParamSlice{p.data(), g.data(), 2, {{1, 2}}}}, AdamWOptions{0.9, 0.999, 1e-8, 0.5});
  adam.step(0.1);
  BOOST_TEST(p[0] == 1.0f * (1 - 0.05f) - 0.1f, boost::test_tools::tolerance(1e-5f));
  BOOST_TEST(p[1] == 2.0f + 0.1f, boost::test_tools::tolerance(1e-5f));  // no decay on index 1
}

// The CPU backend's threads only share the element-wise work: 4 threads give bit-identical parameters and moments
// on slices larger than one work piece, with no-decay ranges crossing piece boundaries.
BOOST_AUTO_TEST_CASE(threaded_step_is_bit_identical) {
  const size_t n = (1u << 20) * 2 + 12345;
  std::vector<float> p1(n), p4(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p1[i] = p4[i] = std::sin(0.001f * static_cast<float>(i));
    g[i] = std::cos(0.003f * static_cast<float>(i));
  }
  std::vector<std::pair<size_t, size_t>> no_decay = {{100, 200}, {(1u << 20) - 10, (1u << 20) + 10}, {n - 5, n}};
  AdamWOptions opt{0.9, 0.999, 1e-8, 0.1};
  auto cpu1 = make_cpu_backend(1), cpu4 = make_cpu_backend(4);
  AdamW one(*cpu1, {ParamSlice{p1.data(), g.data(), n, no_decay}}, opt);
  AdamW four(*cpu4, {ParamSlice{p4.data(), g.data(), n, no_decay}}, opt);
  for (int s = 0; s < 3; ++s) {
    one.step(1e-3);
    four.step(1e-3);
  }
  BOOST_TEST(std::memcmp(p1.data(), p4.data(), n * sizeof(float)) == 0);
  BOOST_TEST(std::memcmp(one.exp_avg_sq(0), four.exp_avg_sq(0), n * sizeof(float)) == 0);
}

BOOST_AUTO_TEST_CASE(linear_schedule_with_warmup) {
  BOOST_TEST(scheduled_lr(LrSchedule::Linear, 1.0, 0, 4, 12) == 0.0);
  BOOST_TEST(scheduled_lr(LrSchedule::Linear, 1.0, 2, 4, 12) == 0.5);
  BOOST_TEST(scheduled_lr(LrSchedule::Linear, 1.0, 4, 4, 12) == 1.0);
  BOOST_TEST(scheduled_lr(LrSchedule::Linear, 1.0, 8, 4, 12) == 0.5);
  BOOST_TEST(scheduled_lr(LrSchedule::Linear, 1.0, 12, 4, 12) == 0.0);
  BOOST_TEST(scheduled_lr(LrSchedule::Linear, 2.0, 0, 0, 10) == 2.0);
  BOOST_TEST(scheduled_lr(LrSchedule::Constant, 2.0, 9, 3, 10) == 2.0);
  BOOST_TEST(scheduled_lr(LrSchedule::ConstantWithWarmup, 2.0, 1, 4, 10) == 0.5);
  BOOST_TEST(scheduled_lr(LrSchedule::Constant, 2.0, 1, 4, 10) == 2.0);  // transformers' constant: no warm-up
}

// torch.amp.GradScaler's update: an overflow halves the scale (below 1 too: train.loss_scale = 0.5 goes to
// 0.25, as GradScaler's does) and restarts the count; 2000 good steps in a row double it.
BOOST_AUTO_TEST_CASE(dynamic_loss_scale_follows_grad_scaler) {
  DynamicLossScale s{0.5};
  s.after_step(true);
  BOOST_TEST(s.value == 0.25);
  s.after_step(true);
  BOOST_TEST(s.value == 0.125);
  for (int i = 0; i < 1999; ++i) s.after_step(false);
  BOOST_TEST(s.value == 0.125);
  s.after_step(true);  // the count starts again
  BOOST_TEST(s.value == 0.0625);
  for (int i = 0; i < 1999; ++i) s.after_step(false);
  BOOST_TEST(s.value == 0.0625);
  s.after_step(false);
  BOOST_TEST(s.value == 0.125);
  BOOST_TEST(s.good_steps == 0);
}

BOOST_AUTO_TEST_CASE(clipping_factor) {
  BOOST_TEST(clip_factor(0.5, 1.0) == 1.0);
  BOOST_TEST(clip_factor(4.0, 1.0) == 1.0 / (4.0 + 1e-6), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(clip_factor(4.0, 0.0) == 1.0);
}

// ---- the host AdamW's paths (src/device/cpu/host_adamw.cpp) ---------------------------------

namespace {

// Many ranges of odd lengths over one slice, alternating decay and none, some longer than a work piece.
struct HostAdamWCase {
  std::vector<float> p, g, m, v;
  std::vector<uint16_t> out16;
  std::vector<float> out32;
  std::vector<size_t> begins, lengths;
  std::vector<double> decays;
};

HostAdamWCase make_host_case(uint32_t seed) {
  HostAdamWCase c;
  const size_t lengths[] = {1, 7, 15, 17, 31, 33, 1001, 3, kHostAdamWPiece + 77, 5, 255, 2 * kHostAdamWPiece + 13, 9};
  size_t n = 0;
  for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; ++i) {
    c.begins.push_back(n + 1);  // one element between ranges: every range starts misaligned
    c.lengths.push_back(lengths[i]);
    c.decays.push_back(i % 3 == 1 ? 0.0 : 0.1);
    n += lengths[i] + 1;
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  c.p.resize(n), c.g.resize(n), c.m.assign(n, 0.f), c.v.assign(n, 0.f), c.out16.assign(n, 0), c.out32.assign(n, 0.f);
  for (auto& x : c.p) x = normal(rng);
  return c;
}

std::vector<AdamWRange> ranges_of(HostAdamWCase& c, DType out) {
  std::vector<AdamWRange> r;
  for (size_t i = 0; i < c.begins.size(); ++i) {
    const size_t b = c.begins[i];
    void* o = out == DType::F32 ? static_cast<void*>(c.out32.data() + b) : static_cast<void*>(c.out16.data() + b);
    r.push_back({c.p.data() + b, c.g.data() + b, c.m.data() + b, c.v.data() + b, c.lengths[i], c.decays[i], o});
  }
  return r;
}

// |got - want| <= 1e-6 max(|want|, rms(want)) for every element: relative, with the vector's scale as the floor
// where a value passes through zero.
void check_relative(const std::vector<float>& got, const std::vector<double>& want, const char* what,
                    const std::string& path) {
  double ss = 0;
  for (double w : want) ss += w * w;
  const double rms = std::sqrt(ss / static_cast<double>(want.size()));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::abs(got[i] - want[i]) / std::max(std::abs(want[i]), rms);
    if (e > worst) worst = e, at = i;
  }
  BOOST_TEST_MESSAGE(path << " " << what << ": largest relative difference " << worst << " at " << at);
  BOOST_CHECK_MESSAGE(worst <= 1e-6, path << " " << what << ": relative difference " << worst << " at element " << at
                                          << " (got " << got[at] << ", want " << want[at] << ")");
}

}  // namespace

// Each path, five steps with clipping (grad_scale) and bias corrections, against the GPU kernel's formula in
// double (src/device/cuda/adamw.cu: p *= 1 - lr wd; m lerps to g; v = b2 v + (1 - b2) g^2;
// p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)); the compute-dtype copy is the updated fp32 parameter rounded once.
BOOST_AUTO_TEST_CASE(host_adamw_paths_match_the_gpu_formula) {
  const double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  for (HostSimd simd : {HostSimd::Scalar, HostSimd::Avx2, HostSimd::Avx512}) {
    const std::string path = host_simd_name(simd);
    if (!host_simd_available(simd)) {
      BOOST_TEST_MESSAGE("skipped: this CPU has no " << path);
      continue;
    }
    for (DType out : {DType::F32, DType::BF16, DType::F16}) {
      HostAdamWCase c = make_host_case(17);
      std::vector<double> rp(c.p.begin(), c.p.end()), rm(c.p.size(), 0.0), rv(c.p.size(), 0.0);
      std::mt19937 rng(5);
      std::normal_distribution<float> normal(0.f, 1.f);
      const std::vector<AdamWRange> ranges = ranges_of(c, out);
      for (int step = 1; step <= 5; ++step) {
        for (auto& x : c.g) x = normal(rng) * (step % 2 ? 1.0f : 1e-3f);
        AdamWHyper h;
        h.lr = lr * step, h.beta1 = beta1, h.beta2 = beta2, h.eps = eps, h.step = step;
        h.grad_scale = step == 3 ? 0.25f : 1.0f;
        h.out_dtype = out;
        host_adamw(ranges, h, 2, simd);
        const double bc1 = 1 - std::pow(beta1, step), bc2 = 1 - std::pow(beta2, step);
        for (size_t r = 0; r < c.begins.size(); ++r)
          for (size_t i = c.begins[r]; i < c.begins[r] + c.lengths[r]; ++i) {
            const double g = static_cast<double>(c.g[i]) * h.grad_scale;
            rp[i] *= 1.0 - h.lr * c.decays[r];
            rm[i] += (1.0 - beta1) * (g - rm[i]);
            rv[i] = rv[i] * beta2 + (1.0 - beta2) * g * g;
            rp[i] -= h.lr / bc1 * (rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps));
          }
      }
      const std::string what = path + " out=" + dtype_name(out);
      check_relative(c.p, rp, "param", what);
      check_relative(c.m, rm, "exp_avg", what);
      check_relative(c.v, rv, "exp_avg_sq", what);
      // The elements between the ranges are not touched.
      for (size_t r = 0; r < c.begins.size(); ++r) BOOST_TEST(c.m[c.begins[r] - 1] == 0.0f);
      size_t wrong = 0;
      for (size_t r = 0; r < c.begins.size(); ++r)
        for (size_t i = c.begins[r]; i < c.begins[r] + c.lengths[r]; ++i) {
          if (out == DType::F32)
            wrong += std::memcmp(&c.out32[i], &c.p[i], sizeof(float)) != 0;
          else
            wrong += c.out16[i] != (out == DType::BF16 ? float_to_bf16(c.p[i]) : float_to_fp16(c.p[i]));
        }
      BOOST_CHECK_MESSAGE(wrong == 0, what << ": " << wrong << " compute-dtype copies differ from the rounded parameter");
    }
  }
}

// The vector paths round the same operations as the scalar one: identical bits, also for 1, 2, 3 and 4 threads.
BOOST_AUTO_TEST_CASE(host_adamw_paths_and_thread_counts_give_identical_bits) {
  auto run = [](HostSimd simd, int threads) {
    HostAdamWCase c = make_host_case(23);
    const std::vector<AdamWRange> ranges = ranges_of(c, DType::BF16);
    for (int step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < c.g.size(); ++i) c.g[i] = std::sin(0.37f * static_cast<float>(i) + step);
      AdamWHyper h;
      h.lr = 1e-2, h.step = step, h.grad_scale = 0.5f, h.out_dtype = DType::BF16;
      host_adamw(ranges, h, threads, simd);
    }
    return c;
  };
  const HostAdamWCase want = run(HostSimd::Scalar, 1);
  for (HostSimd simd : {HostSimd::Scalar, HostSimd::Avx2, HostSimd::Avx512}) {
    if (!host_simd_available(simd)) {
      BOOST_TEST_MESSAGE("skipped: this CPU has no " << host_simd_name(simd));
      continue;
    }
    for (int threads = 1; threads <= 4; ++threads) {
      const HostAdamWCase got = run(simd, threads);
      const size_t bytes = want.p.size() * sizeof(float);
      BOOST_CHECK_MESSAGE(std::memcmp(got.p.data(), want.p.data(), bytes) == 0 &&
                              std::memcmp(got.m.data(), want.m.data(), bytes) == 0 &&
                              std::memcmp(got.v.data(), want.v.data(), bytes) == 0 && got.out16 == want.out16,
                          host_simd_name(simd) << " on " << threads << " thread(s) differs from scalar on one");
    }
  }
}

BOOST_AUTO_TEST_CASE(host_adamw_refuses_step_zero) {
  std::vector<float> p(3), g(3), m(3), v(3);
  AdamWHyper h;
  h.step = 0;
  BOOST_CHECK_THROW(host_adamw({{p.data(), g.data(), m.data(), v.data(), 3, 0.0, nullptr}}, h, 1, HostSimd::Scalar),
                    Error);
}

// The host AdamW's (and BLAS's) threads per rank: OMP_NUM_THREADS / OPENBLAS_NUM_THREADS win, else the node's
// cores over its ranks (or the bound cores), at most SLURM_CPUS_PER_TASK.
BOOST_AUTO_TEST_CASE(default_threads_follow_the_environment) {
  const char* names[] = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"};
  std::vector<std::pair<std::string, bool>> saved;
  for (const char* n : names) {
    const char* v = std::getenv(n);
    saved.push_back({v ? v : "", v != nullptr});
    unsetenv(n);
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  BOOST_TEST(cpu_default_threads(1) >= 1);
  BOOST_TEST(cpu_default_threads(1) <= std::max(1, cores));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const bool bound = sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) < cores;
  if (!bound) BOOST_TEST(cpu_default_threads(4 * std::max(1, cores)) == 1);  // more ranks than cores: one each
  setenv("SLURM_CPUS_PER_TASK", "1", 1);
  BOOST_TEST(cpu_default_threads(1) == 1);
  setenv("OMP_NUM_THREADS", "3", 1);
  BOOST_TEST(cpu_default_threads(1) == 3);  // the user's explicit count wins over Slurm's share
  setenv("OPENBLAS_NUM_THREADS", "5", 1);
  BOOST_TEST(cpu_default_threads(2) == 5);
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i].second)
      setenv(names[i], saved[i].first.c_str(), 1);
    else
      unsetenv(names[i]);
  }
}

// CPU offload updates a slice in chunks as they go up (AdamW::update_slice): any cut of every slice,
// with the compute-dtype copy written per chunk, gives step()'s bits.
BOOST_AUTO_TEST_CASE(update_slice_in_pieces_gives_the_step_bits) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  const size_t n0 = 300000, n1 = 4100;  // several host AdamW pieces; a slice of one piece
  std::vector<float> p0(n0), g0(n0), p1(n1), g1(n1);
  for (auto* v : {&p0, &g0, &p1, &g1})
    for (float& x : *v) x = normal(rng);
  std::vector<float> q0 = p0, q1 = p1;
  std::vector<uint16_t> out0(n0), out1(n1), want0(n0), want1(n1);
  const std::vector<std::pair<size_t, size_t>> no_decay0 = {{10, 70000}, {200000, 200001}}, no_decay1 = {{0, 5}};
  AdamWOptions opt{0.9, 0.95, 1e-8, 0.1};
  auto cpu = make_cpu_backend(2);
  AdamW whole(*cpu, {{p0.data(), g0.data(), n0, no_decay0, want0.data()}, {p1.data(), g1.data(), n1, no_decay1, want1.data()}},
              opt, DType::BF16);
  AdamW pieces(*cpu, {{q0.data(), g0.data(), n0, no_decay0, nullptr}, {q1.data(), g1.data(), n1, no_decay1, nullptr}},
               opt, DType::BF16);
  for (int step = 1; step <= 3; ++step) {
    whole.step(1e-3 * step, 0.5f);
    const StepHyper h = pieces.begin_step(1e-3 * step, 0.5f);
    BOOST_TEST(h.step == step);
    // Uneven cuts, slice 1 before slice 0, one cut inside a no-decay range.
    pieces.update_slice(1, 0, n1, out1.data(), h);
    for (size_t b : {size_t(0), size_t(65536), size_t(150001)}) {
      const size_t e = b == 0 ? 65536 : b == 65536 ? 150001 : n0;
      pieces.update_slice(0, b, e, out0.data() + b, h);
    }
    BOOST_TEST(std::memcmp(p0.data(), q0.data(), n0 * sizeof(float)) == 0);
    BOOST_TEST(std::memcmp(p1.data(), q1.data(), n1 * sizeof(float)) == 0);
    BOOST_TEST(out0 == want0);
    BOOST_TEST(out1 == want1);
    for (size_t k = 0; k < 2; ++k)
      for (size_t i = 0; i < 2; ++i)
        BOOST_TEST(std::memcmp(whole.state(i, k), pieces.state(i, k), (i == 0 ? n0 : n1) * sizeof(float)) == 0);
  }
  BOOST_TEST(pieces.steps_taken() == 3);
}

// Offload's host gradient: each dtype's reduced slice summed into fp32 (overwriting after zero_grad,
// adding after), with the sum of squares of the result, the same bits on any thread count.
BOOST_AUTO_TEST_CASE(host_gradient_accumulation_matches_the_device_arithmetic) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  const size_t n = 3 * kHostAdamWPiece + 77;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    BOOST_TEST_CONTEXT(dtype_name(dt)) {
      std::vector<float> a(n), b(n);
      for (float& x : a) x = normal(rng);
      for (float& x : b) x = normal(rng);
      if (dt != DType::F32) round_to(dt, a.data(), n), round_to(dt, b.data(), n);
      std::vector<uint16_t> a16(n), b16(n);
      if (dt != DType::F32) pack16(dt, a.data(), a16.data(), n), pack16(dt, b.data(), b16.data(), n);
      const void* in_a = dt == DType::F32 ? static_cast<const void*>(a.data()) : a16.data();
      const void* in_b = dt == DType::F32 ? static_cast<const void*>(b.data()) : b16.data();
      std::vector<float> acc_ref(n);
      for (size_t i = 0; i < n; ++i) acc_ref[i] = (0.0f + a[i]) + b[i];
      std::vector<float> first_acc;
      double first_sum = 0;
      for (int threads : {1, 3}) {
        std::vector<float> acc(n, 123.0f);  // stale values: the first call overwrites them
        double s1 = -1, s2 = -1;
        host_accumulate_grad(acc.data(), in_a, dt, n, true, &s1, threads);
        BOOST_TEST(std::memcmp(acc.data(), a.data(), n * sizeof(float)) == 0);
        host_accumulate_grad(acc.data(), in_b, dt, n, false, &s2, threads);
        BOOST_TEST(std::memcmp(acc.data(), acc_ref.data(), n * sizeof(float)) == 0);
        double want = 0;
        for (float x : acc_ref) want += static_cast<double>(x) * x;
        BOOST_TEST(s2 == want, boost::test_tools::tolerance(1e-12));
        BOOST_TEST(host_sum_squares(acc.data(), n, threads) == s2);  // the same order, the same bits
        if (threads == 1) {
          first_acc = acc, first_sum = s2;
        } else {
          BOOST_TEST(acc == first_acc);
          BOOST_TEST(s2 == first_sum);
        }
      }
    }
  }
  std::vector<float> acc(4, 0.0f);
  const float ones[4] = {1, 1, 1, 1};
  host_accumulate_grad(acc.data(), ones, DType::F32, 4, false, nullptr, 2);  // no sum asked
  BOOST_TEST(acc == std::vector<float>(4, 1.0f));
}

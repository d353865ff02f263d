// Tests of optim: AdamW against a double-precision transcription of torch.optim.AdamW, LR schedules, clipping.
#define BOOST_TEST_MODULE test_optim
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <random>

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
  BOOST_TEST(scheduled_lr(LrSchedule::Constant, 2.0, 1, 4, 10) == 0.5);
}

BOOST_AUTO_TEST_CASE(clipping_factor) {
  BOOST_TEST(clip_factor(0.5, 1.0) == 1.0);
  BOOST_TEST(clip_factor(4.0, 1.0) == 1.0 / (4.0 + 1e-6), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(clip_factor(4.0, 0.0) == 1.0);
}

// Tests of optim: AdamW against a double-precision transcription of torch.optim.AdamW, LR schedules, clipping.
#define BOOST_TEST_MODULE test_optim
#include <boost/test/unit_test.hpp>

#include <cmath>
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
  AdamW adam({slice}, opt);
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
  AdamW adam({ParamSlice{p.data(), g.data(), 2, {{1, 2}}}}, AdamWOptions{0.9, 0.999, 1e-8, 0.5});
  adam.step(0.1);
  BOOST_TEST(p[0] == 1.0f * (1 - 0.05f) - 0.1f, boost::test_tools::tolerance(1e-5f));
  BOOST_TEST(p[1] == 2.0f + 0.1f, boost::test_tools::tolerance(1e-5f));  // no decay on index 1
}

BOOST_AUTO_TEST_CASE(linear_schedule_with_warmup) {
  BOOST_TEST(scheduled_lr("linear", 1.0, 0, 4, 12) == 0.0);
  BOOST_TEST(scheduled_lr("linear", 1.0, 2, 4, 12) == 0.5);
  BOOST_TEST(scheduled_lr("linear", 1.0, 4, 4, 12) == 1.0);
  BOOST_TEST(scheduled_lr("linear", 1.0, 8, 4, 12) == 0.5);
  BOOST_TEST(scheduled_lr("linear", 1.0, 12, 4, 12) == 0.0);
  BOOST_TEST(scheduled_lr("linear", 2.0, 0, 0, 10) == 2.0);
  BOOST_TEST(scheduled_lr("constant", 2.0, 9, 3, 10) == 2.0);
  BOOST_TEST(scheduled_lr("constant", 2.0, 1, 4, 10) == 0.5);
}

BOOST_AUTO_TEST_CASE(clipping_factor) {
  BOOST_TEST(clip_factor(0.5, 1.0) == 1.0);
  BOOST_TEST(clip_factor(4.0, 1.0) == 1.0 / (4.0 + 1e-6), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(clip_factor(4.0, 0.0) == 1.0);
}

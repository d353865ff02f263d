// Tests of the 8-bit AdamW (train.optim = adamw_8bit): its update against a plain reference written here
// from the documented maps, bit for bit over several steps; pieces against whole steps; the checkpoint
// round trip of its state; and that it tracks fp32 AdamW on a small problem.
#define BOOST_TEST_MODULE test_optim_8bit
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "shardlm/optim.hpp"

using namespace shardlm;

namespace {

// The reference: one slice's moments as codes and block scales, updated element by element with the
// formulas of docs/design.md's 8-bit AdamW section, written without the library's helpers.
struct Reference {
  std::vector<int8_t> m_code;
  std::vector<uint8_t> v_code;
  std::vector<float> m_scale, v_scale;
  explicit Reference(size_t n)
      : m_code(n, 0), v_code(n, 0), m_scale((n + 255) / 256, 0.f), v_scale((n + 255) / 256, 0.f) {}
};

float ref_m(int8_t code, float scale) {
  const float t = float(std::abs(int(code))) / 127.0f;
  return code < 0 ? -(scale * (t * t)) : scale * (t * t);
}
float ref_v(uint8_t code, float scale) {
  const float t = float(code) / 255.0f;
  return scale * ((t * t) * (t * t));
}

void reference_step(Reference& r, std::vector<float>& p, const std::vector<float>& g, long step, double lr,
                    const AdamWOptions& o, float grad_scale, const std::vector<std::pair<size_t, size_t>>& no_decay) {
  const float b1 = float(o.beta1), b2 = float(o.beta2);
  const float step_size = float(double(float(lr)) / double(float(1.0 - std::pow(o.beta1, double(step)))));
  const float c2 = float(std::sqrt(double(float(1.0 - std::pow(o.beta2, double(step))))));
  const float decay = float(1.0 - double(float(lr)) * float(o.weight_decay));
  const size_t n = p.size();
  for (size_t b = 0; b * 256 < n; ++b) {
    const size_t lo = b * 256, hi = std::min(n, lo + 256);
    std::vector<float> m(hi - lo), v(hi - lo);
    float mmax = 0, vmax = 0;
    for (size_t i = lo; i < hi; ++i) {
      bool decays = true;
      for (auto [a, e] : no_decay) decays = decays && !(i >= a && i < e);
      float mi = ref_m(r.m_code[i], r.m_scale[b]), vi = ref_v(r.v_code[i], r.v_scale[b]);
      const float gk = g[i] * grad_scale;
      if (decays) p[i] *= decay;
      mi = mi + (1.0f - b1) * (gk - mi);
      vi = vi * b2 + ((1.0f - b2) * gk) * gk;
      p[i] = p[i] - step_size * (mi / (std::sqrt(vi) / c2 + float(o.eps)));
      m[i - lo] = mi, v[i - lo] = vi;
      mmax = std::max(mmax, std::fabs(mi)), vmax = std::max(vmax, vi);
    }
    r.m_scale[b] = mmax, r.v_scale[b] = vmax;
    for (size_t i = lo; i < hi; ++i) {
      const float qm = mmax > 0 ? std::nearbyint(std::sqrt(std::fabs(m[i - lo]) / mmax) * 127.0f) : 0.0f;
      r.m_code[i] = int8_t(m[i - lo] < 0 ? -qm : qm);
      r.v_code[i] = uint8_t(vmax > 0 ? std::nearbyint(std::sqrt(std::sqrt(v[i - lo] / vmax)) * 255.0f) : 0.0f);
    }
  }
}

std::vector<float> normal_vector(size_t n, std::mt19937& rng, float sigma) {
  std::normal_distribution<float> normal(0.f, sigma);
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

}  // namespace

BOOST_AUTO_TEST_CASE(update_matches_the_reference_bit_for_bit) {
  std::mt19937 rng(7);
  const size_t n = 3 * 256 + 77;  // a partial last block
  std::vector<float> p = normal_vector(n, rng, 1.f), g(n), q = p;
  const std::vector<std::pair<size_t, size_t>> no_decay = {{10, 300}, {700, 701}};
  const AdamWOptions opt{0.9, 0.95, 1e-8, 0.1};
  auto cpu = make_cpu_backend(2);
  AdamW8bit adam(*cpu, {{p.data(), g.data(), n, no_decay, nullptr}}, opt);
  Reference ref(n);
  std::vector<float> m(n), v(n);
  for (int step = 1; step <= 8; ++step) {
    const std::vector<float> fresh = normal_vector(n, rng, step % 2 ? 1e-3f : 3.0f);  // 3000x apart in turn
    std::copy(fresh.begin(), fresh.end(), g.begin());  // in place: the optimizer holds g's address
    adam.step(1e-2 * step, 0.75f);
    reference_step(ref, q, g, step, 1e-2 * step, opt, 0.75f, no_decay);
    BOOST_TEST(std::memcmp(p.data(), q.data(), n * sizeof(float)) == 0);
    adam.read_state(0, 0, m.data());
    adam.read_state(0, 1, v.data());
    for (size_t i = 0; i < n; i += 37) {
      BOOST_TEST(m[i] == ref_m(ref.m_code[i], ref.m_scale[i / 256]));
      BOOST_TEST(v[i] == ref_v(ref.v_code[i], ref.v_scale[i / 256]));
    }
  }
  BOOST_TEST(adam.state_bytes() == 2 * n + 2 * 4 * sizeof(float));
  BOOST_TEST(optimizer_state_bytes(Optim::AdamW8bit, n) == adam.state_bytes());
}

// CPU offload updates block-aligned pieces (Optimizer::piece_align): every piece once gives step()'s bits,
// the compute-dtype copy included; a piece that cuts a block is refused.
BOOST_AUTO_TEST_CASE(pieces_give_the_step_bits) {
  std::mt19937 rng(11);
  const size_t n = 5000;
  std::vector<float> p = normal_vector(n, rng, 1.f), g = normal_vector(n, rng, 1.f), q = p;
  std::vector<uint16_t> want(n), out(n);
  const std::vector<std::pair<size_t, size_t>> no_decay = {{100, 2000}};
  const AdamWOptions opt{0.9, 0.999, 1e-8, 0.01};
  auto cpu = make_cpu_backend(1);
  AdamW8bit whole(*cpu, {{p.data(), g.data(), n, no_decay, want.data()}}, opt, DType::BF16);
  AdamW8bit pieces(*cpu, {{q.data(), g.data(), n, no_decay, nullptr}}, opt, DType::BF16);
  BOOST_TEST(pieces.piece_align() == kQuantBlock);
  for (int step = 1; step <= 3; ++step) {
    whole.step(1e-3, 1.0f);
    const StepHyper h = pieces.begin_step(1e-3, 1.0f);
    pieces.update_slice(0, 2048, n, out.data() + 2048, h);
    pieces.update_slice(0, 0, 2048, out.data(), h);
    BOOST_TEST(std::memcmp(p.data(), q.data(), n * sizeof(float)) == 0);
    BOOST_TEST(out == want);
  }
  BOOST_CHECK_THROW(pieces.update_slice(0, 100, 512, nullptr, pieces.begin_step(1e-3, 1.0f)), Error);
}

// Checkpoints keep the dequantised fp32 moments; written back into a fresh optimizer they give the same
// codes, so the steps after a resume are those of the run that never stopped.
BOOST_AUTO_TEST_CASE(state_round_trip_resumes_exactly) {
  std::mt19937 rng(5);
  const size_t n = 1000;
  std::vector<float> p = normal_vector(n, rng, 1.f), g(n);
  const AdamWOptions opt{0.9, 0.999, 1e-8, 0.01};
  auto cpu = make_cpu_backend(1);
  AdamW8bit a(*cpu, {{p.data(), g.data(), n, {}, nullptr}}, opt);
  for (int step = 1; step <= 4; ++step) {
    const std::vector<float> fresh = normal_vector(n, rng, 0.1f);
    std::copy(fresh.begin(), fresh.end(), g.begin());
    a.step(1e-3);
  }
  std::vector<float> q = p, m(n), v(n);
  a.read_state(0, 0, m.data());
  a.read_state(0, 1, v.data());
  AdamW8bit b(*cpu, {{q.data(), g.data(), n, {}, nullptr}}, opt);
  b.write_state(0, 0, m.data());
  b.write_state(0, 1, v.data());
  b.set_steps_taken(a.steps_taken());
  std::vector<float> m2(n), v2(n);
  b.read_state(0, 0, m2.data());
  b.read_state(0, 1, v2.data());
  BOOST_TEST(std::memcmp(m.data(), m2.data(), n * sizeof(float)) == 0);
  BOOST_TEST(std::memcmp(v.data(), v2.data(), n * sizeof(float)) == 0);
  for (int step = 5; step <= 8; ++step) {
    const std::vector<float> fresh = normal_vector(n, rng, 0.1f);
    std::copy(fresh.begin(), fresh.end(), g.begin());
    a.step(1e-3);
    b.step(1e-3);
    BOOST_TEST(std::memcmp(p.data(), q.data(), n * sizeof(float)) == 0);
  }
}

// On a noisy quadratic whose curvatures span four orders of magnitude (so blocks hold small and large
// moments together), 8-bit AdamW reaches fp32 AdamW's loss (measured: 0.0077 against 0.0085, from 5.36)
// and ends near its point: the mean gap is 5.7% of the mean distance travelled, most of it the noise's
// jitter around the minimum that either optimizer keeps.
BOOST_AUTO_TEST_CASE(tracks_fp32_adamw_on_a_small_problem) {
  std::mt19937 rng(3);
  const size_t n = 4096;
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<float> curvature(n), target = normal_vector(n, rng, 1.f), start(n, 0.f);
  for (float& c : curvature) c = std::pow(10.f, 4.f * unit(rng) - 2.f);
  std::vector<float> x32 = start, x8 = start, g32(n), g8(n);
  const AdamWOptions opt{0.9, 0.999, 1e-8, 0.0};
  auto cpu = make_cpu_backend(1);
  AdamW full(*cpu, {{x32.data(), g32.data(), n, {}, nullptr}}, opt);
  AdamW8bit quant(*cpu, {{x8.data(), g8.data(), n, {}, nullptr}}, opt);
  auto loss = [&](const std::vector<float>& x) {
    double l = 0;
    for (size_t i = 0; i < n; ++i) l += 0.5 * curvature[i] * double(x[i] - target[i]) * (x[i] - target[i]);
    return l / n;
  };
  std::normal_distribution<float> noise(0.f, 1.f);
  const double first = loss(start);
  for (int step = 1; step <= 400; ++step) {
    for (size_t i = 0; i < n; ++i) {
      const float e = 0.05f * curvature[i] * noise(rng);  // the same noise for both
      g32[i] = curvature[i] * (x32[i] - target[i]) + e;
      g8[i] = curvature[i] * (x8[i] - target[i]) + e;
    }
    full.step(1e-2);
    quant.step(1e-2);
  }
  double gap = 0, travelled = 0;
  for (size_t i = 0; i < n; ++i) gap += std::fabs(x8[i] - x32[i]), travelled += std::fabs(x32[i] - start[i]);
  BOOST_TEST_MESSAGE("loss " << first << " -> fp32 " << loss(x32) << ", 8-bit " << loss(x8) << "; mean |x8 - x32| / "
                             "mean |x32 - x0| = " << gap / travelled);
  BOOST_TEST(loss(x32) < 0.05 * first);
  BOOST_TEST(std::fabs(loss(x8) - loss(x32)) < 0.1 * loss(x32) + 1e-4 * first);
  BOOST_TEST(gap / travelled < 0.1);
}

// Tests of the Llama pieces of the CUDA backend (label gpu): the kernels they use
// (RMSNorm, rotary embeddings with Llama 3.1's rope_scaling, SwiGLU, causal grouped-query attention)
// against double-precision host references that mirror src/model/llama_cpu.cpp, in fp32, bf16 and
// fp16 (attention's backward recomputing the probabilities from the saved log-sum-exp; SwiGLU's backward that
// writes the activation too, bit for bit against the separate kernels), with the references' backward passes
// checked against finite differences; then the UnitModel of the CUDA
// backend (LlamaCuda) against the CPU backend's (LlamaCpu) on a tiny model: loss and every
// parameter gradient of one forward/backward, GQA, tied and untied heads, with and without
// activation checkpointing, Qwen3's q/k norms and Mistral's sliding window (native and cuDNN), and
// their activation bytes against unit_model_memory's; FP8 linear layers with and without checkpointing (the
// backward reusing the forward's amaxes); and LoRA in the CUDA models (Llama, Qwen2, Qwen3,
// Mistral and BLOOM) against the CPU models': loss, adapter gradients, the input
// gradients through the blocks, no base gradient where the base is frozen; with LoRA dropout the same
// masks on both backends (with and without checkpointing), and evaluation as without dropout.
#define BOOST_TEST_MODULE test_cuda_llama
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpu_model_test_support.hpp"
#include "cuda_test_support.hpp"
#include "gemm.hpp"
#include "gqa_attention.hpp"
#include "llama/cuda/llama_cuda.hpp"
#include "lora_dropout.hpp"
#include "rmsnorm.hpp"
#include "rotary.hpp"
#include "swiglu.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

using namespace shardlm;
using shardlm::cuda::Gemm;

namespace {

using namespace cuda_test;

const DType kAllDtypes[] = {DType::F32, DType::BF16, DType::F16};

// ---- host helpers ---------------------------------------------------------------------------

// Activations stored in dt, relative to the largest value: a few units in dt's last place.
double output_tolerance(DType dt) { return dt == DType::F32 ? 1e-5 : (dt == DType::BF16 ? 1.5e-2 : 3e-3); }

// A device buffer of n elements of dt, `shift` elements past a 256-byte boundary (shift 1: the
// kernels must take their unaligned paths).
struct Placed {
  DeviceBuffer buffer;
  void* at;
  Placed(size_t n, DType dt, int shift)
      : buffer((n + 16) * dtype_size(dt)), at(buffer.offset(static_cast<size_t>(shift) * dtype_size(dt))) {}
};

Placed placed(const std::vector<float>& v, DType dt, int shift) {
  Placed p(v.size(), dt, shift);
  upload(p.at, v, dt);
  return p;
}

struct OwnedStream {  // a stream of its own, destroyed with it
  cudaStream_t s = nullptr;
  OwnedStream() { CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~OwnedStream() { cudaStreamDestroy(s); }
  void sync() {
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaGetLastError());
  }
};

double dot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---- RMSNorm reference (llama_cpu.cpp's rms_norm_row and its backward, in double) -----------

std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w, int n, int H, float eps,
                                std::vector<double>* rstd = nullptr) {
  std::vector<double> y(x.size());
  if (rstd) rstd->assign(n, 0.0);
  for (int r = 0; r < n; ++r) {
    double squares = 0.0;
    for (int c = 0; c < H; ++c) squares += x[static_cast<size_t>(r) * H + c] * x[static_cast<size_t>(r) * H + c];
    const double rs = 1.0 / std::sqrt(squares / H + eps);
    if (rstd) (*rstd)[r] = rs;
    for (int c = 0; c < H; ++c) y[static_cast<size_t>(r) * H + c] = x[static_cast<size_t>(r) * H + c] * rs * w[c];
  }
  return y;
}

// dx of the norm and the increment of dweight, given dy.
void rmsnorm_backward_ref(const std::vector<double>& dy, const std::vector<double>& x, const std::vector<double>& w,
                          int n, int H, float eps, std::vector<double>& dx, std::vector<double>& dweight) {
  std::vector<double> rstd;
  rmsnorm_ref(x, w, n, H, eps, &rstd);
  dx.assign(x.size(), 0.0);
  dweight.assign(H, 0.0);
  for (int r = 0; r < n; ++r) {
    const size_t at = static_cast<size_t>(r) * H;
    double sum = 0.0;
    for (int c = 0; c < H; ++c) sum += dy[at + c] * w[c] * x[at + c] * rstd[r];
    const double mean = sum / H;
    for (int c = 0; c < H; ++c) {
      const double xhat = x[at + c] * rstd[r];
      dx[at + c] = rstd[r] * (dy[at + c] * w[c] - xhat * mean);
      dweight[c] += dy[at + c] * xhat;
    }
  }
}

// The bits of max |v| over v, as the FP8 amax holds them (fp8_amax.cuh): NaN's bits above inf's.
unsigned amax_bits_of(const std::vector<float>& v) {
  unsigned m = 0;
  for (float x : v) {
    unsigned bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    m = std::max(m, bits & 0x7fffffffu);
  }
  return m;
}

// An amax word against the host's: the same bits, or both NaN (the device's fp16 NaN reads back as another
// NaN pattern than the host's conversion gives, and fp8_quantize's own pass reads it as the device does).
bool same_amax(unsigned got, unsigned want) {
  const unsigned inf = 0x7f800000u;
  return got == want || (got > inf && want > inf);
}

// `offset` (Gemma's 1): the kernels' weight_offset; the references see the weight offset + w.
void check_rmsnorm(int n, int H, DType dt, int shift, unsigned seed, float offset = 0.0f) {
  BOOST_TEST_CONTEXT("rmsnorm n=" << n << " H=" << H << " dt=" << dtype_name(dt) << " shift=" << shift
                                  << " offset=" << offset) {
    std::mt19937 rng(seed);
    const float eps = 1e-5f;
    const size_t size = static_cast<size_t>(n) * H;
    const std::vector<float> x = random_values(size, rng, dt, 1.0f, 0.3f);
    const std::vector<float> w = random_values(H, rng, dt, 0.1f, 1.0f);
    const std::vector<float> dy = random_values(size, rng, dt);
    const std::vector<float> dx0 = random_values(size, rng, dt);
    const std::vector<float> dw0 = random_values(H, rng, DType::F32, 0.5f);
    Placed d_x = placed(x, dt, shift), d_w = placed(w, dt, shift), d_dy = placed(dy, dt, shift);
    Placed d_y(size, dt, shift), d_dx(size, dt, shift);
    DeviceBuffer d_rstd(n * sizeof(float)), d_dw = to_device(dw0, DType::F32);
    OwnedStream s;
    cuda::rmsnorm_forward(d_x.at, d_w.at, d_y.at, d_rstd.as<float>(), n, H, eps, dt, s.s, offset);
    s.sync();
    std::vector<double> rstd, w_eff = to_double(w);
    for (double& v : w_eff) v += offset;
    const std::vector<double> y = rmsnorm_ref(to_double(x), w_eff, n, H, eps, &rstd);
    BOOST_TEST(relative_error(download(d_y.at, size, dt), y) <= output_tolerance(dt));
    BOOST_TEST(relative_error(download(d_rstd.get(), n, DType::F32), rstd) <= 1e-5);  // fp32 sums of exact inputs
    {  // given an amax word (FP8): the same y, and in the word y's amax as stored, bit for bit
      Placed d_y2(size, dt, shift);
      DeviceBuffer word(sizeof(unsigned));
      CUDA_OK(cudaMemset(word.get(), 0xff, sizeof(unsigned)));  // the launcher zeroes it first
      cuda::rmsnorm_forward(d_x.at, d_w.at, d_y2.at, d_rstd.as<float>(), n, H, eps, dt, s.s, offset,
                            word.as<unsigned>());
      s.sync();
      const std::vector<float> y1 = download(d_y.at, size, dt), y2 = download(d_y2.at, size, dt);
      BOOST_TEST(std::memcmp(y1.data(), y2.data(), size * sizeof(float)) == 0);
      unsigned got = 0;
      CUDA_OK(cudaMemcpy(&got, word.get(), sizeof got, cudaMemcpyDeviceToHost));
      BOOST_TEST(same_amax(got, amax_bits_of(y1)), got << " against " << amax_bits_of(y1));
    }

    std::vector<double> dx, dw;
    rmsnorm_backward_ref(to_double(dy), to_double(x), w_eff, n, H, eps, dx, dw);
    for (bool accumulate : {false, true}) {
      BOOST_TEST_CONTEXT((accumulate ? "dx +=" : "dx =")) {
        upload(d_dx.at, dx0, dt);
        upload(d_dw.get(), dw0, DType::F32);
        cuda::rmsnorm_backward(d_dy.at, d_x.at, d_w.at, d_rstd.as<float>(), d_dx.at, d_dw.as<float>(), n, H,
                               accumulate, dt, s.s, offset);
        s.sync();
        std::vector<double> want_dx = dx;
        if (accumulate)
          for (size_t i = 0; i < size; ++i) want_dx[i] += dx0[i];
        BOOST_TEST(relative_error(download(d_dx.at, size, dt), want_dx) <= output_tolerance(dt));
        const std::vector<float> got_dw = download(d_dw.get(), H, DType::F32);
        std::vector<float> increment(H);
        for (int c = 0; c < H; ++c) increment[c] = got_dw[c] - dw0[c];
        BOOST_TEST(relative_error(increment, dw) <= 2e-5);  // fp32 sums of exact inputs
      }
    }
    // A frozen weight (null dweight, LoRA's base): the same dx, no weight gradient.
    upload(d_dx.at, dx0, dt);
    cuda::rmsnorm_backward(d_dy.at, d_x.at, d_w.at, d_rstd.as<float>(), d_dx.at, nullptr, n, H, false, dt, s.s, offset);
    s.sync();
    BOOST_TEST(relative_error(download(d_dx.at, size, dt), dx) <= output_tolerance(dt), "frozen weight");
  }
}

// ---- rotary reference (llama_cpu.cpp's apply_rotary, angles as LlamaCpu forms them) ----------

std::vector<double> rotary_ref(const std::vector<float>& x, int n, int T, int heads, int d, int ld,
                               const std::vector<float>& inv_freq, bool inverse) {
  std::vector<double> out = to_double(x);
  const int half = d / 2;
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(r % T) * inv_freq[i];
      const double c = std::cos(static_cast<double>(angle));
      const double s = (inverse ? -1.0 : 1.0) * std::sin(static_cast<double>(angle));
      for (int h = 0; h < heads; ++h) {
        const size_t at = static_cast<size_t>(r) * ld + static_cast<size_t>(h) * d;
        const double x1 = x[at + i], x2 = x[at + i + half];
        out[at + i] = x1 * c - x2 * s;
        out[at + i + half] = x2 * c + x1 * s;
      }
    }
  return out;
}

// `heads` rotated heads at the start of rows of `heads + untouched` heads; the rows start `lead` elements into
// the buffer (lead 1: x not aligned to the kernel's packs, one element an access).
void check_rotary(int B, int T, int heads, int untouched, const ModelConfig& rope, DType dt, unsigned seed,
                  int lead = 0) {
  const int d = rope.head_dim(), ld = (heads + untouched) * d, n = B * T;
  BOOST_TEST_CONTEXT("rotary B=" << B << " T=" << T << " heads=" << heads << " +" << untouched << " d=" << d
                                 << " factor=" << rope.rope_scaling.factor << " dt=" << dtype_name(dt)
                                 << " lead=" << lead) {
    std::mt19937 rng(seed);
    const size_t size = static_cast<size_t>(n) * ld;
    const std::vector<float> x = random_values(size, rng, dt);
    std::vector<float> padded(lead, 0.0f);
    padded.insert(padded.end(), x.begin(), x.end());
    const std::vector<float> inv_freq = rope_inv_freq(rope);
    DeviceBuffer d_buf = to_device(padded, dt), d_freq = to_device(inv_freq, DType::F32);
    void* d_x = static_cast<char*>(d_buf.get()) + static_cast<size_t>(lead) * dtype_size(dt);
    const auto rows = [&] {
      const std::vector<float> all = download(d_buf.get(), padded.size(), dt);
      return std::vector<float>(all.begin() + lead, all.end());
    };
    OwnedStream s;
    for (bool inverse : {false, true}) {
      upload(d_buf.get(), padded, dt);
      cuda::rotary_apply(d_x, n, T, heads, d, ld, d_freq.as<float>(), inverse, dt, s.s);
      s.sync();
      const std::vector<float> got = rows();
      BOOST_TEST(relative_error(got, rotary_ref(x, n, T, heads, d, ld, inv_freq, inverse)) <= output_tolerance(dt),
                 (inverse ? "inverse" : "forward"));
      size_t changed = 0;  // the heads after the rotated ones (v) are left alone, bit for bit
      for (int r = 0; r < n; ++r)
        for (int c = heads * d; c < ld; ++c) {
          const size_t at = static_cast<size_t>(r) * ld + c;
          changed += got[at] != x[at];
        }
      BOOST_TEST(changed == 0u);
    }
    if (dt != DType::F32) return;
    // The inverse undoes the forward (it is the transpose of an orthogonal map: the backward).
    upload(d_buf.get(), padded, dt);
    cuda::rotary_apply(d_x, n, T, heads, d, ld, d_freq.as<float>(), false, dt, s.s);
    cuda::rotary_apply(d_x, n, T, heads, d, ld, d_freq.as<float>(), true, dt, s.s);
    s.sync();
    BOOST_TEST(relative_error(rows(), x) <= 1e-5);
  }
}

// ---- SwiGLU reference ------------------------------------------------------------------------

double sigmoid_ref(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// GeGLU's activation (Gemma): tanh-approximated GELU and its derivative, in double.
double gelu_tanh_ref(double x) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad_ref(double x) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846), t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// act(gate) * up with act SiLU, or GELU's tanh approximation with `geglu`.
std::vector<double> swiglu_ref(const std::vector<double>& gate_up, int n, int F, bool geglu = false) {
  std::vector<double> out(static_cast<size_t>(n) * F);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < F; ++c) {
      const double g = gate_up[static_cast<size_t>(r) * 2 * F + c], u = gate_up[static_cast<size_t>(r) * 2 * F + F + c];
      out[static_cast<size_t>(r) * F + c] = (geglu ? gelu_tanh_ref(g) : g * sigmoid_ref(g)) * u;
    }
  return out;
}

std::vector<double> swiglu_backward_ref(const std::vector<double>& dout, const std::vector<double>& gate_up, int n,
                                        int F, bool geglu = false) {
  std::vector<double> d(gate_up.size());
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < F; ++c) {
      const size_t at = static_cast<size_t>(r) * 2 * F + c;
      const double g = gate_up[at], u = gate_up[at + F], s = sigmoid_ref(g), dy = dout[static_cast<size_t>(r) * F + c];
      d[at] = dy * u * (geglu ? gelu_tanh_grad_ref(g) : s * (1.0 + g * (1.0 - s)));
      d[at + F] = dy * (geglu ? gelu_tanh_ref(g) : g * s);
    }
  return d;
}

// SwiGLU's kernels, or with `geglu` GeGLU's (swiglu.hpp), forward and backward.
void gated_forward(bool geglu, const void* gate_up, void* out, int n, int F, DType dt, cudaStream_t s,
                   unsigned* word = nullptr) {
  if (geglu)
    cuda::geglu_tanh_forward(gate_up, out, n, F, dt, s, word);
  else
    cuda::swiglu_forward(gate_up, out, n, F, dt, s, word);
}
void gated_backward(bool geglu, const void* dout, const void* gate_up, void* dgate_up, int n, int F, DType dt,
                    cudaStream_t s, unsigned* word = nullptr, void* act = nullptr) {
  if (geglu)
    cuda::geglu_tanh_backward(dout, gate_up, dgate_up, n, F, dt, s, word, act);
  else
    cuda::swiglu_backward(dout, gate_up, dgate_up, n, F, dt, s, word, act);
}

// The gated kernels given an amax word: the same outputs (`out`, `dgate_up`: those of a run without one), and
// the word the amax of each, as stored, bit for bit (what fp8_quantize's own pass would reduce).
void check_gated_amax(const void* gate_up, const void* dout, int n, int F, DType dt, int shift, bool geglu,
                      const std::vector<float>& out, const std::vector<float>& dgate_up) {
  const size_t wide = static_cast<size_t>(n) * F;
  Placed d_out(wide, dt, shift), d_dgu(2 * wide, dt, shift);
  DeviceBuffer words(2 * sizeof(unsigned));
  unsigned* word = words.as<unsigned>();
  CUDA_OK(cudaMemset(word, 0xff, 2 * sizeof(unsigned)));  // the kernels zero them first
  OwnedStream s;
  gated_forward(geglu, gate_up, d_out.at, n, F, dt, s.s, word);
  gated_backward(geglu, dout, gate_up, d_dgu.at, n, F, dt, s.s, word + 1);
  s.sync();
  unsigned got[2] = {0, 0};
  CUDA_OK(cudaMemcpy(got, word, sizeof got, cudaMemcpyDeviceToHost));
  const std::vector<float> out2 = download(d_out.at, wide, dt), dgu2 = download(d_dgu.at, 2 * wide, dt);
  BOOST_TEST(std::memcmp(out2.data(), out.data(), wide * sizeof(float)) == 0);
  BOOST_TEST(std::memcmp(dgu2.data(), dgate_up.data(), 2 * wide * sizeof(float)) == 0);
  BOOST_TEST(same_amax(got[0], amax_bits_of(out)), got[0] << " against " << amax_bits_of(out));
  BOOST_TEST(same_amax(got[1], amax_bits_of(dgate_up)), got[1] << " against " << amax_bits_of(dgate_up));
}

// SwiGLU's kernels, or with `geglu` GeGLU's (geglu_tanh_forward / backward).
void check_swiglu(int n, int F, DType dt, int shift, unsigned seed, bool geglu = false) {
  BOOST_TEST_CONTEXT((geglu ? "geglu" : "swiglu") << " n=" << n << " F=" << F << " dt=" << dtype_name(dt)
                                                  << " shift=" << shift) {
    std::mt19937 rng(seed);
    const size_t wide = static_cast<size_t>(n) * F;
    const std::vector<float> gate_up = random_values(2 * wide, rng, dt, 2.0f);
    const std::vector<float> dout = random_values(wide, rng, dt);
    Placed d_gu = placed(gate_up, dt, shift), d_dout = placed(dout, dt, shift);
    Placed d_out(wide, dt, shift), d_dgu(2 * wide, dt, shift);
    OwnedStream s;
    gated_forward(geglu, d_gu.at, d_out.at, n, F, dt, s.s);
    gated_backward(geglu, d_dout.at, d_gu.at, d_dgu.at, n, F, dt, s.s);
    s.sync();
    BOOST_TEST(relative_error(download(d_out.at, wide, dt), swiglu_ref(to_double(gate_up), n, F, geglu)) <=
               output_tolerance(dt));
    BOOST_TEST(relative_error(download(d_dgu.at, 2 * wide, dt),
                              swiglu_backward_ref(to_double(dout), to_double(gate_up), n, F, geglu)) <=
               output_tolerance(dt));
    check_gated_amax(d_gu.at, d_dout.at, n, F, dt, shift, geglu, download(d_out.at, wide, dt),
                     download(d_dgu.at, 2 * wide, dt));
  }
}

// The gated backward given act_out (swiglu.hpp) against the separate kernels: dgate|dup and their amax the bits of
// the backward without it, act those of the forward; act_out over dout (LlamaCuda's in-place call) or apart (dout
// then left as it was).
void check_gated_backward_writing_act(int n, int F, DType dt, int shift, unsigned seed, bool geglu) {
  BOOST_TEST_CONTEXT((geglu ? "geglu" : "swiglu") << " n=" << n << " F=" << F << " dt=" << dtype_name(dt)
                                                  << " shift=" << shift) {
    std::mt19937 rng(seed);
    const size_t wide = static_cast<size_t>(n) * F;
    const std::vector<float> gate_up = random_values(2 * wide, rng, dt, 2.0f);
    const std::vector<float> dout = random_values(wide, rng, dt);
    Placed d_gu = placed(gate_up, dt, shift), d_out(wide, dt, shift), d_dgu(2 * wide, dt, shift);
    OwnedStream s;
    Placed d_dout = placed(dout, dt, shift);
    gated_forward(geglu, d_gu.at, d_out.at, n, F, dt, s.s);
    gated_backward(geglu, d_dout.at, d_gu.at, d_dgu.at, n, F, dt, s.s);
    s.sync();
    const std::vector<float> want_act = download(d_out.at, wide, dt), want_dgu = download(d_dgu.at, 2 * wide, dt);
    for (const bool in_place : {true, false}) {
      BOOST_TEST_CONTEXT((in_place ? "act over dout" : "act apart")) {
        Placed d_dy = placed(dout, dt, shift), d_act(wide, dt, shift), d_dgu2(2 * wide, dt, shift);
        void* act = in_place ? d_dy.at : d_act.at;
        DeviceBuffer word(sizeof(unsigned));
        CUDA_OK(cudaMemset(word.get(), 0xff, sizeof(unsigned)));  // the kernel zeroes it first
        gated_backward(geglu, d_dy.at, d_gu.at, d_dgu2.at, n, F, dt, s.s, word.as<unsigned>(), act);
        s.sync();
        const std::vector<float> got_act = download(act, wide, dt), got_dgu = download(d_dgu2.at, 2 * wide, dt);
        BOOST_TEST(std::memcmp(got_act.data(), want_act.data(), wide * sizeof(float)) == 0);
        BOOST_TEST(std::memcmp(got_dgu.data(), want_dgu.data(), 2 * wide * sizeof(float)) == 0);
        unsigned got = 0;
        CUDA_OK(cudaMemcpy(&got, word.get(), sizeof got, cudaMemcpyDeviceToHost));
        BOOST_TEST(same_amax(got, amax_bits_of(want_dgu)), got << " against " << amax_bits_of(want_dgu));
        if (!in_place) {
          const std::vector<float> dy_after = download(d_dy.at, wide, dt), dy_before = download(d_dout.at, wide, dt);
          BOOST_TEST(std::memcmp(dy_after.data(), dy_before.data(), wide * sizeof(float)) == 0);
        }
      }
    }
  }
}

// ---- grouped-query attention reference (llama_cpu.cpp's attention, in double) ---------------

struct AttnShape {
  int B, T, heads, kv_heads, d;
  int G() const { return heads / kv_heads; }
  int qw() const { return heads * d; }
  int ld() const { return (heads + 2 * kv_heads) * d; }
  size_t qkv_size() const { return static_cast<size_t>(B) * T * ld(); }
  size_t ctx_size() const { return static_cast<size_t>(B) * T * qw(); }
  size_t probs_size() const { return static_cast<size_t>(B) * heads * T * T; }
  size_t q_at(int b, int i, int n, int e) const { return (static_cast<size_t>(b) * T + i) * ld() + n * d + e; }
  size_t k_at(int b, int j, int g, int e) const { return (static_cast<size_t>(b) * T + j) * ld() + qw() + g * d + e; }
  size_t v_at(int b, int j, int g, int e) const { return k_at(b, j, g, e) + kv_heads * d; }
  size_t ctx_at(int b, int i, int n, int e) const { return (static_cast<size_t>(b) * T + i) * qw() + n * d + e; }
  size_t probs_at(int b, int n, int i, int j) const { return ((static_cast<size_t>(b) * heads + n) * T + i) * T + j; }
  size_t lse_size() const { return static_cast<size_t>(B) * heads * T; }
  size_t lse_at(int b, int n, int i) const { return (static_cast<size_t>(b) * heads + n) * T + i; }
};

// probs, ctx and, when asked, each row's log-sum-exp of the scores (what the GPU keeps for backward).
void attention_ref(const AttnShape& s, const std::vector<double>& qkv, std::vector<double>& probs,
                   std::vector<double>& ctx, std::vector<double>* lse = nullptr) {
  probs.assign(s.probs_size(), 0.0);
  ctx.assign(s.ctx_size(), 0.0);
  if (lse) lse->assign(s.lse_size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> row(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int n = 0; n < s.heads; ++n) {
      const int g = n / s.G();
      for (int i = 0; i < s.T; ++i) {
        double max_score = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          double dotp = 0.0;
          for (int e = 0; e < s.d; ++e) dotp += qkv[s.q_at(b, i, n, e)] * qkv[s.k_at(b, j, g, e)];
          row[j] = scale * dotp;
          max_score = std::max(max_score, row[j]);
        }
        double total = 0.0;
        for (int j = 0; j <= i; ++j) total += std::exp(row[j] - max_score);
        if (lse) (*lse)[s.lse_at(b, n, i)] = max_score + std::log(total);
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(row[j] - max_score) / total;
          probs[s.probs_at(b, n, i, j)] = p;
          for (int e = 0; e < s.d; ++e) ctx[s.ctx_at(b, i, n, e)] += p * qkv[s.v_at(b, j, g, e)];
        }
      }
    }
}

std::vector<double> attention_backward_ref(const AttnShape& s, const std::vector<double>& qkv,
                                           const std::vector<double>& probs, const std::vector<double>& dctx) {
  std::vector<double> dqkv(s.qkv_size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> dp(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int n = 0; n < s.heads; ++n) {
      const int g = n / s.G();
      for (int i = 0; i < s.T; ++i) {
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) {
          double v = 0.0;
          for (int e = 0; e < s.d; ++e) v += dctx[s.ctx_at(b, i, n, e)] * qkv[s.v_at(b, j, g, e)];
          dp[j] = v;
          sum += probs[s.probs_at(b, n, i, j)] * v;
        }
        for (int j = 0; j <= i; ++j) {
          const double p = probs[s.probs_at(b, n, i, j)];
          const double ds = p * (dp[j] - sum) * scale;
          for (int e = 0; e < s.d; ++e) {
            dqkv[s.v_at(b, j, g, e)] += p * dctx[s.ctx_at(b, i, n, e)];
            dqkv[s.q_at(b, i, n, e)] += ds * qkv[s.k_at(b, j, g, e)];
            dqkv[s.k_at(b, j, g, e)] += ds * qkv[s.q_at(b, i, n, e)];
          }
        }
      }
    }
  return dqkv;
}

struct GpuAttention {
  std::vector<float> lse, ctx, dqkv;
};

GpuAttention run_gpu_attention(const AttnShape& s, const std::vector<float>& qkv, const std::vector<float>& dctx,
                               DType dt) {
  const size_t es = dtype_size(dt);
  DeviceBuffer d_qkv = to_device(qkv, dt), d_dctx = to_device(dctx, dt);
  DeviceBuffer d_ctx(s.ctx_size() * es), d_lse(s.lse_size() * sizeof(float)), d_dqkv(s.qkv_size() * es);
  DeviceBuffer d_work(cuda::gqa_attention_workspace_bytes(s.T, s.heads, s.kv_heads, s.d, dt));
  // Garbage in the outputs and the workspace: everything must be written, masked probabilities too.
  CUDA_OK(cudaMemset(d_lse.get(), 0x7f, d_lse.bytes()));
  CUDA_OK(cudaMemset(d_ctx.get(), 0x7f, d_ctx.bytes()));
  CUDA_OK(cudaMemset(d_dqkv.get(), 0x7f, d_dqkv.bytes()));
  CUDA_OK(cudaMemset(d_work.get(), 0x7f, d_work.bytes()));
  Gemm gemm;
  OwnedStream st;
  BOOST_REQUIRE_NO_THROW(cuda::gqa_attention_forward(gemm, d_qkv.get(), d_ctx.get(), d_lse.as<float>(), s.B, s.T,
                                                     s.heads, s.kv_heads, s.d, dt, d_work.get(), st.s));
  // LlamaCuda's blocks share the workspace: the backward recomputes from qkv and lse alone.
  CUDA_OK(cudaMemsetAsync(d_work.get(), 0x7f, d_work.bytes(), st.s));
  BOOST_REQUIRE_NO_THROW(cuda::gqa_attention_backward(gemm, d_dctx.get(), d_qkv.get(), d_lse.as<float>(), d_dqkv.get(),
                                                      s.B, s.T, s.heads, s.kv_heads, s.d, dt, d_work.get(), st.s));
  st.sync();
  GpuAttention out;
  out.lse = download(d_lse.get(), s.lse_size(), DType::F32);
  out.ctx = download(d_ctx.get(), s.ctx_size(), dt);
  out.dqkv = download(d_dqkv.get(), s.qkv_size(), dt);
  return out;
}

// q, k, v drawn with standard deviation `input_scale`: larger ones give sharper rows, where most
// probabilities are exp(s - lse) of a score far below the row's log-sum-exp.
void check_attention(const AttnShape& s, DType dt, double tol_forward, double tol_backward, unsigned seed,
                     float input_scale = 1.0f) {
  BOOST_TEST_CONTEXT("attention B=" << s.B << " T=" << s.T << " heads=" << s.heads << " kv_heads=" << s.kv_heads
                                    << " d=" << s.d << " dt=" << dtype_name(dt) << " input_scale=" << input_scale) {
    std::mt19937 rng(seed);
    const std::vector<float> qkv = random_values(s.qkv_size(), rng, dt, input_scale);
    const std::vector<float> dctx = random_values(s.ctx_size(), rng, dt);
    const GpuAttention gpu = run_gpu_attention(s, qkv, dctx, dt);
    std::vector<double> probs, ctx, lse;
    attention_ref(s, to_double(qkv), probs, ctx, &lse);
    // fp32 scores of inputs exact in dt: the log-sum-exp is fp32-accurate whatever dt.
    BOOST_TEST(relative_error(gpu.lse, lse) <= 1e-5);
    // A masked probability left as workspace garbage would swamp the context or the gradients.
    BOOST_TEST(relative_error(gpu.ctx, ctx) <= tol_forward);
    BOOST_TEST(relative_error(gpu.dqkv, attention_backward_ref(s, to_double(qkv), probs, to_double(dctx))) <=
               tol_backward);
  }
}

// ---- a tiny Llama on both backends --------------------------------------------------------------

ModelConfig tiny_llama(bool tied) {
  ModelConfig c = model_test::model_shape("llama", 97, 32, 2, 4, 0.1f);
  c.num_kv_heads = 2;  // grouped-query: two query heads per kv head
  c.intermediate_size = 48;
  c.rms_norm_eps = 1e-5f;
  // Llama 3.1 scaling with a short original context: head_dim 8 gives one blended frequency and three
  // slowed ones.
  c.rope_scaling.factor = 8;
  c.rope_scaling.original_max_position_embeddings = 16;
  c.tie_word_embeddings = tied;
  return c;
}

// A model's parameters as both backends take them, per unit: the base (model_layout) and, with LoRA,
// the adapters (lora_layout; none without).
struct Params {
  std::vector<std::vector<float>> base, adapters;
};

// What a pass trains: a LoRA run freezes the base blocks and the root (their gradients are null).
struct Trained {
  bool blocks = true, root = true;
};

// A frozen unit's base gradient buffer holds this before the pass, and must after it.
constexpr float kPoison = -1.25e37f;

struct Pass {
  double loss = 0;
  std::vector<std::vector<float>> grads;          // per unit, fp32
  std::vector<std::vector<float>> adapter_grads;  // per unit, fp32, with LoRA
};

// v where a backend's model reads it: the host values on the CPU, a copy in dt (kept in `owned`) on the
// GPU; null when v is empty.
float* resident(const std::vector<float>& v, DType dt, bool gpu, std::vector<DeviceBuffer>& owned) {
  if (v.empty()) return nullptr;
  if (!gpu) return const_cast<float*>(v.data());
  owned.push_back(to_device(v, dt));
  return owned.back().as<float>();
}

// One forward and backward of grad_scale * loss through the UnitModel of `backend`, built for
// max_batch x max_seq (at least B x T): on the GPU with the parameters, tokens and gradients in
// device memory, the parameters in dt. Frozen units get null base gradients; theirs are returned as
// poisoned before the pass. With a dropout seed, a training pass with LoRA dropout's masks of that seed.
Pass unit_model_pass(BackendKind backend, const ModelConfig& cfg, const Params& params,
                     const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int B, int T,
                     float grad_scale, DType dt, bool checkpointing, int max_batch, int max_seq, Trained trained = {},
                     std::optional<uint64_t> dropout_seed = std::nullopt) {
  const bool gpu = backend == BackendKind::Cuda;
  const std::unique_ptr<UnitModel> model = make_unit_model(cfg, backend, dt, max_batch, max_seq, checkpointing);
  model->set_dropout(dropout_seed);
  BOOST_TEST(model->activation_bytes() ==
             unit_model_memory(cfg, backend, dt, max_batch, max_seq, checkpointing).activations);
  const size_t units = params.base.size();
  auto frozen = [&](size_t u) { return u == 0 ? !trained.root : !trained.blocks; };
  std::vector<DeviceBuffer> owned;
  auto place = [&](const std::vector<float>& v, DType t) { return resident(v, t, gpu, owned); };
  std::vector<std::vector<float>> grads(units), adapter_grads(units);
  std::vector<const void*> p(units), a(units, nullptr);
  std::vector<float*> g(units), ga(units, nullptr);
  for (size_t u = 0; u < units; ++u) {
    grads[u].assign(params.base[u].size(), frozen(u) ? kPoison : 0.0f);
    p[u] = place(params.base[u], dt);
    g[u] = place(grads[u], DType::F32);
    if (params.adapters.empty()) continue;
    adapter_grads[u].assign(params.adapters[u].size(), 0.0f);
    a[u] = place(params.adapters[u], dt);
    ga[u] = place(adapter_grads[u], DType::F32);
  }
  DeviceBuffer d_tokens = to_device_raw(tokens), d_targets = to_device_raw(targets);
  const int32_t* tok = gpu ? d_tokens.as<int32_t>() : tokens.data();
  const int32_t* tgt = gpu ? d_targets.as<int32_t>() : targets.data();
  OwnedStream stream;
  const Stream s = gpu ? stream.s : nullptr;
  const int L = cfg.num_layers;
  float* droot = frozen(0) ? nullptr : g[0];
  model->reset_loss(s);
  model->embed_forward(p[0], tok, B, T, s);
  for (int l = 0; l < L; ++l) model->block_forward(l, {p[1 + l], a[1 + l]}, B, T, s);
  model->head(p[0], tgt, B, T, grad_scale, true, droot, s);
  for (int l = L - 1; l >= 0; --l)
    model->block_backward(l, {p[1 + l], a[1 + l]}, {frozen(1 + l) ? nullptr : g[1 + l], ga[1 + l]}, B, T, s);
  model->embed_backward(p[0], tok, droot, B, T, s);
  Pass out;
  out.loss = model->loss_sum(s);
  stream.sync();
  auto fetch = [&](const std::vector<float>& host, const float* at) {
    return gpu && at ? download(at, host.size(), DType::F32) : host;
  };
  for (size_t u = 0; u < units; ++u) {
    out.grads.push_back(fetch(grads[u], g[u]));
    out.adapter_grads.push_back(fetch(adapter_grads[u], ga[u]));
  }
  return out;
}

// Each tensor of `layout` in got against want, within tol (relative to the tensor's largest value).
void expect_tensors_close(const std::vector<UnitLayout>& layout, const std::vector<std::vector<float>>& got,
                          const std::vector<std::vector<float>>& want, double tol) {
  for (size_t u = 0; u < layout.size(); ++u)
    for (const TensorSpec& t : layout[u].tensors) {
      std::vector<float> g(got[u].begin() + t.offset, got[u].begin() + t.offset + t.numel);
      std::vector<float> w(want[u].begin() + t.offset, want[u].begin() + t.offset + t.numel);
      BOOST_TEST(relative_error(g, w) <= tol, t.name << " of unit " << layout[u].name);
    }
}

// Two sequences of 11 tokens, one repeated (its embedding gradient adds up), some positions without a target.
struct Batch {
  int B = 2, T = 11;
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(const ModelConfig& cfg) {
  Batch b;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, cfg.vocab_size - 1);
  for (int i = 0; i < b.B * b.T; ++i) {
    b.tokens.push_back(token(rng));
    b.targets.push_back(i % 4 == 1 ? -1 : token(rng));
  }
  b.tokens[3] = b.tokens[7] = b.tokens[15];
  return b;
}

// The model's parameters from the library's init, rounded to dt: both sides see what the GPU computes with.
std::vector<std::vector<float>> params_in(const ModelConfig& cfg, DType dt) {
  std::vector<std::vector<float>> params = model_test::make_model(cfg, 11).params;
  if (dt != DType::F32)
    for (auto& p : params) round_to(dt, p.data(), p.size());
  return params;
}

// Phi-3's rotary options on cfg's shape: 3/4 of each head rotating, LongRoPE with factors for that rotary
// dimension and an original context of 4 positions against 64, so the tests' sequences take the long factors.
void phi3_rope(ModelConfig& cfg) {
  cfg.partial_rotary_factor = 0.75;
  cfg.rope_scaling = RopeScaling{};
  cfg.longrope = LongRope{};
  for (int i = 0; i < cfg.rotary_dim() / 2; ++i) {
    cfg.longrope.short_factor.push_back(1.0f + 0.5f * i);
    cfg.longrope.long_factor.push_back(1.25f + 2.0f * i);
  }
  cfg.longrope.original_max_position_embeddings = 4;
  cfg.max_position_embeddings = 64;
}

// head_dim 8 (tiny_llama's) is below what cuDNN's fused attention takes: those runs use the native
// kernels whatever `attention` says (auto); head_dim 64 runs the fused path in 16 bits.
void compare_with_cpu(bool tied, DType dt, bool checkpointing, double tol_loss, double tol_grad,
                      const std::string& arch = "llama", AttentionImpl attention = AttentionImpl::Auto,
                      int head_dim = 8, int head_size = 0, int window = 0) {
  BOOST_TEST_CONTEXT(arch << " tied=" << tied << " dt=" << dtype_name(dt) << " checkpointing=" << checkpointing
                          << " attention=" << static_cast<int>(attention) << " head_dim=" << head_dim
                          << " head_size=" << head_size << " window=" << window) {
    ModelConfig cfg = tiny_llama(tied);
    cfg.arch = arch;
    cfg.attention = attention;
    cfg.hidden_size = head_dim * cfg.num_heads;
    cfg.head_size = head_size;  // Qwen3, Mistral: head_dim apart from hidden_size / heads
    cfg.sliding_window = window;  // Mistral
    if (window > 0) cfg.rope_scaling = RopeScaling{};
    // Gemma 3: local / global layers (the window on layer 0), their own rope tables, the score scale.
    if (arch == "gemma3") cfg = model_test::as_gemma3(cfg, head_size, window, 100.0f, 10.0f);
    if (arch == "phi3") phi3_rope(cfg);  // after the head dimension is set
    const Params params{params_in(cfg, dt), {}};
    const Batch b = random_batch(cfg);
    const float grad_scale = 0.25f;
    const Pass want = unit_model_pass(BackendKind::Cpu, cfg, params, b.tokens, b.targets, b.B, b.T, grad_scale,
                                      DType::F32, false, b.B, b.T);
    // Built for more than it runs: the shapes of the pass, not of the buffers, must drive every kernel.
    const Pass got = unit_model_pass(BackendKind::Cuda, cfg, params, b.tokens, b.targets, b.B, b.T, grad_scale, dt,
                                     checkpointing, b.B + 1, b.T + 5);
    BOOST_TEST(std::abs(got.loss - want.loss) <= tol_loss * std::abs(want.loss));
    expect_tensors_close(model_layout(cfg), got.grads, want.grads, tol_grad);
  }
}

// ---- LoRA: the CUDA models' adapters against the CPU models' ---------------------------------------

// cfg with LoRA (r 4, alpha 8: scale 2) on `targets`, or on every linear layer of its family.
ModelConfig with_lora(ModelConfig cfg, std::vector<std::string> targets = {}) {
  cfg.lora.r = 4;
  cfg.lora.alpha = 8;
  if (targets.empty())
    for (const LinearModule& m : linear_modules(cfg)) targets.push_back(m.name);
  cfg.lora.target_modules = std::move(targets);
  return cfg;
}

// Random adapters, B non-zero too (PEFT's zero B would leave every term but dB out of the test), in dt.
std::vector<std::vector<float>> random_adapters(const ModelConfig& cfg, DType dt) {
  std::mt19937 rng(5);
  std::vector<std::vector<float>> out;
  for (const UnitLayout& u : lora_layout(cfg)) out.push_back(random_values(u.numel, rng, dt, 0.1f));
  return out;
}

// One pass of `model` with LoRA on both backends: the loss (the blocks' outputs), every adapter gradient
// and, where trained, every base gradient (the root's carries dh_0, the input gradient through every
// block); a frozen unit's base gradient buffer is never written. With dropout > 0 a training pass whose
// masks both backends draw from the same seed.
void compare_lora_with_cpu(const ModelConfig& model, DType dt, bool checkpointing, Trained trained, double tol_loss,
                           double tol_grad, const std::vector<std::string>& targets = {}, double dropout = 0) {
  BOOST_TEST_CONTEXT(model.arch << " LoRA dt=" << dtype_name(dt) << " checkpointing=" << checkpointing
                                << " blocks trained=" << trained.blocks << " root trained=" << trained.root
                                << " targets=" << (targets.empty() ? "all" : targets.front() + "...")
                                << " dropout=" << dropout) {
    ModelConfig cfg = with_lora(model, targets);
    cfg.lora.dropout = dropout;
    const std::optional<uint64_t> seed = dropout > 0 ? std::optional<uint64_t>(77) : std::nullopt;
    const Params params{params_in(cfg, dt), random_adapters(cfg, dt)};
    const Batch b = random_batch(cfg);
    const float grad_scale = 0.25f;
    const Pass want = unit_model_pass(BackendKind::Cpu, cfg, params, b.tokens, b.targets, b.B, b.T, grad_scale,
                                      DType::F32, false, b.B, b.T, trained, seed);
    const Pass got = unit_model_pass(BackendKind::Cuda, cfg, params, b.tokens, b.targets, b.B, b.T, grad_scale, dt,
                                     checkpointing, b.B + 1, b.T + 5, trained, seed);
    BOOST_TEST(std::abs(got.loss - want.loss) <= tol_loss * std::abs(want.loss));
    expect_tensors_close(lora_layout(cfg), got.adapter_grads, want.adapter_grads, tol_grad);
    const std::vector<UnitLayout> layout = model_layout(cfg);
    for (size_t u = 0; u < layout.size(); ++u) {
      const bool frozen = u == 0 ? !trained.root : !trained.blocks;
      if (!frozen) {
        expect_tensors_close({layout[u]}, {got.grads[u]}, {want.grads[u]}, tol_grad);
        continue;
      }
      const std::vector<float>& g = got.grads[u];
      const auto changed = std::count_if(g.begin(), g.end(), [](float v) { return v != kPoison; });
      BOOST_TEST(changed == 0, "frozen unit " << layout[u].name);
    }
  }
}

// Greedy decoding in fp32 through the UnitModel of `backend`: one step with the prompt's tokens as the
// rows of cache slot 0, and every row's next token.
std::vector<int32_t> greedy_next(BackendKind backend, const ModelConfig& cfg, const Params& params,
                                 const std::vector<int32_t>& prompt) {
  const bool gpu = backend == BackendKind::Cuda;
  const int n = static_cast<int>(prompt.size());
  const std::unique_ptr<UnitModel> model = make_unit_model(cfg, backend, DType::F32, 1, n, false);
  std::vector<DeviceBuffer> owned;
  auto ints = [&](const std::vector<int32_t>& v) {
    if (!gpu) return const_cast<int32_t*>(v.data());
    owned.push_back(to_device_raw(v));
    return owned.back().as<int32_t>();
  };
  auto floats = [&](const std::vector<float>& v) { return resident(v, DType::F32, gpu, owned); };
  std::vector<int32_t> positions(n), slots(n, 0), next(n, -1);
  for (int i = 0; i < n; ++i) positions[i] = i;
  int32_t* out = ints(next);
  OwnedStream stream;
  const Stream s = gpu ? stream.s : nullptr;
  model->decode_allocate(1, n, n);
  model->decode_embed(floats(params.base[0]), ints(prompt), n, s);
  for (int l = 0; l < cfg.num_layers; ++l)
    model->decode_block(l, {floats(params.base[1 + l]), floats(params.adapters[1 + l])}, ints(slots), ints(positions),
                        n, s);
  model->decode_head(floats(params.base[0]), ints(positions), n, out, nullptr, s);
  stream.sync();
  model->decode_free();
  return gpu ? from_device_raw<int32_t>(out, n) : next;
}

// The tiny models of the LoRA tests: Llama (grouped-query heads, untied head), Qwen2 (q/k/v biases,
// tied head), Qwen3 (per-head q/k norms, head_dim 12 at hidden 32 / 4 heads), Mistral (a sliding window
// of 3 keys, head_dim 12) and BLOOM (fused
// interleaved q|k|v with biases, GELU).
std::vector<ModelConfig> lora_models() {
  ModelConfig qwen2 = tiny_llama(true);
  qwen2.arch = "qwen2";
  ModelConfig qwen3 = tiny_llama(false);
  qwen3.arch = "qwen3";
  qwen3.head_size = 12;
  ModelConfig mistral = tiny_llama(false);
  mistral.arch = "mistral";
  mistral.head_size = 12;
  mistral.sliding_window = 3;
  mistral.rope_scaling = RopeScaling{};
  ModelConfig gemma3 = model_test::tiny_gemma3();
  ModelConfig phi3 = tiny_llama(false);
  phi3.arch = "phi3";
  phi3.sliding_window = 3;
  phi3_rope(phi3);
  return {tiny_llama(false), qwen2, qwen3, mistral, gemma3, phi3, model_test::tiny_bloom()};
}

}  // namespace

BOOST_AUTO_TEST_CASE(device_present) { require_device("test_cuda_llama"); }

// n = 0 launches nothing and touches no pointer.
BOOST_AUTO_TEST_CASE(empty_sizes_launch_nothing) {
  require_device("test_cuda_llama");
  Gemm gemm;
  for (DType dt : kAllDtypes) {
    cuda::rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, 0, 64, 1e-5f, dt, nullptr);
    cuda::rmsnorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 64, true, dt, nullptr);
    cuda::rotary_apply(nullptr, 0, 4, 2, 8, 16, nullptr, false, dt, nullptr);
    cuda::swiglu_forward(nullptr, nullptr, 0, 16, dt, nullptr);
    cuda::swiglu_backward(nullptr, nullptr, nullptr, 0, 16, dt, nullptr);
    cuda::geglu_tanh_forward(nullptr, nullptr, 0, 16, dt, nullptr);
    cuda::geglu_tanh_backward(nullptr, nullptr, nullptr, 0, 16, dt, nullptr);
    cuda::gqa_attention_forward(gemm, nullptr, nullptr, nullptr, 0, 4, 4, 2, 8, dt, nullptr, nullptr);
    cuda::gqa_attention_backward(gemm, nullptr, nullptr, nullptr, nullptr, 0, 4, 4, 2, 8, dt, nullptr, nullptr);
  }
  CUDA_OK(cudaDeviceSynchronize());
  BOOST_CHECK_THROW(
      cuda::gqa_attention_forward(gemm, nullptr, nullptr, nullptr, 1, 4, 4, 3, 8, DType::F32, nullptr, nullptr),
      Error);  // 3 kv heads do not divide 4 query heads
  BOOST_CHECK_THROW(cuda::rotary_apply(nullptr, 4, 4, 2, 7, 14, nullptr, false, DType::F32, nullptr), Error);
}

BOOST_AUTO_TEST_CASE(rmsnorm_matches_reference) {
  require_device("test_cuda_llama");
  unsigned seed = 100;
  struct Shape {
    int n, H;
  };
  // Packs and single elements (odd H), one row and many (the weight-gradient kernel's row slices); the backward's
  // rows held in registers by one to eight warps (in bf16 1024: 2, 2048: 4, 3072 and 4096: 8; 5000, and the
  // unaligned and fp32 rows above 2048, by the two-pass kernel), row counts that leave a block's last rows empty.
  const Shape shapes[] = {{1, 8},     {7, 64},    {33, 4096}, {5, 37},   {300, 128},
                          {2, 5000},  {1000, 24}, {9, 1024},  {41, 2048}, {17, 3072}};
  for (DType dt : kAllDtypes)
    for (const Shape& s : shapes) {
      check_rmsnorm(s.n, s.H, dt, 0, ++seed);
      if (s.H % 8 == 0) check_rmsnorm(s.n, s.H, dt, 1, ++seed);  // pointers off 16-byte alignment
    }
}

// Gemma's (1 + weight) norms: the kernels' weight_offset in both directions, the weight gradient unchanged.
BOOST_AUTO_TEST_CASE(rmsnorm_with_unit_offset_matches_reference) {
  require_device("test_cuda_llama");
  unsigned seed = 150;
  for (DType dt : kAllDtypes) {
    check_rmsnorm(7, 64, dt, 0, ++seed, 1.0f);
    check_rmsnorm(5, 37, dt, 0, ++seed, 1.0f);
    check_rmsnorm(300, 256, dt, 1, ++seed, 1.0f);
  }
}

BOOST_AUTO_TEST_CASE(rmsnorm_backward_reference_matches_finite_differences) {
  require_device("test_cuda_llama");
  const int n = 3, H = 6;
  const float eps = 1e-5f;
  std::mt19937 rng(7);
  const std::vector<float> x = random_values(n * H, rng, DType::F32), w = random_values(H, rng, DType::F32, 0.2f, 1.0f);
  const std::vector<float> weights = random_values(n * H, rng, DType::F32);  // loss = sum(y * weights)
  std::vector<double> dx, dw;
  rmsnorm_backward_ref(to_double(weights), to_double(x), to_double(w), n, H, eps, dx, dw);
  const auto numeric_dx = numeric_gradient(
      [&](const std::vector<double>& xs) { return dot(rmsnorm_ref(xs, to_double(w), n, H, eps), weights); },
      to_double(x));
  const auto numeric_dw = numeric_gradient(
      [&](const std::vector<double>& ws) { return dot(rmsnorm_ref(to_double(x), ws, n, H, eps), weights); },
      to_double(w));
  BOOST_TEST(relative_error(std::vector<float>(dx.begin(), dx.end()), numeric_dx) <= 1e-6);
  BOOST_TEST(relative_error(std::vector<float>(dw.begin(), dw.end()), numeric_dw) <= 1e-6);
  // And the GPU against the same finite differences.
  DeviceBuffer d_x = to_device(x, DType::F32), d_w = to_device(w, DType::F32), d_dy = to_device(weights, DType::F32);
  DeviceBuffer d_y(n * H * 4), d_rstd(n * 4), d_dx(n * H * 4);
  DeviceBuffer d_dw = to_device(std::vector<float>(H, 0.0f), DType::F32);
  OwnedStream s;
  cuda::rmsnorm_forward(d_x.get(), d_w.get(), d_y.get(), d_rstd.as<float>(), n, H, eps, DType::F32, s.s);
  cuda::rmsnorm_backward(d_dy.get(), d_x.get(), d_w.get(), d_rstd.as<float>(), d_dx.get(), d_dw.as<float>(), n, H,
                         false, DType::F32, s.s);
  s.sync();
  BOOST_TEST(relative_error(download(d_dx.get(), n * H, DType::F32), numeric_dx) <= 1e-5);
  BOOST_TEST(relative_error(download(d_dw.get(), H, DType::F32), numeric_dw) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(rotary_matches_reference) {
  require_device("test_cuda_llama");
  const ModelConfig plain = rope_config(16, 10000.0f, 0, 8192);
  const ModelConfig llama31 = rope_config(128, 500000.0f, 8, 8192);  // Llama-3.1-8B's table
  const ModelConfig short_context = rope_config(32, 10000.0f, 4, 64);  // every band of the scaling
  check_rotary(2, 13, 6, 2, plain, DType::F32, 1);  // 4 query + 2 key heads, 2 value heads untouched
  check_rotary(1, 3000, 3, 1, llama31, DType::F32, 2);  // long positions: large angles
  check_rotary(3, 40, 5, 0, short_context, DType::F32, 3);
  check_rotary(2, 5, 1, 0, rope_config(2, 10000.0f, 0, 8192), DType::F32, 4);  // head_dim 2
  for (DType dt : {DType::BF16, DType::F16}) {
    check_rotary(2, 13, 6, 2, plain, dt, 5);
    check_rotary(1, 700, 3, 1, llama31, dt, 6);
  }
  // The kernel's access widths: 4 frequencies a thread (above), 2 (a half of 6) and 1 (x not aligned), each over
  // more heads than it loads at once (8).
  const ModelConfig twelve = rope_config(12, 10000.0f, 0, 8192);
  for (DType dt : kAllDtypes) {
    check_rotary(2, 9, 11, 2, twelve, dt, 7);
    check_rotary(2, 9, 17, 1, plain, dt, 8, 1);
    check_rotary(1, 33, 9, 0, llama31, dt, 9, 1);
  }
  // The scaled table differs from the plain one: the test above exercises rope_scaling.
  const std::vector<float> scaled = rope_inv_freq(llama31);
  ModelConfig unscaled = llama31;
  unscaled.rope_scaling.factor = 0;
  BOOST_TEST(scaled.back() < rope_inv_freq(unscaled).back());
}

BOOST_AUTO_TEST_CASE(swiglu_matches_reference) {
  require_device("test_cuda_llama");
  unsigned seed = 200;
  struct Shape {
    int n, F;
  };
  const Shape shapes[] = {{1, 8}, {37, 96}, {5, 33}, {16, 1408}, {3, 1}};
  for (DType dt : kAllDtypes)
    for (const Shape& s : shapes) {
      check_swiglu(s.n, s.F, dt, 0, ++seed);
      if (s.F % 8 == 0) check_swiglu(s.n, s.F, dt, 1, ++seed);
    }
}

// The amax the gated kernels reduce for FP8 keeps an inf and a NaN of their outputs (the step's non-finite check
// then sees them through the quantized copy), and is zero for an all-zero output.
BOOST_AUTO_TEST_CASE(gated_activation_amax_keeps_infs_and_nans) {
  require_device("test_cuda_llama");
  const int n = 4, F = 16;
  for (DType dt : {DType::BF16, DType::F16})
    for (const float poison : {0.0f, INFINITY, NAN}) {
      BOOST_TEST_CONTEXT("dt=" << dtype_name(dt) << " poison=" << poison) {
        std::vector<float> gate_up(2 * n * F, 0.0f), dout(n * F, 0.0f);
        if (poison != 0.0f) gate_up[2 * F + F + 3] = poison, dout[F + 5] = poison;  // row 1: an up and a dout
        Placed d_gu = placed(gate_up, dt, 0), d_dout = placed(dout, dt, 0);
        Placed d_out(n * F, dt, 0), d_dgu(2 * n * F, dt, 0);
        OwnedStream s;
        cuda::swiglu_forward(d_gu.at, d_out.at, n, F, dt, s.s);
        cuda::swiglu_backward(d_dout.at, d_gu.at, d_dgu.at, n, F, dt, s.s);
        s.sync();
        const std::vector<float> out = download(d_out.at, n * F, dt), dgu = download(d_dgu.at, 2 * n * F, dt);
        check_gated_amax(d_gu.at, d_dout.at, n, F, dt, 0, false, out, dgu);
        const unsigned fwd = amax_bits_of(out), bwd = amax_bits_of(dgu);
        if (poison == 0.0f) BOOST_TEST((fwd == 0u && bwd == 0u));
        else BOOST_TEST((fwd >= 0x7f800000u || bwd >= 0x7f800000u));  // inf or NaN reached an output
      }
    }
}

BOOST_AUTO_TEST_CASE(swiglu_backward_matches_finite_differences) {
  require_device("test_cuda_llama");
  const int n = 3, F = 5;
  std::mt19937 rng(9);
  const std::vector<float> gate_up = random_values(2 * n * F, rng, DType::F32, 2.0f);
  const std::vector<float> weights = random_values(n * F, rng, DType::F32);
  const auto numeric =
      numeric_gradient([&](const std::vector<double>& gu) { return dot(swiglu_ref(gu, n, F), weights); },
                       to_double(gate_up));
  const std::vector<double> analytic = swiglu_backward_ref(to_double(weights), to_double(gate_up), n, F);
  BOOST_TEST(relative_error(std::vector<float>(analytic.begin(), analytic.end()), numeric) <= 1e-6);
  DeviceBuffer d_gu = to_device(gate_up, DType::F32), d_dout = to_device(weights, DType::F32), d_dgu(2 * n * F * 4);
  OwnedStream s;
  cuda::swiglu_backward(d_dout.get(), d_gu.get(), d_dgu.get(), n, F, DType::F32, s.s);
  s.sync();
  BOOST_TEST(relative_error(download(d_dgu.get(), 2 * n * F, DType::F32), numeric) <= 1e-5);
}

// GeGLU (Gemma): gelu_tanh(gate) * up and its backward against the double reference, in every dtype, packs
// and single elements; the reference's backward against finite differences, and the kernel's.
BOOST_AUTO_TEST_CASE(geglu_tanh_matches_reference) {
  require_device("test_cuda_llama");
  unsigned seed = 250;
  struct Shape {
    int n, F;
  };
  const Shape shapes[] = {{1, 8}, {37, 96}, {5, 33}, {16, 6912}, {3, 1}};
  for (DType dt : kAllDtypes)
    for (const Shape& s : shapes) {
      check_swiglu(s.n, s.F, dt, 0, ++seed, true);
      if (s.F % 8 == 0) check_swiglu(s.n, s.F, dt, 1, ++seed, true);
    }
  const int n = 3, F = 5;
  std::mt19937 rng(19);
  const std::vector<float> gate_up = random_values(2 * n * F, rng, DType::F32, 2.0f);
  const std::vector<float> weights = random_values(n * F, rng, DType::F32);
  const auto numeric =
      numeric_gradient([&](const std::vector<double>& gu) { return dot(swiglu_ref(gu, n, F, true), weights); },
                       to_double(gate_up));
  const std::vector<double> analytic = swiglu_backward_ref(to_double(weights), to_double(gate_up), n, F, true);
  BOOST_TEST(relative_error(std::vector<float>(analytic.begin(), analytic.end()), numeric) <= 1e-6);
  DeviceBuffer d_gu = to_device(gate_up, DType::F32), d_dout = to_device(weights, DType::F32), d_dgu(2 * n * F * 4);
  OwnedStream s;
  cuda::geglu_tanh_backward(d_dout.get(), d_gu.get(), d_dgu.get(), n, F, DType::F32, s.s);
  s.sync();
  BOOST_TEST(relative_error(download(d_dgu.get(), 2 * n * F, DType::F32), numeric) <= 1e-5);
}

// The activation's backward writing the activation too (LlamaCuda's down_proj backward), SwiGLU and GeGLU: the
// separate kernels' bits in every dtype, in packs and single elements (F not a multiple of the pack, pointers off
// 16-byte alignment), over its own input gradient and apart.
BOOST_AUTO_TEST_CASE(gated_backward_writing_the_activation_gives_the_separate_kernels_bits) {
  require_device("test_cuda_llama");
  unsigned seed = 300;
  struct Shape {
    int n, F;
  };
  const Shape shapes[] = {{1, 8}, {37, 96}, {5, 33}, {16, 1408}, {3, 1}, {7, 6}};
  for (const bool geglu : {false, true})
    for (DType dt : kAllDtypes)
      for (const Shape& s : shapes) {
        check_gated_backward_writing_act(s.n, s.F, dt, 0, ++seed, geglu);
        if (s.F % 8 == 0) check_gated_backward_writing_act(s.n, s.F, dt, 1, ++seed, geglu);
      }
}

BOOST_AUTO_TEST_CASE(grouped_query_attention_matches_reference_fp32) {
  require_device("test_cuda_llama");
  check_attention({2, 13, 4, 2, 8}, DType::F32, 1e-5, 1e-4, 11);   // two query heads per kv head
  check_attention({1, 77, 8, 2, 64}, DType::F32, 1e-5, 1e-4, 12);  // four, Llama's head size
  check_attention({3, 7, 6, 1, 4}, DType::F32, 1e-5, 1e-4, 13);    // one kv head for all (MQA)
  check_attention({2, 9, 3, 3, 5}, DType::F32, 1e-5, 1e-4, 14);    // no grouping; odd head_dim: unaligned views
  check_attention({1, 1, 4, 2, 8}, DType::F32, 1e-5, 1e-4, 15);    // one position
  check_attention({1, 1, 3, 3, 5}, DType::F32, 1e-5, 1e-4, 16);    // one position, no grouping
  check_attention({2, 40, 4, 2, 8}, DType::F32, 1e-5, 1e-4, 17, 2.0f);  // sharper rows: scores of std 4
}

BOOST_AUTO_TEST_CASE(grouped_query_attention_matches_reference_16bit) {
  require_device("test_cuda_llama");
  // Probabilities and outputs are rounded to 16 bits; the reference keeps them exact.
  check_attention({2, 13, 4, 2, 8}, DType::BF16, 1.5e-2, 4e-2, 21);
  check_attention({1, 77, 8, 2, 64}, DType::BF16, 1.5e-2, 4e-2, 22);
  check_attention({2, 13, 4, 2, 8}, DType::F16, 2e-3, 6e-3, 23);
  check_attention({3, 7, 6, 1, 4}, DType::F16, 2e-3, 6e-3, 24);
  check_attention({1, 1, 4, 2, 8}, DType::BF16, 1.5e-2, 4e-2, 25);  // one position
  check_attention({2, 40, 4, 2, 8}, DType::F16, 2e-3, 6e-3, 26, 2.0f);  // sharper rows
}

BOOST_AUTO_TEST_CASE(grouped_query_attention_backward_matches_finite_differences) {
  require_device("test_cuda_llama");
  const AttnShape s{1, 5, 4, 2, 3};
  std::mt19937 rng(31);
  const std::vector<float> qkv = random_values(s.qkv_size(), rng, DType::F32);
  const std::vector<float> weights = random_values(s.ctx_size(), rng, DType::F32);  // loss = sum(ctx * weights)
  const GpuAttention gpu = run_gpu_attention(s, qkv, weights, DType::F32);
  const auto numeric = numeric_gradient(
      [&](const std::vector<double>& x) {
        std::vector<double> probs, ctx;
        attention_ref(s, x, probs, ctx);
        return dot(ctx, weights);
      },
      to_double(qkv));
  std::vector<double> probs, ctx;
  attention_ref(s, to_double(qkv), probs, ctx);
  const std::vector<double> analytic = attention_backward_ref(s, to_double(qkv), probs, to_double(weights));
  BOOST_TEST(relative_error(std::vector<float>(analytic.begin(), analytic.end()), numeric) <= 1e-7);
  BOOST_TEST(relative_error(gpu.dqkv, numeric) <= 1e-4);
}

// The CUDA UnitModel's loss and every parameter gradient against the CPU one's, on the same parameters and batch.
BOOST_AUTO_TEST_CASE(llama_cuda_matches_llama_cpu_fp32) {
  require_device("test_cuda_llama");
  for (bool tied : {false, true})
    for (bool checkpointing : {false, true}) compare_with_cpu(tied, DType::F32, checkpointing, 1e-5, 1e-4);
}

// Mistral: a sliding window of 3 keys over sequences of 11 (native softmax rows; cuDNN's band mask at
// head_dim 16 in bf16), head_dim 12 and 16 != hidden_size / heads = 8.
BOOST_AUTO_TEST_CASE(mistral_cuda_matches_mistral_cpu) {
  require_device("test_cuda_llama");
  for (bool tied : {false, true})
    compare_with_cpu(tied, DType::F32, false, 1e-5, 1e-4, "mistral", AttentionImpl::Auto, 8, 12, 3);
  compare_with_cpu(false, DType::F32, true, 1e-5, 1e-4, "mistral", AttentionImpl::Auto, 8, 12, 3);
  compare_with_cpu(false, DType::F32, false, 1e-5, 1e-4, "mistral", AttentionImpl::Auto, 8, 12, 1);
  for (AttentionImpl attention : {AttentionImpl::Cudnn, AttentionImpl::Native})
    for (int window : {3, 8}) compare_with_cpu(false, DType::BF16, false, 2e-2, 0.1, "mistral", attention, 8, 16, window);
}

// Gemma 3: (1 + w) norms (the RMSNorm kernels' offset), sandwich norms, GeGLU, the scaled embeddings, q/k
// norms, query_pre_attn_scalar 10 and local (window 3, rope 100) / global (rope theta / 2) layers; head_dim 12
// in fp32 (native kernels), 16 in bf16 on cuDNN's fused attention (two graphs: with and without the band) and on
// the native kernels; activation checkpointing (the sandwich norms' inputs recomputed).
BOOST_AUTO_TEST_CASE(gemma3_cuda_matches_gemma3_cpu) {
  require_device("test_cuda_llama");
  for (bool tied : {false, true})
    compare_with_cpu(tied, DType::F32, false, 1e-5, 1e-4, "gemma3", AttentionImpl::Auto, 8, 12, 3);
  compare_with_cpu(true, DType::F32, true, 1e-5, 1e-4, "gemma3", AttentionImpl::Auto, 8, 12, 3);
  for (AttentionImpl attention : {AttentionImpl::Cudnn, AttentionImpl::Native})
    for (bool checkpointing : {false, true})
      compare_with_cpu(true, DType::BF16, checkpointing, 2e-2, 0.1, "gemma3", attention, 8, 16, 3);
}

// Phi-3: the fused qkv_proj / gate_up_proj tensors, partial rotary (6 of 8 or 12 of 16 dimensions) with
// LongRoPE's long factors and attention factor, a window of 3 keys; fp32 on the native kernels, bf16 on both
// attention paths (head_dim 16).
BOOST_AUTO_TEST_CASE(phi3_cuda_matches_phi3_cpu) {
  require_device("test_cuda_llama");
  for (bool checkpointing : {false, true})
    compare_with_cpu(false, DType::F32, checkpointing, 1e-5, 1e-4, "phi3", AttentionImpl::Auto, 8, 0, 3);
  compare_with_cpu(false, DType::F32, false, 1e-5, 1e-4, "phi3", AttentionImpl::Native, 16, 0, 0);
  for (AttentionImpl attention : {AttentionImpl::Cudnn, AttentionImpl::Native})
    for (int window : {0, 3}) compare_with_cpu(false, DType::BF16, false, 2e-2, 0.1, "phi3", attention, 16, 0, window);
}

// Qwen2: the q/k/v biases through the fused GEMM's bias epilogue and bias_grad.
BOOST_AUTO_TEST_CASE(qwen2_cuda_matches_qwen2_cpu) {
  require_device("test_cuda_llama");
  for (bool tied : {false, true}) compare_with_cpu(tied, DType::F32, false, 1e-5, 1e-4, "qwen2");
  compare_with_cpu(true, DType::F32, true, 1e-5, 1e-4, "qwen2");
  compare_with_cpu(true, DType::BF16, false, 2e-2, 0.1, "qwen2");
}

// Qwen3: the per-head q/k RMSNorms (the RMSNorm kernels on tokens x heads rows of head_dim, their
// weight gradients summed over those rows) with head_dim 12 and 16 != hidden_size / heads = 8; bf16
// on cuDNN's fused attention (head_dim 16) and on the native kernels.
BOOST_AUTO_TEST_CASE(qwen3_cuda_matches_qwen3_cpu) {
  require_device("test_cuda_llama");
  for (bool tied : {false, true})
    compare_with_cpu(tied, DType::F32, false, 1e-5, 1e-4, "qwen3", AttentionImpl::Auto, 8, 12);
  compare_with_cpu(false, DType::F32, true, 1e-5, 1e-4, "qwen3", AttentionImpl::Auto, 8, 12);
  for (AttentionImpl attention : {AttentionImpl::Auto, AttentionImpl::Native})
    compare_with_cpu(false, DType::BF16, false, 2e-2, 0.1, "qwen3", attention, 8, 16);
}

// LoRA on every linear layer, as a LoRA run trains it (the base and the root frozen: no base gradient is
// formed, the poisoned buffers stay as they were), with and without activation checkpointing (the
// saved x A^T recomputed); then with the root trained (the embedding gradient carries dh_0 through
// every block's adapters) and with the base trained beside the adapters.
BOOST_AUTO_TEST_CASE(lora_cuda_matches_lora_cpu_fp32) {
  require_device("test_cuda_llama");
  for (const ModelConfig& model : lora_models()) {
    for (bool checkpointing : {false, true})
      compare_lora_with_cpu(model, DType::F32, checkpointing, Trained{false, false}, 1e-5, 1e-4);
    compare_lora_with_cpu(model, DType::F32, false, Trained{false, true}, 1e-5, 1e-4);
    compare_lora_with_cpu(model, DType::F32, true, Trained{true, true}, 1e-5, 1e-4);
  }
}

// Some layers adapted and others not: PEFT's default for Llama (q_proj, v_proj), and BLOOM with one of
// its two MLP layers adapted, so that GELU's fused epilogue meets the LoRA path on either side.
BOOST_AUTO_TEST_CASE(lora_cuda_on_some_layers_matches_lora_cpu) {
  require_device("test_cuda_llama");
  const std::vector<ModelConfig> models = lora_models();
  for (const ModelConfig& model : {models[0], models[1]})
    compare_lora_with_cpu(model, DType::F32, false, Trained{false, true}, 1e-5, 1e-4, {"q_proj", "v_proj"});
  for (const char* mlp : {"dense_h_to_4h", "dense_4h_to_h"})
    for (bool checkpointing : {false, true})
      compare_lora_with_cpu(models.back(), DType::F32, checkpointing, Trained{false, true}, 1e-5, 1e-4,
                            {"query_key_value", mlp});
  // Phi-3: one adapter over the fused q|k|v, or over gate|up, beside unadapted layers.
  const auto phi3 = std::find_if(models.begin(), models.end(), [](const ModelConfig& m) { return m.arch == "phi3"; });
  BOOST_TEST_REQUIRE((phi3 != models.end()));
  for (const char* fused : {"qkv_proj", "gate_up_proj"})
    compare_lora_with_cpu(*phi3, DType::F32, false, Trained{false, true}, 1e-5, 1e-4, {fused});
}

// Greedy decoding with the key/value cache and the adapters' terms: the CPU model's tokens.
BOOST_AUTO_TEST_CASE(lora_cuda_decodes_as_lora_cpu) {
  require_device("test_cuda_llama");
  for (const ModelConfig& model : lora_models()) {
    const ModelConfig cfg = with_lora(model);
    const Params params{params_in(cfg, DType::F32), random_adapters(cfg, DType::F32)};
    const std::vector<int32_t> prompt = random_batch(cfg).tokens;
    const std::vector<int32_t> want = greedy_next(BackendKind::Cpu, cfg, params, prompt);
    BOOST_TEST_CONTEXT(model.arch) {
      BOOST_TEST(greedy_next(BackendKind::Cuda, cfg, params, prompt) == want, boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(lora_cuda_bf16_stays_close_to_lora_cpu) {
  require_device("test_cuda_llama");
  for (const ModelConfig& model : lora_models())
    for (bool checkpointing : {false, true})
      compare_lora_with_cpu(model, DType::BF16, checkpointing, Trained{false, true}, 2e-2, 0.1);
}

// LoRA dropout (p 0.3, one seed on both backends): the CUDA models draw the CPU models' masks
// (lora_dropout.cu, dropout_mask.hpp), so the loss and every adapter gradient agree to the fp32
// tolerances, with and without activation checkpointing (whose recomputation draws the forward's masks
// again), the root trained too (dh_0 through every block's masked input gradients); and on some layers.
BOOST_AUTO_TEST_CASE(lora_dropout_cuda_matches_lora_cpu_fp32) {
  require_device("test_cuda_llama");
  for (const ModelConfig& model : lora_models()) {
    for (bool checkpointing : {false, true}) {
      compare_lora_with_cpu(model, DType::F32, checkpointing, Trained{false, false}, 1e-5, 1e-4, {}, 0.3);
      compare_lora_with_cpu(model, DType::F32, checkpointing, Trained{false, true}, 1e-5, 1e-4, {}, 0.3);
    }
  }
  const std::vector<ModelConfig> models = lora_models();
  compare_lora_with_cpu(models[0], DType::F32, true, Trained{false, true}, 1e-5, 1e-4, {"q_proj", "v_proj"}, 0.3);
  for (const char* mlp : {"dense_h_to_4h", "dense_4h_to_h"})
    compare_lora_with_cpu(models.back(), DType::F32, true, Trained{false, true}, 1e-5, 1e-4, {"query_key_value", mlp}, 0.3);
}

BOOST_AUTO_TEST_CASE(lora_dropout_cuda_bf16_stays_close_to_lora_cpu) {
  require_device("test_cuda_llama");
  for (const ModelConfig& model : lora_models())
    for (bool checkpointing : {false, true})
      compare_lora_with_cpu(model, DType::BF16, checkpointing, Trained{false, true}, 2e-2, 0.1, {}, 0.3);
}

// Without a training seed (evaluation) a CUDA model with lora.dropout computes exactly what it computes
// without dropout (no dropout kernel runs); with one, something else.
BOOST_AUTO_TEST_CASE(lora_dropout_cuda_evaluation_equals_no_dropout) {
  require_device("test_cuda_llama");
  for (const ModelConfig& model : lora_models()) {
    BOOST_TEST_CONTEXT(model.arch) {
      ModelConfig plain = with_lora(model);
      ModelConfig dropping = plain;
      dropping.lora.dropout = 0.3;
      const Params params{params_in(plain, DType::F32), random_adapters(plain, DType::F32)};
      const Batch b = random_batch(plain);
      auto pass = [&](const ModelConfig& cfg, std::optional<uint64_t> seed) {
        return unit_model_pass(BackendKind::Cuda, cfg, params, b.tokens, b.targets, b.B, b.T, 0.25f, DType::F32,
                               false, b.B, b.T, Trained{false, false}, seed);
      };
      const Pass want = pass(plain, std::nullopt), eval = pass(dropping, std::nullopt), train = pass(dropping, 77);
      BOOST_TEST(eval.loss == want.loss);
      BOOST_TEST((eval.adapter_grads == want.adapter_grads));
      BOOST_TEST(std::abs(train.loss - want.loss) > 1e-4 * std::abs(want.loss));
    }
  }
}

BOOST_AUTO_TEST_CASE(llama_cuda_16bit_stays_close_to_llama_cpu) {
  require_device("test_cuda_llama");
  compare_with_cpu(false, DType::BF16, false, 2e-2, 0.1);
  compare_with_cpu(false, DType::F16, true, 5e-3, 0.03);
}

// model.fp8_linear on sizes that all run in FP8 (2 x 8 tokens, hidden 32, q|k|v 64, gate|up 96): an amax
// slot per block and projection, counted by the plan (unit_model_pass checks the bytes); with activation
// checkpointing, whose recomputation leaves down_proj's forward out so that its backward reads the first
// forward's amaxes (of the same recomputed bits), the loss and gradients are those of kept activations, bit
// for bit. With model.fp8_keep_weights (the backward reads the transposed weight its forward kept instead of
// quantizing the weight again) the bits are the same again.
BOOST_AUTO_TEST_CASE(llama_cuda_fp8_backward_reuses_the_forward_amaxes) {
  require_device("test_cuda_llama");
  ModelConfig cfg = tiny_llama(false);
  cfg.fp8_linear = true;
  const int B = 2, T = 8;
  BOOST_TEST(cuda::llama_cuda_sizes(cfg, DType::BF16, B, T, false, false).fp8.slots ==
             static_cast<size_t>(cfg.num_layers) * cuda::kFp8SlotsPerBlock);
  const Params params{params_in(cfg, DType::BF16), {}};
  Batch b = random_batch(cfg);
  b.tokens.resize(B * T), b.targets.resize(B * T);
  const Pass kept = unit_model_pass(BackendKind::Cuda, cfg, params, b.tokens, b.targets, B, T, 0.25f, DType::BF16,
                                    false, B, T);
  const Pass recomputed = unit_model_pass(BackendKind::Cuda, cfg, params, b.tokens, b.targets, B, T, 0.25f,
                                          DType::BF16, true, B, T);
  BOOST_TEST(recomputed.loss == kept.loss);
  for (size_t u = 0; u < kept.grads.size(); ++u)
    BOOST_TEST(recomputed.grads[u] == kept.grads[u], boost::test_tools::per_element());

  ModelConfig keeping = cfg;
  keeping.fp8_keep_weights = true;
  const cuda::Fp8ScratchSize with = cuda::llama_cuda_sizes(keeping, DType::BF16, B, T, false, false).fp8;
  const cuda::Fp8ScratchSize without = cuda::llama_cuda_sizes(cfg, DType::BF16, B, T, false, false).fp8;
  BOOST_TEST(with.kept.size() == with.slots);
  BOOST_TEST(!with.frozen);
  BOOST_TEST(without.kept.empty());
  BOOST_TEST(with.bytes() > without.bytes());
  for (const bool checkpointing : {false, true}) {
    const Pass again = unit_model_pass(BackendKind::Cuda, keeping, params, b.tokens, b.targets, B, T, 0.25f,
                                       DType::BF16, checkpointing, B, T);
    BOOST_TEST(again.loss == kept.loss);
    for (size_t u = 0; u < kept.grads.size(); ++u)
      BOOST_TEST(again.grads[u] == kept.grads[u], boost::test_tools::per_element());
  }
}

// Head dim 64: cuDNN's fused attention in 16 bits (auto), and the native kernels asked for by name.
BOOST_AUTO_TEST_CASE(both_attention_paths_stay_close_to_llama_cpu) {
  require_device("test_cuda_llama");
  for (const AttentionImpl a : {AttentionImpl::Auto, AttentionImpl::Native}) {
    compare_with_cpu(false, DType::BF16, false, 2e-2, 0.1, "llama", a, 64);
    compare_with_cpu(true, DType::F16, true, 5e-3, 0.03, "llama", a, 64);
    compare_with_cpu(false, DType::BF16, true, 2e-2, 0.1, "qwen2", a, 64);
  }
}

// model.attention picks the path; the model says which and why (the run's log prints it).
BOOST_AUTO_TEST_CASE(attention_path_is_chosen_and_explained) {
  require_device("test_cuda_llama");
  ModelConfig cfg = tiny_llama(false);
  cfg.hidden_size = 64 * cfg.num_heads;
  auto description = [&](AttentionImpl a, DType dt) {
    cfg.attention = a;
    return cuda::LlamaCuda(cfg, dt, 2, 16, false, LlamaBlock{}).attention_description();
  };
#ifdef SHARDLM_HAVE_CUDNN
  BOOST_TEST(description(AttentionImpl::Auto, DType::BF16).rfind("cudnn (cuDNN 9.", 0) == 0);
  BOOST_TEST(description(AttentionImpl::Cudnn, DType::F16).rfind("cudnn", 0) == 0);
  BOOST_TEST(description(AttentionImpl::Auto, DType::F32).find("fp32") != std::string::npos);
#else
  BOOST_TEST(description(AttentionImpl::Auto, DType::BF16).find("no cuDNN") != std::string::npos);
#endif
  BOOST_TEST(description(AttentionImpl::Native, DType::BF16) == "native (model.attention = native)");
  cfg.attention = AttentionImpl::Cudnn;
  BOOST_CHECK_EXCEPTION(cuda::LlamaCuda(cfg, DType::F32, 2, 16, false, LlamaBlock{}), Error, [](const Error& e) {
    return std::string(e.what()).find("model.attention = cudnn") != std::string::npos;
  });
  // The fused path holds only the log-sum-exp and its backward's own scratch: the planned sizes say so.
  cfg.attention = AttentionImpl::Auto;
  const size_t fused = cuda::llama_cuda_sizes(cfg, DType::BF16, 2, 16, false, true).total();
  const size_t native = cuda::llama_cuda_sizes(cfg, DType::BF16, 2, 16, false, false).total();
  BOOST_TEST(fused != native);
}

BOOST_AUTO_TEST_CASE(llama_cuda_checks_shapes) {
  require_device("test_cuda_llama");
  const ModelConfig cfg = tiny_llama(false);
  cuda::LlamaCuda model(cfg, DType::F32, 2, 8, false, LlamaBlock{});
  BOOST_CHECK_THROW(model.block_forward(0, nullptr, 1, 9, nullptr), Error);  // longer than max_seq
  BOOST_CHECK_THROW(model.block_forward(0, nullptr, 3, 4, nullptr), Error);  // more than max_batch
  BOOST_CHECK_THROW(model.block_forward(2, nullptr, 1, 4, nullptr), Error);  // no such layer
  // The factory picks by arch.
  BOOST_TEST(dynamic_cast<cuda::LlamaCuda*>(cuda::make_cuda_model(cfg, DType::F32, 1, 4, false).get()) != nullptr);
}

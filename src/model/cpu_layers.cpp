// The CPU norms and linear layers of cpu_layers.hpp.
#include "cpu_layers.hpp"

#include <cmath>

#include "shardlm/device.hpp"

namespace shardlm::model_detail {

void layer_norm_row(const float* x, int H, const float* weight, const float* bias, float eps, float* xhat,
                    float* rstd, float* y) {
  // Mean and variance in double: rows of large activations lose digits in a float sum.
  double sum = 0.0;
  for (int c = 0; c < H; ++c) sum += x[c];
  const double mean = sum / H;
  double squares = 0.0;
  for (int c = 0; c < H; ++c) squares += (x[c] - mean) * (x[c] - mean);
  const float inv_std = static_cast<float>(1.0 / std::sqrt(squares / H + eps));
  const float mean_f = static_cast<float>(mean);
  *rstd = inv_std;
  for (int c = 0; c < H; ++c) {
    xhat[c] = (x[c] - mean_f) * inv_std;
    y[c] = xhat[c] * weight[c] + bias[c];
  }
}

void layer_norm_backward_row(const float* dy, const float* xhat, float rstd, int H, const float* weight, float* dx,
                             bool accumulate, float* dweight, float* dbias) {
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int c = 0; c < H; ++c) {
    const float g = dy[c] * weight[c];
    sum_g += g;
    sum_g_xhat += g * xhat[c];
    if (dweight) dweight[c] += dy[c] * xhat[c];
    if (dbias) dbias[c] += dy[c];
  }
  const float mean_g = sum_g / H, mean_g_xhat = sum_g_xhat / H;
  for (int c = 0; c < H; ++c) {
    const float d = rstd * (dy[c] * weight[c] - mean_g - xhat[c] * mean_g_xhat);
    dx[c] = accumulate ? dx[c] + d : d;
  }
}

void rms_norm_row(const float* x, int H, const float* weight, float eps, float* xhat, float* rstd, float* y,
                  float weight_offset) {
  // The mean square in double: rows of large activations lose digits in a float sum.
  double squares = 0.0;
  for (int c = 0; c < H; ++c) squares += static_cast<double>(x[c]) * x[c];
  const float inv_rms = static_cast<float>(1.0 / std::sqrt(squares / H + eps));
  *rstd = inv_rms;
  for (int c = 0; c < H; ++c) {
    xhat[c] = x[c] * inv_rms;
    y[c] = xhat[c] * (weight_offset + weight[c]);
  }
}

void rms_norm_backward_row(const float* dy, const float* xhat, float rstd, int H, const float* weight, float* dx,
                           bool accumulate, float* dweight, float weight_offset) {
  float sum_g_xhat = 0.0f;
  for (int c = 0; c < H; ++c) {
    sum_g_xhat += dy[c] * (weight_offset + weight[c]) * xhat[c];
    if (dweight) dweight[c] += dy[c] * xhat[c];
  }
  const float mean_g_xhat = sum_g_xhat / H;
  for (int c = 0; c < H; ++c) {
    const float d = rstd * (dy[c] * (weight_offset + weight[c]) - xhat[c] * mean_g_xhat);
    dx[c] = accumulate ? dx[c] + d : d;
  }
}

void CpuNorm::forward_row(const float* params, const float* x, int H, float* xhat, float* rstd, float* y) const {
  if (kind == Kind::Rms)
    rms_norm_row(x, H, params + weight, eps, xhat, rstd, y, weight_offset);
  else
    layer_norm_row(x, H, params + weight, params + bias, eps, xhat, rstd, y);
}

void CpuNorm::backward_row(const float* params, const float* dy, const float* xhat, float rstd, int H, float* dx,
                           bool accumulate, float* dparams) const {
  float* dweight = dparams ? dparams + weight : nullptr;
  if (kind == Kind::Rms)
    rms_norm_backward_row(dy, xhat, rstd, H, params + weight, dx, accumulate, dweight, weight_offset);
  else
    layer_norm_backward_row(dy, xhat, rstd, H, params + weight, dx, accumulate, dweight,
                            dparams ? dparams + bias : nullptr);
}

void CpuNorm::forward_rows(const float* params, const float* x, int rows, int H, float* xhat, float* rstd,
                           float* y) const {
  for (int r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * H;
    forward_row(params, x + at, H, xhat + at, rstd + r, y + at);
  }
}

void CpuNorm::backward_rows(const float* params, const float* dy, const float* xhat, const float* rstd, int rows,
                            int H, float* dx, float* dparams) const {
  for (int r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r) * H;
    backward_row(params, dy + at, xhat + at, rstd[r], H, dx + at, true, dparams);
  }
}

void linear(const float* x, int rows, int in, const float* weight, const float* bias, int out, const float* residual,
            float* y) {
  if (bias || residual) {
    for (int r = 0; r < rows; ++r) {
      float* yr = y + static_cast<size_t>(r) * out;
      const float* rr = residual ? residual + static_cast<size_t>(r) * out : nullptr;
      for (int c = 0; c < out; ++c) yr[c] = rr && bias ? rr[c] + bias[c] : rr ? rr[c] : bias[c];
    }
  }
  cpu_gemm(false, true, rows, out, in, 1.0f, x, in, weight, in, bias || residual ? 1.0f : 0.0f, y, out);
}

void linear_param_backward(const float* x, const float* dy, int rows, int in, int out, float* dweight, float* dbias) {
  if (!dweight) return;  // a frozen layer
  cpu_gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dweight, in);
  if (!dbias) return;
  for (int r = 0; r < rows; ++r) {
    const float* dyr = dy + static_cast<size_t>(r) * out;
    for (int c = 0; c < out; ++c) dbias[c] += dyr[c];
  }
}

void linear_input_backward(const float* dy, int rows, int in, const float* weight, int out, bool accumulate,
                           float* dx) {
  cpu_gemm(false, false, rows, in, out, 1.0f, dy, out, weight, in, accumulate ? 1.0f : 0.0f, dx, in);
}

}  // namespace shardlm::model_detail

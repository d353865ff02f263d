// Private to src/model: the CPU layers the families' blocks are built from, fp32: LayerNorm and
// RMSNorm rows (a norm named by its offsets in a flat parameter), and linear layers through cpu_gemm.
#pragma once

#include <cstddef>

namespace shardlm::model_detail {

// One row of LayerNorm: y = xhat * weight + bias with xhat = (x - mean) * rstd; keeps xhat and rstd.
void layer_norm_row(const float* x, int H, const float* weight, const float* bias, float eps, float* xhat,
                    float* rstd, float* y);
// Its backward: dx (+)= rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight;
// dweight += dy * xhat, dbias += dy (each unless null: frozen). `accumulate` adds dx onto what is there.
void layer_norm_backward_row(const float* dy, const float* xhat, float rstd, int H, const float* weight, float* dx,
                             bool accumulate, float* dweight, float* dbias);
// One row of RMSNorm: y = xhat * weight with xhat = x * rstd, rstd = 1 / sqrt(mean(x^2) + eps).
// With weight_offset (Gemma's 1): y = xhat * (weight_offset + weight).
void rms_norm_row(const float* x, int H, const float* weight, float eps, float* xhat, float* rstd, float* y,
                  float weight_offset = 0.0f);
// Its backward: dx (+)= rstd * (g - xhat * mean(g * xhat)) with g = dy * (weight_offset + weight); dweight += dy * xhat.
void rms_norm_backward_row(const float* dy, const float* xhat, float rstd, int H, const float* weight, float* dx,
                           bool accumulate, float* dweight, float weight_offset = 0.0f);

// A norm of a family, located by the offsets of its tensors inside a flat parameter: LayerNorm
// (weight and bias) or RMSNorm (weight only).
struct CpuNorm {
  enum class Kind { Layer, Rms };
  Kind kind = Kind::Layer;
  size_t weight = 0, bias = 0;  // element offsets; bias unused for RMSNorm
  float eps = 1e-5f;
  float weight_offset = 0.0f;  // RMSNorm: y = xhat * (weight_offset + weight) (Gemma: 1)

  void forward_row(const float* params, const float* x, int H, float* xhat, float* rstd, float* y) const;
  // dparams (the flat parameter's gradient) receives the weight's (and bias's) gradient; null: frozen.
  void backward_row(const float* params, const float* dy, const float* xhat, float rstd, int H, float* dx,
                    bool accumulate, float* dparams) const;
  void forward_rows(const float* params, const float* x, int rows, int H, float* xhat, float* rstd, float* y) const;
  // dx += the rows' input gradients (the residual's gradient is already there).
  void backward_rows(const float* params, const float* dy, const float* xhat, const float* rstd, int rows, int H,
                     float* dx, float* dparams) const;
};

// y[rows, out] = residual + x[rows, in] W^T + bias with W stored [out, in]; residual and bias may
// be null (without either the product is written straight into y). y may be the residual.
void linear(const float* x, int rows, int in, const float* weight, const float* bias, int out, const float* residual,
            float* y);
// dW[out, in] += dy^T x; dbias[out] += the column sums of dy when dbias is not null. Nothing when
// dweight is null (a frozen layer).
void linear_param_backward(const float* x, const float* dy, int rows, int in, int out, float* dweight, float* dbias);
// dx[rows, in] (=|+=) dy W.
void linear_input_backward(const float* dy, int rows, int in, const float* weight, int out, bool accumulate,
                           float* dx);

}  // namespace shardlm::model_detail

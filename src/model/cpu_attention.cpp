// Causal attention's forward and backward on the CPU (cpu_attention.hpp): per sequence and query
// head, cpu_gemm for Q K^T and P V, loops for the causal softmax.
#include "cpu_attention.hpp"

#include <algorithm>
#include <cmath>

#include "shardlm/device.hpp"

namespace shardlm::model_detail {

void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* probs,
                       float* context) {
  const int T = s.seq, d = s.head_dim, lc = s.heads * d;
  const float scale = s.score_scale();
  for (int b = 0; b < s.batch; ++b) {
    for (int n = 0; n < s.heads; ++n) {
      const int g = s.kv_head_of(n);
      float* p = probs + s.probs_at(b, n);
      cpu_gemm(false, true, T, T, d, scale, q + s.q_at(b, n), s.q_ld, k + s.kv_at(b, g), s.kv_ld, 0.0f, p, T);
      for (int i = 0; i < T; ++i) {
        float* row = p + static_cast<size_t>(i) * T;
        const int lo = s.first_key(b, i);
        if (s.slopes)
          for (int j = lo; j <= i; ++j) row[j] += s.slopes[n] * static_cast<float>(j);
        const float max_score = *std::max_element(row + lo, row + i + 1);
        float total = 0.0f;
        for (int j = lo; j <= i; ++j) {
          row[j] = std::exp(row[j] - max_score);
          total += row[j];
        }
        const float inv_total = 1.0f / total;
        for (int j = lo; j <= i; ++j) row[j] *= inv_total;
        // Causal mask, (packed rows) the keys of earlier samples and those before the sliding window;
        // the backward relies on these zeros.
        std::fill(row, row + lo, 0.0f);
        for (int j = i + 1; j < T; ++j) row[j] = 0.0f;
      }
      cpu_gemm(false, false, T, d, T, 1.0f, p, T, v + s.kv_at(b, g), s.kv_ld, 0.0f, context + s.context_at(b, n), lc);
    }
  }
}

void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* probs,
                        const float* dcontext, float* dscores, float* dq, float* dk, float* dv) {
  const int T = s.seq, d = s.head_dim, lc = s.heads * d;
  const float scale = s.score_scale();
  // dk and dv add up over the query heads of a group: zero them first.
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < T; ++t)
      for (int g = 0; g < s.kv_heads; ++g) {
        const size_t at = s.kv_at(b, g) + static_cast<size_t>(t) * s.kv_ld;
        std::fill(dk + at, dk + at + d, 0.0f);
        std::fill(dv + at, dv + at + d, 0.0f);
      }
  for (int b = 0; b < s.batch; ++b) {
    for (int n = 0; n < s.heads; ++n) {
      const int g = s.kv_head_of(n);
      const float* qn = q + s.q_at(b, n);
      const float* kg = k + s.kv_at(b, g);
      const float* vg = v + s.kv_at(b, g);
      const float* p = probs + s.probs_at(b, n);
      const float* dctx = dcontext + s.context_at(b, n);
      // dP = dctx V^T, dV += P^T dctx.
      cpu_gemm(false, true, T, T, d, 1.0f, dctx, lc, vg, s.kv_ld, 0.0f, dscores, T);
      cpu_gemm(true, false, T, d, T, 1.0f, p, T, dctx, lc, 1.0f, dv + s.kv_at(b, g), s.kv_ld);
      // Softmax backward in place: dS = P * (dP - sum_j P dP); masked entries (the causal mask,
      // other samples of a packed row, keys before the window) have P = 0.
      for (int i = 0; i < T; ++i) {
        const float* prow = p + static_cast<size_t>(i) * T;
        float* row = dscores + static_cast<size_t>(i) * T;
        float dot = 0.0f;
        for (int j = 0; j <= i; ++j) dot += prow[j] * row[j];
        for (int j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot);
        for (int j = i + 1; j < T; ++j) row[j] = 0.0f;
      }
      // S = scale * Q K^T: dQ = scale * dS K, dK += scale * dS^T Q.
      cpu_gemm(false, false, T, d, T, scale, dscores, T, kg, s.kv_ld, 0.0f, dq + s.q_at(b, n), s.q_ld);
      cpu_gemm(true, false, T, d, T, scale, dscores, T, qn, s.q_ld, 1.0f, dk + s.kv_at(b, g), s.kv_ld);
    }
  }
}

}  // namespace shardlm::model_detail

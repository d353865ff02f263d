// The token embedding and the LM head with its fused, chunked cross-entropy on the CPU
// (cpu_head.hpp), shared by every family.
#include "cpu_head.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shardlm/device.hpp"

namespace shardlm::model_detail {
namespace {

// Logits of at most this many tokens exist at once (BLOOM's vocabulary has 250,880 entries).
constexpr size_t kHeadChunkTokens = 128;

// Cross-entropy of `rows` rows of logits [rows, V]; row r's target is targets[positions[r]].
// Returns the sum of the rows' losses. With `backward`, each row is replaced in place by
// d(grad_scale * CE)/d(logits) = grad_scale * (softmax - one_hot(target)).
double cross_entropy_rows(float* logits, int rows, int V, const int32_t* targets, const int32_t* positions,
                          float grad_scale, bool backward) {
  double loss = 0.0;
  for (int r = 0; r < rows; ++r) {
    float* row = logits + static_cast<size_t>(r) * V;
    const int32_t target = targets[positions[r]];
    // Stable log-sum-exp: shift by the row maximum, sum the exponentials in double.
    const float max_logit = *std::max_element(row, row + V);
    double total = 0.0;
    for (int v = 0; v < V; ++v) total += std::exp(row[v] - max_logit);
    loss += max_logit + std::log(total) - row[target];
    if (!backward) continue;
    const float inv_total = static_cast<float>(1.0 / total);
    for (int v = 0; v < V; ++v) row[v] = grad_scale * std::exp(row[v] - max_logit) * inv_total;
    row[target] -= grad_scale;
  }
  return loss;
}

}  // namespace

CpuRootNorm root_norm(const ModelConfig& cfg, const CpuNorm& model_norm) {
  const RootTensor weight = root_tensor(cfg, model_norm.weight);
  CpuRootNorm out{model_norm, weight.saved};
  out.norm.weight = weight.offset;
  if (model_norm.kind == CpuNorm::Kind::Layer) {
    const RootTensor bias = root_tensor(cfg, model_norm.bias);
    SHARDLM_CHECK(bias.saved == weight.saved, "root_norm: a norm's weight and bias are trained apart");
    out.norm.bias = bias.offset;
  }
  return out;
}

void check_tokens(const int32_t* tokens, size_t n, int vocab_size, const char* who, const char* what) {
  for (size_t i = 0; i < n; ++i)
    SHARDLM_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size, who, "::", what, ": token id ", tokens[i], " at position ", i,
                  " is outside the vocabulary [0, ", vocab_size, ")");
}

// ---- embedding ------------------------------------------------------------------------------

CpuEmbedding::CpuEmbedding(const char* who, RootTensor table, const CpuRootNorm* norm, int max_tokens,
                           int hidden_size, int vocab_size)
    : who_(who), table_(table), normed_(norm != nullptr), norm_(norm ? *norm : CpuRootNorm{}),
      hidden_size_(hidden_size), vocab_size_(vocab_size) {
  if (!normed_) return;
  xhat_.allocate(static_cast<size_t>(max_tokens) * hidden_size, MemKind::Activations);
  rstd_.allocate(static_cast<size_t>(max_tokens), MemKind::Activations);
  dx_.allocate(static_cast<size_t>(hidden_size), MemKind::Activations);
}

size_t CpuEmbedding::bytes_for(bool normed, size_t max_tokens, size_t hidden_size) {
  return normed ? (max_tokens * hidden_size + max_tokens + hidden_size) * sizeof(float) : 0;
}

void CpuEmbedding::forward(CpuParams root, const int32_t* tokens, int B, int T, float* h0) {
  const size_t N = static_cast<size_t>(B) * T, H = hidden_size_;
  check_tokens(tokens, N, vocab_size_, who_, "embed_forward");
  batch_ = B;
  seq_ = T;
  const float* table = table_.at(root);
  for (size_t r = 0; r < N; ++r) {
    const float* row = table + static_cast<size_t>(tokens[r]) * H;
    if (normed_)
      norm_.norm.forward_row(norm_.params(root), row, static_cast<int>(H), xhat_.data() + r * H, rstd_.data() + r,
                             h0 + r * H);
    else
      std::memcpy(h0 + r * H, row, sizeof(float) * H);
  }
}

void CpuEmbedding::backward(CpuParams root, const int32_t* tokens, const float* dh0, UnitGrads droot, int B, int T) {
  float* dtable = table_.grad(droot);
  float* dnorm = normed_ ? norm_.grads(droot) : nullptr;
  if (!dtable && !dnorm) return;  // nothing below h0 is trained
  SHARDLM_CHECK(B == batch_ && T == seq_, who_, "::embed_backward: shape ", B, " x ", T,
                " does not match the last embed_forward (", batch_, " x ", seq_, ")");
  const size_t N = static_cast<size_t>(B) * T, H = hidden_size_;
  check_tokens(tokens, N, vocab_size_, who_, "embed_backward");
  // A lookup's gradient is a scatter-add onto the token's row (through the norm when there is one).
  for (size_t r = 0; r < N; ++r) {
    float* row = dtable ? dtable + static_cast<size_t>(tokens[r]) * H : dx_.data();
    const float* g = dh0 + r * H;
    if (normed_)
      norm_.norm.backward_row(norm_.params(root), g, xhat_.data() + r * H, rstd_[r], static_cast<int>(H), row,
                              dtable != nullptr, dnorm);
    else
      for (size_t c = 0; c < H; ++c) row[c] += g[c];
  }
}

// ---- final norm, LM head, cross-entropy -----------------------------------------------------

CpuLmHead::CpuLmHead(const char* who, const CpuRootNorm& norm, RootTensor head, int max_tokens, int hidden_size,
                     int vocab_size)
    : who_(who), norm_(norm), head_(head), hidden_size_(hidden_size), vocab_size_(vocab_size) {
  const size_t chunk = std::min(kHeadChunkTokens, static_cast<size_t>(max_tokens)), H = hidden_size;
  const MemKind kind = MemKind::Activations;
  rows_.allocate(chunk, kind);
  xhat_.allocate(chunk * H, kind);
  rstd_.allocate(chunk, kind);
  out_.allocate(chunk * H, kind);
  grad_.allocate(chunk * H, kind);
  logits_.allocate(chunk * vocab_size, kind);
}

float* CpuLmHead::share_scratch(size_t bytes) {
  if (logits_.size() * sizeof(float) < bytes) logits_.allocate((bytes + sizeof(float) - 1) / sizeof(float), MemKind::Activations);
  return logits_.data();
}

size_t CpuLmHead::scratch_bytes_for(size_t max_tokens, size_t vocab_size) {
  return std::min(kHeadChunkTokens, max_tokens) * vocab_size * sizeof(float);
}

size_t CpuLmHead::bytes() const {
  return (xhat_.size() + rstd_.size() + out_.size() + grad_.size() + logits_.size()) * sizeof(float) +
         rows_.size() * sizeof(int32_t);
}

size_t CpuLmHead::bytes_for(size_t max_tokens, size_t hidden_size, size_t vocab_size) {
  const size_t chunk = std::min(kHeadChunkTokens, max_tokens);
  return (3 * chunk * hidden_size + chunk) * sizeof(float) + scratch_bytes_for(max_tokens, vocab_size) +
         chunk * sizeof(int32_t);
}

double CpuLmHead::loss(CpuParams root, const float* h, const int32_t* targets, int B, int T, int64_t* count,
                       float grad_scale, float* dh, UnitGrads droot) {
  const int H = hidden_size_, V = vocab_size_;
  const size_t N = static_cast<size_t>(B) * T;
  // Validate every target before touching droot, so a bad batch leaves no partial gradient behind.
  for (size_t i = 0; i < N; ++i)
    SHARDLM_CHECK(targets[i] == -1 || (targets[i] >= 0 && targets[i] < V), who_, "::head_loss: target id ",
                  targets[i], " at position ", i, " is outside the vocabulary [0, ", V, ") and is not -1");
  const bool backward = dh != nullptr;
  // Positions without a target get no gradient from the loss; the norm is per position, so their dh is 0.
  if (backward && N > 0) std::memset(dh, 0, sizeof(float) * N * H);

  const float* head = head_.at(root);
  const float* norm = norm_.params(root);
  float* dhead = head_.grad(droot);
  float* dnorm = norm_.grads(droot);
  const int chunk = static_cast<int>(rows_.size());
  double loss = 0.0;
  int64_t counted = 0;
  size_t next = 0;
  while (true) {
    // Gather the next chunk of positions that have a target.
    int rows = 0;
    for (; next < N && rows < chunk; ++next)
      if (targets[next] >= 0) rows_[rows++] = static_cast<int32_t>(next);
    if (rows == 0) break;
    counted += rows;
    for (int r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(r) * H;
      norm_.norm.forward_row(norm, h + static_cast<size_t>(rows_[r]) * H, H, xhat_.data() + at, rstd_.data() + r,
                             out_.data() + at);
    }
    float* logits = logits_.data();
    cpu_gemm(false, true, rows, V, H, 1.0f, out_.data(), H, head, H, 0.0f, logits, V);
    loss += cross_entropy_rows(logits, rows, V, targets, rows_.data(), grad_scale, backward);
    if (!backward) continue;
    // logits = hn W^T: dW += dlogits^T hn (into the embeddings when tied), dhn = dlogits W.
    if (dhead) cpu_gemm(true, false, V, H, rows, 1.0f, logits, V, out_.data(), H, 1.0f, dhead, H);
    cpu_gemm(false, false, rows, H, V, 1.0f, logits, V, head, H, 0.0f, grad_.data(), H);
    for (int r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(r) * H;
      norm_.norm.backward_row(norm, grad_.data() + at, xhat_.data() + at, rstd_[r], H,
                              dh + static_cast<size_t>(rows_[r]) * H, false, dnorm);
    }
  }
  if (count) *count = counted;
  return loss;
}

void CpuLmHead::last_logits(CpuParams root, const float* h, int B, int T, float* logits) {
  SHARDLM_CHECK(B == 0 || T > 0, who_, "::head_logits: sequences of length 0 have no last position");
  const int H = hidden_size_, V = vocab_size_;
  // One sequence at a time: the last position's final norm, then its row of logits.
  for (int b = 0; b < B; ++b) {
    const float* last = h + (static_cast<size_t>(b) * T + (T - 1)) * H;
    norm_.norm.forward_row(norm_.params(root), last, H, xhat_.data(), rstd_.data(), out_.data());
    cpu_gemm(false, true, 1, V, H, 1.0f, out_.data(), H, head_.at(root), H, 0.0f, logits + static_cast<size_t>(b) * V,
             V);
  }
}

}  // namespace shardlm::model_detail

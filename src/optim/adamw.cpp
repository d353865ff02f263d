// AdamW on the rank's fp32 master shards; moments live beside the shard they belong to.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "shardlm/optim.hpp"

namespace shardlm {

AdamW::AdamW(const std::vector<ParamSlice>& slices, const AdamWOptions& opt) : slices_(slices), opt_(opt) {
  for (const ParamSlice& s : slices_) {
    exp_avg_.emplace_back(s.numel, MemKind::Optimizer);
    exp_avg_sq_.emplace_back(s.numel, MemKind::Optimizer);
  }
}

size_t AdamW::state_bytes() const {
  size_t bytes = 0;
  for (size_t i = 0; i < slices_.size(); ++i)
    bytes += (exp_avg_[i].size() + exp_avg_sq_[i].size()) * sizeof(float);
  return bytes;
}

namespace {

void update_range(float* p, const float* g, float* m, float* v, size_t begin, size_t end,
                  float decay_factor, float b1, float b2, float step_size, float bias2_sqrt, float eps) {
  for (size_t i = begin; i < end; ++i) {
    p[i] *= decay_factor;
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    p[i] -= step_size * m[i] / denom;
  }
}

}  // namespace

void AdamW::step(double lr) {
  ++step_;
  const double bias1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(step_));
  const double bias2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(step_));
  const float step_size = static_cast<float>(lr / bias1);
  const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  const float b1 = static_cast<float>(opt_.beta1), b2 = static_cast<float>(opt_.beta2);
  const float eps = static_cast<float>(opt_.eps);
  const float decay = static_cast<float>(1.0 - lr * opt_.weight_decay);
  // Work items: stretches of one slice with one decay factor, cut into pieces of at most 1 M
  // elements so that threads share even a single large slice.
  struct Piece {
    size_t slice, begin, end;
    float decay;
  };
  constexpr size_t kPiece = 1u << 20;
  std::vector<Piece> pieces;
  auto add = [&](size_t s, size_t begin, size_t end, float d) {
    for (size_t b = begin; b < end; b += kPiece) pieces.push_back({s, b, std::min(end, b + kPiece), d});
  };
  for (size_t s = 0; s < slices_.size(); ++s) {
    // Alternating decayed stretches and the no-decay ranges (sorted, disjoint).
    size_t pos = 0;
    for (const auto& [begin, end] : slices_[s].no_decay) {
      add(s, pos, begin, decay);
      add(s, begin, end, 1.0f);
      pos = end;
    }
    add(s, pos, slices_[s].numel, decay);
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < pieces.size(); i = next++) {
      const Piece& p = pieces[i];
      const ParamSlice& slice = slices_[p.slice];
      update_range(slice.param, slice.grad, exp_avg_[p.slice].data(), exp_avg_sq_[p.slice].data(), p.begin, p.end,
                   p.decay, b1, b2, step_size, bias2_sqrt, eps);
    }
  };
  const int helpers = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads_), pieces.size())) - 1;
  std::vector<std::thread> pool;
  for (int t = 0; t < helpers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

double scheduled_lr(LrSchedule schedule, double base_lr, long step, long warmup, long total) {
  if (warmup > 0 && step < warmup) return base_lr * static_cast<double>(step) / static_cast<double>(warmup);
  if (schedule == LrSchedule::Constant) return base_lr;
  if (total <= warmup) return base_lr;
  double remaining = static_cast<double>(total - step) / static_cast<double>(total - warmup);
  return base_lr * (remaining > 0.0 ? remaining : 0.0);
}

double clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(grad_norm)) return 1.0;
  double f = max_norm / (grad_norm + 1e-6);
  return f < 1.0 ? f : 1.0;
}

}  // namespace shardlm

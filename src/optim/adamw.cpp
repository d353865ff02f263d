// AdamW on the rank's fp32 master shards, on the backend that holds them; its moments live there too.
#include <algorithm>
#include <cmath>

#include "shardlm/optim.hpp"

namespace shardlm {

AdamW::AdamW(Backend& backend, const std::vector<ParamSlice>& slices, const AdamWOptions& opt, DType out_dtype)
    : backend_(backend), opt_(opt), out_dtype_(out_dtype) {
  for (const ParamSlice& s : slices) {
    const size_t i = exp_avg_.size();
    slice_ranges_.push_back(ranges_.size());
    exp_avg_.push_back(backend_.allocate(s.numel * sizeof(float), MemKind::Optimizer));
    exp_avg_sq_.push_back(backend_.allocate(s.numel * sizeof(float), MemKind::Optimizer));
    // Alternating decayed stretches and the no-decay ranges (sorted, disjoint).
    auto add = [&](size_t begin, size_t end, double wd) {
      if (end <= begin) return;
      const size_t out = dtype_size(out_dtype_) * begin;
      ranges_.push_back({s.param + begin, s.grad + begin, exp_avg(i) + begin, exp_avg_sq(i) + begin, end - begin, wd,
                         s.param_out ? static_cast<char*>(s.param_out) + out : nullptr});
      range_offset_.push_back(begin);
    };
    size_t pos = 0;
    for (const auto& [begin, end] : s.no_decay) {
      add(pos, begin, opt_.weight_decay);
      add(begin, end, 0.0);
      pos = end;
    }
    add(pos, s.numel, opt_.weight_decay);
  }
  slice_ranges_.push_back(ranges_.size());
}

size_t AdamW::state_bytes() const {
  size_t bytes = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i) bytes += exp_avg_[i].bytes() + exp_avg_sq_[i].bytes();
  return bytes;
}

void AdamW::step(double lr, float grad_scale, Stream s) { backend_.adamw(ranges_, hyper(begin_step(lr, grad_scale)), s); }

void AdamW::update_slices(size_t first, size_t last, const StepHyper& h, Stream s) {
  SHARDLM_CHECK(first <= last && last + 1 <= slice_ranges_.size(), "AdamW::update_slices: no slices [", first, ", ",
                last, ")");
  const std::vector<AdamWRange> some(ranges_.begin() + static_cast<std::ptrdiff_t>(slice_ranges_[first]),
                                     ranges_.begin() + static_cast<std::ptrdiff_t>(slice_ranges_[last]));
  if (!some.empty()) backend_.adamw(some, hyper(h), s);
}

StepHyper count_step(long& steps, double lr, float grad_scale, DType out_dtype) {
  StepHyper h;
  h.lr = lr;
  h.step = ++steps;
  h.grad_scale = grad_scale;
  h.out_dtype = out_dtype;
  return h;
}

AdamWHyper adamw_hyper(const AdamWOptions& opt, const StepHyper& step) {
  AdamWHyper h;
  h.lr = step.lr, h.beta1 = opt.beta1, h.beta2 = opt.beta2, h.eps = opt.eps;
  h.step = step.step;
  h.grad_scale = step.grad_scale;
  h.out_dtype = step.out_dtype;
  return h;
}

StepHyper AdamW::begin_step(double lr, float grad_scale) { return count_step(step_, lr, grad_scale, out_dtype_); }

AdamWHyper AdamW::hyper(const StepHyper& step) const { return adamw_hyper(opt_, step); }

void AdamW::read_state(size_t slice, size_t k, float* out) {
  const DeviceArray& a = (k == 0 ? exp_avg_ : exp_avg_sq_).at(slice);
  backend_.copy(out, a.data(), a.bytes(), CopyKind::DeviceToHost, backend_.compute_stream());
  backend_.synchronize(backend_.compute_stream());
}

void AdamW::write_state(size_t slice, size_t k, const float* in) {
  const DeviceArray& a = (k == 0 ? exp_avg_ : exp_avg_sq_).at(slice);
  backend_.copy(a.data(), in, a.bytes(), CopyKind::HostToDevice, backend_.compute_stream());
  backend_.synchronize(backend_.compute_stream());
}

std::vector<AdamWRange> AdamW::piece(size_t i, size_t begin, size_t end, const AdamWRange& at, DType out_dtype) const {
  SHARDLM_CHECK(i + 1 < slice_ranges_.size(), "AdamW: no slice ", i);
  std::vector<AdamWRange> out;
  for (size_t r = slice_ranges_[i]; r < slice_ranges_[i + 1]; ++r) {
    const AdamWRange& whole = ranges_[r];
    const size_t lo = std::max(begin, range_offset_[r]), hi = std::min(end, range_offset_[r] + whole.numel);
    if (lo >= hi) continue;
    const size_t k = lo - begin;
    out.push_back({at.param + k, at.grad + k, at.exp_avg + k, at.exp_avg_sq + k, hi - lo, whole.weight_decay,
                   at.param_out ? static_cast<char*>(at.param_out) + k * dtype_size(out_dtype) : nullptr});
  }
  return out;
}

void AdamW::update_slice(size_t i, size_t begin, size_t end, void* out, const StepHyper& h) {
  SHARDLM_CHECK(i + 1 < slice_ranges_.size(), "AdamW::update_slice: no slice ", i);
  if (slice_ranges_[i] == slice_ranges_[i + 1]) return;  // an empty slice
  // The slice's own arrays from element begin: its ranges cover it, the first from its element 0.
  const AdamWRange& first = ranges_[slice_ranges_[i]];
  const AdamWRange at{first.param + begin, first.grad + begin, first.exp_avg + begin, first.exp_avg_sq + begin, 0, 0, out};
  backend_.adamw(piece(i, begin, end, at, h.out_dtype), hyper(h), nullptr);
}

void AdamW::update_slice_on(Backend& backend, Stream s, size_t i, size_t begin, size_t end, float* param,
                            const float* grad, const std::vector<float*>& state, void* out, const StepHyper& h) {
  SHARDLM_CHECK(state.size() == 2, "AdamW::update_slice_on: ", state.size(), " state vectors, AdamW has 2");
  backend.adamw(piece(i, begin, end, {param, grad, state[0], state[1], 0, 0, out}, h.out_dtype), hyper(h), s);
}

double clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(grad_norm)) return 1.0;
  double f = max_norm / (grad_norm + 1e-6);
  return f < 1.0 ? f : 1.0;
}

}  // namespace shardlm

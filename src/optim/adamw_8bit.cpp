// 8-bit AdamW on the rank's fp32 master shards (train.optim = adamw_8bit): the codes and block scales of
// its moments live on the backend that holds the shards; Backend::adamw_8bit runs the update. Also the
// factory that picks train.optim's optimizer and the bytes each one's state takes.
#include <algorithm>
#include <cstring>

#include "shardlm/optim.hpp"

namespace shardlm {

std::unique_ptr<Optimizer> make_optimizer(Optim optim, Backend& backend, const std::vector<ParamSlice>& slices,
                                          const AdamWOptions& opt, DType out_dtype) {
  switch (optim) {
    case Optim::AdamWTorch: return std::make_unique<AdamW>(backend, slices, opt, out_dtype);
    case Optim::AdamW8bit: return std::make_unique<AdamW8bit>(backend, slices, opt, out_dtype);
  }
  throw Error(concat("make_optimizer: unknown train.optim ", static_cast<int>(optim)));
}

size_t optimizer_state_bytes(Optim optim, size_t numel) {
  return optim == Optim::AdamW8bit ? AdamW8bit::bytes_for(numel) : 2 * numel * sizeof(float);
}

size_t AdamW8bit::bytes_for(size_t numel) {
  const size_t blocks = (numel + kQuantBlock - 1) / kQuantBlock;
  return 2 * numel + 2 * blocks * sizeof(float);
}

AdamW8bit::AdamW8bit(Backend& backend, const std::vector<ParamSlice>& slices, const AdamWOptions& opt,
                     DType out_dtype)
    : backend_(backend), opt_(opt), out_dtype_(out_dtype) {
  for (const ParamSlice& p : slices) {
    Slice s;
    s.param = p;
    const size_t blocks = (p.numel + kQuantBlock - 1) / kQuantBlock;
    // Zero codes and zero scales are zero moments, as AdamW starts.
    s.exp_avg = backend_.allocate(p.numel, MemKind::Optimizer);
    s.exp_avg_sq = backend_.allocate(p.numel, MemKind::Optimizer);
    s.exp_avg_scale = backend_.allocate(blocks * sizeof(float), MemKind::Optimizer);
    s.exp_avg_sq_scale = backend_.allocate(blocks * sizeof(float), MemKind::Optimizer);
    for (const auto& [begin, end] : p.no_decay) s.no_decay.insert(s.no_decay.end(), {uint64_t(begin), uint64_t(end)});
    slices_.push_back(std::move(s));
  }
}

size_t AdamW8bit::state_bytes() const {
  size_t bytes = 0;
  for (const Slice& s : slices_)
    bytes += s.exp_avg.bytes() + s.exp_avg_sq.bytes() + s.exp_avg_scale.bytes() + s.exp_avg_sq_scale.bytes();
  return bytes;
}

StepHyper AdamW8bit::begin_step(double lr, float grad_scale) { return count_step(step_, lr, grad_scale, out_dtype_); }

AdamWHyper AdamW8bit::hyper(const StepHyper& step) const { return adamw_hyper(opt_, step); }

// Elements [begin, end) of slice i (begin on a block boundary), writing `out` from element begin.
AdamW8bitRange AdamW8bit::range(size_t i, size_t begin, size_t end, void* out) const {
  SHARDLM_CHECK(i < slices_.size(), "AdamW8bit: no slice ", i);
  const Slice& s = slices_[i];
  SHARDLM_CHECK(begin <= end && end <= s.param.numel && begin % kQuantBlock == 0 &&
                    (end % kQuantBlock == 0 || end == s.param.numel),
                "AdamW8bit: elements [", begin, ", ", end, ") of slice ", i, " (", s.param.numel,
                ") are not whole blocks of ", kQuantBlock);
  AdamW8bitRange r;
  r.param = s.param.param + begin;
  r.grad = s.param.grad + begin;
  r.exp_avg = s.exp_avg.as<int8_t>() + begin;
  r.exp_avg_sq = s.exp_avg_sq.as<uint8_t>() + begin;
  r.exp_avg_scale = s.exp_avg_scale.as<float>() + begin / kQuantBlock;
  r.exp_avg_sq_scale = s.exp_avg_sq_scale.as<float>() + begin / kQuantBlock;
  r.numel = end - begin;
  r.no_decay = s.no_decay.data();
  r.no_decay_count = s.param.no_decay.size();
  r.position = begin;
  r.weight_decay = opt_.weight_decay;
  r.param_out = out;
  return r;
}

void AdamW8bit::step(double lr, float grad_scale, Stream s) {
  update_slices(0, slices_.size(), begin_step(lr, grad_scale), s);
}

void AdamW8bit::update_slices(size_t first, size_t last, const StepHyper& h, Stream s) {
  SHARDLM_CHECK(first <= last && last <= slices_.size(), "AdamW8bit::update_slices: no slices [", first, ", ", last,
                ")");
  std::vector<AdamW8bitRange> ranges;
  for (size_t i = first; i < last; ++i)
    if (slices_[i].param.numel > 0) ranges.push_back(range(i, 0, slices_[i].param.numel, slices_[i].param.param_out));
  if (!ranges.empty()) backend_.adamw_8bit(ranges, hyper(h), s);
}

void AdamW8bit::update_slice(size_t i, size_t begin, size_t end, void* out, const StepHyper& h) {
  if (end > begin) backend_.adamw_8bit({range(i, begin, end, out)}, hyper(h), nullptr);
}

void AdamW8bit::update_slice_on(Backend&, Stream, size_t, size_t, size_t, float*, const float*,
                                const std::vector<float*>&, void*, const StepHyper&) {
  throw Error("8-bit AdamW updates an offloaded run's root unit on the host only (fsdp.offload_root_update = host)");
}

// The codes and scales of vector k of slice i, copied to the host when the backend's memory is not.
void AdamW8bit::read_state(size_t slice, size_t k, float* out) {
  SHARDLM_CHECK(slice < slices_.size() && k < 2, "AdamW8bit::read_state: no vector ", k, " of slice ", slice);
  const Slice& s = slices_[slice];
  const DeviceArray& codes = k == 0 ? s.exp_avg : s.exp_avg_sq;
  const DeviceArray& scales = k == 0 ? s.exp_avg_scale : s.exp_avg_sq_scale;
  std::vector<uint8_t> code(codes.bytes());
  std::vector<float> scale(scales.bytes() / sizeof(float));
  const Stream on = backend_.compute_stream();
  backend_.copy(code.data(), codes.data(), codes.bytes(), CopyKind::DeviceToHost, on);
  backend_.copy(scale.data(), scales.data(), scales.bytes(), CopyKind::DeviceToHost, on);
  backend_.synchronize(on);
  const size_t n = s.param.numel;
  for (size_t b = 0; b * kQuantBlock < n; ++b) {
    const size_t at = b * kQuantBlock, len = std::min(kQuantBlock, n - at);
    if (k == 0)
      dequantise_exp_avg(reinterpret_cast<const int8_t*>(code.data()) + at, scale[b], len, out + at);
    else
      dequantise_exp_avg_sq(code.data() + at, scale[b], len, out + at);
  }
}

void AdamW8bit::write_state(size_t slice, size_t k, const float* in) {
  SHARDLM_CHECK(slice < slices_.size() && k < 2, "AdamW8bit::write_state: no vector ", k, " of slice ", slice);
  Slice& s = slices_[slice];
  const DeviceArray& codes = k == 0 ? s.exp_avg : s.exp_avg_sq;
  const DeviceArray& scales = k == 0 ? s.exp_avg_scale : s.exp_avg_sq_scale;
  std::vector<uint8_t> code(codes.bytes());
  std::vector<float> scale(scales.bytes() / sizeof(float));
  const size_t n = s.param.numel;
  for (size_t b = 0; b * kQuantBlock < n; ++b) {
    const size_t at = b * kQuantBlock, len = std::min(kQuantBlock, n - at);
    if (k == 0)
      quantise_exp_avg(in + at, len, reinterpret_cast<int8_t*>(code.data()) + at, &scale[b]);
    else
      quantise_exp_avg_sq(in + at, len, code.data() + at, &scale[b]);
  }
  const Stream on = backend_.compute_stream();
  backend_.copy(codes.data(), code.data(), codes.bytes(), CopyKind::HostToDevice, on);
  backend_.copy(scales.data(), scale.data(), scales.bytes(), CopyKind::HostToDevice, on);
  backend_.synchronize(on);
}

}  // namespace shardlm

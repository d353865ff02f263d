// LoRA's frozen base: each unit's frozen weights, this rank's slice in the compute dtype, initialised or
// loaded through host staging (frozen_state, frozen_loaded), with the checksum of what was loaded.
#include <algorithm>
#include <cstring>

#include "fsdp_engine_impl.hpp"

namespace shardlm {

std::vector<UnitState> FsdpEngine::frozen_state(uint64_t seed) {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.lora, "FsdpEngine::frozen_state: nothing is frozen without LoRA");
  std::vector<UnitState> states;
  frozen_staging_.assign(m.units.size(), {});
  for (size_t u = 0; u < m.units.size(); ++u) {
    const FlatParameter& f = m.units[u].frozen;
    std::vector<float>& host = frozen_staging_[u];
    host.assign(f.shard_numel, 0.0f);
    init_unit_slice(*f.layout, static_cast<int>(u), seed, f.shard_begin, f.shard_begin + f.shard_numel, host.data());
    states.push_back(slice_state(f, groups_.replicate->rank() == 0, host.data()));
  }
  return states;
}

void FsdpEngine::frozen_loaded() {
  Impl& m = *impl_;
  SHARDLM_CHECK(frozen_staging_.size() == m.units.size(), "FsdpEngine::frozen_loaded without frozen_state");
  const DType cdt = plan_.compute_dtype;
  std::vector<uint16_t> host16;
  frozen_checksum_ = 0;
  for (size_t u = 0; u < m.units.size(); ++u) {
    Unit& d = m.units[u];
    std::vector<float>& host = frozen_staging_[u];
    const size_t n = host.size();
    if (cdt != DType::F32) round_to(cdt, host.data(), n);  // the values the model will read
    else if (m.opt.param_dtype != DType::F32) round_to(m.opt.param_dtype, host.data(), n);
    // A sum over the elements this rank holds first (primary replicas), of a hash of (unit, index,
    // value): the same total for any world size once the ranks' parts are added.
    if (groups_.replicate->rank() == 0) {
      const size_t end = std::min(d.frozen.shard_numel, d.frozen.numel - std::min(d.frozen.numel, d.frozen.shard_begin));
      for (size_t i = 0; i < end; ++i) frozen_checksum_ += base_checksum_term(u, d.frozen.shard_begin + i, host[i]);
    }
    if (cdt == DType::F32) {
      // Values as a gather in fsdp.param_dtype would deliver them (the CPU backend's 16-bit runs): rounded above.
      backend_->copy(d.frozen_slice.data(), host.data(), n * sizeof(float),
                     CopyKind::HostToDevice, m.compute);
    } else {
      host16.resize(n);
      pack16(cdt, host.data(), host16.data(), n);
      backend_->copy(d.frozen_slice.data(), host16.data(), n * sizeof(uint16_t), CopyKind::HostToDevice, m.compute);
    }
    backend_->synchronize(m.compute);  // the staging is freed next
    std::vector<float>().swap(host);
  }
  frozen_staging_.clear();
  m.model->frozen_weights_changed();
  m.params_updated();
}

}  // namespace shardlm

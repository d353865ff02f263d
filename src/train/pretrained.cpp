// Starting weights from a Hugging Face model directory (each rank reads the slices it owns) and from a
// PEFT adapter folder; LoRA's frozen base and its checksum.
#include <algorithm>
#include <cstdio>

#include "shardlm/dist.hpp"
#include "train_checkpoint.hpp"

namespace shardlm {

PretrainedLoad load_pretrained(const std::string& dir, const std::vector<UnitState>& units, MPI_Comm comm) {
  Timer timer;
  PretrainedLoad result;
  uint64_t mine = 0;
  // Every rank opens the directory (headers only) and reads its own slices; an error on any rank
  // (a missing tensor, a shape that disagrees with config.json) ends every rank with its message.
  run_collectively(comm, [&] {
    HfModelDir model(dir);
    SHARDLM_CHECK(model.layout().size() == units.size(), "model directory ", dir, " has ", model.layout().size(),
                  " units, the run has ", units.size());
    for (size_t u = 0; u < units.size(); ++u) {
      const UnitState& s = units[u];
      // By the tensors' names: LoRA's units hold a part of the model's (lora_frozen_layout, the saved modules).
      const UnitLayout& as = s.layout ? *s.layout : model.layout()[u];
      SHARDLM_CHECK(s.numel == as.numel, "model directory ", dir, ": unit ", model.layout()[u].name, " has ", as.numel,
                    " elements, the run's has ", s.numel);
      model.read_unit_slice(u, as, s.begin, s.begin + s.count, s.param);
      // A fresh optimizer: its state starts at zero, as in a run from the seed's initialisation.
      for (const StateVector& v : s.optimizer) std::fill(v.data, v.data + s.count, 0.0f);
    }
    mine = model.bytes_read();
  });
  result.seconds_mine = timer.seconds();
  result.bytes_total = mpi_sum(comm, static_cast<uint64_t>(mine));
  result.bytes_max_rank = mpi_max(comm, static_cast<uint64_t>(mine));
  result.seconds = mpi_max(comm, result.seconds_mine);
  return result;
}

PretrainedLoad load_frozen_base(FsdpEngine& engine, const std::string& dir, uint64_t seed, MPI_Comm comm) {
  const PretrainedLoad load = load_pretrained(dir, engine.frozen_state(seed), comm);
  engine.frozen_loaded();
  return load;
}

std::string frozen_base_checksum(const FsdpEngine& engine, MPI_Comm comm) {
  return hex_digits(mpi_sum(comm, static_cast<uint64_t>(engine.frozen_checksum_part())));
}

void load_peft_adapter_slices(FsdpEngine& engine, const std::string& dir, const ModelConfig& model, MPI_Comm comm) {
  const std::vector<UnitState> states = engine.checkpoint_state();
  run_collectively(comm, [&] {
    const PeftAdapter adapter = read_peft_adapter(dir, model);
    for (const UnitState& s : states)
      for (const TensorSpec& spec : s.layout->tensors) {
        const std::vector<float>& values = adapter.tensors.at(spec.name).values;
        const size_t lo = std::max(s.begin, spec.offset), hi = std::min(s.begin + s.count, spec.offset + spec.numel);
        for (size_t i = lo; i < hi; ++i) s.param[i - s.begin] = values[i - spec.offset];
      }
  });
  engine.checkpoint_loaded();
}

}  // namespace shardlm

// Starting weights from a Hugging Face model directory: each rank reads the slices it owns.
#include <algorithm>

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
  unsigned long long in[1] = {mine}, total[1] = {0};
  MPI_Allreduce(in, total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm);
  MPI_Allreduce(&mine, &result.bytes_max_rank, 1, MPI_UINT64_T, MPI_MAX, comm);
  MPI_Allreduce(&result.seconds_mine, &result.seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  result.bytes_total = total[0];
  return result;
}

}  // namespace shardlm

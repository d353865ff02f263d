// The CPU engine: FsdpModel (synchronous schedule over MPI) and AdamW on the host slices.
#include <algorithm>

#include "engine.hpp"
#include "shardlm/optim.hpp"

namespace shardlm {
namespace {

class CpuEngine : public TrainEngine {
 public:
  CpuEngine(const RunConfig& cfg, ProcessGroups groups, int micro)
      : groups_(std::move(groups)),
        model_(cfg.model, FsdpOptions{cfg.fsdp.strategy, cfg.fsdp.param_dtype, cfg.fsdp.reduce_dtype}, groups_,
               micro, cfg.data.max_length, cfg.train.seed),
        optimizer_(model_.param_slices(),
                   {cfg.train.adam_beta1, cfg.train.adam_beta2, cfg.train.adam_eps, cfg.train.weight_decay}) {}

  double forward_backward(const MicroBatch& mb, float grad_scale) override {
    return model_.forward_backward(mb, grad_scale);
  }
  double forward_loss(const MicroBatch& mb) override { return model_.forward_loss(mb); }
  void zero_grad() override { model_.zero_grad(); }
  double grad_norm() override { return model_.grad_norm(); }
  void optimizer_step(double lr, float grad_factor) override {
    model_.scale_grads(grad_factor);
    optimizer_.step(lr);
    model_.params_updated();
  }
  long optimizer_steps() const override { return optimizer_.steps_taken(); }
  void set_optimizer_steps(long steps) override { optimizer_.set_steps_taken(steps); }

  std::vector<UnitState> checkpoint_state() override {
    std::vector<UnitState> states;
    std::vector<FlatParameter>& units = model_.units();
    for (size_t u = 0; u < units.size(); ++u)
      states.push_back(unit_state(units[u], groups_.replicate->rank() == 0, units[u].master.data(),
                                  {{"exp_avg", optimizer_.exp_avg(u)}, {"exp_avg_sq", optimizer_.exp_avg_sq(u)}}));
    return states;
  }
  void checkpoint_loaded() override { model_.params_updated(); }
  FsdpMemory memory() const override { return model_.memory(); }
  size_t optimizer_bytes() const override { return optimizer_.state_bytes(); }
  ProcessGroups& groups() override { return groups_; }
  void decode_begin(int slots, int max_len, int max_rows) override { model_.decode_begin(slots, max_len, max_rows); }
  void decode_step(const int32_t* tokens, const int* slots, const int* positions, int n, const int* logit_rows, int m,
                   int32_t* next) override {
    model_.decode_step(tokens, slots, positions, n, logit_rows, m, next);
  }
  void decode_end() override { model_.decode_end(); }

 private:
  ProcessGroups groups_;
  FsdpModel model_;
  AdamW optimizer_;
};

}  // namespace

UnitState unit_state(const FlatParameter& p, bool primary, float* param, std::vector<StateVector> optimizer) {
  UnitState s;
  s.layout = p.layout;
  s.numel = p.numel;
  s.begin = std::min(p.shard_begin, p.numel);
  s.count = std::min(p.shard_begin + p.shard_numel, p.numel) - s.begin;
  s.primary = primary;
  s.param = param;
  s.optimizer = std::move(optimizer);
  return s;
}

std::unique_ptr<TrainEngine> make_cpu_engine(const RunConfig& cfg, ProcessGroups groups, int micro) {
  return std::make_unique<CpuEngine>(cfg, std::move(groups), micro);
}

}  // namespace shardlm

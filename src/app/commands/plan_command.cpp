// `shardlm plan DECK`: each strategy's per-rank memory (with and without CPU offload and activation
// checkpointing on the CUDA backend), the largest micro-batch that fits, and a recommendation.
// Serial and without MPI: it only sizes buffers (src/fsdp/memory_plan.cpp), it allocates none.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "shardlm/config.hpp"
#include "shardlm/fsdp.hpp"

namespace shardlm {
namespace {

constexpr size_t kGiB = size_t(1) << 30;
// Micro-batches beyond this are not searched (a plan, not a proof that 10^6 sequences fit).
constexpr int kMaxMicroSearched = 1 << 16;

struct PlanArgs {
  std::string deck;
  std::vector<std::string> overrides;
  size_t budget = 80 * kGiB;
  size_t host_budget = 0;  // a node's host memory; 0: this machine's (MemTotal)
  int ranks = 1;
  int ranks_per_node = -1;  // -1: the deck's dist.ranks_per_node
  bool json = false;
};

// The number at the start of `text` (std::stod for double, std::stol for long) and how many
// characters it took: 0 where there is none or it is out of range.
template <typename Number>
std::pair<Number, size_t> leading_number(const std::string& text) {
  size_t used = 0;
  try {
    Number value;
    if constexpr (std::is_floating_point_v<Number>)
      value = std::stod(text, &used);
    else
      value = std::stol(text, &used);
    return {value, used};
  } catch (const std::exception&) {
    return {Number{}, 0};
  }
}

int parse_count(const std::string& flag, const std::string& text) {
  const auto [v, used] = leading_number<long>(text);
  SHARDLM_CHECK(used == text.size() && used > 0 && v >= 1 && v <= (1 << 20), flag, " = '", text,
                "': must be a whole number from 1 to ", 1 << 20);
  return static_cast<int>(v);
}

// Plan's own options; everything else is a deck override for load_run_config.
PlanArgs parse_plan_args(const std::vector<std::string>& args) {
  PlanArgs p;
  p.deck = parse_deck_arguments(args, p.overrides, [&](DeckArgument& a) {
    std::string v;
    if (a.value("--gpu-memory", v))
      p.budget = parse_size("--gpu-memory", v);
    else if (a.value("--host-memory", v))
      p.host_budget = parse_size("--host-memory", v);
    else if (a.value("--ranks-per-node", v))
      p.ranks_per_node = parse_count("--ranks-per-node", v);
    else if (a.value("--ranks", v))
      p.ranks = parse_count("--ranks", v);
    else if (a.arg() == "--json")
      p.json = true;
    else
      return false;
    return true;
  });
  return p;
}

// This machine's memory: MemTotal of /proc/meminfo (0 where it cannot be read).
size_t this_machine_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemTotal:") return kib * 1024;
  return 0;
}

struct Row {
  ShardingStrategy strategy;
  bool offload = false, checkpointing = false;
  RankMemoryPlan memory;
  size_t total = 0;         // what the run reports as its peak
  size_t with_runtime = 0;  // plus the CUDA runtime: what must fit
  bool host_fits = true;  // CUDA: host/node <= the node's host memory
  bool fits = false;      // the GPU's memory and the host's
  int max_micro = 0;
  bool deck = false;  // the deck's own configuration
};

struct Plan {
  RunConfig cfg;
  PlanArgs args;
  int ranks_per_node = 0;
  size_t runtime = 0;
  size_t host_budget = 0;   // a node's host memory (--host-memory, else this machine's)
  std::string host_source;  // where host_budget came from
  std::vector<Row> rows;
  int pick = -1;  // index of the recommended row, or -1 when nothing fits
  std::string why;
};

MemoryPlanSpec spec_of(const Plan& plan, const Row& row, int micro) {
  MemoryPlanSpec s;
  s.model = plan.cfg.model;
  s.backend = plan.cfg.run.backend;
  s.fsdp = fsdp_options(plan.cfg.fsdp);
  s.fsdp.optimizer = plan.cfg.train.optim;
  s.fsdp.strategy = row.strategy;
  s.fsdp.cpu_offload = row.offload;
  s.fsdp.accumulation = std::max(1, plan.cfg.train.batch_size / std::max(1, plan.args.ranks * micro));
  s.activation_checkpointing = row.checkpointing;
  s.world_size = plan.args.ranks;
  s.ranks_per_node = plan.ranks_per_node;
  s.micro_batch = micro;
  s.max_seq = plan.cfg.data.max_length;
  return s;
}

// fsdp.no_sync as the row's run would carry it out (FsdpBufferPlan::no_sync, the plan the buffers come from).
NoSync resolved_no_sync(const Plan& plan, const Row& row) {
  const MemoryPlanSpec s = spec_of(plan, row, plan.cfg.train.micro_batch_size);
  const EngineLayouts layouts = engine_layouts(s.model);
  const bool cuda = s.backend == BackendKind::Cuda;
  return fsdp_buffer_plan(layouts.trainable, layouts.frozen, s.fsdp, row.memory.shard_size, row.memory.replicate_size,
                          cuda, cuda ? s.fsdp.param_dtype : DType::F32)
      .no_sync;
}

size_t needed(const Plan& plan, const Row& row, int micro) {
  return plan_rank_memory(spec_of(plan, row, micro)).device_total() + plan.runtime;
}

// The longest data.max_length whose run fits at the deck's micro-batch with the given attention
// path (0: not even one token, or the host's memory does not fit), by doubling then bisection up to kMaxSeqSearched.
constexpr int kMaxSeqSearched = 1 << 22;
int longest_sequence(const Plan& plan, const Row& row, AttentionImpl attention) {
  if (!row.host_fits) return 0;  // the host's share does not shrink with the sequence
  auto fits = [&](int seq) {
    MemoryPlanSpec s = spec_of(plan, row, plan.cfg.train.micro_batch_size);
    s.model.attention = attention;
    s.max_seq = seq;
    return plan_rank_memory(s).device_total() + plan.runtime <= plan.args.budget;
  };
  if (!fits(1)) return 0;
  int lo = 1, hi = 2;
  while (hi <= kMaxSeqSearched && fits(hi)) lo = hi, hi *= 2;
  if (hi > kMaxSeqSearched) return lo;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

// What the CUDA models will run for attention, as far as the build and the shape tell.
std::string planned_attention(const RunConfig& c) {
  const DType compute = c.fsdp.param_dtype;
  if (c.model.attention == AttentionImpl::Native) return "native (model.attention = native)";
  const std::string refused = fused_attention_refusal(c.model, compute);
  if (refused.empty())
    return concat("cudnn fused flash attention (model.attention = ", attention_impl_name(c.model.attention),
                  "; on a GPU of compute capability 8.0 or newer; the native kernels elsewhere)");
  return concat("native (", refused, ")");
}

// Memory grows with the micro-batch: double until it no longer fits, then bisect.
int largest_micro_batch(const Plan& plan, const Row& row) {
  if (needed(plan, row, 1) > plan.args.budget) return 0;
  int lo = 1, hi = 2;
  while (hi <= kMaxMicroSearched && needed(plan, row, hi) <= plan.args.budget) lo = hi, hi *= 2;
  if (hi > kMaxMicroSearched) return lo;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (needed(plan, row, mid) <= plan.args.budget ? lo : hi) = mid;
  }
  return lo;
}

std::string config_name(const Row& r) {
  return concat(strategy_name(r.strategy), r.offload ? " + CPU offload" : "", r.checkpointing ? " + AC" : "");
}

// Fastest first: fewer collectives (NO_SHARD, then SHARD_GRAD_OP, which gathers once per step;
// the hybrids keep gathers inside a node, HYBRID_SHARD_ZERO2 once per step), then FULL_SHARD;
// recomputation (about 16% slower on the GPU, docs/history/performance-log.md) before CPU offload (bound by the
// host AdamW and the PCIe copies), then both.
void recommend(Plan& plan) {
  const bool cuda = plan.cfg.run.backend == BackendKind::Cuda;
  const bool nodes = plan.args.ranks / plan.ranks_per_node > 1;
  std::vector<ShardingStrategy> order = {ShardingStrategy::NoShard, ShardingStrategy::ShardGradOp};
  if (nodes) order.insert(order.end(), {ShardingStrategy::HybridShardZero2, ShardingStrategy::HybridShard});
  order.push_back(ShardingStrategy::FullShard);
  const std::vector<std::pair<bool, bool>> stages =
      cuda ? std::vector<std::pair<bool, bool>>{{false, false}, {false, true}, {true, false}, {true, true}}
           : std::vector<std::pair<bool, bool>>{{false, false}};
  // The rows in that order of preference.
  std::vector<size_t> preferred;
  for (const auto& [offload, ac] : stages)
    for (ShardingStrategy s : order)
      for (size_t i = 0; i < plan.rows.size(); ++i)
        if (plan.rows[i].strategy == s && plan.rows[i].offload == offload && plan.rows[i].checkpointing == ac)
          preferred.push_back(i);
  for (size_t i : preferred) {
    const Row& r = plan.rows[i];
    if (!r.fits) continue;
    plan.pick = static_cast<int>(i);
    if (!r.offload && !r.checkpointing)
      plan.why = "the fastest that fits: NO_SHARD, then SHARD_GRAD_OP, HYBRID_SHARD_ZERO2, HYBRID_SHARD, FULL_SHARD";
    else if (!r.offload)
      plan.why = "nothing fits without recomputation; activation checkpointing costs about 16%";
    else
      plan.why = "nothing fits without CPU offload, which is slower (the host AdamW, the copies over PCIe)";
    return;
  }
  // Nothing fits: the preferred configuration among those that fit the largest micro-batch.
  const Row* best = nullptr;
  for (size_t i : preferred)
    if (!best || plan.rows[i].max_micro > best->max_micro) best = &plan.rows[i];
  if (best && best->max_micro > 0)
    plan.why = concat("nothing fits at micro-batch ", plan.cfg.train.micro_batch_size, "; ", config_name(*best),
                      " fits micro-batch ", best->max_micro, " (--train.micro_batch_size=", best->max_micro, ")");
  else
    plan.why = "not even micro-batch 1 fits: use more ranks, a shorter data.max_length or more memory";
}

Plan make_plan(const PlanArgs& args) {
  Plan plan;
  plan.args = args;
  plan.cfg = load_run_config(args.deck, args.overrides, args.ranks, false);
  plan.ranks_per_node = args.ranks_per_node > 0 ? args.ranks_per_node : plan.cfg.dist.ranks_per_node;
  if (plan.ranks_per_node <= 0) plan.ranks_per_node = args.ranks;
  SHARDLM_CHECK(args.ranks % plan.ranks_per_node == 0, "--ranks-per-node = ", plan.ranks_per_node,
                ": does not divide --ranks = ", args.ranks);
  const bool cuda = plan.cfg.run.backend == BackendKind::Cuda;
  plan.runtime = cuda ? kCudaRuntimeOverheadBytes : 0;
  plan.host_budget = args.host_budget > 0 ? args.host_budget : this_machine_memory();
  plan.host_source = args.host_budget > 0 ? "--host-memory" : "this machine's MemTotal";
  for (bool offload : {false, true})
    for (bool ac : {false, true})
      for (ShardingStrategy s : all_strategies()) {
        // The CPU backend keeps its state in host memory already and does not recompute.
        if (!cuda && (offload || ac)) continue;
        Row r;
        r.strategy = s, r.offload = offload, r.checkpointing = ac;
        r.memory = plan_rank_memory(spec_of(plan, r, plan.cfg.train.micro_batch_size));
        r.total = r.memory.device_total();
        r.with_runtime = r.total + plan.runtime;
        // The host's share does not grow with the micro-batch: a host that cannot hold it fits none.
        r.host_fits = !cuda || plan.host_budget == 0 || r.memory.host_per_node() <= plan.host_budget;
        r.fits = r.with_runtime <= args.budget && r.host_fits;
        r.max_micro = r.host_fits ? largest_micro_batch(plan, r) : 0;
        r.deck = s == plan.cfg.fsdp.strategy && (!cuda || (offload == plan.cfg.fsdp.cpu_offload &&
                                                           ac == plan.cfg.fsdp.activation_checkpointing));
        plan.rows.push_back(r);
      }
  recommend(plan);
  return plan;
}

// The deck, the model and the budgets the rows are measured against.
void print_plan_header(const Plan& plan) {
  const RunConfig& c = plan.cfg;
  const ModelConfig& m = c.model;
  const bool cuda = c.run.backend == BackendKind::Cuda;
  const size_t params = plan.rows.front().memory.record.model_params;
  std::printf("shardlm plan: %s\n", plan.args.deck.c_str());
  std::printf("model    %s: vocab %d, hidden %d, layers %d, heads %d", m.arch.c_str(), m.vocab_size, m.hidden_size,
              m.num_layers, m.num_heads);
  if (model_family(m.arch).grouped_query) std::printf(", kv heads %d, intermediate %d", m.kv_heads(), m.ffn_size());
  std::printf("; %zu parameters (%s fp32)\n", params, format_bytes(params * 4).c_str());
  if (m.lora.enabled()) {
    const size_t trained = plan.rows.front().memory.record.trainable_params;
    // lora.modules_to_save: whole root modules trained beside the adapters (fp32 master, gradient, AdamW).
    std::string saved;
    for (const std::string& name : m.lora.modules_to_save) saved += (saved.empty() ? " and " : ", ") + name;
    if (!saved.empty()) saved += " whole";
    std::printf("lora     r %d, alpha %g on %zu module kind(s)%s: %zu parameters trained (%.3f%%), the rest of the "
                "base frozen in %s\n", m.lora.r, m.lora.alpha, m.lora.target_modules.size(), saved.c_str(), trained,
                100.0 * static_cast<double>(trained) / static_cast<double>(params),
                dtype_name(cuda ? c.fsdp.param_dtype : DType::F32));
  }
  std::printf("run      %s backend, %d rank(s), %d per node; micro-batch %d x %d tokens; param %s, reduce %s\n",
              backend_name(c.run.backend), plan.args.ranks, plan.ranks_per_node, c.train.micro_batch_size, c.data.max_length,
              dtype_name(c.fsdp.param_dtype), dtype_name(c.fsdp.reduce_dtype));
  if (cuda) std::printf("attention %s\n", planned_attention(c).c_str());
  if (cuda)
    std::printf("budget   %s per GPU, of which %s for the CUDA runtime (context, cuBLASLt, NCCL; measured,\n"
                "         docs/history/performance-log.md); \"total\" is what the run reports as its peak\n",
                format_bytes(plan.args.budget).c_str(), format_bytes(plan.runtime).c_str());
  if (cuda)
    std::printf("host     %s per node (%s); a row fits when host/node fits in it too\n",
                plan.host_budget > 0 ? format_bytes(plan.host_budget).c_str() : "unknown, not checked",
                plan.host_source.c_str());
  else
    std::printf("budget   %s of host memory per rank; \"total\" is what the run reports as its peak\n",
                format_bytes(plan.args.budget).c_str());
}

// One row per configuration: its memory by role, its total and whether it fits.
void print_rows(const Plan& plan) {
  const bool cuda = plan.cfg.run.backend == BackendKind::Cuda;
  std::printf("\n  %-37s %5s %11s %11s %11s %11s %11s %11s", "configuration", "shard", "params", "grads", "optimizer",
              "activations", "buffers", "total");
  if (cuda) std::printf(" %11s %11s %11s", "+runtime", "host/rank", "host/node");
  std::printf(" %4s %9s\n", "fits", "max micro");
  for (const Row& r : plan.rows) {
    const RankMemoryPlan& p = r.memory;
    std::printf("%s %-37s %5d %11s %11s %11s %11s %11s %11s", r.deck ? "*" : " ", config_name(r).c_str(), p.shard_size,
                format_bytes(p.params()).c_str(), format_bytes(p.grads()).c_str(), format_bytes(p.optimizer).c_str(),
                format_bytes(p.activations()).c_str(), format_bytes(p.buffers()).c_str(),
                format_bytes(r.total).c_str());
    if (cuda)
      std::printf(" %11s %11s %11s", format_bytes(r.with_runtime).c_str(), format_bytes(p.host_bytes).c_str(),
                  format_bytes(p.host_per_node()).c_str());
    std::printf(" %4s %9d\n", r.fits ? "yes" : r.host_fits ? "no" : "host", r.max_micro);
  }
}

// What the columns and the offload choices mean.
void print_notes(const Plan& plan) {
  const RunConfig& c = plan.cfg;
  const bool cuda = c.run.backend == BackendKind::Cuda;
  std::printf("\n  * the deck's configuration; shard = shard-group size;"
              " max micro = the largest micro-batch that fits\n");
  if (cuda) std::printf("  fits = host: the GPU's memory would do, the node's host memory (host/node) would not\n");
  if (cuda)
    std::printf("  host/rank, host/node: host memory of a rank and of its node's %d rank(s) (checkpoint staging, or\n"
                "  with CPU offload the fp32 master, gradient and moments plus the pinned copy buffers)\n"
                "  CPU offload keeps no fp32 gradient slice on the GPU: each unit's reduced gradient goes to the host\n"
                "  in fsdp.reduce_dtype as soon as it is reduced, and AdamW runs there unit by unit\n",
                plan.ranks_per_node);
  if (cuda && !c.fsdp.offload_dir.empty())
    for (const Row& r : plan.rows)
      if (r.offload) {
        std::printf("  fsdp.offload_dir = '%s': with CPU offload AdamW's moments (%s per rank with a shard group of\n"
                    "  %d) live in memory-mapped files there, not in host/rank; docs/deck.md says what that costs\n",
                    c.fsdp.offload_dir.c_str(), format_bytes(r.memory.offload_file_bytes).c_str(), r.memory.shard_size);
        // At memory speed only while the page cache holds the files beside what the node's ranks keep.
        const size_t cached = r.memory.host_per_node() + r.memory.offload_file_bytes * plan.ranks_per_node;
        if (plan.host_budget > 0 && cached > plan.host_budget)
          std::printf("  the node's page cache cannot hold them too (%s with host/node, over %s): every optimizer\n"
                      "  step reads and writes them on disk\n", format_bytes(cached).c_str(),
                      format_bytes(plan.host_budget).c_str());
        break;
      }
  std::printf("  grads: the full block-gradient buffers (several ranks%s) lie in the LM head's logits scratch,\n"
              "  which is counted there and not under activations (not with fsdp.no_sync = full)\n",
              cuda ? ", or CPU offload" : "");
  if (!cuda)
    std::printf("  (fsdp.cpu_offload and fsdp.activation_checkpointing apply to the CUDA backend only)\n");
}

// The longest sequence that fits, the accumulation mode and the recommendation.
void print_choices(const Plan& plan) {
  const RunConfig& c = plan.cfg;
  const bool cuda = c.run.backend == BackendKind::Cuda;
  if (cuda) {
    // The longest data.max_length at the deck's micro-batch, for the deck's configuration and the
    // recommended one, with the attention path the run would take and with the native kernels.
    const bool fused = plans_fused_attention(c.model, c.fsdp.param_dtype);
    std::printf("\nlongest sequence that fits at micro-batch %d%s:\n", c.train.micro_batch_size,
                fused ? " (cuDNN attention; native attention in parentheses)" : "");
    for (size_t i = 0; i < plan.rows.size(); ++i) {
      const Row& r = plan.rows[i];
      if (!r.deck && static_cast<int>(i) != plan.pick) continue;
      std::printf("  %-37s %d tokens", concat(config_name(r), r.deck ? " *" : " (recommended)").c_str(),
                  longest_sequence(plan, r, fused ? c.model.attention : AttentionImpl::Native));
      if (fused) std::printf(" (%d)", longest_sequence(plan, r, AttentionImpl::Native));
      std::printf("\n");
    }
  }
  for (const Row& r : plan.rows)
    if (r.deck) {
      const int accumulation = std::max(1, c.train.batch_size / std::max(1, plan.args.ranks * c.train.micro_batch_size));
      const NoSync mode = resolved_no_sync(plan, r);
      std::printf("\naccumulation: %d micro-step(s) a step; fsdp.no_sync = %s runs %s for the deck's configuration%s\n",
                  accumulation, no_sync_name(c.fsdp.no_sync), no_sync_name(mode),
                  mode == NoSync::Full ? " (every block gathered and its full fp32 gradient held through the step: "
                                         "in params and grads above)"
                  : mode == NoSync::Replicate ? " (the replicate group's all-reduce once a step; no extra memory)"
                                              : "");
    }
  if (plan.pick >= 0)
    std::printf("\nrecommendation: %s at micro-batch %d (up to %d fits): %s\n",
                config_name(plan.rows[plan.pick]).c_str(), c.train.micro_batch_size, plan.rows[plan.pick].max_micro,
                plan.why.c_str());
  else
    std::printf("\nrecommendation: none: %s\n", plan.why.c_str());
}

void print_table(const Plan& plan) {
  print_plan_header(plan);
  print_rows(plan);
  print_notes(plan);
  print_choices(plan);
}

void print_json(const Plan& plan) {
  const RunConfig& c = plan.cfg;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const Row& r : plan.rows) {
    const RankMemoryPlan& p = r.memory;
    rows.push_back({{"strategy", strategy_name(r.strategy)},
                    {"cpu_offload", r.offload},
                    {"activation_checkpointing", r.checkpointing},
                    {"deck", r.deck},
                    {"shard_group_size", p.shard_size},
                    {"replicate_group_size", p.replicate_size},
                    {"params_bytes", p.params()},
                    {"grads_bytes", p.grads()},
                    {"optimizer_bytes", p.optimizer},
                    {"activation_bytes", p.activations()},
                    {"buffer_bytes", p.buffers()},
                    {"total_bytes", r.total},
                    {"with_runtime_bytes", r.with_runtime},
                    {"host_optimizer_bytes", p.host_optimizer},
                    {"offload_file_bytes", p.offload_file_bytes},
                    {"host_bytes", p.host_bytes},
                    {"host_bytes_per_node", p.host_per_node()},
                    {"offload_file_bytes_per_node", p.offload_file_bytes * static_cast<size_t>(plan.ranks_per_node)},
                    {"host_fits", r.host_fits},
                    {"fits", r.fits},
                    {"max_micro_batch", r.max_micro},
                    {"no_sync", no_sync_name(resolved_no_sync(plan, r))},
                    {"head_scratch_shared_bytes", p.shared_head_scratch},
                    // The fields of the run's "memory" record, by the same names.
                    {"memory_record",
                     {{"master_shard_bytes", p.record.master_shard},
                      {"grad_shard_bytes", p.record.grad_shard},
                      {"optimizer_bytes", p.optimizer + p.host_optimizer + p.offload_file_bytes},
                      {"full_param_bytes", p.record.full_params},
                      {"full_grad_bytes", p.record.full_grads},
                      {"activation_bytes", p.record.activations},
                      {"comm_staging_bytes", p.record.comm_staging}}}});
  }
  nlohmann::ordered_json out = {
      {"deck", plan.args.deck},
      {"backend", backend_name(c.run.backend)},
      {"model",
       {{"arch", c.model.arch},
        {"vocab_size", c.model.vocab_size},
        {"hidden_size", c.model.hidden_size},
        {"num_layers", c.model.num_layers},
        {"num_heads", c.model.num_heads},
        {"parameters", plan.rows.front().memory.record.model_params}}},
      {"ranks", plan.args.ranks},
      {"ranks_per_node", plan.ranks_per_node},
      {"micro_batch_size", c.train.micro_batch_size},
      {"max_length", c.data.max_length},
      {"param_dtype", dtype_name(c.fsdp.param_dtype)},
      {"reduce_dtype", dtype_name(c.fsdp.reduce_dtype)},
      {"attention", planned_attention(c)},
      {"budget_bytes", plan.args.budget},
      {"runtime_overhead_bytes", plan.runtime},
      {"host_budget_bytes_per_node", plan.host_budget},
      {"host_budget_source", plan.host_source},
      {"rows", rows}};
  if (plan.pick >= 0) {
    const Row& pick = plan.rows[plan.pick];
    out["recommendation"] = {{"strategy", strategy_name(pick.strategy)},
                             {"cpu_offload", pick.offload},
                             {"activation_checkpointing", pick.checkpointing},
                             {"max_micro_batch", pick.max_micro},
                             {"why", plan.why}};
  } else
    out["recommendation"] = {{"strategy", nullptr}, {"why", plan.why}};
  std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

int command_plan(const std::vector<std::string>& args) {
  return run_parsed_command("plan", args, parse_plan_args, [](const PlanArgs& a) {
    const Plan plan = make_plan(a);
    plan.args.json ? print_json(plan) : print_table(plan);
    return 0;
  });
}

}  // namespace shardlm

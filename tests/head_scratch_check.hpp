// The check that the full block-gradient buffers in the LM head's scratch (FsdpBufferPlan::grads_in_head_scratch)
// change nothing, on either backend (test_fsdp on the CPU, test_cuda_engine on the GPU): two engines of one
// deck, one with its buffers apart, take steps with an evaluation and greedy decoding before each micro-step
// (both write the scratch) and must give the same losses, next tokens, gradient norms and gradient slices,
// the sharing one holding less by the bytes the two share. And the same for the gathered embedding table in the
// head's gradient buffer (FsdpBufferPlan::root_overlap).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine.hpp"
#include "mpi_fixture.hpp"
#include "shardlm/fsdp.hpp"
#include "shardlm/train.hpp"

// The bytes an engine holds on its backend, by its own record.
inline size_t engine_bytes(const shardlm::FsdpEngine& e) {
  const shardlm::FsdpMemory m = e.memory();
  return m.master_shard + m.grad_shard + m.full_params + m.full_grads + m.comm_staging + m.activations;
}

// A micro-batch of `micro` random sequences of cfg's max length, every fifth target masked.
inline shardlm::MicroBatch random_micro_batch(const shardlm::RunConfig& cfg, int micro, std::mt19937& rng) {
  const int V = cfg.model.vocab_size, T = cfg.data.max_length;
  shardlm::MicroBatch mb;
  mb.batch = micro, mb.seq = T;
  for (int i = 0; i < micro * T; ++i) mb.tokens.push_back(static_cast<int32_t>(rng() % V));
  for (int i = 0; i < micro * T; ++i) mb.targets.push_back(i % 5 == 0 ? -1 : static_cast<int32_t>(rng() % V));
  mb.target_count = 0;
  for (int32_t t : mb.targets) mb.target_count += t >= 0;
  return mb;
}

// grads holds two engines' gradient slices, every unit of the first, then every unit of the second: each
// unit's two equal bit for bit (exact), or to `tolerance` (1e-5) of the first's largest element; the first
// `inexact` units to that in any case (the root: the GPU embedding's backward adds with atomics, in any order).
inline void expect_same_grad_slices(const std::vector<std::vector<float>>& grads, bool exact, size_t inexact = 0,
                                    float tolerance = 1e-5f) {
  const size_t units = grads.size() / 2;
  for (size_t u = 0; u < units; ++u) {
    const std::vector<float>&a = grads[u], &b = grads[units + u];
    BOOST_TEST_REQUIRE(a.size() == b.size());
    float gap = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) gap = std::max(gap, std::fabs(a[i] - b[i])), scale = std::max(scale, std::fabs(a[i]));
    if (exact && u >= inexact) BOOST_TEST(gap == 0.0f, "unit " << u << ": " << gap << " of " << scale);
    else BOOST_TEST(gap <= tolerance * scale, "unit " << u << ": " << gap << " of " << scale);
  }
}

// An evaluation of `eval` and one greedy token after a 4-token prompt (both write the LM head's scratch and read
// the gathered root): the loss; the token goes to `next`.
inline double evaluate_and_decode(shardlm::FsdpEngine& e, const shardlm::MicroBatch& eval, std::vector<int32_t>& next) {
  static const std::vector<int32_t> prompt = {3, 17, 5, 9};
  static const std::vector<int> slots(4, 0), positions = {0, 1, 2, 3}, last = {3};
  const double loss = e.forward_loss(eval);
  int32_t token = -1;
  e.decode_begin(1, 8, 4);
  e.decode_step(prompt.data(), slots.data(), positions.data(), 4, last.data(), 1, &token, nullptr);
  e.decode_end();
  next.push_back(token);
  return loss;
}

// One step of two engines, the first's losses, tokens, norm and slices, then the second's (each half of each
// vector): the losses and tokens equal, the norms to `norm_tolerance` (1e-9: the GPU's atomic sums of squares),
// the slices bit for bit (exact) or to 1e-5; after an update (not exact) the losses to 1e-6, the norms
// to 1e-5 and the slices to 1e-2. Why so loose after an update: the first step's atomic sums (BLOOM's LayerNorm
// weight gradients, the embedding's rows) differ in their last bits between two engines of one kind, and AdamW's
// g / sqrt(v) makes that a difference of whole steps for the smallest gradients: on 2 x H200 (2026-12-01, BLOOM
// NO_SHARD offloaded, step 3) losses 1e-7 apart, norms 3e-7, the root's slice 1.3e-3 of its largest element.
// What a buffer not zeroed, or overwritten while in use, would do is of the order of the values themselves.
inline void expect_same_step(const std::vector<double>& losses, const std::vector<int32_t>& next,
                             const std::vector<double>& norms, const std::vector<std::vector<float>>& grads,
                             bool exact, bool after_update, double norm_tolerance = 1e-9) {
  after_update = after_update && !exact;
  const double loss_tolerance = after_update ? 1e-6 : 0.0;
  const size_t half = losses.size() / 2;
  for (size_t i = 0; i < half; ++i)
    BOOST_TEST(std::fabs(losses[half + i] - losses[i]) <= loss_tolerance * std::fabs(losses[i]), "loss " << i);
  for (size_t i = 0; i < next.size() / 2; ++i) BOOST_TEST(next[next.size() / 2 + i] == next[i], "token " << i);
  const double norm_gap = std::max(norm_tolerance, after_update ? 1e-5 : 0.0);
  BOOST_TEST(std::fabs(norms[1] - norms[0]) <= norm_gap * norms[0]);
  expect_same_grad_slices(grads, exact, 0, after_update ? 1e-2f : 1e-5f);
}

// Two engines of cfg take two steps (or `steps`) of two micro-steps of the same random micro-batches (the second
// adds to the first; an AdamW update after each step): the same losses, exactly in the first step, to 1e-6 after
// an update, and gradient slices to 1e-5 of each slice's largest element. (Bit for bit would be too strict: the
// norms' weight gradients add with atomics, in any order, so after the first update the parameters may differ in
// their last bits too.)
inline void expect_two_steps_alike(const shardlm::RunConfig& cfg, int micro, shardlm::FsdpEngine& a,
                                   shardlm::FsdpEngine& b, unsigned seed, int steps = 2) {
  using namespace shardlm;
  std::mt19937 rng(seed + static_cast<unsigned>(world_rank()));
  for (int step = 0; step < steps; ++step) {
    const MicroBatch first = random_micro_batch(cfg, micro, rng), second = random_micro_batch(cfg, micro, rng);
    std::vector<double> losses;
    std::vector<std::vector<float>> grads;
    for (FsdpEngine* e : {&a, &b}) {
      e->zero_grad();
      losses.push_back(e->forward_backward(first, 0.5f / first.target_count, 0));
      e->last_micro_step();
      losses.push_back(e->forward_backward(second, 0.5f / second.target_count, 0));
      for (size_t u = 0; u < e->num_units(); ++u) grads.push_back(e->grad_slice(u));
      e->optimizer_step(1e-3, 1.0f);
    }
    BOOST_TEST_CONTEXT("step " << step) {
      const double tolerance = step == 0 ? 0.0 : 1e-6;
      BOOST_TEST(std::fabs(losses[2] - losses[0]) <= tolerance * std::fabs(losses[0]));
      BOOST_TEST(std::fabs(losses[3] - losses[1]) <= tolerance * std::fabs(losses[1]));
      expect_same_grad_slices(grads, false);
    }
  }
}

// `base` under strategy `s` as the checks below run it: the replicated strategies all-reduce over the replicas
// once a step (no sync for the replicas), the sharded ones reduce every micro-step; HYBRID_SHARD as two emulated
// nodes where the world divides. Its topology beside it.
struct StrategyRun {
  shardlm::RunConfig cfg;
  shardlm::Topology topo;
};
inline StrategyRun under_strategy(const shardlm::RunConfig& base, shardlm::ShardingStrategy s) {
  using namespace shardlm;
  StrategyRun r{base, {}};
  r.cfg.fsdp.strategy = s;
  const bool replicated = s == ShardingStrategy::HybridShard || s == ShardingStrategy::NoShard;
  r.cfg.fsdp.no_sync = replicated ? NoSync::Auto : NoSync::Off;
  const int per_node = s == ShardingStrategy::HybridShard && world_size() % 2 == 0 ? world_size() / 2 : 0;
  r.topo = make_topology(MPI_COMM_WORLD, per_node);
  return r;
}

// Every strategy of `base` (its backend, model, dtype and offload as given). The sharded strategies reduce
// every micro-step (no sync in full would keep the buffers apart); the replicated ones all-reduce over the
// replicas once a step (no sync for the replicas, shared). Each step alike as expect_same_step says (`exact`:
// bit for bit).
inline void expect_head_scratch_changes_nothing(const shardlm::RunConfig& base, bool exact) {
  using namespace shardlm;
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::HybridShard,
                             ShardingStrategy::NoShard}) {
    const StrategyRun run = under_strategy(base, s);
    const RunConfig& cfg = run.cfg;
    const Topology& topo = run.topo;
    const int micro = 2;
    auto apart = make_engine(cfg, MPI_COMM_WORLD, topo, micro, [](FsdpOptions& o) { o.share_head_scratch = false; });
    auto shared = make_engine(cfg, MPI_COMM_WORLD, topo, micro);
    const std::string tag = concat(backend_name(cfg.run.backend), "_", cfg.model.arch,
                                   cfg.model.lora.enabled() ? "_lora_" : "_", strategy_name(s),
                                   cfg.fsdp.cpu_offload ? "_offload" : "");
    BOOST_TEST_CONTEXT(tag) {
      const FsdpBufferPlan& plan = shared->buffer_plan();
      BOOST_TEST((plan.no_sync != NoSync::Full));
      BOOST_TEST(plan.grads_in_head_scratch == (plan.grad_buffers > 0));
      BOOST_TEST(!apart->buffer_plan().grads_in_head_scratch);
      BOOST_TEST(shared->memory().full_grads == apart->memory().full_grads);
      if (plan.grads_in_head_scratch) BOOST_TEST(engine_bytes(*shared) < engine_bytes(*apart));
      else BOOST_TEST(engine_bytes(*shared) == engine_bytes(*apart));
      for (FsdpEngine* e : {apart.get(), shared.get()})
        if (e->lora()) {
          e->frozen_state(cfg.train.seed);
          e->frozen_loaded();
        }
      std::mt19937 rng(11 + world_rank());
      auto batch = [&] { return random_micro_batch(cfg, micro, rng); };
      for (int step = 0; step < 3; ++step) {
        const MicroBatch eval = batch(), train_mb = batch();
        std::vector<double> losses, norms;
        std::vector<std::vector<float>> grads;
        std::vector<int32_t> next;
        for (FsdpEngine* e : {apart.get(), shared.get()}) {
          losses.push_back(evaluate_and_decode(*e, eval, next));
          e->zero_grad();
          e->last_micro_step();
          losses.push_back(e->forward_backward(train_mb, 1.0f / train_mb.target_count, 0));
          norms.push_back(e->grad_norm());
          for (size_t u = 0; u < e->num_units(); ++u) grads.push_back(e->grad_slice(u));
          e->optimizer_step(1e-3, 1.0f);
        }
        BOOST_TEST_CONTEXT("step " << step) { expect_same_step(losses, next, norms, grads, exact, step > 0); }
      }
    }
  }
}

// The gathered embedding table in the head's fp32 gradient buffer (FsdpBufferPlan::root_overlap) changes
// nothing, on either backend: an untied model with the root's reduction split (every micro-step reducing),
// FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD, against an engine with the two apart
// (FsdpOptions::table_in_head_grad off), with a deck of one micro-step a step (with accumulation it does not
// apply). Where it applies (several ranks in the shard group) the plan puts the table's bytes (everything of the
// root before the head's part) in the buffer, less at most its 256-byte alignment, and the engine's gradients
// count them less. Each of three steps takes two micro-steps with an
// evaluation and greedy decoding before each (the second micro-step's lookup, the evaluation and decoding
// each need the root gathered again, over the head's gradient): the same losses, next tokens, norms and
// gradient slices (expect_same_step; the norms to 1e-5, as this check first passed on the GPU).
inline void expect_table_in_head_grad_changes_nothing(const shardlm::RunConfig& base, bool exact) {
  using namespace shardlm;
  for (ShardingStrategy s :
       {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::HybridShard}) {
    RunConfig cfg = base;
    cfg.fsdp.strategy = s;
    cfg.fsdp.root_reduction = RootReduction::Split;
    cfg.fsdp.no_sync = NoSync::Off;
    const int per_node = s == ShardingStrategy::HybridShard && world_size() % 2 == 0 ? world_size() / 2 : 0;
    const Topology topo = make_topology(MPI_COMM_WORLD, per_node);
    const int micro = 2;
    // A deck of one micro-step a step (the engines are driven through two below all the same): with
    // accumulation the root stays gathered between micro-steps and shares nothing.
    cfg.train.batch_size = micro * world_size();
    RunConfig accumulating = cfg;
    accumulating.train.batch_size = 2 * micro * world_size();
    BOOST_TEST(make_engine(accumulating, MPI_COMM_WORLD, topo, micro)->buffer_plan().root_overlap == 0u);
    auto apart = make_engine(cfg, MPI_COMM_WORLD, topo, micro, [](FsdpOptions& o) { o.table_in_head_grad = false; });
    auto shared = make_engine(cfg, MPI_COMM_WORLD, topo, micro);
    BOOST_TEST_CONTEXT(concat(backend_name(cfg.run.backend), "_", cfg.model.arch, "_", strategy_name(s))) {
      const FsdpBufferPlan& plan = shared->buffer_plan();
      BOOST_TEST(apart->buffer_plan().root_overlap == 0u);
      const bool applies = !plan.alias && !plan.direct_grads && plan.root_split.grad_from > 0;
      if (shared->groups().shard->size() > 1) BOOST_TEST(applies);
      if (applies) {
        const size_t table = plan.root_split.grad_from * dtype_size(plan.compute_dtype);
        BOOST_TEST(plan.root_overlap <= table);
        BOOST_TEST(plan.root_overlap + 256 > table);
      } else {
        BOOST_TEST(plan.root_overlap == 0u);
      }
      BOOST_TEST(shared->memory().full_grads + plan.root_overlap == apart->memory().full_grads);
      BOOST_TEST(shared->memory().full_params == apart->memory().full_params);
      BOOST_TEST(engine_bytes(*shared) + plan.root_overlap == engine_bytes(*apart));
      std::mt19937 rng(13 + world_rank());
      auto batch = [&] { return random_micro_batch(cfg, micro, rng); };
      for (int step = 0; step < 3; ++step) {
        const MicroBatch eval = batch(), first = batch(), second = batch();
        std::vector<double> losses, norms;
        std::vector<std::vector<float>> grads;
        std::vector<int32_t> next;
        for (FsdpEngine* e : {apart.get(), shared.get()}) {
          e->zero_grad();
          for (const MicroBatch* mb : {&first, &second}) {
            losses.push_back(evaluate_and_decode(*e, eval, next));
            if (mb == &second) e->last_micro_step();
            losses.push_back(e->forward_backward(*mb, 0.5f / mb->target_count, 0));
          }
          norms.push_back(e->grad_norm());
          for (size_t u = 0; u < e->num_units(); ++u) grads.push_back(e->grad_slice(u));
          e->optimizer_step(1e-3, 1.0f);
        }
        BOOST_TEST_CONTEXT("step " << step) { expect_same_step(losses, next, norms, grads, exact, step > 0, 1e-5); }
      }
    }
  }
}

// FsdpBufferPlan::root_in_slices: the head's gradient buffer and the gathered root lie in the first blocks' gradient
// slices (fsdp.root_in_grad_slices, on by default). Against it off, FULL_SHARD and SHARD_GRAD_OP, one micro-step a step: the
// plan puts it there where the shard group has several ranks (`base`'s model small enough: a tiny untied Llama of
// 24 layers whose 259-row vocabulary holds every rank's 64 ids, so that the table's rows are packed), the engine
// then holds the allocation's bytes less (the slices' 256-byte alignment more), and each of three steps, with an
// evaluation and greedy decoding before it (the root gathered over the slices after the update), gives the same
// losses, tokens, norms and slices (expect_same_step). A second forward after a backward, before the update, would
// gather the root over that step's gradients: the engine refuses it.
inline void expect_root_in_slices_changes_nothing(const shardlm::RunConfig& base, bool exact) {
  using namespace shardlm;
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp}) {
    RunConfig cfg = base;
    cfg.fsdp.strategy = s;
    cfg.fsdp.root_reduction = RootReduction::Split;
    cfg.fsdp.no_sync = NoSync::Off;
    cfg.model.tie_word_embeddings = false;
    cfg.model.num_layers = 24;
    cfg.data.max_length = 32;
    const int micro = 2;
    cfg.train.micro_batch_size = micro;
    cfg.train.batch_size = micro * world_size();
    const Topology topo = make_topology(MPI_COMM_WORLD, 0);
    auto apart = make_engine(cfg, MPI_COMM_WORLD, topo, micro, [](FsdpOptions& o) { o.root_in_grad_slices = false; });
    auto inside = make_engine(cfg, MPI_COMM_WORLD, topo, micro);  // (the key's default)
    BOOST_TEST_CONTEXT(concat(backend_name(cfg.run.backend), "_", strategy_name(s))) {
      const FsdpBufferPlan& plan = inside->buffer_plan();
      BOOST_TEST(!apart->buffer_plan().root_in_slices);
      BOOST_TEST(plan.root_in_slices == (world_size() > 1));
      if (plan.root_in_slices) {
        BOOST_TEST(plan.root_split.rows_packed);
        BOOST_TEST(2 * plan.slices_under_root <= plan.layers);
        const size_t padding = plan.layers * (plan.slice_stride - plan.block_padded / world_size() * sizeof(float));
        BOOST_TEST(engine_bytes(*inside) + plan.root_shared_bytes() == engine_bytes(*apart) + padding);
        BOOST_TEST(inside->memory().grad_shard == apart->memory().grad_shard + padding);
      } else {
        BOOST_TEST(engine_bytes(*inside) == engine_bytes(*apart));
      }
      std::mt19937 rng(29 + world_rank());
      for (int step = 0; step < 3; ++step) {
        const MicroBatch eval = random_micro_batch(cfg, micro, rng), mb = random_micro_batch(cfg, micro, rng);
        std::vector<double> losses, norms;
        std::vector<std::vector<float>> grads;
        std::vector<int32_t> next;
        for (FsdpEngine* e : {apart.get(), inside.get()}) {
          e->zero_grad();
          losses.push_back(evaluate_and_decode(*e, eval, next));
          e->last_micro_step();
          losses.push_back(e->forward_backward(mb, 0.5f / mb.target_count, 0));
          if (e == inside.get() && plan.root_in_slices && step == 1) BOOST_CHECK_THROW(e->forward_loss(eval), Error);
          norms.push_back(e->grad_norm());
          for (size_t u = 0; u < e->num_units(); ++u) grads.push_back(e->grad_slice(u));
          e->optimizer_step(1e-3, 1.0f);
        }
        BOOST_TEST_CONTEXT("step " << step) { expect_same_step(losses, next, norms, grads, exact, step > 0, 1e-5); }
      }
    }
  }
}

// RootSplit::rows_packed: the embedding's backward adds each token's row into its packed row (the row's first
// occurrence among every rank's ids) instead of writing the table's rows over the head's part and packing them
// from there: the same steps as with it off (expect_two_steps_alike, three steps). `base`'s model made untied with a
// vocabulary of 2,048 rows, which holds every rank's ids (the slots are token ids to the model); FULL_SHARD,
// SHARD_GRAD_OP and HYBRID_SHARD.
inline void expect_rows_packed_changes_nothing(const shardlm::RunConfig& base) {
  using namespace shardlm;
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::HybridShard}) {
    RunConfig cfg = base;
    cfg.fsdp.strategy = s;
    cfg.model.tie_word_embeddings = false;
    cfg.model.vocab_size = 2048;
    cfg.fsdp.root_reduction = RootReduction::Split;
    cfg.fsdp.no_sync = NoSync::Off;
    const int per_node = s == ShardingStrategy::HybridShard && world_size() % 2 == 0 ? world_size() / 2 : 0;
    const Topology topo = make_topology(MPI_COMM_WORLD, per_node);
    const int micro = 2;
    auto apart = make_engine(cfg, MPI_COMM_WORLD, topo, micro, [](FsdpOptions& o) { o.rows_packed = false; });
    auto packed = make_engine(cfg, MPI_COMM_WORLD, topo, micro);
    BOOST_TEST_CONTEXT(concat(backend_name(cfg.run.backend), "_", strategy_name(s))) {
      BOOST_TEST(!apart->buffer_plan().root_split.rows_packed);
      BOOST_TEST(packed->buffer_plan().root_split.rows_packed == (world_size() > 1));
      expect_two_steps_alike(cfg, micro, *apart, *packed, 61, 3);
    }
  }
}

// FsdpEngine::LossRead::later (a step's loss read once, after its last micro-step) changes nothing: two engines
// of `base` on every strategy (the replicated ones without a reduction before the last micro-step), three steps
// of three micro-steps, one reading each micro-step's loss, the other none but the last's. The deferring engine
// returns 0 for the first two and their sum with the third's for the last (to 1e-12 of it on the CPU, whose loss
// is a double; to 1e-6 on the GPU, whose device sum is fp32); the gradient slices and norms as
// expect_same_step (`exact`: bit for bit before an update). An evaluation between unread micro-steps is refused;
// zero_grad() drops a loss left unread.
inline void expect_loss_read_once_changes_nothing(const shardlm::RunConfig& base, bool exact) {
  using namespace shardlm;
  const bool cpu = base.run.backend == BackendKind::Cpu;
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::HybridShard,
                             ShardingStrategy::NoShard}) {
    const StrategyRun run = under_strategy(base, s);
    const RunConfig& cfg = run.cfg;
    const Topology& topo = run.topo;
    const int micro = 2, micro_steps = 3;
    auto reading = make_engine(cfg, MPI_COMM_WORLD, topo, micro);
    auto deferring = make_engine(cfg, MPI_COMM_WORLD, topo, micro);
    BOOST_TEST_CONTEXT(backend_name(cfg.run.backend) << " " << cfg.model.arch << " " << strategy_name(s)
                                                     << (cfg.fsdp.cpu_offload ? " offload" : "")) {
      std::mt19937 rng(29 + world_rank());
      for (int step = 0; step < 3; ++step) {
        std::vector<MicroBatch> mbs;
        for (int m = 0; m < micro_steps; ++m) mbs.push_back(random_micro_batch(cfg, micro, rng));
        double read_sum = 0, deferred_sum = 0;
        std::vector<double> norms;
        std::vector<std::vector<float>> grads;
        for (FsdpEngine* e : {reading.get(), deferring.get()}) {
          const bool defer = e == deferring.get();
          e->zero_grad();
          if (defer && step == 1) {  // a loss left unread: an evaluation is refused, zero_grad() drops it
            e->forward_backward(mbs[0], 0.0f, 0, FsdpEngine::LossRead::later);
            BOOST_CHECK_THROW(e->forward_loss(mbs[0]), Error);
            e->zero_grad();
          }
          for (int m = 0; m < micro_steps; ++m) {
            const bool last = m + 1 == micro_steps;
            if (last) e->last_micro_step();
            const double loss = e->forward_backward(mbs[m], 1.0f / (micro_steps * mbs[m].target_count), 0,
                                                    defer && !last ? FsdpEngine::LossRead::later
                                                                   : FsdpEngine::LossRead::now);
            if (defer && !last) BOOST_TEST(loss == 0.0);
            (defer ? deferred_sum : read_sum) += loss;
          }
          norms.push_back(e->grad_norm());
          for (size_t u = 0; u < e->num_units(); ++u) grads.push_back(e->grad_slice(u));
          e->optimizer_step(1e-3, 1.0f);
        }
        BOOST_TEST_CONTEXT("step " << step) {
          const bool after_update = step > 0 && !exact;
          const double loss_tolerance = (cpu ? 1e-12 : 1e-6) + (after_update ? 1e-6 : 0.0);
          BOOST_TEST(read_sum > 0.0);
          BOOST_TEST(std::fabs(deferred_sum - read_sum) <= loss_tolerance * read_sum, deferred_sum << " " << read_sum);
          BOOST_TEST(std::fabs(norms[1] - norms[0]) <= (after_update ? 1e-5 : 1e-9) * norms[0]);
          expect_same_grad_slices(grads, exact, 0, after_update ? 1e-2f : 1e-5f);
        }
      }
    }
  }
}

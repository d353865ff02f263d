// CPU offload's host side on the CPU (under mpirun): the host worker's ordering, tickets and errors,
// and the FSDP engine's offloaded schedule run end to end over a CPU backend posing as a device (its
// memory reached through copies only), against the same engine without offload: equal losses,
// gradient norms and final state for every strategy, with gradient accumulation, clipping, the early
// per-unit updates, a 16-bit reduction, LoRA and a checkpoint round trip. The CUDA side of the same
// schedule (streams, events, pinned copies) is test_cuda_engine's. The same engine without offload also
// checks fsdp.no_sync (accumulation that reduces once a step) against every micro-step reducing.
#define BOOST_TEST_MODULE test_offload
#include "mpi_fixture.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "config_test_support.hpp"
#include "host_worker.hpp"
#include "temp_dir.hpp"
#include "shardlm/fsdp.hpp"

using namespace shardlm;

namespace {

// The CPU backend as a device: host_memory() is false, so the engine stages the batch and the offload
// copies through copy() as it does on a GPU; everything else is the CPU backend's.
class DeviceLikeCpu final : public Backend {
 public:
  DeviceLikeCpu() : cpu_(make_cpu_backend(1)) {}
  BackendKind kind() const override { return BackendKind::Cpu; }
  bool host_memory() const override { return false; }
  bool asynchronous() const override { return false; }
  DType compute_dtype(DType p) const override { return cpu_->compute_dtype(p); }
  std::string device_name() const override { return "cpu as a device"; }
  DeviceArray allocate(size_t bytes, MemKind kind) override { return cpu_->allocate(bytes, kind); }
  size_t allocated_bytes() const override { return cpu_->allocated_bytes(); }
  size_t peak_bytes() const override { return cpu_->peak_bytes(); }
  size_t available_bytes() const override { return cpu_->available_bytes(); }
  void pin_host(void* p, size_t bytes) override { cpu_->pin_host(p, bytes); }
  void unpin_host(void* p) override { cpu_->unpin_host(p); }
  Stream compute_stream() const override { return nullptr; }
  Stream comm_stream() const override { return nullptr; }
  Stream copy_stream(CopyKind) const override { return nullptr; }
  std::unique_ptr<BackendEvent> make_event() override { return cpu_->make_event(); }
  std::unique_ptr<BackendEvent> make_timing_event() override { return cpu_->make_timing_event(); }
  double elapsed_ms(BackendEvent& a, BackendEvent& b) override { return cpu_->elapsed_ms(a, b); }
  void synchronize(Stream s) override { cpu_->synchronize(s); }
  void bind_thread() override {}
  int host_threads() const override { return 1; }
  void zero(void* p, size_t bytes, Stream s) override { cpu_->zero(p, bytes, s); }
  void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream s) override {
    cpu_->copy(dst, src, bytes, kind, s);
  }
  void cast(const void* in, DType a, void* out, DType b, size_t n, Stream s) override { cpu_->cast(in, a, out, b, n, s); }
  void accumulate(float* x, const void* y, DType dt, size_t n, Stream s) override { cpu_->accumulate(x, y, dt, n, s); }
  void sum_squares(const float* x, size_t n, double* sum, Stream s) override { cpu_->sum_squares(x, n, sum, s); }
  void adamw(const std::vector<AdamWRange>& r, const AdamWHyper& h, Stream s) override { cpu_->adamw(r, h, s); }
  void adamw_8bit(const std::vector<AdamW8bitRange>& r, const AdamWHyper& h, Stream s) override {
    cpu_->adamw_8bit(r, h, s);
  }
  void rows_mark_first(const int32_t* ids, size_t m, int32_t* first, size_t rows, Stream s) override {
    cpu_->rows_mark_first(ids, m, first, rows, s);
  }
  void rows_slots(const int32_t* ids, size_t n, const int32_t* first, size_t m, size_t rows, int32_t* slots,
                  Stream s) override {
    cpu_->rows_slots(ids, n, first, m, rows, slots, s);
  }
  void rows_pack(const float* t, size_t w, const int32_t* ids, const int32_t* first, size_t m, size_t rows, void* out,
                 DType dt, Stream s) override {
    cpu_->rows_pack(t, w, ids, first, m, rows, out, dt, s);
  }
  void rows_unpack_add(const void* in, DType dt, size_t w, const int32_t* ids, const int32_t* first, size_t m, size_t rows,
                       float* slice, long long pos, size_t count, Stream s) override {
    cpu_->rows_unpack_add(in, dt, w, ids, first, m, rows, slice, pos, count, s);
  }
  void rows_sum_squares(size_t w, const int32_t* ids, const int32_t* first, size_t m, size_t rows, const float* slice,
                        long long pos, size_t count, bool named, double* sum, Stream s) override {
    cpu_->rows_sum_squares(w, ids, first, m, rows, slice, pos, count, named, sum, s);
  }
  void rows_zero(float* t, size_t w, const int32_t* ids, size_t m, size_t rows, Stream s) override {
    cpu_->rows_zero(t, w, ids, m, rows, s);
  }

 private:
  std::unique_ptr<Backend> cpu_;
};

ModelConfig tiny_model(bool lora) {
  ModelConfig c = bloom_shape(67, 16, 3, 2);
  c.init_std = 0.3f;
  if (lora) {
    c.lora.r = 2;
    c.lora.alpha = 4;
    c.lora.target_modules = {"query_key_value", "dense_4h_to_h"};
  }
  return c;
}

constexpr int kBatch = 2, kSeq = 9;

// Micro-batch m of step s on this rank: random tokens, every position a target but the last.
MicroBatch micro_batch(int s, int m, const ModelConfig& c) {
  std::mt19937 rng(1000 * s + 10 * m + world_rank());
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
  MicroBatch mb;
  mb.batch = kBatch, mb.seq = kSeq;
  for (int i = 0; i < kBatch * kSeq; ++i) {
    mb.tokens.push_back(token(rng));
    mb.targets.push_back(i % kSeq == kSeq - 1 ? -1 : token(rng));
  }
  mb.target_count = kBatch * (kSeq - 1);
  return mb;
}

struct Case {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  int accum = 1;
  double max_norm = 0;       // 0: no clipping
  bool announce = true;      // last_micro_step as the trainer calls it
  DType reduce = DType::F32;
  bool lora = false;
  std::string moments_dir;   // fsdp.offload_dir: the host AdamW's moments in mapped files there
  bool device_sums = false;  // fsdp.offload_accumulate = device
  bool root_on_device = false;  // fsdp.offload_root_update = device (in chunks of kRootChunk elements)
  size_t resident = 0;          // with it, the root's elements resident on the device (fsdp.offload_resident_gib)
  // fsdp.no_sync; off by default, so that the engine without offload sums in the order the offloaded one
  // does (an offloaded engine runs off whatever it says)
  NoSync no_sync = NoSync::Off;
  bool split_root = false;        // fsdp.root_reduction = split
  Optim optim = Optim::AdamWTorch;  // train.optim
};
// Less than the tiny root's slice on any rank count used, so its update on the device takes several
// chunks and both buffers.
constexpr size_t kRootChunk = 100;
// Resident elements: some (not a whole number of chunks, so the streamed rest starts mid-chunk), and
// more than any rank's slice of the root (all of it).
constexpr size_t kSomeResident = 130, kAllResident = size_t(1) << 30;

std::string name_of(const Case& c) {
  return concat(strategy_name(c.strategy), " accum ", c.accum, " max_norm ", c.max_norm, c.announce ? "" : " unannounced",
                " reduce ", dtype_name(c.reduce), c.lora ? " lora" : "", c.device_sums ? " device sums" : "",
                c.root_on_device ? " root on device" : "", c.resident ? concat(" resident ", c.resident) : "",
                " no_sync ", no_sync_name(c.no_sync), c.split_root ? " split root" : "", " ", optim_name(c.optim));
}

struct Run {
  std::vector<double> losses, norms, eval;
  std::vector<std::vector<float>> master, exp_avg_sq;
  long steps = 0;
};

std::unique_ptr<FsdpEngine> make_engine(const Case& c, bool offload) {
  const ModelConfig model = tiny_model(c.lora);
  const int per_node = world_size() >= 2 ? world_size() / 2 : 1;  // the hybrids: two emulated nodes
  const Topology topo = make_topology(MPI_COMM_WORLD, per_node);
  FsdpOptions o;
  o.strategy = c.strategy;
  o.reduce_dtype = c.reduce;
  o.cpu_offload = offload;
  o.offload_accumulate = c.device_sums ? OffloadAccumulate::Device : OffloadAccumulate::Host;
  o.offload_root_update = offload && c.root_on_device ? OffloadRootUpdate::Device : OffloadRootUpdate::Host;
  o.offload_stream_chunk = kRootChunk;
  o.offload_resident_gib = double(c.resident * 3 * sizeof(float)) / double(size_t(1) << 30);  // exact
  o.no_sync = c.no_sync;
  o.accumulation = c.accum;
  o.root_reduction = c.split_root ? RootReduction::Split : RootReduction::Whole;
  o.optimizer = c.optim;
  AdamWOptions adam;
  adam.weight_decay = 0.1;
  std::unique_ptr<Backend> be = offload ? std::unique_ptr<Backend>(new DeviceLikeCpu) : make_cpu_backend(1);
  return std::make_unique<FsdpEngine>(std::move(be), make_mpi_process_groups(MPI_COMM_WORLD, topo, c.strategy),
                                      make_unit_model(model, BackendKind::Cpu, DType::F32, kBatch, kSeq, false), o, adam,
                                      7, kBatch * kSeq, offload ? make_cpu_backend(2, c.moments_dir) : nullptr);
}

// Five optimizer steps as train_step takes them, then an eval loss and the final state.
Run train_steps(const Case& c, bool offload) {
  const ModelConfig model = tiny_model(c.lora);
  std::unique_ptr<FsdpEngine> e = make_engine(c, offload);
  Run r;
  const float scale = 1.0f / static_cast<float>(world_size() * c.accum * kBatch * (kSeq - 1));
  const bool known = c.max_norm <= 0;
  for (int s = 0; s < 5; ++s) {
    const double lr = 2e-2 * (s + 1);
    e->zero_grad();
    double loss = 0;
    for (int m = 0; m < c.accum; ++m) {
      if (c.announce && m + 1 == c.accum)
        e->last_micro_step(known ? std::optional<FsdpEngine::StepUpdate>({lr, 1.0f}) : std::nullopt);
      loss += e->forward_backward(micro_batch(s, m, model), scale, 0);
    }
    r.losses.push_back(loss);
    const double norm = e->grad_norm();
    r.norms.push_back(norm);
    e->optimizer_step(lr, known ? 1.0f : static_cast<float>(clip_factor(norm, c.max_norm)));
  }
  r.eval.push_back(e->forward_loss(micro_batch(9, 0, model)));
  for (const UnitState& st : e->checkpoint_state()) {
    r.master.emplace_back(st.param, st.param + st.count);
    r.exp_avg_sq.emplace_back(st.optimizer.at(1).data, st.optimizer.at(1).data + st.count);
  }
  r.steps = e->optimizer_steps();
  return r;
}

void expect_same(const Run& got, const Run& want, double rel) {
  BOOST_TEST_REQUIRE(got.losses.size() == want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    BOOST_TEST(got.losses[i] == want.losses[i], boost::test_tools::tolerance(rel));
    BOOST_TEST(got.norms[i] == want.norms[i], boost::test_tools::tolerance(rel));
  }
  BOOST_TEST(got.eval.at(0) == want.eval.at(0), boost::test_tools::tolerance(rel));
  BOOST_TEST(got.steps == want.steps);
  BOOST_TEST_REQUIRE(got.master.size() == want.master.size());
  for (size_t u = 0; u < want.master.size(); ++u)
    for (size_t i = 0; i < want.master[u].size(); ++i) {
      BOOST_TEST(got.master[u][i] == want.master[u][i], boost::test_tools::tolerance(static_cast<float>(rel * 10)));
      BOOST_TEST(got.exp_avg_sq[u][i] == want.exp_avg_sq[u][i], boost::test_tools::tolerance(static_cast<float>(rel * 10)));
    }
}

// Case c's steps offloaded give its steps without offload (expect_same to a relative 1e-6).
void expect_offload_changes_nothing(const Case& c) {
  BOOST_TEST_CONTEXT(name_of(c)) { expect_same(train_steps(c, true), train_steps(c, false), 1e-6); }
}

// `base` under every strategy, with each of `accums` micro-steps a step, updating early (no clipping)
// and deferred (clipping at 0.05): strategy outermost, clipping innermost.
std::vector<Case> every_strategy(const Case& base, std::initializer_list<int> accums) {
  std::vector<Case> cases;
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard,
                             ShardingStrategy::HybridShard, ShardingStrategy::HybridShardZero2})
    for (int accum : accums)
      for (double max_norm : {0.0, 0.05}) {
        Case c = base;
        c.strategy = s, c.accum = accum, c.max_norm = max_norm;
        cases.push_back(c);
      }
  return cases;
}

}  // namespace

// ---- the host worker ----

BOOST_AUTO_TEST_CASE(host_worker_runs_tasks_in_order_and_waits_by_ticket) {
  std::vector<int> seen;
  std::atomic<bool> release{false};
  HostWorker w;
  BOOST_TEST(w.idle());
  w.wait(0);  // no task: returns at once
  const HostWorker::Ticket t1 = w.post([&] {
    while (!release) std::this_thread::yield();
    seen.push_back(1);
  });
  const HostWorker::Ticket t2 = w.post([&] { seen.push_back(2); });
  BOOST_TEST(t1 == 1u);
  BOOST_TEST(t2 == 2u);
  BOOST_TEST(!w.idle());
  release = true;
  w.wait(t1);
  BOOST_TEST(seen.size() >= 1u);
  w.drain();
  BOOST_TEST(seen == std::vector<int>({1, 2}));
  BOOST_TEST(w.idle());
  BOOST_CHECK_THROW(w.wait(7), Error);  // never posted
}

BOOST_AUTO_TEST_CASE(host_worker_keeps_the_first_error_and_skips_what_follows) {
  std::vector<int> seen;
  {
    HostWorker w;
    w.post([&] { seen.push_back(1); });
    const HostWorker::Ticket bad = w.post([] { throw std::runtime_error("first"); });
    w.post([] { throw std::runtime_error("second"); });
    const HostWorker::Ticket after = w.post([&] { seen.push_back(4); });
    try {
      w.wait(bad);
      BOOST_FAIL("no error");
    } catch (const std::runtime_error& e) {
      BOOST_TEST(std::string(e.what()) == "first");
    }
    BOOST_CHECK_THROW(w.wait(after), std::runtime_error);  // and on every wait after
  }
  BOOST_TEST(seen == std::vector<int>({1}));
}

BOOST_AUTO_TEST_CASE(host_worker_finishes_its_queue_before_it_goes) {
  std::atomic<int> done{0};
  {
    HostWorker w([&] { done += 100; });  // the setup runs first, on the worker thread
    for (int i = 0; i < 50; ++i)
      w.post([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        ++done;
      });
  }
  BOOST_TEST(done == 150);
}

// ---- the offloaded engine against the same engine without offload ----

// Every strategy, early updates (no clipping) and deferred ones (clipping), with and without
// accumulation: the same losses, gradient norms, eval loss, master and moments.
BOOST_AUTO_TEST_CASE(offloaded_steps_give_the_steps_without_offload) {
  for (const Case& c : every_strategy(Case{}, {1, 2})) expect_offload_changes_nothing(c);
}

// 8-bit AdamW (train.optim = adamw_8bit) offloaded: the host updates every unit in block-aligned chunks,
// early or at optimizer_step, with its state in memory or in mapped files, and gives the steps without offload.
BOOST_AUTO_TEST_CASE(offloaded_8bit_adamw_gives_the_steps_without_offload) {
  TempDir dir{"offload_8bit"};
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::HybridShard})
    for (double max_norm : {0.0, 0.05})
      for (bool in_files : {false, true}) {
        Case c;
        c.strategy = s, c.accum = 2, c.max_norm = max_norm, c.optim = Optim::AdamW8bit;
        if (in_files) c.moments_dir = dir.root.string();
        BOOST_TEST_CONTEXT(name_of(c) << (in_files ? " in files" : "")) {
          expect_same(train_steps(c, true), train_steps(c, false), 1e-6);
        }
      }
}

// The clipping cases clip: the norms exceed max_norm (else they would test nothing deferred).
// ---- fsdp.no_sync, without offload ----

// Three steps at a small learning rate: each step's loss, gradient norm and every unit's gradient slice.
struct GradRun {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> grads;  // step-major, then unit
};
GradRun accumulated_gradients(const Case& c) {
  const ModelConfig model = tiny_model(c.lora);
  std::unique_ptr<FsdpEngine> e = make_engine(c, false);
  const float scale = 1.0f / static_cast<float>(world_size() * c.accum * kBatch * (kSeq - 1));
  GradRun r;
  for (int s = 0; s < 3; ++s) {
    e->zero_grad();
    double loss = 0;
    for (int m = 0; m < c.accum; ++m) {
      if (c.announce && m + 1 == c.accum) e->last_micro_step();
      loss += e->forward_backward(micro_batch(s, m, model), scale, 0);
    }
    r.losses.push_back(loss);
    r.norms.push_back(e->grad_norm());
    for (size_t u = 0; u < e->num_units(); ++u) r.grads.push_back(e->grad_slice(u));
    e->optimizer_step(1e-3, 1.0f);
  }
  return r;
}

// Reducing once a step changes only the order of the sums: full (unsharded gradients and gathered
// blocks kept between micro-steps) and replicate (the replicas' all-reduce in the last micro-step only)
// give the gradients of every micro-step reducing (off), step after step (the gathers follow each
// update), on every strategy, announced or not (unannounced, the slices' readers reduce what is left),
// with the root's reduction split or whole, an fp32 or a bf16 reduction, and LoRA; the plan says which
// mode ran. (Compared per element against the unit's largest gradient: AdamW's steps would amplify
// the rounding of near-zero gradients.)
BOOST_AUTO_TEST_CASE(no_sync_gives_the_gradients_of_every_micro_step_reducing) {
  const int world = world_size();
  for (ShardingStrategy s : all_strategies())
    for (NoSync mode : {NoSync::Replicate, NoSync::Full})
      for (int variant = 0; variant < 4; ++variant) {
        Case c;
        c.strategy = s;
        c.accum = 3;
        c.no_sync = mode;
        c.announce = variant != 1;
        c.split_root = variant == 2;
        c.reduce = variant == 3 ? DType::BF16 : DType::F32;
        c.lora = variant == 1;
        Case off = c;
        off.no_sync = NoSync::Off;
        const double tol = c.reduce == DType::BF16 ? 2e-2 : 1e-5;
        BOOST_TEST_CONTEXT(name_of(c)) {
          const auto e = make_engine(c, false);
          const int shard = e->groups().shard->size(), replicas = e->groups().replicate->size();
          const NoSync want = world == 1 ? NoSync::Off
                              : mode == NoSync::Full && shard > 1 ? NoSync::Full
                              : replicas > 1 ? NoSync::Replicate : NoSync::Off;
          BOOST_TEST((e->buffer_plan().no_sync == want));
          if (want == NoSync::Full) BOOST_TEST(e->buffer_plan().grad_buffers == 3u);  // one a block
          const GradRun got = accumulated_gradients(c), ref = accumulated_gradients(off);
          for (size_t i = 0; i < ref.losses.size(); ++i) {
            BOOST_TEST(got.losses[i] == ref.losses[i], boost::test_tools::tolerance(c.reduce == DType::BF16 ? 1e-4 : 1e-6));
            BOOST_TEST(got.norms[i] == ref.norms[i], boost::test_tools::tolerance(tol));
          }
          BOOST_TEST_REQUIRE(got.grads.size() == ref.grads.size());
          for (size_t k = 0; k < ref.grads.size(); ++k) {
            float largest = 0, worst = 0;
            for (size_t i = 0; i < ref.grads[k].size(); ++i) {
              largest = std::max(largest, std::fabs(ref.grads[k][i]));
              worst = std::max(worst, std::fabs(got.grads[k][i] - ref.grads[k][i]));
            }
            BOOST_TEST(worst <= tol * largest);
          }
        }
      }
}

BOOST_AUTO_TEST_CASE(the_clipping_cases_clip) {
  Case c;
  c.max_norm = 0.05;
  const Run r = train_steps(c, true);
  for (double n : r.norms) BOOST_TEST(n > 0.05);
}

// Without last_micro_step (a caller that does not announce the step's end) grad_norm sums the host
// gradient itself; a bf16 reduction lands and is summed in bf16 as the device path rounds it; LoRA's
// units without a trainable slice (its root) take no part.
BOOST_AUTO_TEST_CASE(unannounced_steps_bf16_reductions_and_lora) {
  std::vector<Case> cases(4);
  cases[0].announce = false, cases[0].accum = 2;
  cases[1].announce = false, cases[1].max_norm = 0.05;
  cases[2].reduce = DType::BF16, cases[2].accum = 2;
  cases[3].lora = true, cases[3].accum = 2;
  Case lora_clip;
  lora_clip.lora = true, lora_clip.max_norm = 0.01, lora_clip.strategy = ShardingStrategy::NoShard;
  cases.push_back(lora_clip);
  for (const Case& c : cases)
    expect_offload_changes_nothing(c);
}

// fsdp.offload_dir: AdamW's moments in memory-mapped files give the same steps (accumulation and
// clipping: the deferred updates; and the early ones); the files are unlinked as soon as they are made,
// so the directory is empty while the engine runs and after. A directory that cannot take a file is an
// error naming the key.
BOOST_AUTO_TEST_CASE(moments_in_mapped_files_give_the_same_steps) {
  TempDir dir{"offload_dir"};
  for (double max_norm : {0.0, 0.05}) {
    Case c;
    c.accum = 2, c.max_norm = max_norm;
    Case mapped = c;
    mapped.moments_dir = dir.root.string();
    BOOST_TEST_CONTEXT(name_of(c)) { expect_same(train_steps(mapped, true), train_steps(c, false), 1e-6); }
  }
  Case c;
  c.moments_dir = dir.root.string();
  {
    const std::unique_ptr<FsdpEngine> e = make_engine(c, true);
    BOOST_TEST(std::filesystem::is_empty(dir.root));
  }
  BOOST_TEST(std::filesystem::is_empty(dir.root));
  c.moments_dir = (dir.root / "missing").string();
  std::string e;
  try {
    make_engine(c, true);
  } catch (const Error& err) {
    e = err.what();
  }
  BOOST_TEST(e.find("fsdp.offload_dir = '" + c.moments_dir + "': cannot create a file there") != std::string::npos, e);
}

// fsdp.offload_accumulate = device: the micro-steps summed on the device and sent down once give the
// same steps: every strategy, accumulation 1 (nothing summed on the device), 2 and 3, early and deferred
// updates; a bf16 reduction (widened as it is added, as the host does it); unannounced steps (the sums
// go down when grad_norm asks); LoRA. Mid-step, grad_slice reads the sums so far.
BOOST_AUTO_TEST_CASE(device_sums_give_the_same_steps) {
  Case device_sums;
  device_sums.device_sums = true;
  for (const Case& c : every_strategy(device_sums, {1, 3})) expect_offload_changes_nothing(c);
  std::vector<Case> cases(4);
  cases[0].announce = false, cases[0].accum = 2;
  cases[1].reduce = DType::BF16, cases[1].accum = 2;
  cases[2].reduce = DType::BF16, cases[2].accum = 3, cases[2].max_norm = 0.05;
  cases[3].lora = true, cases[3].accum = 2;
  for (Case& c : cases) {
    c.device_sums = true;
    expect_offload_changes_nothing(c);
  }
  Case c;
  c.accum = 2, c.device_sums = true;
  const ModelConfig model = tiny_model(false);
  std::unique_ptr<FsdpEngine> off = make_engine(c, true), plain = make_engine(c, false);
  for (FsdpEngine* e : {off.get(), plain.get()}) {
    e->zero_grad();
    e->forward_backward(micro_batch(0, 0, model), 0.01f, 0);
  }
  for (size_t u = 0; u < off->num_units(); ++u) BOOST_TEST(off->grad_slice(u) == plain->grad_slice(u));
  off->zero_grad();
  BOOST_TEST(off->grad_norm() == 0.0);
}

namespace {

// Steps of counts[s] micro-steps each (the last announced, clipped at 0.05) on an offloaded engine
// and one without offload: after each backward the same norm and gradient slices. Step `traced` is
// traced, and the offloaded engine's timeline goes to check_trace.
void compare_steps(FsdpEngine& off, FsdpEngine& plain, const std::vector<int>& counts, int traced,
                   const std::function<void(const StepTrace&, int micro_steps)>& check_trace) {
  const ModelConfig model = tiny_model(false);
  for (int s = 0; s < static_cast<int>(counts.size()); ++s) {
    double norms[2];
    int k = 0;
    for (FsdpEngine* e : {&off, &plain}) {
      if (s == traced) e->trace_begin();
      e->zero_grad();
      for (int m = 0; m < counts[s]; ++m) {
        if (m + 1 == counts[s]) e->last_micro_step(std::nullopt);
        e->forward_backward(micro_batch(s, m, model), 0.01f, 0);
      }
      norms[k++] = e->grad_norm();
    }
    BOOST_TEST_CONTEXT("step " << s) {
      BOOST_TEST(norms[0] == norms[1], boost::test_tools::tolerance(1e-6));
      for (size_t u = 0; u < off.num_units(); ++u)
        BOOST_TEST(off.grad_slice(u) == plain.grad_slice(u), boost::test_tools::per_element());
    }
    for (FsdpEngine* e : {&off, &plain}) e->optimizer_step(1e-2, static_cast<float>(clip_factor(norms[0], 0.05)));
    if (s == traced) {
      const StepTrace t = off.trace_end();
      plain.trace_end();
      for (const TraceSpan& span : t.spans) {
        BOOST_TEST(span.begin_ms >= 0.0);
        BOOST_TEST(span.end_ms >= span.begin_ms);
        BOOST_TEST(span.end_ms <= t.step_ms);
      }
      check_trace(t, counts[s]);
    }
  }
}

}  // namespace

// Steps of one micro-step (the host's way) between steps summed on the device, as packing makes them,
// and micro-steps after a step of one without zero_grad (the host holds those sums: the host's way
// again): the same gradients and norms as without offload. A traced step's spans are every unit's.
BOOST_AUTO_TEST_CASE(device_sums_with_varying_micro_steps_and_a_trace) {
  Case c;
  c.device_sums = true;
  const ModelConfig model = tiny_model(false);
  std::unique_ptr<FsdpEngine> off = make_engine(c, true), plain = make_engine(c, false);
  compare_steps(*off, *plain, {1, 3, 1, 2}, 1, [&](const StepTrace& t, int micro_steps) {
    int reduces = 0;
    for (const TraceSpan& span : t.spans) reduces += span.name.rfind("reduce unit", 0) == 0;
    BOOST_TEST(reduces == micro_steps * static_cast<int>(off->num_units()));
  });
  for (FsdpEngine* e : {off.get(), plain.get()}) {
    e->zero_grad();
    e->last_micro_step(std::nullopt);
    e->forward_backward(micro_batch(7, 0, model), 0.01f, 0);
    e->forward_backward(micro_batch(7, 1, model), 0.01f, 0);  // past the announced last: summed on the host
  }
  for (size_t u = 0; u < off->num_units(); ++u)
    BOOST_TEST(off->grad_slice(u) == plain->grad_slice(u), boost::test_tools::per_element());
}

// fsdp.offload_root_update = device: the root updated on the device from its gradient there (one
// micro-step, or the device sums) gives the same steps: every strategy, one and three micro-steps
// (three summed on the host: the root goes the host's way), early and deferred updates; with the device
// sums; unannounced steps and a bf16 reduction (the host's way); LoRA (no root to update). Each also
// with part and with all of the root's state resident on the device (fsdp.offload_resident_gib).
BOOST_AUTO_TEST_CASE(root_updated_on_the_device_gives_the_same_steps) {
  BOOST_TEST_REQUIRE(tiny_model(false).vocab_size * tiny_model(false).hidden_size > 2 * kRootChunk * 4);
  Case on_device;
  on_device.root_on_device = true;
  for (Case c : every_strategy(on_device, {1, 3}))
    for (size_t resident : {size_t(0), kSomeResident, kAllResident}) {
      if (resident > 0 && c.accum == 3 && c.max_norm == 0.0) continue;
      c.resident = resident;
      expect_offload_changes_nothing(c);
    }
  std::vector<Case> cases(8);
  cases[0].device_sums = true, cases[0].accum = 3, cases[0].max_norm = 0.05;
  cases[1].device_sums = true, cases[1].accum = 2;
  cases[2].announce = false, cases[2].max_norm = 0.05;
  cases[3].reduce = DType::BF16, cases[3].max_norm = 0.05;
  cases[4].lora = true;
  cases[5] = cases[0], cases[5].resident = kSomeResident;
  cases[6] = cases[1], cases[6].resident = kAllResident;
  cases[7] = cases[2], cases[7].resident = kSomeResident;
  for (Case& c : cases) {
    c.root_on_device = true;
    expect_offload_changes_nothing(c);
  }
}

// Steps whose root updates on the device between steps whose root updates on the host (their state
// comes back first) and a traced one: the same gradients (the root's read back from the device), norms
// and parameters as without offload; the trace shows the root's update on the compute lane. With
// `resident` of the root's elements kept on the device: that part comes back before the host updates the
// root and goes up again before its next update on the device.
void root_between_host_steps(size_t resident) {
  Case c;
  c.root_on_device = true, c.resident = resident;
  std::unique_ptr<FsdpEngine> off = make_engine(c, true), plain = make_engine(c, false);
  BOOST_TEST((off->options().offload_root_update == OffloadRootUpdate::Device));
  BOOST_TEST(off->offload_description().find("on the GPU") != std::string::npos);
  const size_t kept = std::min(resident, off->unit(0).shard_numel);
  const bool streams = kept < off->unit(0).shard_numel;
  BOOST_TEST(off->buffer_plan().offload_resident == kept);
  BOOST_TEST((off->offload_description().find("resident") != std::string::npos) == (resident > 0));
  Case streamed = c;
  streamed.resident = 0;
  // The resident master is counted with the slices (its moments with the optimizer's bytes, in the plan).
  BOOST_TEST(off->memory().master_shard == make_engine(streamed, true)->memory().master_shard + kept * sizeof(float));
  compare_steps(*off, *plain, {1, 2, 1, 1, 2}, 3, [&](const StepTrace& t, int) {
    int updates = 0, host_updates = 0, downs = 0, ups = 0;
    for (const TraceSpan& span : t.spans) {
      updates += span.name == "update unit 0 on the device" && span.lane == "compute";
      host_updates += span.name.rfind("update unit ", 0) == 0 && span.lane == "host";
      downs += span.lane == "down";
      ups += span.lane == "up";
    }
    BOOST_TEST(updates == 1);
    const int blocks = static_cast<int>(off->num_units()) - 1;
    BOOST_TEST(host_updates == blocks);           // the blocks on the host
    BOOST_TEST(ups == blocks);                    // each going up
    BOOST_TEST(downs == blocks + (streams ? 1 : 0));  // their gradients down, the root's streamed state back
    BOOST_TEST(summarize_trace(t).host_ms > 0.0);
  });
  const std::vector<UnitState> a = off->checkpoint_state(), b = plain->checkpoint_state();
  for (size_t u = 0; u < a.size(); ++u)
    for (size_t i = 0; i < a[u].count; ++i) {
      BOOST_TEST(a[u].param[i] == b[u].param[i], boost::test_tools::tolerance(1e-5f));
      for (size_t k = 0; k < 2; ++k)
        BOOST_TEST(a[u].optimizer.at(k).data[i] == b[u].optimizer.at(k).data[i], boost::test_tools::tolerance(1e-5f));
    }
}

BOOST_AUTO_TEST_CASE(root_on_the_device_between_host_steps_and_a_trace) {
  for (size_t resident : {size_t(0), kSomeResident, kAllResident})
    BOOST_TEST_CONTEXT("resident " << resident) { root_between_host_steps(resident); }
}

// A checkpoint of a run whose root's state is partly or wholly resident on the device: saved as the device
// has it (the same as without offload), and after a load the loaded state replaces the device's, so the
// step after the load repeats the step after the save bit for bit.
BOOST_AUTO_TEST_CASE(resident_root_state_in_a_checkpoint_round_trip) {
  const ModelConfig model = tiny_model(false);
  auto one_step = [&](FsdpEngine& e, int s) {
    e.zero_grad();
    e.last_micro_step(std::nullopt);
    const double loss = e.forward_backward(micro_batch(s, 0, model), 0.01f, 0);
    e.optimizer_step(1e-2, static_cast<float>(clip_factor(e.grad_norm(), 0.05)));
    return loss;
  };
  auto snapshot = [](FsdpEngine& e) {  // every unit's master, then its moments
    std::vector<std::vector<float>> v;
    for (const UnitState& st : e.checkpoint_state()) {
      v.emplace_back(st.param, st.param + st.count);
      for (const auto& o : st.optimizer) v.emplace_back(o.data, o.data + st.count);
    }
    return v;
  };
  for (size_t resident : {kSomeResident, kAllResident}) {
    Case c;
    c.root_on_device = true, c.resident = resident;
    BOOST_TEST_CONTEXT(name_of(c)) {
      std::unique_ptr<FsdpEngine> off = make_engine(c, true), plain = make_engine(c, false);
      for (int s = 0; s < 2; ++s) BOOST_TEST(one_step(*off, s) == one_step(*plain, s), boost::test_tools::tolerance(1e-6));
      const std::vector<std::vector<float>> saved = snapshot(*off), want = snapshot(*plain);
      BOOST_TEST_REQUIRE(saved.size() == want.size());
      for (size_t a = 0; a < saved.size(); ++a)
        for (size_t i = 0; i < saved[a].size(); ++i) BOOST_TEST(saved[a][i] == want[a][i], boost::test_tools::tolerance(1e-5f));
      BOOST_TEST_REQUIRE(off->optimizer_steps() == 2);
      const double next = one_step(*off, 2);
      const std::vector<std::vector<float>> after = snapshot(*off);
      std::vector<UnitState> views = off->checkpoint_state();
      size_t a = 0;
      for (UnitState& st : views) {
        std::memcpy(st.param, saved[a++].data(), st.count * sizeof(float));
        for (auto& o : st.optimizer) std::memcpy(o.data, saved[a++].data(), st.count * sizeof(float));
      }
      off->checkpoint_loaded();
      off->set_optimizer_steps(2);  // as a resume sets it
      BOOST_TEST(one_step(*off, 2) == next);
      BOOST_TEST((snapshot(*off) == after));
    }
  }
}

// The gradient slices read back (grad_slice) are the host's sums, zero after zero_grad; a checkpoint
// written and loaded back through the views resumes the same run.
BOOST_AUTO_TEST_CASE(grad_slices_and_a_checkpoint_round_trip) {
  Case c;
  c.accum = 2;
  const ModelConfig model = tiny_model(false);
  std::unique_ptr<FsdpEngine> off = make_engine(c, true), plain = make_engine(c, false);
  for (FsdpEngine* e : {off.get(), plain.get()}) {
    e->zero_grad();
    e->forward_backward(micro_batch(0, 0, model), 0.01f, 0);
    e->forward_backward(micro_batch(0, 1, model), 0.01f, 0);
  }
  for (size_t u = 0; u < off->num_units(); ++u) BOOST_TEST(off->grad_slice(u) == plain->grad_slice(u));
  off->zero_grad();
  for (size_t u = 0; u < off->num_units(); ++u)
    BOOST_TEST(off->grad_slice(u) == std::vector<float>(off->unit(u).shard_numel, 0.0f));
  BOOST_TEST(off->grad_norm() == 0.0);
  // A step with no micro-step since zero_grad: a zero gradient (only weight decay moves the master).
  plain->zero_grad();
  off->optimizer_step(1e-2, 1.0f);
  plain->optimizer_step(1e-2, 1.0f);
  // Save the offloaded state, run one more step, load the saved state back: the step repeats exactly.
  std::vector<std::vector<float>> saved;
  for (const UnitState& st : off->checkpoint_state()) saved.emplace_back(st.param, st.param + st.count);
  auto one_step = [&](FsdpEngine& e) {
    e.zero_grad();
    e.last_micro_step(FsdpEngine::StepUpdate{1e-2, 1.0f});
    const double loss = e.forward_backward(micro_batch(1, 0, model), 0.01f, 0);
    e.grad_norm();
    e.optimizer_step(1e-2, 1.0f);
    return loss;
  };
  const double first = one_step(*off);
  BOOST_TEST(first == one_step(*plain), boost::test_tools::tolerance(1e-6));
  std::vector<UnitState> views = off->checkpoint_state();
  for (size_t u = 0; u < views.size(); ++u) std::memcpy(views[u].param, saved[u].data(), saved[u].size() * sizeof(float));
  off->checkpoint_loaded();
  // The master is the saved one again (the moments moved on), so the forward gives that step's loss.
  BOOST_TEST(off->forward_loss(micro_batch(1, 0, model)) == first, boost::test_tools::tolerance(1e-12));
}

// The early path's contract: optimizer_step must follow with the announced values, and nothing else
// may run in between.
BOOST_AUTO_TEST_CASE(an_early_step_must_be_finished_as_announced) {
  Case c;
  const ModelConfig model = tiny_model(false);
  std::unique_ptr<FsdpEngine> e = make_engine(c, true);
  e->zero_grad();
  e->last_micro_step(FsdpEngine::StepUpdate{1e-2, 1.0f});
  e->forward_backward(micro_batch(0, 0, model), 0.01f, 0);
  BOOST_CHECK_THROW(e->forward_backward(micro_batch(0, 1, model), 0.01f, 0), Error);
  BOOST_CHECK_THROW(e->zero_grad(), Error);
  BOOST_CHECK_THROW(e->optimizer_step(2e-2, 1.0f), Error);
  e->optimizer_step(1e-2, 1.0f);
  BOOST_TEST(e->optimizer_steps() == 1);
  e->zero_grad();
  e->forward_backward(micro_batch(0, 1, model), 0.01f, 0);
}

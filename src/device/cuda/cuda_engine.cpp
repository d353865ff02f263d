// The CUDA engine: the FSDP schedule of DESIGN.md on two streams. Parameter all-gathers run on the
// communication stream one unit ahead of the compute stream (fsdp.forward_prefetch,
// fsdp.backward_prefetch = pre | post | none; under FULL_SHARD at most fsdp.limit_all_gathers
// gathered blocks, in flight or in use); each block's gradient is reduce-scattered
// on the communication stream while the compute stream runs the previous block's backward (two
// full-gradient buffers alternate). Master weights, gradients and AdamW moments stay on the GPU in
// fp32 as this rank's slices; AdamW writes the compute-dtype copy that the next gather sends.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "../../fsdp/fsdp_internal.hpp"
#include "../../train/engine.hpp"
#include "cuda_model.hpp"
#include "device_memory.hpp"
#include "kernels.hpp"
#include "nccl_communicator.hpp"
#include "shardlm/device.hpp"
#include "shardlm/optim.hpp"

namespace shardlm {
namespace {

using cuda::DeviceBuffer;

struct Event {
  Event() { SHARDLM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s) { SHARDLM_CUDA_CHECK(cudaEventRecord(e, s)); }
  void wait_on(cudaStream_t s) { SHARDLM_CUDA_CHECK(cudaStreamWaitEvent(s, e, 0)); }
  cudaEvent_t e = nullptr;
};

// One unit's state on this rank's GPU.
struct DeviceUnit {
  FlatParameter host;                // layout, slicing, no-decay ranges; host master = checkpoint staging
  DeviceBuffer<float> master, grad, exp_avg, exp_avg_sq;
  DeviceBuffer<char> compute_shard;  // the slice in the compute dtype (what the all-gather sends)
  std::vector<float> host_exp_avg, host_exp_avg_sq;
  std::vector<float> host_grad;      // CPU offload: the gradient slice, copied once per step
};

double nccl_timeout_seconds() {
  const char* v = std::getenv("SHARDLM_NCCL_TIMEOUT");
  return v && *v ? std::atof(v) : 600.0;
}

class CudaEngine : public TrainEngine {
 public:
  CudaEngine(const RunConfig& cfg, MPI_Comm comm, const Topology& topo, int micro)
      : cfg_(cfg), dt_(cfg.fsdp.param_dtype), dsize_(dtype_size(cfg.fsdp.param_dtype)), layout_(model_layout(cfg.model)) {
    const size_t device_bytes_before = cuda::device_memory_stats().current;
    SHARDLM_CHECK(cfg.fsdp.reduce_dtype == DType::F32 || cfg.fsdp.reduce_dtype == cfg.fsdp.param_dtype,
                  "fsdp.reduce_dtype = ", dtype_name(cfg.fsdp.reduce_dtype),
                  ": the CUDA backend reduces in fp32 or in fsdp.param_dtype");
    cuda::select_device(topo);
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    params_written_ = std::make_unique<Event>();
    reductions_done_ = std::make_unique<Event>();
    groups_ = cuda::make_nccl_process_groups(comm, topo, cfg.fsdp.strategy, comm_, nccl_timeout_seconds());
    shard_ = static_cast<cuda::NcclCommunicator*>(groups_.shard.get());
    replicate_ = static_cast<cuda::NcclCommunicator*>(groups_.replicate.get());
    const int shard_rank = shard_->rank(), shard_size = shard_->size();
    full_shard_ = cfg.fsdp.strategy == ShardingStrategy::FullShard;
    offload_ = cfg.fsdp.cpu_offload;
    // Sharded, not offloaded, 16-bit compute: no 16-bit copy of the slice is kept beside the fp32
    // master; each all-gather casts the master into this rank's place in the gather buffer and
    // gathers in place (1/S of the model's size in 16 bits less, at one cast of the slice a gather).
    cast_at_gather_ = !offload_ && shard_size > 1 && dt_ != DType::F32;
    backward_prefetch_ = cfg.fsdp.backward_prefetch == BackwardPrefetch::Post   ? Prefetch::Post
                         : cfg.fsdp.backward_prefetch == BackwardPrefetch::None ? Prefetch::None
                                                                                : Prefetch::Pre;

    for (size_t u = 0; u < layout_.size(); ++u) {
      DeviceUnit d;
      d.host = make_flat_parameter(layout_[u], static_cast<int>(u), shard_rank, shard_size, cfg.train.seed);
      const size_t n = d.host.shard_numel;
      d.grad.allocate(n);
      if (offload_) {
        // The master stays in d.host.master; the GPU holds the slice it gathers from, in any dtype.
        d.compute_shard.allocate(n * dsize_);
        d.host_grad.assign(n, 0.0f);
      } else {
        d.master.allocate(n), d.exp_avg.allocate(n), d.exp_avg_sq.allocate(n);
        SHARDLM_CUDA_CHECK(cudaMemcpy(d.master.data(), d.host.master.data(), n * 4, cudaMemcpyHostToDevice));
        d.exp_avg.zero(compute_), d.exp_avg_sq.zero(compute_);
        if (dt_ != DType::F32 && !cast_at_gather_) d.compute_shard.allocate(n * dsize_);
        d.host_exp_avg.assign(n, 0.0f), d.host_exp_avg_sq.assign(n, 0.0f);
      }
      units_.push_back(std::move(d));
    }
    if (offload_) {
      // The arrays copied every step are page-locked, so the copies run at DMA speed and need no
      // bounce buffer: the gradient slices, the 16-bit staging of the updated slices (or, in fp32,
      // the masters themselves).
      size_t largest = 0;
      for (DeviceUnit& d : units_) {
        pin(d.host_grad.data(), d.host_grad.size() * 4);
        if (dt_ == DType::F32) pin(d.host.master.data(), d.host.shard_numel * 4);
        largest = std::max(largest, d.host.shard_numel);
      }
      if (dt_ != DType::F32) {
        host16_.assign(largest, 0);
        pin(host16_.data(), host16_.size() * 2);
      }
      std::vector<ParamSlice> slices;
      for (DeviceUnit& d : units_)
        slices.push_back({d.host.master.data(), d.host_grad.data(), d.host.shard_numel, d.host.no_decay});
      host_optimizer_ = std::make_unique<AdamW>(
          slices, AdamWOptions{cfg.train.adam_beta1, cfg.train.adam_beta2, cfg.train.adam_eps, cfg.train.weight_decay});
      // The host's cores, shared by the ranks on it.
      host_optimizer_->set_threads(cpu_default_threads(topo.host_ranks));
    }
    refresh_compute_shards();

    // Gathered parameters: the root's; one block buffer per layer (kept from forward to backward)
    // or, under FULL_SHARD, fsdp.limit_all_gathers (default 2) that take turns, so the next block
    // can be gathered while this one computes; with one, gathers and compute alternate.
    alias_ = shard_size == 1;
    const int L = cfg.model.num_layers;
    const size_t block_padded = units_.size() > 1 ? units_[1].host.padded_numel : 0;
    if (!alias_) {
      root_full_.allocate(units_[0].host.padded_numel * dsize_);
      const int copies = full_shard_ ? std::min(cfg.fsdp.limit_all_gathers, L) : L;
      block_full_.resize(copies);
      for (auto& b : block_full_) b.allocate(block_padded * dsize_);
    }
    holder_.assign(block_full_.size(), -1);
    gathered_.assign(units_.size(), false);
    slot_free_.resize(block_full_.size());
    unit_gathered_.resize(units_.size());
    for (auto& e : slot_free_) e = std::make_unique<Event>();
    for (auto& e : unit_gathered_) e = std::make_unique<Event>();

    // A single rank (one shard, no replicas) reduces nothing: the backward accumulates straight into
    // the gradient slices, which are then the whole gradients, and needs no full-gradient buffers or
    // reduce staging (2.1 GB for BLOOM-560M).
    direct_grads_ = shard_size == 1 && replicate_->size() == 1;
    if (!direct_grads_) root_grad_full_.allocate(units_[0].host.padded_numel);
    for (int i = 0; i < 2 && block_padded > 0; ++i) {
      if (!direct_grads_) block_grad_full_[i].allocate(block_padded);
      grad_ready_[i] = std::make_unique<Event>();
      grad_reduced_[i] = std::make_unique<Event>();
      grad_reduced_[i]->record(comm_);
    }
    root_grad_ready_ = std::make_unique<Event>();
    size_t max_shard = 0, max_padded = 0;
    for (const DeviceUnit& d : units_) max_shard = std::max(max_shard, d.host.shard_numel), max_padded = std::max(max_padded, d.host.padded_numel);
    if (!direct_grads_) grad_slice_.allocate(max_shard);
    if (cfg.fsdp.reduce_dtype != DType::F32 && !direct_grads_) {
      reduce_send_.allocate(max_padded * dsize_);
      reduce_recv_.allocate(max_shard * dsize_);
    }
    model_ = cuda::make_cuda_model(cfg.model, dt_, micro, cfg.data.max_length, cfg.fsdp.activation_checkpointing);
    tokens_.allocate(static_cast<size_t>(micro) * cfg.data.max_length);
    targets_.allocate(static_cast<size_t>(micro) * cfg.data.max_length);
    loss_.allocate(1), count_.allocate(1), norm_.allocate(1);
    SHARDLM_CUDA_CHECK(cudaMallocHost(&host_scalars_, 64));
    SHARDLM_CUDA_CHECK(cudaDeviceSynchronize());
    check_memory_plan(cfg, topo, micro, cuda::device_memory_stats().current - device_bytes_before);
  }

  ~CudaEngine() override {
    cudaDeviceSynchronize();
    for (void* p : pinned_) cudaHostUnregister(p);  // before the arrays are freed
    cudaFreeHost(host_scalars_);
    model_.reset();
    units_.clear();
    groups_ = ProcessGroups{};
    cudaStreamDestroy(compute_);
    cudaStreamDestroy(comm_);
  }

  double forward_backward(const MicroBatch& mb, float grad_scale) override { return run(mb, grad_scale, true); }
  double forward_loss(const MicroBatch& mb) override { return run(mb, 0.0f, false); }

  void zero_grad() override {
    for (DeviceUnit& d : units_) d.grad.zero(compute_);
  }

  double grad_norm() override {
    finish_reductions();
    SHARDLM_CUDA_CHECK(cudaMemsetAsync(norm_.data(), 0, sizeof(double), compute_));
    for (DeviceUnit& d : units_) cuda::sum_squares(d.grad.data(), d.host.shard_numel, norm_.data(), compute_);
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(host_scalars_, norm_.data(), sizeof(double), cudaMemcpyDeviceToHost, compute_));
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(compute_));
    // Slices partition the model within a shard group; replicas hold identical slices.
    return std::sqrt(shard_->host_sum(*static_cast<double*>(host_scalars_)));
  }

  void optimizer_step(double lr, float grad_factor) override {
    finish_reductions();
    if (offload_) {
      host_step(lr, grad_factor);
      return;
    }
    ++steps_;
    cuda::AdamWArgs a;
    a.lr = static_cast<float>(lr);
    a.beta1 = static_cast<float>(cfg_.train.adam_beta1);
    a.beta2 = static_cast<float>(cfg_.train.adam_beta2);
    a.eps = static_cast<float>(cfg_.train.adam_eps);
    a.bias_correction1 = static_cast<float>(1.0 - std::pow(cfg_.train.adam_beta1, static_cast<double>(steps_)));
    a.bias_correction2 = static_cast<float>(1.0 - std::pow(cfg_.train.adam_beta2, static_cast<double>(steps_)));
    a.grad_scale = grad_factor;
    for (DeviceUnit& d : units_) {
      // Ranges alternate: decayed, then each no-decay range, up to the end of the slice.
      size_t at = 0;
      auto update = [&](size_t begin, size_t end, float wd) {
        if (end <= begin) return;
        cuda::AdamWArgs r = a;
        r.weight_decay = wd;
        void* out = dt_ == DType::F32 || cast_at_gather_ ? nullptr : d.compute_shard.data() + begin * dsize_;
        cuda::adamw_step(d.master.data() + begin, d.grad.data() + begin, d.exp_avg.data() + begin,
                         d.exp_avg_sq.data() + begin, end - begin, r, out, dt_, compute_);
      };
      for (const auto& nd : d.host.no_decay) {
        update(at, nd.first, static_cast<float>(cfg_.train.weight_decay));
        update(nd.first, nd.second, 0.0f);
        at = nd.second;
      }
      update(at, d.host.shard_numel, static_cast<float>(cfg_.train.weight_decay));
    }
    params_updated();
  }

  long optimizer_steps() const override { return offload_ ? host_optimizer_->steps_taken() : steps_; }
  void set_optimizer_steps(long steps) override {
    steps_ = steps;
    if (offload_) host_optimizer_->set_steps_taken(steps);
  }

  std::vector<UnitState> checkpoint_state() override {
    SHARDLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<UnitState> states;
    for (size_t u = 0; u < units_.size(); ++u) {
      DeviceUnit& d = units_[u];
      const size_t n = d.host.shard_numel;
      if (!offload_) {
        SHARDLM_CUDA_CHECK(cudaMemcpy(d.host.master.data(), d.master.data(), n * 4, cudaMemcpyDeviceToHost));
        SHARDLM_CUDA_CHECK(cudaMemcpy(d.host_exp_avg.data(), d.exp_avg.data(), n * 4, cudaMemcpyDeviceToHost));
        SHARDLM_CUDA_CHECK(cudaMemcpy(d.host_exp_avg_sq.data(), d.exp_avg_sq.data(), n * 4, cudaMemcpyDeviceToHost));
      }
      states.push_back(unit_state(d.host, replicate_->rank() == 0, d.host.master.data(),
                                  offload_ ? host_optimizer_->exp_avg(u) : d.host_exp_avg.data(),
                                  offload_ ? host_optimizer_->exp_avg_sq(u) : d.host_exp_avg_sq.data()));
    }
    return states;
  }

  void checkpoint_loaded() override {
    for (DeviceUnit& d : units_) {
      if (offload_) continue;  // the loaded host arrays are the state
      const size_t n = d.host.shard_numel;
      SHARDLM_CUDA_CHECK(cudaMemcpy(d.master.data(), d.host.master.data(), n * 4, cudaMemcpyHostToDevice));
      SHARDLM_CUDA_CHECK(cudaMemcpy(d.exp_avg.data(), d.host_exp_avg.data(), n * 4, cudaMemcpyHostToDevice));
      SHARDLM_CUDA_CHECK(cudaMemcpy(d.exp_avg_sq.data(), d.host_exp_avg_sq.data(), n * 4, cudaMemcpyHostToDevice));
    }
    refresh_compute_shards();
    params_updated();
  }

  FsdpMemory memory() const override {
    FsdpMemory m;
    for (const DeviceUnit& d : units_) {
      m.master_shard += d.master.bytes() + d.compute_shard.bytes();
      m.grad_shard += d.grad.bytes();
      m.model_params += d.host.numel;
    }
    m.full_params = root_full_.bytes();
    for (const auto& b : block_full_) m.full_params += b.bytes();
    m.full_grads = root_grad_full_.bytes() + block_grad_full_[0].bytes() + block_grad_full_[1].bytes();
    m.comm_staging = grad_slice_.bytes() + reduce_send_.bytes() + reduce_recv_.bytes();
    m.activations = model_->activation_bytes();
    return m;
  }
  size_t optimizer_bytes() const override {
    if (offload_) return host_optimizer_->state_bytes();  // in host memory
    size_t n = 0;
    for (const DeviceUnit& d : units_) n += d.exp_avg.bytes() + d.exp_avg_sq.bytes();
    return n;
  }
  size_t device_peak_bytes() const override { return cuda::device_memory_stats().peak; }
  ProcessGroups& groups() override { return groups_; }

  // ---- greedy generation: the forward's gather schedule around the model's decode path ----
  void decode_begin(int slots, int max_len, int max_rows) override {
    SHARDLM_CHECK(!decode_host_, "CudaEngine::decode_begin: already decoding (decode_end first)");
    SHARDLM_CHECK(slots >= 1 && max_len >= 1 && max_rows >= 1, "CudaEngine::decode_begin: bad sizes slots=", slots,
                  " max_len=", max_len, " max_rows=", max_rows);
    model_->decode_allocate(slots, max_len, max_rows);
    // Per step: tokens, slots, positions, logit rows (sent), next tokens (received), max_rows each.
    decode_index_.allocate(5 * static_cast<size_t>(max_rows));
    decode_host_ = std::make_unique<cuda::PinnedBuffer<int32_t>>();
    decode_host_->allocate(5 * static_cast<size_t>(max_rows));
    decode_slots_ = slots, decode_max_len_ = max_len, decode_max_rows_ = max_rows;
  }

  void decode_step(const int32_t* tokens, const int* slots, const int* positions, int n, const int* logit_rows,
                   int m, int32_t* next) override {
    SHARDLM_CHECK(decode_host_, "CudaEngine::decode_step before decode_begin");
    const int R = decode_max_rows_, L = cfg_.model.num_layers;
    SHARDLM_CHECK(n >= 0 && n <= R && m >= 0 && m <= n, "CudaEngine::decode_step: ", n, " rows and ", m,
                  " logit rows, decode_begin sized ", R, " rows");
    // Checked here, in one place: the kernels index the cache with these.
    int32_t* host = decode_host_->data();
    for (int r = 0; r < n; ++r) {
      SHARDLM_CHECK(tokens[r] >= 0 && tokens[r] < cfg_.model.vocab_size, "CudaEngine::decode_step: row ", r,
                    " has token ", tokens[r], " outside the vocabulary of ", cfg_.model.vocab_size);
      SHARDLM_CHECK(slots[r] >= 0 && slots[r] < decode_slots_ && positions[r] >= 0 && positions[r] < decode_max_len_,
                    "CudaEngine::decode_step: row ", r, " at slot ", slots[r], " position ", positions[r],
                    " is outside the cache of ", decode_slots_, " slots x ", decode_max_len_, " positions");
      host[r] = tokens[r], host[R + r] = slots[r], host[2 * R + r] = positions[r];
    }
    for (int i = 0; i < m; ++i) {
      SHARDLM_CHECK(logit_rows[i] >= 0 && logit_rows[i] < n, "CudaEngine::decode_step: logit row ", logit_rows[i],
                    " of a step of ", n, " rows");
      host[3 * R + i] = logit_rows[i];
    }
    int32_t* dev = decode_index_.data();
    if (n > 0)
      SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dev, host, 4 * static_cast<size_t>(R) * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, compute_));
    // The forward's schedule: with n == 0 the rank still joins every all-gather.
    const void* root = use(0);
    if (L > 0 && cfg_.fsdp.forward_prefetch) gather(1);
    model_->decode_embed(root, dev, n, compute_);
    for (int l = 0; l < L; ++l) {
      const void* p = use(1 + l);
      if (cfg_.fsdp.forward_prefetch && can_prefetch() && l + 1 < L) gather(2 + l);
      model_->decode_block(l, p, dev + R, dev + 2 * R, n, compute_);
      done_with(1 + l);
    }
    model_->decode_head_argmax(root, dev + 3 * R, m, dev + 4 * R, compute_);
    if (m > 0)
      SHARDLM_CUDA_CHECK(cudaMemcpyAsync(host + 4 * R, dev + 4 * R, static_cast<size_t>(m) * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, compute_));
    // Also keeps the next step from overwriting staging that this step's copy still reads.
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(compute_));
    std::copy(host + 4 * R, host + 4 * R + m, next);
  }

  void decode_end() override {
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(compute_));
    model_->decode_free();
    decode_index_.release();
    decode_host_.reset();
    decode_slots_ = decode_max_len_ = decode_max_rows_ = 0;
  }

 private:
  // `shardlm plan` predicts these buffers from memory_plan.cpp: say so when the two disagree.
  void check_memory_plan(const RunConfig& cfg, const Topology& topo, int micro, size_t allocated) const {
    MemoryPlanSpec spec;
    spec.model = cfg.model;
    spec.backend = BackendKind::Cuda;
    spec.strategy = cfg.fsdp.strategy;
    spec.param_dtype = cfg.fsdp.param_dtype;
    spec.reduce_dtype = cfg.fsdp.reduce_dtype;
    spec.cpu_offload = cfg.fsdp.cpu_offload;
    spec.activation_checkpointing = cfg.fsdp.activation_checkpointing;
    spec.world_size = topo.world_size;
    spec.ranks_per_node = cfg.fsdp.strategy == ShardingStrategy::HybridShard ? topo.local_size : 0;
    spec.micro_batch = micro;
    spec.max_seq = cfg.data.max_length;
    const size_t planned = plan_rank_memory(spec).device_total();
    if (planned != allocated)
      log_info(concat("warning: the CUDA engine allocated ", allocated, " bytes where `shardlm plan` predicts ",
                      planned, " (src/fsdp/memory_plan.cpp is out of date)"));
  }

  // The compute-dtype slices from the fp32 masters (after init and after a checkpoint load).
  void refresh_compute_shards() {
    if (offload_) {
      // Host fp32 master -> compute dtype on the host -> the GPU slice.
      for (DeviceUnit& d : units_) {
        const size_t n = d.host.shard_numel;
        if (dt_ == DType::F32) {
          SHARDLM_CUDA_CHECK(cudaMemcpy(d.compute_shard.data(), d.host.master.data(), n * 4, cudaMemcpyHostToDevice));
        } else {
          SHARDLM_CHECK(n <= host16_.size(), "CUDA engine: 16-bit staging of ", host16_.size(), " < slice ", n);
          pack16(dt_, d.host.master.data(), host16_.data(), n);
          SHARDLM_CUDA_CHECK(cudaMemcpy(d.compute_shard.data(), host16_.data(), n * 2, cudaMemcpyHostToDevice));
        }
      }
      return;
    }
    if (dt_ == DType::F32 || cast_at_gather_) return;
    for (DeviceUnit& d : units_)
      cuda::cast(d.master.data(), DType::F32, d.compute_shard.data(), dt_, d.host.shard_numel, compute_);
  }

  const void* shard_source(const DeviceUnit& d) const {
    return dt_ == DType::F32 && !offload_ ? static_cast<const void*>(d.master.data()) : d.compute_shard.data();
  }

  // CPU offload: gradient slices to the host, AdamW there (the CPU backend's optimizer), the
  // updated slices back to the GPU in the compute dtype.
  void host_step(double lr, float grad_factor) {
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(compute_));
    for (DeviceUnit& d : units_) {
      const size_t n = d.host.shard_numel;
      SHARDLM_CUDA_CHECK(cudaMemcpy(d.host_grad.data(), d.grad.data(), n * 4, cudaMemcpyDeviceToHost));
      if (grad_factor != 1.0f)
        for (size_t i = 0; i < n; ++i) d.host_grad[i] *= grad_factor;
    }
    host_optimizer_->step(lr);
    refresh_compute_shards();
    params_updated();
  }

  // Where unit u's gathered parameters live (its slot's buffer, or the slice itself on one rank).
  const void* full_params(size_t u) {
    if (alias_) return shard_source(units_[u]);
    if (u == 0) return root_full_.data();
    return block_full_[slot(u)].data();
  }
  size_t slot(size_t u) const { return full_shard_ ? (u - 1) % block_full_.size() : u - 1; }

  // Enqueues unit u's all-gather on the communication stream unless it is already there.
  void gather(size_t u) {
    if (alias_ || gathered_[u]) return;
    if (u > 0) {
      const size_t sl = slot(u);
      if (holder_[sl] >= 0) gathered_[holder_[sl]] = false;  // evicted from the shared slot
      slot_free_[sl]->wait_on(comm_);  // the slot's previous block has finished computing
      holder_[sl] = static_cast<int>(u);
    }
    const DeviceUnit& d = units_[u];
    void* full = const_cast<void*>(full_params(u));
    if (cast_at_gather_) {
      // In place: NCCL reads this rank's part of the receive buffer when send == recv + rank * count.
      char* mine = static_cast<char*>(full) + static_cast<size_t>(shard_->rank()) * d.host.shard_numel * dsize_;
      cuda::cast(d.master.data(), DType::F32, mine, dt_, d.host.shard_numel, comm_);
      shard_->all_gather(mine, full, d.host.shard_numel, dt_);
    } else {
      shard_->all_gather(shard_source(d), full, d.host.shard_numel, dt_);
    }
    unit_gathered_[u]->record(comm_);
    gathered_[u] = true;
  }

  // The compute stream may use unit u's parameters from here on.
  const void* use(size_t u) {
    gather(u);
    if (!alias_) unit_gathered_[u]->wait_on(compute_);
    return full_params(u);
  }
  void done_with(size_t u) {
    if (!alias_ && u > 0) slot_free_[slot(u)]->record(compute_);
  }

  void params_updated() {
    std::fill(gathered_.begin(), gathered_.end(), false);
    std::fill(holder_.begin(), holder_.end(), -1);
    // The new slices must be written before any gather reads them.
    params_written_->record(compute_);
    params_written_->wait_on(comm_);
  }

  // Where the backward accumulates unit u's full fp32 gradient: the unit's gradient slice itself
  // when the gradients are direct, else the root's buffer or block l = u - 1's buffer l % 2.
  float* full_grad(size_t u) {
    if (direct_grads_) return units_[u].grad.data();
    return u == 0 ? root_grad_full_.data() : block_grad_full_[(u - 1) % 2].data();
  }

  // Reduces a unit's full fp32 gradient into its slice on the communication stream.
  void reduce(size_t u, float* full_grad) {
    if (direct_grads_) return;  // the backward wrote into the slice itself
    DeviceUnit& d = units_[u];
    const size_t n = d.host.shard_numel;
    if (shard_->size() == 1) {
      if (replicate_->size() > 1) replicate_->all_reduce(full_grad, n, DType::F32, ReduceOp::Sum);
      cuda::accumulate(d.grad.data(), full_grad, n, comm_);
      return;
    }
    if (cfg_.fsdp.reduce_dtype == DType::F32) {
      shard_->reduce_scatter(full_grad, grad_slice_.data(), n, DType::F32, ReduceOp::Sum);
      if (replicate_->size() > 1) replicate_->all_reduce(grad_slice_.data(), n, DType::F32, ReduceOp::Sum);
    } else {
      cuda::cast(full_grad, DType::F32, reduce_send_.data(), dt_, d.host.padded_numel, comm_);
      shard_->reduce_scatter(reduce_send_.data(), reduce_recv_.data(), n, dt_, ReduceOp::Sum);
      if (replicate_->size() > 1) replicate_->all_reduce(reduce_recv_.data(), n, dt_, ReduceOp::Sum);
      cuda::cast(reduce_recv_.data(), dt_, grad_slice_.data(), DType::F32, n, comm_);
    }
    cuda::accumulate(d.grad.data(), grad_slice_.data(), n, comm_);
  }

  void finish_reductions() {
    reductions_done_->record(comm_);
    reductions_done_->wait_on(compute_);
  }

  double run(const MicroBatch& mb, float grad_scale, bool backward) {
    const int B = mb.batch, T = mb.seq, L = cfg_.model.num_layers;
    const size_t N = static_cast<size_t>(B) * T;
    SHARDLM_CHECK(N <= tokens_.size(), "micro-batch of ", B, " x ", T, " tokens exceeds the planned ", tokens_.size());
    if (N > 0) {
      SHARDLM_CUDA_CHECK(cudaMemcpyAsync(tokens_.data(), mb.tokens.data(), N * 4, cudaMemcpyHostToDevice, compute_));
      SHARDLM_CUDA_CHECK(cudaMemcpyAsync(targets_.data(), mb.targets.data(), N * 4, cudaMemcpyHostToDevice, compute_));
    }
    loss_.zero(compute_);
    count_.zero(compute_);

    const void* root = use(0);
    if (L > 0 && cfg_.fsdp.forward_prefetch) gather(1);
    if (N > 0) model_->embed_forward(root, tokens_.data(), B, T, compute_);
    for (int l = 0; l < L; ++l) {
      const void* p = use(1 + l);
      // Forward prefetch: the next block's gather runs during this one (it needs a slot of its own).
      if (cfg_.fsdp.forward_prefetch && can_prefetch() && l + 1 < L) gather(2 + l);
      if (N > 0) model_->block_forward(l, p, B, T, compute_);
      done_with(1 + l);
    }
    if (backward) {
      // The previous micro-batch's root reduction reads root_grad_full_.
      finish_root_reduction();
      if (!direct_grads_) root_grad_full_.zero(compute_);
      if (L > 0 && backward_prefetch_ != Prefetch::None) gather(L);  // the last block (usually still held)
    }
    if (N > 0)
      model_->head(root, targets_.data(), B, T, grad_scale, backward, loss_.data(), count_.data(),
                   backward ? full_grad(0) : nullptr, compute_);
    if (backward) {
      for (int l = L - 1; l >= 0; --l) {
        const void* p = use(1 + l);
        // BACKWARD_PRE: the previous block's gather is queued before this block's backward (and its
        // reduce-scatter), so it overlaps this block's compute.
        if (backward_prefetch_ == Prefetch::Pre && can_prefetch() && l > 0) gather(l);
        const int gs = l % 2;
        grad_reduced_[gs]->wait_on(compute_);  // its last reduction has read the buffer
        if (!direct_grads_) block_grad_full_[gs].zero(compute_);
        float* grad = full_grad(1 + l);
        if (N > 0) model_->block_backward(l, p, grad, B, T, compute_);
        done_with(1 + l);
        grad_ready_[gs]->record(compute_);
        grad_ready_[gs]->wait_on(comm_);
        reduce(1 + l, grad);
        grad_reduced_[gs]->record(comm_);
        // BACKWARD_POST: queued after this block's backward and reduce-scatter; it waits for the
        // slot this block frees, so it is safe with a single buffer too.
        if (backward_prefetch_ == Prefetch::Post && l > 0) gather(l);
      }
      if (N > 0) model_->embed_backward(root, tokens_.data(), full_grad(0), B, T, compute_);
      root_grad_ready_->record(compute_);
      root_grad_ready_->wait_on(comm_);
      reduce(0, full_grad(0));
      root_reduced_pending_ = true;
    }
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(host_scalars_, loss_.data(), sizeof(float), cudaMemcpyDeviceToHost, compute_));
    SHARDLM_CUDA_CHECK(cudaStreamSynchronize(compute_));
    return static_cast<double>(*reinterpret_cast<float*>(host_scalars_));
  }

  // A prefetch queued before this unit's compute must land in another slot than the one in use.
  bool can_prefetch() const { return !full_shard_ || block_full_.size() >= 2; }

  // Page-locks an existing host array for fast copies (undone in the destructor).
  void pin(void* p, size_t bytes) {
    if (bytes == 0) return;
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    SHARDLM_CHECK(e == cudaSuccess, "fsdp.cpu_offload: cannot page-lock ", bytes, " bytes of host memory (",
                  cudaGetErrorString(e), "); raise the locked-memory limit (ulimit -l) or turn offload off");
    pinned_.push_back(p);
  }

  void finish_root_reduction() {
    if (!root_reduced_pending_) return;
    finish_reductions();
    root_reduced_pending_ = false;
  }

  RunConfig cfg_;
  DType dt_;
  size_t dsize_;
  std::vector<UnitLayout> layout_;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  ProcessGroups groups_;
  cuda::NcclCommunicator* shard_ = nullptr;
  cuda::NcclCommunicator* replicate_ = nullptr;
  bool full_shard_ = true, alias_ = false, offload_ = false;
  enum class Prefetch { Pre, Post, None };
  Prefetch backward_prefetch_ = Prefetch::Pre;
  std::unique_ptr<AdamW> host_optimizer_;  // CPU offload only
  std::vector<uint16_t> host16_;          // CPU offload: 16-bit staging of one slice (page-locked)
  std::vector<void*> pinned_;             // CPU offload: host arrays page-locked with cudaHostRegister
  std::vector<DeviceUnit> units_;
  DeviceBuffer<char> root_full_;
  std::vector<DeviceBuffer<char>> block_full_;
  std::vector<int> holder_;     // per block slot: the unit whose parameters it holds, or -1
  std::vector<bool> gathered_;  // per unit: its gathered parameters are current
  std::vector<std::unique_ptr<Event>> slot_free_, unit_gathered_;
  DeviceBuffer<float> root_grad_full_, block_grad_full_[2], grad_slice_;  // empty when direct_grads_
  bool direct_grads_ = false;  // one rank in all: the backward accumulates into the gradient slices
  bool cast_at_gather_ = false;  // no compute_shard: the gathers cast the masters themselves
  DeviceBuffer<char> reduce_send_, reduce_recv_;
  std::unique_ptr<Event> grad_ready_[2], grad_reduced_[2], root_grad_ready_;
  // Stream orderings taken every step, made once (after select_device: events belong to a device).
  std::unique_ptr<Event> params_written_, reductions_done_;
  bool root_reduced_pending_ = false;
  std::unique_ptr<cuda::CudaModel> model_;
  DeviceBuffer<int32_t> tokens_, targets_;
  DeviceBuffer<float> loss_;
  DeviceBuffer<long long> count_;
  DeviceBuffer<double> norm_;
  void* host_scalars_ = nullptr;
  long steps_ = 0;
  // Greedy generation, between decode_begin and decode_end (the model holds the cache).
  DeviceBuffer<int32_t> decode_index_;                     // tokens, slots, positions, logit rows, next
  std::unique_ptr<cuda::PinnedBuffer<int32_t>> decode_host_;  // their host staging; set while decoding
  int decode_slots_ = 0, decode_max_len_ = 0, decode_max_rows_ = 0;
};

}  // namespace

std::unique_ptr<TrainEngine> make_cuda_engine(const RunConfig& cfg, MPI_Comm comm, const Topology& topo, int micro) {
  return std::make_unique<CudaEngine>(cfg, comm, topo, micro);
}

}  // namespace shardlm

// The FSDP schedule of one micro-batch on the CPU backend: unshard each unit before it runs,
// reshard after (FULL_SHARD) or keep it until the optimizer step (SHARD_GRAD_OP), reduce each
// unit's gradient as soon as its backward is done. Every buffer is sized here, once.
#include <algorithm>
#include <cmath>

#include "fsdp_internal.hpp"

namespace shardlm {

struct FsdpModel::Buffers {
  // Gathered parameters: the root's, and either one per block (kept from forward to backward)
  // or one shared by all blocks in turn (FULL_SHARD).
  Buffer<float> root_full;
  std::vector<Buffer<float>> block_full;
  std::vector<bool> gathered;      // per unit: its gathered copy is current
  int shared_block_holder = -1;    // FULL_SHARD: the unit whose parameters block_full[0] holds
  bool alias_master = false;       // one-rank shard, fp32: the master slice is the full parameter
  Buffer<float> root_grad_full;
  Buffer<float> block_grad_full;
  Buffer<float> grad_slice_tmp;    // a reduced slice before it is added to the grad slice
  Buffer<uint16_t> send16, recv16; // 16-bit staging for mixed-precision gathers and reductions
  Buffer<float> hidden[2];         // hidden states between units, ping-pong
  Buffer<float> dhidden[2];        // their gradients
  // Greedy decoding only (decode_begin to decode_end): hidden states of the step's rows, one row of logits.
  std::vector<float> decode_hidden[2], decode_logits;
  int decode_rows = 0;
};

FsdpModel::FsdpModel(const ModelConfig& cfg, const FsdpOptions& opt, ProcessGroups& groups,
                     int max_batch, int max_seq, uint64_t seed)
    : cfg_(cfg), opt_(opt), groups_(groups), layout_(model_layout(cfg)), buf_(std::make_unique<Buffers>()) {
  const int shard_rank = groups_.shard->rank(), shard_size = groups_.shard->size();
  for (size_t u = 0; u < layout_.size(); ++u)
    units_.push_back(make_flat_parameter(layout_[u], static_cast<int>(u), shard_rank, shard_size, seed));
  model_ = make_cpu_model(cfg, max_batch, max_seq);

  Buffers& b = *buf_;
  const FsdpBufferSizes sizes = fsdp_buffer_sizes(layout_, opt_, shard_size, cfg.hidden_size, max_batch, max_seq);
  b.alias_master = sizes.alias_master;
  b.root_full.allocate(sizes.root_full, MemKind::Params);
  for (size_t i = 0; i < sizes.block_full_copies; ++i) b.block_full.emplace_back(sizes.block_full, MemKind::Params);
  b.gathered.assign(units_.size(), false);
  b.root_grad_full.allocate(sizes.root_grad_full, MemKind::Grads);
  b.block_grad_full.allocate(sizes.block_grad_full, MemKind::Grads);
  b.grad_slice_tmp.allocate(sizes.grad_slice_tmp, MemKind::Comm);
  b.send16.allocate(sizes.staging16, MemKind::Comm);
  b.recv16.allocate(sizes.staging16, MemKind::Comm);
  for (int i = 0; i < 2; ++i) {
    b.hidden[i].allocate(sizes.hidden, MemKind::Activations);
    b.dhidden[i].allocate(sizes.hidden, MemKind::Activations);
  }
}

FsdpModel::~FsdpModel() = default;

const float* FsdpModel::unshard(size_t unit) {
  Buffers& b = *buf_;
  FlatParameter& p = units_[unit];
  if (b.alias_master) return p.master.data();
  float* dst;
  if (unit == 0) {
    dst = b.root_full.data();
  } else if (reshards_after_forward(opt_.strategy)) {
    dst = b.block_full[0].data();
    if (b.shared_block_holder != static_cast<int>(unit)) b.gathered[unit] = false;
  } else {
    dst = b.block_full[unit - 1].data();
  }
  if (b.gathered[unit]) return dst;
  Communicator& shard = *groups_.shard;
  if (opt_.param_dtype == DType::F32) {
    shard.all_gather(p.master.data(), dst, p.shard_numel, DType::F32);
  } else {
    // Cast the slice to the compute dtype first, so the gather moves half the bytes.
    pack16(opt_.param_dtype, p.master.data(), b.send16.data(), p.shard_numel);
    shard.all_gather(b.send16.data(), b.recv16.data(), p.shard_numel, opt_.param_dtype);
    unpack16(opt_.param_dtype, b.recv16.data(), dst, p.padded_numel);
  }
  b.gathered[unit] = true;
  if (unit > 0 && reshards_after_forward(opt_.strategy)) b.shared_block_holder = static_cast<int>(unit);
  return dst;
}

void FsdpModel::reshard_after_use(size_t unit) {
  // FULL_SHARD and HYBRID_SHARD free a block's gathered parameters after each use; the others keep them until
  // the optimizer changes the slices. The root stays gathered for the whole step (as FSDP's root).
  if (unit > 0 && reshards_after_forward(opt_.strategy)) {
    buf_->gathered[unit] = false;
    buf_->shared_block_holder = -1;
  }
}

void FsdpModel::reduce_grad(size_t unit, float* full_grad) {
  Buffers& b = *buf_;
  FlatParameter& p = units_[unit];
  float* slice = b.grad_slice_tmp.data();
  Communicator& shard = *groups_.shard;
  Communicator& replicate = *groups_.replicate;
  if (opt_.reduce_dtype == DType::F32) {
    shard.reduce_scatter(full_grad, slice, p.shard_numel, DType::F32, ReduceOp::Sum);
    replicate.all_reduce(slice, p.shard_numel, DType::F32, ReduceOp::Sum);
  } else {
    pack16(opt_.reduce_dtype, full_grad, b.send16.data(), p.padded_numel);
    shard.reduce_scatter(b.send16.data(), b.recv16.data(), p.shard_numel, opt_.reduce_dtype, ReduceOp::Sum);
    replicate.all_reduce(b.recv16.data(), p.shard_numel, opt_.reduce_dtype, ReduceOp::Sum);
    unpack16(opt_.reduce_dtype, b.recv16.data(), slice, p.shard_numel);
  }
  float* grad = p.grad.data();
  for (size_t i = 0; i < p.shard_numel; ++i) grad[i] += slice[i];
}

double FsdpModel::forward_backward(const MicroBatch& mb, float grad_scale) {
  Buffers& b = *buf_;
  const int B = mb.batch, T = mb.seq, L = cfg_.num_layers;
  const float* root = unshard(0);
  model_->embed_forward(root, mb.tokens.data(), B, T, b.hidden[0].data());
  int cur = 0;
  for (int l = 0; l < L; ++l) {
    const float* params = unshard(1 + l);
    model_->block_forward(l, params, b.hidden[cur].data(), b.hidden[1 - cur].data(), B, T);
    reshard_after_use(1 + l);
    cur = 1 - cur;
  }
  b.root_grad_full.zero();
  int64_t count = 0;
  double loss = model_->head_loss(root, b.hidden[cur].data(), mb.targets.data(), B, T, &count, grad_scale,
                                  b.dhidden[0].data(), b.root_grad_full.data());
  cur = 0;
  for (int l = L - 1; l >= 0; --l) {
    const float* params = unshard(1 + l);
    b.block_grad_full.zero();
    model_->block_backward(l, params, b.dhidden[cur].data(), b.dhidden[1 - cur].data(),
                           b.block_grad_full.data(), B, T);
    reduce_grad(1 + l, b.block_grad_full.data());
    reshard_after_use(1 + l);
    cur = 1 - cur;
  }
  model_->embed_backward(root, mb.tokens.data(), b.dhidden[cur].data(), b.root_grad_full.data(), B, T);
  reduce_grad(0, b.root_grad_full.data());
  return loss;
}

double FsdpModel::forward_loss(const MicroBatch& mb) {
  Buffers& b = *buf_;
  const int B = mb.batch, T = mb.seq;
  const float* root = unshard(0);
  model_->embed_forward(root, mb.tokens.data(), B, T, b.hidden[0].data());
  int cur = 0;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const float* params = unshard(1 + l);
    model_->block_forward(l, params, b.hidden[cur].data(), b.hidden[1 - cur].data(), B, T);
    reshard_after_use(1 + l);
    cur = 1 - cur;
  }
  int64_t count = 0;
  return model_->head_loss(root, b.hidden[cur].data(), mb.targets.data(), B, T, &count, 0.0f, nullptr, nullptr);
}

void FsdpModel::decode_begin(int slots, int max_len, int max_rows) {
  Buffers& b = *buf_;
  model_->decode_begin(slots, max_len, max_rows);
  b.decode_rows = max_rows;
  for (std::vector<float>& h : b.decode_hidden) h.assign(static_cast<size_t>(max_rows) * cfg_.hidden_size, 0.0f);
  b.decode_logits.assign(cfg_.vocab_size, 0.0f);
}

void FsdpModel::decode_step(const int32_t* tokens, const int* slots, const int* positions, int n,
                            const int* logit_rows, int m, int32_t* next) {
  Buffers& b = *buf_;
  SHARDLM_CHECK(n >= 0 && n <= b.decode_rows, "FsdpModel::decode_step: ", n, " rows exceed the ", b.decode_rows,
                " of decode_begin");
  const size_t H = cfg_.hidden_size;
  const float* root = unshard(0);
  // The embedding is per token: one row at a time keeps within the sizes the model was built for.
  for (int r = 0; r < n; ++r) model_->embed_forward(root, tokens + r, 1, 1, b.decode_hidden[0].data() + r * H);
  int cur = 0;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const float* params = unshard(1 + l);
    model_->block_decode(l, params, b.decode_hidden[cur].data(), b.decode_hidden[1 - cur].data(), n, slots, positions);
    reshard_after_use(1 + l);
    cur = 1 - cur;
  }
  float* logits = b.decode_logits.data();
  for (int i = 0; i < m; ++i) {
    SHARDLM_CHECK(logit_rows[i] >= 0 && logit_rows[i] < n, "FsdpModel::decode_step: logit row ", logit_rows[i],
                  " is not one of the step's ", n, " rows");
    model_->head_logits(root, b.decode_hidden[cur].data() + static_cast<size_t>(logit_rows[i]) * H, 1, 1, logits);
    // std::max_element returns the first maximum: the lowest id on ties, as torch.argmax.
    next[i] = static_cast<int32_t>(std::max_element(logits, logits + cfg_.vocab_size) - logits);
  }
}

void FsdpModel::decode_end() {
  Buffers& b = *buf_;
  model_->decode_end();
  b.decode_rows = 0;
  for (std::vector<float>* v : {&b.decode_hidden[0], &b.decode_hidden[1], &b.decode_logits})
    std::vector<float>().swap(*v);
}

void FsdpModel::zero_grad() {
  for (FlatParameter& p : units_) p.grad.zero();
}

double FsdpModel::grad_norm() {
  double local = 0.0;
  for (const FlatParameter& p : units_)
    for (size_t i = 0; i < p.shard_numel; ++i) local += static_cast<double>(p.grad[i]) * p.grad[i];
  // Slices partition the model within a shard group; replicas hold identical slices.
  float sum = static_cast<float>(local);
  groups_.shard->all_reduce(&sum, 1, DType::F32, ReduceOp::Sum);
  return std::sqrt(static_cast<double>(sum));
}

void FsdpModel::scale_grads(float factor) {
  if (factor == 1.0f) return;
  for (FlatParameter& p : units_)
    for (size_t i = 0; i < p.shard_numel; ++i) p.grad[i] *= factor;
}

void FsdpModel::params_updated() {
  std::fill(buf_->gathered.begin(), buf_->gathered.end(), false);
  buf_->shared_block_holder = -1;
}

std::vector<ParamSlice> FsdpModel::param_slices() {
  std::vector<ParamSlice> slices;
  for (FlatParameter& p : units_) slices.push_back({p.master.data(), p.grad.data(), p.shard_numel, p.no_decay});
  return slices;
}

FsdpMemory FsdpModel::memory() const {
  const Buffers& b = *buf_;
  FsdpMemory m;
  for (const FlatParameter& p : units_) {
    m.master_shard += p.master.size() * sizeof(float);
    m.grad_shard += p.grad.size() * sizeof(float);
    m.model_params += p.numel;
  }
  m.full_params = b.root_full.size() * sizeof(float);
  for (const Buffer<float>& f : b.block_full) m.full_params += f.size() * sizeof(float);
  m.full_grads = (b.root_grad_full.size() + b.block_grad_full.size()) * sizeof(float);
  m.comm_staging = b.grad_slice_tmp.size() * sizeof(float) + (b.send16.size() + b.recv16.size()) * sizeof(uint16_t);
  m.activations = model_->activation_bytes();
  for (int i = 0; i < 2; ++i) m.activations += (b.hidden[i].size() + b.dhidden[i].size()) * sizeof(float);
  return m;
}

}  // namespace shardlm

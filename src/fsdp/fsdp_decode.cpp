// FsdpEngine's generation: the forward's gather schedule around the model's decode path, one step of
// rows at a time, with the rows' indices checked once here (the kernels index with them); each step
// hands back the argmax of the rows asked for (greedy) or their logits (sampling, src/train/generate.cpp).
#include "fsdp_engine_impl.hpp"

namespace shardlm {

void FsdpEngine::decode_begin(int slots, int max_len, int max_rows) {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.decode_max_rows == 0, "FsdpEngine::decode_begin: already decoding (decode_end first)");
  SHARDLM_CHECK(slots >= 1 && max_len >= 1 && max_rows >= 1, "FsdpEngine::decode_begin: bad sizes slots=", slots,
                " max_len=", max_len, " max_rows=", max_rows);
  m.model->decode_allocate(slots, max_len, max_rows);
  // Per step: tokens, slots, positions, logit rows (sent), next tokens (received), max_rows each.
  const size_t n = 5 * static_cast<size_t>(max_rows);
  m.decode_index = backend_->allocate(n * sizeof(int32_t), MemKind::Other);
  m.decode_host.assign(n, 0);
  m.decode_slots = slots, m.decode_max_len = max_len, m.decode_max_rows = max_rows;
}

void FsdpEngine::decode_step(const int32_t* tokens, const int* slots, const int* positions, int n,
                             const int* logit_rows, int m_rows, int32_t* next, float* logits) {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.decode_max_rows > 0, "FsdpEngine::decode_step before decode_begin");
  const int R = m.decode_max_rows, L = m.L;
  const int V = m.model->config().vocab_size;
  SHARDLM_CHECK(n >= 0 && n <= R && m_rows >= 0 && m_rows <= n, "FsdpEngine::decode_step: ", n, " rows and ", m_rows,
                " logit rows, decode_begin sized ", R, " rows");
  SHARDLM_CHECK(!logits || m_rows <= m.decode_slots, "FsdpEngine::decode_step: logits of ", m_rows,
                " rows asked for, decode_begin sized ", m.decode_slots, " slots");
  const size_t logit_bytes = static_cast<size_t>(m.decode_slots) * V * sizeof(float);
  if (logits && m.decode_logits.bytes() < logit_bytes) m.decode_logits = backend_->allocate(logit_bytes, MemKind::Other);
  float* dev_logits = logits ? m.decode_logits.as<float>() : nullptr;
  int32_t* host = m.decode_host.data();
  for (int r = 0; r < n; ++r) {
    SHARDLM_CHECK(tokens[r] >= 0 && tokens[r] < V, "FsdpEngine::decode_step: row ", r, " has token ", tokens[r],
                  " outside the vocabulary of ", V);
    SHARDLM_CHECK(slots[r] >= 0 && slots[r] < m.decode_slots && positions[r] >= 0 && positions[r] < m.decode_max_len,
                  "FsdpEngine::decode_step: row ", r, " at slot ", slots[r], " position ", positions[r],
                  " is outside the cache of ", m.decode_slots, " slots x ", m.decode_max_len, " positions");
    host[r] = tokens[r], host[R + r] = slots[r], host[2 * R + r] = positions[r];
  }
  for (int i = 0; i < m_rows; ++i) {
    SHARDLM_CHECK(logit_rows[i] >= 0 && logit_rows[i] < n, "FsdpEngine::decode_step: logit row ", logit_rows[i],
                  " of a step of ", n, " rows");
    host[3 * R + i] = logit_rows[i];
  }
  int32_t* dev = m.decode_index.as<int32_t>();
  if (n > 0) backend_->copy(dev, host, 4 * static_cast<size_t>(R) * sizeof(int32_t), CopyKind::HostToDevice, m.compute);
  // The forward's schedule: with n == 0 the rank still joins every all-gather.
  const UnitParams root = m.use(0);
  if (L > 0 && m.forward_prefetch) m.gather(1);
  m.model->decode_embed(root, dev, n, m.compute);
  for (int l = 0; l < L; ++l) {
    const UnitParams p = m.use(1 + l);
    if (m.forward_prefetch && m.can_prefetch() && l + 1 < L) m.gather(2 + l);
    m.model->decode_block(l, p, dev + R, dev + 2 * R, n, m.compute);
    m.done_with(1 + l);
  }
  m.head_takes_scratch();
  m.model->decode_head(root, dev + 3 * R, m_rows, next ? dev + 4 * R : nullptr, dev_logits, m.compute);
  if (m_rows > 0 && next)
    backend_->copy(host + 4 * R, dev + 4 * R, static_cast<size_t>(m_rows) * sizeof(int32_t), CopyKind::DeviceToHost,
                   m.compute);
  if (m_rows > 0 && logits)
    backend_->copy(logits, dev_logits, static_cast<size_t>(m_rows) * V * sizeof(float), CopyKind::DeviceToHost,
                   m.compute);
  // Also keeps the next step from overwriting staging that this step's copy still reads.
  backend_->synchronize(m.compute);
  if (next) std::copy(host + 4 * R, host + 4 * R + m_rows, next);
}

int FsdpEngine::vocab_size() const { return impl_->model->config().vocab_size; }

const ModelConfig& FsdpEngine::model_config() const { return impl_->model->config(); }

void FsdpEngine::decode_end() {
  Impl& m = *impl_;
  backend_->synchronize(m.compute);
  m.model->decode_free();
  m.decode_index = DeviceArray{};
  m.decode_logits = DeviceArray{};
  std::vector<int32_t>().swap(m.decode_host);
  m.decode_slots = m.decode_max_len = m.decode_max_rows = 0;
}

}  // namespace shardlm

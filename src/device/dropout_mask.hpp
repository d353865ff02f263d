// LoRA dropout's masks, counter-based: whether an element is kept is a hash of the micro-step's seed,
// the block, the adapted layer and the element's coordinates (sequence, position, column), so the CPU
// models, the CUDA kernel (lora_dropout.cu) and a recomputation under activation checkpointing draw the
// same mask with no state. Written once for host C++ and CUDA device code (docs/lora.md, "Dropout").
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SHARDLM_HOST_DEVICE __host__ __device__
#else
#define SHARDLM_HOST_DEVICE
#endif

namespace shardlm {

// SplitMix64's increment and finaliser (Steele, Lea and Flood 2014): mix(s + i * gamma) over counters i
// is SplitMix64's output sequence, which passes BigCrush.
constexpr uint64_t kDropoutGamma = 0x9e3779b97f4a7c15ULL;
SHARDLM_HOST_DEVICE inline uint64_t dropout_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
// A key that depends on key and v (SplitMix64's output number v + 1 from state key).
SHARDLM_HOST_DEVICE inline uint64_t dropout_combine(uint64_t key, uint64_t v) {
  return dropout_mix(key + (v + 1) * kDropoutGamma);
}

// The element's coordinates are packed into one 64-bit counter: sequence (20 bits), position (22),
// column (22); dropout_mask_fits checks a model's sizes against these.
constexpr int kDropoutColumnBits = 22, kDropoutPositionBits = 22, kDropoutSequenceBits = 20;

// One adapted layer's mask in one training forward. Element (b, t, c) of its input x[b, t, c] is kept
// when the high 32 bits of its hash are at least `threshold` (probability 1 - threshold / 2^32, which
// is 1 - p to within 2^-32) and is then multiplied by `scale` = 1 / (1 - p), in fp32; else it is 0.
struct DropoutMask {
  uint64_t stream = 0;     // dropout_stream(seed, layer, module)
  uint32_t threshold = 0;  // round(p 2^32)
  float scale = 1.0f;      // 1 / (1 - p), as torch's dropout scales its kept values

  SHARDLM_HOST_DEVICE bool keep(uint32_t sequence, uint32_t position, uint32_t column) const {
    const uint64_t counter = (static_cast<uint64_t>(sequence) << (kDropoutPositionBits + kDropoutColumnBits)) |
                             (static_cast<uint64_t>(position) << kDropoutColumnBits) | column;
    return static_cast<uint32_t>(dropout_combine(stream, counter) >> 32) >= threshold;
  }
  // What element (b, t, c) of x is multiplied by: scale or 0.
  SHARDLM_HOST_DEVICE float factor(uint32_t sequence, uint32_t position, uint32_t column) const {
    return keep(sequence, position, column) ? scale : 0.0f;
  }
};

// The key of block `layer`'s adapted layer `module` (an index in the family's linear_modules order):
// every adapted layer draws its own mask, as PEFT's one nn.Dropout per layer.
inline uint64_t dropout_stream(uint64_t seed, int layer, int module) {
  return dropout_combine(dropout_combine(seed, static_cast<uint64_t>(static_cast<uint32_t>(layer))),
                         static_cast<uint64_t>(static_cast<uint32_t>(module)));
}

// The mask of dropout probability p (in (0, 1)) of that layer under `seed`.
inline DropoutMask dropout_mask(uint64_t seed, double p, int layer, int module) {
  DropoutMask m;
  m.stream = dropout_stream(seed, layer, module);
  const double t = p * 4294967296.0 + 0.5;
  m.threshold = t >= 4294967295.0 ? 0xffffffffu : static_cast<uint32_t>(t);
  m.scale = static_cast<float>(1.0 / (1.0 - p));
  return m;
}

// Whether micro-batches of up to max_batch sequences of max_seq positions, through layers of up to
// max_in inputs, have coordinates that fit the counter's fields.
inline bool dropout_mask_fits(long long max_batch, long long max_seq, long long max_in) {
  return max_batch <= (1LL << kDropoutSequenceBits) && max_seq <= (1LL << kDropoutPositionBits) &&
         max_in <= (1LL << kDropoutColumnBits);
}

// The seed of one training micro-batch's masks: a hash of the run's seed (train.seed), the optimizer
// step (0-based, as a resume restores it), the micro-step within it and the rank that runs it, so a
// resumed run draws the masks the uninterrupted one drew.
inline uint64_t dropout_micro_step_seed(uint64_t run_seed, long long step, int micro_step, int rank) {
  uint64_t k = dropout_mix(run_seed ^ 0x4c6f5241646f7574ULL);  // "LoRAdout": apart from the init's streams
  k = dropout_combine(k, static_cast<uint64_t>(step));
  k = dropout_combine(k, static_cast<uint64_t>(static_cast<uint32_t>(micro_step)));
  return dropout_combine(k, static_cast<uint64_t>(static_cast<uint32_t>(rank)));
}

}  // namespace shardlm

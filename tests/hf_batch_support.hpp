// The recorded batch of a transformers/PEFT reference (test_hf_parity, test_peft_parity).
#pragma once

#include "shardlm/data.hpp"
#include "shardlm/io.hpp"

// The recorded sequences this rank takes (sequence i on rank i % world), targets shifted as
// transformers does: position t predicts token t + 1 unless labels[t + 1] is -100.
inline shardlm::MicroBatch recorded_rank_batch(const shardlm::SafetensorsEntry& ids,
                                               const shardlm::SafetensorsEntry& labels, int rank, int world) {
  const int B = static_cast<int>(ids.shape[0]), T = static_cast<int>(ids.shape[1]);
  shardlm::MicroBatch mb;
  mb.seq = T;
  for (int b = rank; b < B; b += world) {
    ++mb.batch;
    for (int t = 0; t < T; ++t) {
      mb.tokens.push_back(static_cast<int32_t>(ids.data[b * T + t]));
      const float next = t + 1 < T ? labels.data[b * T + t + 1] : -100.0f;
      mb.targets.push_back(next < 0 ? -1 : static_cast<int32_t>(next));
      mb.target_count += next >= 0;
    }
  }
  if (mb.batch == 0) mb.seq = 0;
  return mb;
}

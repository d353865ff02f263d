// Helpers of the suites that train end to end under mpirun (test_fsdp, test_resume, test_cuda_engine).
#pragma once

#include "shardlm/train.hpp"

// Training without the per-step echo.
inline shardlm::TrainOptions quiet() {
  shardlm::TrainOptions o;
  o.echo = false;
  return o;
}

// The tiny BLOOM on the demo SQuAD data these suites start from: byte tokens, 2 layers of 4 heads
// `hidden_size` wide, a global batch of 8 in micro-batches of 2 at lr 3e-3; each suite sets the rest.
inline shardlm::RunConfig tiny_squad_config(int hidden_size) {
  shardlm::RunConfig cfg;
  cfg.model.vocab_size = 259;
  cfg.model.hidden_size = hidden_size;
  cfg.model.num_layers = 2;
  cfg.model.num_heads = 4;
  cfg.data.train_file = SHARDLM_SOURCE_DIR "/input/data/demo_squad_train.json";
  cfg.train.batch_size = 8;
  cfg.train.micro_batch_size = 2;
  cfg.train.lr = 3e-3;
  return cfg;
}

// Helpers of the suites that train end to end under mpirun (test_fsdp, test_resume, test_cuda_engine,
// test_cli).
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "shardlm/data.hpp"
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

// tiny_squad_config's model made a Llama: 2 key/value heads for its 4 query heads, a SwiGLU 48 wide,
// rope theta 1e4.
inline void make_tiny_llama(shardlm::ModelConfig& m) {
  m.arch = "llama";
  m.num_kv_heads = 2;
  m.intermediate_size = 48;
  m.rope_theta = 10000.0f;
}

// Writes the byte tokenizer's files (as `shardlm export` writes them) into folder `dir` with the ids
// of 'a' and 'b' swapped: another tokenizer of the same 259 tokens, which no model config key tells
// apart. Returns the path of its tokenizer.json.
inline std::string write_swapped_byte_tokenizer(const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (const auto& [name, text] : shardlm::ByteTokenizer::hf_files(1024)) {
    std::string content = text;
    if (name == "tokenizer.json") {
      nlohmann::ordered_json tokenizer = nlohmann::ordered_json::parse(text);
      nlohmann::ordered_json& vocab = tokenizer["model"]["vocab"];
      std::swap(vocab["a"], vocab["b"]);
      content = tokenizer.dump(2) + "\n";
    }
    std::ofstream(std::filesystem::path(dir) / name) << content;
  }
  return (std::filesystem::path(dir) / "tokenizer.json").string();
}

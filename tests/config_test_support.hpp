// The config's enums printed by name, so BOOST_TEST can show the values it compares, and a few
// model-shape helpers the config, checkpoint and input suites share.
#pragma once

#include <boost/test/unit_test.hpp>

#include <ostream>

#include "shardlm/config.hpp"

namespace shardlm {
inline std::ostream& boost_test_print_type(std::ostream& os, ShardingStrategy s) { return os << strategy_name(s); }
inline std::ostream& boost_test_print_type(std::ostream& os, DType t) { return os << dtype_name(t); }
inline std::ostream& boost_test_print_type(std::ostream& os, DataFormat f) { return os << data_format_name(f); }
inline std::ostream& boost_test_print_type(std::ostream& os, TokenizerSource t) { return os << tokenizer_source_name(t); }
inline std::ostream& boost_test_print_type(std::ostream& os, LrSchedule s) { return os << lr_schedule_name(s); }
inline std::ostream& boost_test_print_type(std::ostream& os, BackwardPrefetch p) { return os << backward_prefetch_name(p); }
inline std::ostream& boost_test_print_type(std::ostream& os, EvalGenerate g) { return os << eval_generate_name(g); }
inline std::ostream& boost_test_print_type(std::ostream& os, ResumeFrom r) { return os << resume_from_name(r); }
inline std::ostream& boost_test_print_type(std::ostream& os, BackendKind b) { return os << backend_name(b); }
inline std::ostream& boost_test_print_type(std::ostream& os, LoraInit i) { return os << lora_init_name(i); }
}  // namespace shardlm

// A BLOOM model of the given shape, its other fields at their defaults.
inline shardlm::ModelConfig bloom_shape(int vocab_size, int hidden_size, int num_layers, int num_heads) {
  shardlm::ModelConfig cfg;
  cfg.arch = "bloom";
  cfg.vocab_size = vocab_size;
  cfg.hidden_size = hidden_size;
  cfg.num_layers = num_layers;
  cfg.num_heads = num_heads;
  return cfg;
}

// Checks a loaded model's shape and the norm and init numbers BLOOM takes, one BOOST_TEST a field
// (exact comparisons: the values are read back, not computed).
inline void check_bloom_shape(const shardlm::ModelConfig& m, int vocab_size, int hidden_size, int num_layers,
                              int num_heads, float layer_norm_eps, float init_std) {
  BOOST_TEST(m.vocab_size == vocab_size);
  BOOST_TEST(m.hidden_size == hidden_size);
  BOOST_TEST(m.num_layers == num_layers);
  BOOST_TEST(m.num_heads == num_heads);
  BOOST_TEST(m.layer_norm_eps == layer_norm_eps);
  BOOST_TEST(m.init_std == init_std);
}

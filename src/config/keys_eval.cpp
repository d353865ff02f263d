// The [eval] section's keys and their checks: the generation's cache against the node's memory.
// Adding a key: keys.cpp's first lines.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "key_builders.hpp"

namespace shardlm::config_detail {

// SQuAD evaluation by generation: each rank's key/value cache holds eval.batch_size prompts of up to
// data.max_length tokens plus eval.max_new_tokens, K and V of every layer, in fp32 at most. Checked
// here, before training, against this node's available memory (the cache is allocated after training).
static void check_generation_sizes(const RunConfig& cfg) {
  if (cfg.data.format != DataFormat::Squad || cfg.eval.generate == EvalGenerate::None || cfg.data.eval_file.empty())
    return;
  const ModelConfig& m = cfg.model;
  model_layout(m);  // a shape no model has is refused as such first, not blamed on this key
  const int64_t positions = int64_t{cfg.data.max_length} + cfg.eval.max_new_tokens;
  if (positions > INT32_MAX)
    bad_value("eval.max_new_tokens", std::to_string(cfg.eval.max_new_tokens),
              concat("with data.max_length (", cfg.data.max_length, ") gives ", positions,
                     " positions, more than the 2147483647 a sequence may have"));
  const int64_t slots = cfg.eval.batch_size > 0 ? cfg.eval.batch_size : cfg.train.micro_batch_size;
  const double bytes = static_cast<double>(slots) * static_cast<double>(positions) * 2.0 * m.num_layers *
                       m.kv_heads() * m.head_dim() * sizeof(float);
  const double available = static_cast<double>(host_available_bytes());
  if (available > 0 && bytes > available)
    bad_value("eval.max_new_tokens", std::to_string(cfg.eval.max_new_tokens),
              concat("the generation's key/value cache would take ",
                     format_bytes(static_cast<size_t>(std::min(bytes, 1e18))), " per rank (", slots, " prompts x ",
                     positions, " positions (data.max_length ", cfg.data.max_length, " + this) x ", m.num_layers,
                     " layers, K and V), more than the ", format_bytes(static_cast<size_t>(available)),
                     " this node has available; lower it, data.max_length or eval.batch_size, or set eval.generate "
                     "= none"));
}

static void check_eval(const RunConfig& cfg, int) {
  check_generation_sizes(cfg);
  if (cfg.data.eval_file.empty() && cfg.eval.every_steps > 0)
    bad_value("eval.every_steps", std::to_string(cfg.eval.every_steps), "needs data.eval_file");
}

DeckSection eval_section() {
  return {"eval", check_eval, {
      enum_key("eval.generate", SHARDLM_FIELD(eval.generate), eval_generate_name)
          .doc("`data.format = squad` with an `eval_file` only: answer every eval question by greedy generation and "
               "score the answers with the official SQuAD v1.1 exact match and F1 (best over each question's "
               "reference answers): after the last epoch (`end`; with early stopping, at the evaluation that stops the "
               "run), after every epoch (`epoch`), or never"),
      int_key("eval.max_new_tokens", SHARDLM_FIELD(eval.max_new_tokens), 1, "must be >= 1")
          .doc("the longest answer generated; EOS ends one earlier"),
      int_key("eval.batch_size", SHARDLM_FIELD(eval.batch_size), 0, "must be >= 0 (0 = train.micro_batch_size)")
          .doc("prompts one rank decodes together (0 = `train.micro_batch_size`)"),
      int_key("eval.every_steps", SHARDLM_FIELD(eval.every_steps), 0, "must be >= 0 (0 = after each epoch only)")
          .doc("also the eval loss every N optimizer steps (Trainer's `eval_strategy = steps` with `eval_steps`), "
               "beside the one after each epoch (a step that ends an epoch is evaluated once); generation stays at "
               "the epochs. Each is an `eval` line and record, a TensorBoard `eval/loss`, and counts for "
               "`checkpoint.keep_best` and early stopping. 0 = after each epoch only; needs `data.eval_file`"),
  }};
}

}  // namespace shardlm::config_detail

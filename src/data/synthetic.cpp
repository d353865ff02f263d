// synthetic_examples: text made up from a seed, for smoke runs whose deck names data that is not here.
#include <random>

#include "shardlm/data.hpp"

namespace shardlm {

std::vector<Example> synthetic_examples(size_t count, int max_length, const Tokenizer& tok, uint64_t seed) {
  static const char* const kWords[] = {"the", "model", "learns", "a", "shard", "of", "every", "step",
                                       "and", "gathers", "its", "block", "before", "it", "runs", "again"};
  std::mt19937_64 draw(seed);
  std::vector<Example> examples;
  examples.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    std::string text = "sample " + std::to_string(i) + ":";
    while (text.size() < static_cast<size_t>(max_length)) text += std::string(" ") + kWords[draw() % std::size(kWords)];
    examples.push_back(next_token_example(tok.encode(text), tok, max_length));
  }
  return examples;
}

}  // namespace shardlm

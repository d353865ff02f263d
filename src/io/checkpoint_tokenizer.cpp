// What a checkpoint keeps of the run's tokenizer: a hash of its tokenizer.json, which resume
// compares with the resuming run's (the model config alone cannot tell two 259-token vocabularies apart).

#include "checkpoint_format.hpp"
#include "shardlm/data.hpp"

namespace shardlm {
namespace {

constexpr const char* kByteTokenizer = "byte";
constexpr size_t kShortHashDigits = 12;  // enough to tell two files apart by eye

// "byte", or the source with the hash's first `digits` hex digits.
std::string shown_tokenizer(const std::string& source, const std::string& hash, size_t digits) {
  if (hash == kByteTokenizer) return kByteTokenizer;
  const std::string file = source.empty() ? "a tokenizer.json" : source;
  if (hash.empty()) return concat(file, " (no hash kept: written before checkpoints kept one)");
  return concat(file, " (hash ", hash.substr(0, digits), ")");
}

// data.tokenizer of the checkpoint's resolved deck; "" when the deck does not say.
std::string deck_tokenizer(const std::string& deck) {
  try {
    const std::map<std::string, std::string> values = ini_values(deck, "the checkpoint's deck");
    const auto it = values.find("data.tokenizer");
    return it == values.end() ? "" : it->second;
  } catch (const Error&) {
    return "";  // the source only makes the text clearer
  }
}

}  // namespace

std::string tokenizer_hash(const std::string& tokenizer_json) {
  if (tokenizer_json.empty()) return kByteTokenizer;
  ckpt::Fnv1a hash;
  hash.add_bytes(read_input_file(tokenizer_file(tokenizer_json), "tokenizer file", kMaxTokenizerBytes));
  return hex_digits(hash.value());
}

std::string checkpoint_tokenizer_text(const CheckpointMeta& checkpoint) {
  return shown_tokenizer(deck_tokenizer(checkpoint.deck), checkpoint.tokenizer_hash, checkpoint.tokenizer_hash.size());
}

std::string tokenizer_difference(const CheckpointMeta& checkpoint, const RunConfig& run, const std::string& run_hash) {
  if (checkpoint.tokenizer_hash.empty() || checkpoint.tokenizer_hash == run_hash) return "";
  const std::string run_source = run.tokenizer_json().empty() ? kByteTokenizer : run.tokenizer_json();
  return concat("data.tokenizer is ",
                shown_tokenizer(deck_tokenizer(checkpoint.deck), checkpoint.tokenizer_hash, kShortHashDigits),
                " in the checkpoint, ", shown_tokenizer(run_source, run_hash, kShortHashDigits), " in this run");
}

}  // namespace shardlm

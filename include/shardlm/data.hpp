// data: tokenizer, dataset readers (SQuAD v1.1 JSON, JSONL text), batching and the distributed sampler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shardlm {

// Byte-level tokenizer: ids 0..255 are the bytes, then the special tokens.
class ByteTokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kPad = 258;
  int32_t vocab_size() const { return 259; }
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // special tokens are dropped
};

// One training sequence. targets[t] is the token position t must predict (tokens[t + 1] where a
// loss is taken), -1 elsewhere; tokens and targets have the same length.
struct Example {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
};

struct DatasetOptions {
  int max_length = 512;   // tokens per sequence after truncation
  size_t limit = 0;       // keep the first `limit` records after the seeded shuffle (0 = all)
  uint64_t seed = 0;      // order of the subset selection
  bool shuffle_subset = false;
};

// SQuAD v1.1 JSON ({"data":[{"paragraphs":[{"context","qas":[{"question","answers":[{"text"}]}]}]}]}).
// Each question becomes "Question: {q} Context: {c} Answer:" + " {answer}" + EOS, the loss taken
// on the answer tokens and EOS only; the context (never the answer) is truncated to fit.
// Throws Error naming the file (and record) on malformed input.
std::vector<Example> load_squad(const std::string& path, const ByteTokenizer& tok,
                                const DatasetOptions& opt);

// JSON lines with {"text": ...} (loss on every next token) or {"prompt": ..., "completion": ...}
// (loss on the completion and EOS only), truncated to max_length.
std::vector<Example> load_jsonl(const std::string& path, const ByteTokenizer& tok,
                                const DatasetOptions& opt);

// A permutation of 0..n-1 drawn by Fisher-Yates from std::mt19937_64(seed) with unbiased bounded
// draws, so it is the same on every standard library (std::shuffle is not). Used for the seeded
// subset selection of the loaders and the epoch orders of the sampler.
std::vector<size_t> seeded_permutation(size_t n, uint64_t seed);

// The subset rule of DatasetOptions shared by the loaders: with limit > 0, keep `limit` examples,
// the first ones or (shuffle_subset) those seeded_permutation(n, seed) puts first, in file order.
std::vector<Example> select_subset(std::vector<Example> all, const DatasetOptions& opt);

// A micro-batch padded to its longest sequence (padding never takes a loss).
struct MicroBatch {
  int batch = 0;
  int seq = 0;
  std::vector<int32_t> tokens;   // batch * seq
  std::vector<int32_t> targets;  // batch * seq, -1 where no loss
  int64_t target_count = 0;      // positions with a target
};

MicroBatch make_micro_batch(const std::vector<Example>& data, const std::vector<size_t>& indices,
                            int32_t pad_id);

// Number of loss positions over the given examples.
int64_t count_targets(const std::vector<Example>& data, const std::vector<size_t>& indices);

// Splits each epoch's (seeded, optionally shuffled) order into global batches of a fixed size;
// the global batch of a step is the same whatever the world size, and each rank's micro-batches
// are contiguous pieces of it. The last incomplete global batch of an epoch is dropped.
class DistributedSampler {
 public:
  DistributedSampler(size_t dataset_size, size_t global_batch, uint64_t seed, bool shuffle);
  size_t steps_per_epoch() const;
  std::vector<size_t> global_batch(size_t epoch, size_t step) const;
  // Indices of micro-batch `micro` (of size micro_size) of `rank` among `world` ranks.
  std::vector<size_t> micro_batch(size_t epoch, size_t step, int rank, int world, int micro,
                                  int micro_size) const;

 private:
  std::vector<size_t> order(size_t epoch) const;
  size_t n_;
  size_t global_batch_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace shardlm

// Micro-batch assembly: examples padded to the longest one, row-major, padding without loss.
#include <algorithm>

#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace {

const Example& example_at(const std::vector<Example>& data, size_t index) {
  SHARDLM_CHECK(index < data.size(), "batch: example index ", index, " is out of range (",
                data.size(), " examples)");
  return data[index];
}

}  // namespace

MicroBatch make_micro_batch(const std::vector<Example>& data, const std::vector<size_t>& indices,
                            int32_t pad_id, int length_multiple, int max_seq) {
  SHARDLM_CHECK(length_multiple >= 1, "batch: length multiple ", length_multiple, " must be >= 1");
  MicroBatch mb;
  size_t longest = 0;
  for (size_t index : indices) longest = std::max(longest, example_at(data, index).tokens.size());
  // Up to the next multiple, within max_seq, never below the longest example.
  const size_t m = static_cast<size_t>(length_multiple);
  size_t rounded = (longest + m - 1) / m * m;
  if (max_seq > 0) rounded = std::min(rounded, static_cast<size_t>(max_seq));
  longest = std::max(longest, rounded);
  mb.batch = static_cast<int>(indices.size());
  mb.seq = static_cast<int>(longest);
  mb.tokens.assign(indices.size() * longest, pad_id);
  mb.targets.assign(indices.size() * longest, -1);
  for (size_t row = 0; row < indices.size(); ++row) {
    const Example& ex = data[indices[row]];
    SHARDLM_CHECK(ex.targets.size() == ex.tokens.size(), "batch: example ", indices[row], " has ",
                  ex.tokens.size(), " tokens but ", ex.targets.size(), " targets");
    std::copy(ex.tokens.begin(), ex.tokens.end(), mb.tokens.begin() + row * longest);
    std::copy(ex.targets.begin(), ex.targets.end(), mb.targets.begin() + row * longest);
    for (int32_t target : ex.targets) mb.target_count += target >= 0 ? 1 : 0;
  }
  return mb;
}

int64_t count_targets(const std::vector<Example>& data, const std::vector<size_t>& indices) {
  int64_t count = 0;
  for (size_t index : indices) {
    for (int32_t target : example_at(data, index).targets) count += target >= 0 ? 1 : 0;
  }
  return count;
}

}  // namespace shardlm

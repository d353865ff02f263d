// Micro-batch assembly: examples padded to the longest row, row-major, padding without loss; and
// sequence packing: examples end to end in rows (first-fit decreasing), dealt out to the ranks.
#include <algorithm>
#include <numeric>

#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace {

const Example& example_at(const std::vector<Example>& data, size_t index) {
  SHARDLM_CHECK(index < data.size(), "batch: example index ", index, " is out of range (",
                data.size(), " examples)");
  const Example& ex = data[index];
  SHARDLM_CHECK(ex.targets.size() == ex.tokens.size(), "batch: example ", index, " has ", ex.tokens.size(),
                " tokens but ", ex.targets.size(), " targets");
  return ex;
}

size_t row_length(const std::vector<Example>& data, const PackedRow& row) {
  size_t n = 0;
  for (size_t index : row) n += example_at(data, index).tokens.size();
  return n;
}

// Rows of examples end to end, each padded to the longest row rounded up to a multiple of
// `length_multiple` (within max_seq, never below the longest); `starts` only when `packed`.
MicroBatch build_micro_batch(const std::vector<Example>& data, const std::vector<PackedRow>& rows, int32_t pad_id,
                             int length_multiple, int max_seq, bool packed) {
  SHARDLM_CHECK(length_multiple >= 1, "batch: length multiple ", length_multiple, " must be >= 1");
  MicroBatch mb;
  size_t longest = 0;
  for (const PackedRow& row : rows) longest = std::max(longest, row_length(data, row));
  const size_t m = static_cast<size_t>(length_multiple);
  size_t rounded = (longest + m - 1) / m * m;
  if (max_seq > 0) rounded = std::min(rounded, static_cast<size_t>(max_seq));
  longest = std::max(longest, rounded);
  mb.batch = static_cast<int>(rows.size());
  mb.seq = static_cast<int>(longest);
  mb.tokens.assign(rows.size() * longest, pad_id);
  mb.targets.assign(rows.size() * longest, -1);
  if (packed) mb.starts.assign(rows.size() * longest, 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t base = r * longest;
    size_t at = 0;
    for (size_t index : rows[r]) {
      const Example& ex = data[index];
      std::copy(ex.tokens.begin(), ex.tokens.end(), mb.tokens.begin() + base + at);
      std::copy(ex.targets.begin(), ex.targets.end(), mb.targets.begin() + base + at);
      if (packed) std::fill_n(mb.starts.begin() + base + at, ex.tokens.size(), static_cast<int32_t>(at));
      for (int32_t target : ex.targets) mb.target_count += target >= 0 ? 1 : 0;
      at += ex.tokens.size();
    }
    if (packed) std::fill(mb.starts.begin() + base + at, mb.starts.begin() + base + longest, static_cast<int32_t>(at));
  }
  return mb;
}

}  // namespace

MicroBatch make_micro_batch(const std::vector<Example>& data, const std::vector<size_t>& indices,
                            int32_t pad_id, int length_multiple, int max_seq) {
  std::vector<PackedRow> rows;
  rows.reserve(indices.size());
  for (size_t index : indices) rows.push_back({index});
  return build_micro_batch(data, rows, pad_id, length_multiple, max_seq, false);
}

MicroBatch make_packed_micro_batch(const std::vector<Example>& data, const std::vector<PackedRow>& rows,
                                   int32_t pad_id, int length_multiple, int max_seq) {
  return build_micro_batch(data, rows, pad_id, length_multiple, max_seq, true);
}

int64_t count_targets(const std::vector<Example>& data, const std::vector<size_t>& indices) {
  int64_t count = 0;
  for (size_t index : indices) {
    for (int32_t target : example_at(data, index).targets) count += target >= 0 ? 1 : 0;
  }
  return count;
}

std::vector<PackedRow> pack_rows(const std::vector<Example>& data, const std::vector<size_t>& indices, int capacity) {
  SHARDLM_CHECK(capacity >= 1, "pack_rows: capacity ", capacity, " must be >= 1");
  std::vector<size_t> order(indices.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto length = [&](size_t i) { return example_at(data, indices[i]).tokens.size(); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return length(a) > length(b); });
  std::vector<PackedRow> rows;
  std::vector<size_t> free;  // room left in each row
  for (size_t i : order) {
    const size_t n = length(i);
    SHARDLM_CHECK(n <= static_cast<size_t>(capacity), "pack_rows: example ", indices[i], " has ", n,
                  " tokens, more than a row's ", capacity);
    size_t r = 0;
    while (r < rows.size() && free[r] < n) ++r;
    if (r == rows.size()) rows.emplace_back(), free.push_back(static_cast<size_t>(capacity));
    rows[r].push_back(indices[i]);
    free[r] -= n;
  }
  return rows;
}

PackedStep pack_step(const std::vector<Example>& data, const std::vector<size_t>& global, int capacity, int world,
                     int rows_per_micro) {
  SHARDLM_CHECK(world >= 1 && rows_per_micro >= 1, "pack_step: world ", world, " and rows per micro-batch ",
                rows_per_micro, " must be >= 1");
  PackedStep step;
  step.rows = pack_rows(data, global, capacity);
  const size_t per_micro_step = static_cast<size_t>(world) * rows_per_micro;
  step.micro_steps = static_cast<int>((step.rows.size() + per_micro_step - 1) / per_micro_step);
  return step;
}

std::vector<PackedRow> PackedStep::micro_batch(int m, int rank, int world, int rows_per_micro) const {
  const size_t first = (static_cast<size_t>(m) * world + rank) * rows_per_micro;
  std::vector<PackedRow> out;
  for (size_t r = first; r < first + static_cast<size_t>(rows_per_micro) && r < rows.size(); ++r)
    out.push_back(rows[r]);
  return out;
}

}  // namespace shardlm

// Seeded portable permutations, the loaders' subset rule, and the DistributedSampler that cuts
// epochs into global batches and global batches into per-rank micro-batches.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <random>
#include <utility>

#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace {

// Uniform draw in [0, bound) without modulo bias: reject the lowest 2^64 mod bound values
// so the rest divides evenly (std::uniform_int_distribution differs between libraries).
uint64_t draw_below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

// Odd multiplier that spreads consecutive epochs over unrelated generator seeds.
constexpr uint64_t kEpochStride = 0x9E3779B97F4A7C15ULL;

}  // namespace

std::vector<size_t> seeded_permutation(size_t n, uint64_t seed) {
  std::vector<size_t> perm(n);
  for (size_t i = 0; i < n; ++i) perm[i] = i;
  std::mt19937_64 rng(seed);
  for (size_t i = n; i > 1; --i) {
    const size_t j = static_cast<size_t>(draw_below(rng, i));
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

std::vector<size_t> subset_indices(size_t n, const DatasetOptions& opt) {
  const size_t kept = opt.limit == 0 ? n : std::min(opt.limit, n);
  std::vector<size_t> chosen(kept);
  if (opt.shuffle_subset && kept < n) {
    const std::vector<size_t> perm = seeded_permutation(n, opt.seed);
    std::copy(perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(kept), chosen.begin());
    // File order keeps the subset readable; prefixes of one permutation make subsets nested.
    std::sort(chosen.begin(), chosen.end());
  } else {
    for (size_t i = 0; i < kept; ++i) chosen[i] = i;
  }
  return chosen;
}

DatasetOptions dataset_options(const DataSection& data, size_t limit, uint64_t seed) {
  DatasetOptions opt;
  opt.max_length = data.max_length;
  opt.limit = limit;
  opt.seed = seed;
  opt.shuffle_subset = limit > 0;
  return opt;
}

std::vector<Example> select_subset(std::vector<Example> all, const DatasetOptions& opt) {
  if (opt.limit == 0 || opt.limit >= all.size()) return all;
  std::vector<Example> subset;
  subset.reserve(opt.limit);
  for (size_t index : subset_indices(all.size(), opt)) subset.push_back(std::move(all[index]));
  return subset;
}

DistributedSampler::DistributedSampler(size_t dataset_size, size_t global_batch, uint64_t seed,
                                       bool shuffle)
    : n_(dataset_size), global_batch_(global_batch), seed_(seed), shuffle_(shuffle) {
  SHARDLM_CHECK(global_batch_ > 0, "sampler: global batch size must be positive");
  // A dataset smaller than one global batch would give epochs with no step at all.
  SHARDLM_CHECK(n_ >= global_batch_, "sampler: dataset of ", n_,
                " examples is smaller than one global batch of ", global_batch_);
}

size_t DistributedSampler::steps_per_epoch() const { return n_ / global_batch_; }

std::shared_ptr<const DistributedSampler::EpochOrder> DistributedSampler::order(size_t epoch) const {
  std::shared_ptr<const EpochOrder> last = std::atomic_load(&last_order_);
  if (last && last->epoch == epoch) return last;
  auto made = std::make_shared<EpochOrder>();
  made->epoch = epoch;
  if (shuffle_) {
    made->indices = seeded_permutation(n_, seed_ + static_cast<uint64_t>(epoch) * kEpochStride);
  } else {
    made->indices.resize(n_);
    for (size_t i = 0; i < n_; ++i) made->indices[i] = i;
  }
  std::shared_ptr<const EpochOrder> result = std::move(made);
  std::atomic_store(&last_order_, result);
  return result;
}

std::vector<size_t> DistributedSampler::global_batch(size_t epoch, size_t step) const {
  SHARDLM_CHECK(step < steps_per_epoch(), "sampler: step ", step, " is out of range (",
                steps_per_epoch(), " steps per epoch)");
  const std::shared_ptr<const EpochOrder> order_of_epoch = order(epoch);
  const std::vector<size_t>& all = order_of_epoch->indices;
  const auto first = all.begin() + static_cast<std::ptrdiff_t>(step * global_batch_);
  return std::vector<size_t>(first, first + static_cast<std::ptrdiff_t>(global_batch_));
}

std::vector<size_t> DistributedSampler::micro_batch(size_t epoch, size_t step, int rank, int world,
                                                    int micro, int micro_size) const {
  SHARDLM_CHECK(world > 0 && rank >= 0 && rank < world, "sampler: rank ", rank,
                " is out of range for world size ", world);
  SHARDLM_CHECK(micro_size > 0, "sampler: micro-batch size must be positive, got ", micro_size);
  const size_t per_step = static_cast<size_t>(world) * static_cast<size_t>(micro_size);
  SHARDLM_CHECK(global_batch_ % per_step == 0, "sampler: global batch ", global_batch_,
                " is not divisible by world size ", world, " x micro-batch size ", micro_size);
  const size_t piece = global_batch_ / static_cast<size_t>(world);
  const size_t micros = piece / static_cast<size_t>(micro_size);
  SHARDLM_CHECK(micro >= 0 && static_cast<size_t>(micro) < micros, "sampler: micro-batch ", micro,
                " is out of range (", micros, " per rank and step)");
  const std::vector<size_t> batch = global_batch(epoch, step);
  // Rank r owns the r-th contiguous piece; its micro-batches are consecutive slices of it.
  const size_t begin = static_cast<size_t>(rank) * piece +
                       static_cast<size_t>(micro) * static_cast<size_t>(micro_size);
  return std::vector<size_t>(
      batch.begin() + static_cast<std::ptrdiff_t>(begin),
      batch.begin() + static_cast<std::ptrdiff_t>(begin + static_cast<size_t>(micro_size)));
}

}  // namespace shardlm

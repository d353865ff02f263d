// A backend's token-row primitives (Backend::rows_*: the embedding's part of the root's reduction)
// against a plain host reference: ids with repeats and ids outside the table (row 0), packing in each
// dtype, each id's slot (its row's first occurrence), adding back into a slice that starts inside a row and ends
// inside another, zeroing the rows.
// Shared by test_token_rows (CPU backend) and test_cuda_kernels (CUDA backend).
#pragma once

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/device.hpp"

namespace shardlm::token_rows_test {

template <typename T>
DeviceArray upload(Backend& be, const std::vector<T>& host) {
  DeviceArray a = be.allocate(host.size() * sizeof(T), MemKind::Other);
  be.copy(a.data(), host.data(), a.bytes(), CopyKind::HostToDevice, be.compute_stream());
  return a;
}
template <typename T>
std::vector<T> download(Backend& be, const DeviceArray& a, size_t n) {
  std::vector<T> host(n);
  be.copy(host.data(), a.data(), n * sizeof(T), CopyKind::DeviceToHost, be.compute_stream());
  be.synchronize(be.compute_stream());
  return host;
}

inline void check_token_rows(Backend& be, DType dt) {
  const size_t rows = 20, width = 7, m = 50;
  const Stream s = be.compute_stream();
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> id(-3, static_cast<int32_t>(rows) + 2);
  std::uniform_real_distribution<float> value(-2.f, 2.f);
  std::vector<int32_t> ids(m);
  for (int32_t& x : ids) x = id(rng);
  ids[7] = ids[3];  // a repeat at least
  std::vector<float> table(rows * width);
  for (float& x : table) x = value(rng);
  auto row_of = [&](int32_t v) { return v >= 0 && static_cast<size_t>(v) < rows ? static_cast<size_t>(v) : size_t(0); };
  std::vector<bool> first_k(m, false), seen(rows, false);
  for (size_t k = 0; k < m; ++k)
    if (!seen[row_of(ids[k])]) seen[row_of(ids[k])] = first_k[k] = true;

  DeviceArray d_ids = upload(be, ids), d_table = upload(be, table);
  DeviceArray d_first = be.allocate(rows * sizeof(int32_t), MemKind::Other);
  be.zero(d_first.data(), d_first.bytes(), s);
  be.rows_mark_first(d_ids.as<int32_t>(), m, d_first.as<int32_t>(), rows, s);
  const std::vector<int32_t> first = download<int32_t>(be, d_first, rows);
  for (size_t r = 0; r < rows; ++r) {
    if (!seen[r]) BOOST_TEST(first[r] == 0, "row " << r << " named by no id");
  }
  for (size_t k = 0; k < m; ++k)
    if (first_k[k]) BOOST_TEST(first[row_of(ids[k])] == static_cast<int32_t>(m - k), "first occurrence " << k);

  // Slots: each id's row's first occurrence, for ids in another order (a rank's own tokens among everyone's).
  std::vector<int32_t> own(ids.rbegin(), ids.rend());
  DeviceArray d_own = upload(be, own), d_slots = be.allocate(own.size() * sizeof(int32_t), MemKind::Other);
  be.rows_slots(d_own.as<int32_t>(), own.size(), d_first.as<int32_t>(), m, rows, d_slots.as<int32_t>(), s);
  const std::vector<int32_t> slots = download<int32_t>(be, d_slots, own.size());
  for (size_t i = 0; i < own.size(); ++i) {
    size_t k = 0;
    while (row_of(ids[k]) != row_of(own[i])) ++k;
    BOOST_TEST(slots[i] == static_cast<int32_t>(k), "slot of id " << own[i] << " at " << i);
  }

  // Pack: first occurrences carry their row (rounded to dt), the others zeros.
  DeviceArray d_packed = be.allocate(m * width * dtype_size(dt), MemKind::Other);
  be.rows_pack(d_table.as<float>(), width, d_ids.as<int32_t>(), d_first.as<int32_t>(), m, rows, d_packed.data(), dt, s);
  std::vector<float> packed(m * width);
  DeviceArray d_packed32 = be.allocate(m * width * sizeof(float), MemKind::Other);
  be.cast(d_packed.data(), dt, d_packed32.data(), DType::F32, m * width, s);
  packed = download<float>(be, d_packed32, m * width);
  for (size_t k = 0; k < m; ++k)
    for (size_t c = 0; c < width; ++c) {
      const float want = first_k[k] ? round_to(dt, table[row_of(ids[k]) * width + c]) : 0.0f;
      BOOST_TEST(packed[k * width + c] == want, "packed row " << k << " column " << c);
    }

  // Unpack into a slice holding table elements [25, 85): it starts inside row 3 and ends inside row 12.
  const long long pos = -25;
  const size_t count = 60;
  std::vector<float> slice(count);
  for (float& x : slice) x = value(rng);
  std::vector<double> want(slice.begin(), slice.end());
  for (size_t k = 0; k < m; ++k) {
    if (!first_k[k]) continue;
    for (size_t c = 0; c < width; ++c) {
      const long long i = pos + static_cast<long long>(row_of(ids[k]) * width + c);
      if (i >= 0 && i < static_cast<long long>(count)) want[static_cast<size_t>(i)] += packed[k * width + c];
    }
  }
  DeviceArray d_slice = upload(be, slice);
  be.rows_unpack_add(d_packed.data(), dt, width, d_ids.as<int32_t>(), d_first.as<int32_t>(), m, rows,
                     d_slice.as<float>(), pos, count, s);
  const std::vector<float> got = download<float>(be, d_slice, count);
  for (size_t i = 0; i < count; ++i)
    BOOST_TEST(std::abs(got[i] - want[i]) <= 1e-6 * (1.0 + std::abs(want[i])), "slice element " << i);

  // Squares of the slice's table elements: the named rows', the others', and the two adding up to the slice's
  // own sum (the slice lies inside the table). A second slice starting before the table (pos > 0) leaves its
  // first elements out of both.
  double named_want = 0, others_want = 0;
  for (size_t i = 0; i < count; ++i) {
    const size_t row = static_cast<size_t>(static_cast<long long>(i) - pos) / width;
    (seen[row] ? named_want : others_want) += static_cast<double>(got[i]) * got[i];
  }
  DeviceArray d_sum = be.allocate(2 * sizeof(double), MemKind::Other);
  be.zero(d_sum.data(), d_sum.bytes(), s);
  double* sums = d_sum.as<double>();
  be.rows_sum_squares(width, d_ids.as<int32_t>(), d_first.as<int32_t>(), m, rows, d_slice.as<float>(), pos, count,
                      true, sums, s);
  be.rows_sum_squares(width, d_ids.as<int32_t>(), d_first.as<int32_t>(), m, rows, d_slice.as<float>(), pos, count,
                      false, sums + 1, s);
  std::vector<double> sq = download<double>(be, d_sum, 2);
  BOOST_TEST(named_want > 0);
  BOOST_TEST(others_want > 0);
  BOOST_TEST(std::abs(sq[0] - named_want) <= 1e-6 * named_want, "named rows' squares " << sq[0] << " vs " << named_want);
  BOOST_TEST(std::abs(sq[1] - others_want) <= 1e-6 * others_want, "other rows' squares " << sq[1] << " vs " << others_want);
  // A slice of 3 elements before the table and its first 40 (rows 0 to 5): only those 40 counted.
  std::vector<float> before(43);
  for (float& x : before) x = value(rng);
  DeviceArray d_before = upload(be, before);
  double before_named = 0, before_others = 0;
  for (size_t i = 3; i < before.size(); ++i) (seen[(i - 3) / width] ? before_named : before_others) += double(before[i]) * before[i];
  be.zero(d_sum.data(), d_sum.bytes(), s);
  be.rows_sum_squares(width, d_ids.as<int32_t>(), d_first.as<int32_t>(), m, rows, d_before.as<float>(), 3, before.size(),
                      true, sums, s);
  be.rows_sum_squares(width, d_ids.as<int32_t>(), d_first.as<int32_t>(), m, rows, d_before.as<float>(), 3, before.size(),
                      false, sums + 1, s);
  sq = download<double>(be, d_sum, 2);
  BOOST_TEST(std::abs(sq[0] - before_named) <= 1e-6 * (1 + before_named), "named rows' squares (slice before the table)");
  BOOST_TEST(std::abs(sq[1] - before_others) <= 1e-6 * (1 + before_others), "other rows' squares (slice before the table)");

  // Zero: every named row, nothing else.
  be.rows_zero(d_table.as<float>(), width, d_ids.as<int32_t>(), m, rows, s);
  const std::vector<float> zeroed = download<float>(be, d_table, rows * width);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < width; ++c)
      BOOST_TEST(zeroed[r * width + c] == (seen[r] ? 0.0f : table[r * width + c]), "row " << r << " column " << c);
}

}  // namespace shardlm::token_rows_test

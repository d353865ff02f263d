// The backend-neutral part of the collective benchmark: collective names, nccl-tests' size and
// bus-bandwidth conventions, the size sweep, and the data pattern its check runs verify.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "shardlm/dist.hpp"

namespace shardlm {

namespace {

// A modulus that keeps the all_gather/broadcast pattern below 256, exact in every dtype.
constexpr size_t kGatherModulus = 251;

// Largest integer up to which every integer is exact in the dtype (partial sums stay exact below it).
double exact_integer_limit(DType t) {
  switch (t) {
    case DType::F32: return 16777216.0;  // 2^24
    case DType::BF16: return 256.0;      // 2^8
    case DType::F16: return 2048.0;      // 2^11
  }
  return 0;
}

// Unit roundoff of the dtype, for the tolerance of sums too large to be exact.
double unit_roundoff(DType t) {
  switch (t) {
    case DType::F32: return std::ldexp(1.0, -24);
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F16: return std::ldexp(1.0, -11);
  }
  return 0;
}

bool is_reduction(Collective c) { return c == Collective::AllReduce || c == Collective::ReduceScatter; }

void store(DType t, void* dst, size_t i, float v) {
  if (t == DType::F32)
    static_cast<float*>(dst)[i] = v;
  else
    static_cast<uint16_t*>(dst)[i] = t == DType::BF16 ? float_to_bf16(v) : float_to_fp16(v);
}

float load(DType t, const void* src, size_t i) {
  if (t == DType::F32) return static_cast<const float*>(src)[i];
  const uint16_t h = static_cast<const uint16_t*>(src)[i];
  return t == DType::BF16 ? bf16_to_float(h) : fp16_to_float(h);
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllReduce: return "all_reduce";
    case Collective::Broadcast: return "broadcast";
  }
  return "?";
}

Collective parse_collective(const std::string& name) {
  std::string key;
  for (char ch : name)
    if (ch != '_' && ch != '-') key += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (Collective c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce, Collective::Broadcast}) {
    std::string canonical;
    for (const char* p = collective_name(c); *p; ++p)
      if (*p != '_') canonical += *p;
    if (key == canonical) return c;
  }
  throw Error(concat("unknown collective '", name, "' (expected all_gather, reduce_scatter, all_reduce or broadcast)"));
}

double bus_bandwidth_factor(Collective c, int ranks) {
  const double n = ranks;
  switch (c) {
    case Collective::AllReduce: return 2.0 * (n - 1) / n;
    case Collective::AllGather:
    case Collective::ReduceScatter: return (n - 1) / n;
    case Collective::Broadcast: return 1.0;
  }
  return 0;
}

CollectiveShape collective_shape(Collective c, size_t nominal_bytes, int ranks, DType dtype) {
  const size_t word = dtype_size(dtype);
  CollectiveShape s;
  if (c == Collective::AllGather || c == Collective::ReduceScatter) {
    s.piece = nominal_bytes / (word * static_cast<size_t>(ranks));
    s.count = s.piece * static_cast<size_t>(ranks);
  } else {
    s.piece = nominal_bytes / word;
    s.count = s.piece;
  }
  s.bytes = s.count * word;
  return s;
}

std::vector<size_t> sweep_sizes(size_t min_bytes, size_t max_bytes, int factor) {
  SHARDLM_CHECK(min_bytes >= 1 && min_bytes <= max_bytes && factor >= 2, "bad size sweep: ", min_bytes, " to ",
                max_bytes, " by x", factor);
  std::vector<size_t> sizes;
  for (size_t s = min_bytes; s <= max_bytes; s *= static_cast<size_t>(factor)) {
    sizes.push_back(s);
    if (s > max_bytes / static_cast<size_t>(factor)) break;  // the next one would pass max (or overflow)
  }
  return sizes;
}

void fill_collective_input(Collective c, DType dtype, int rank, int ranks, int root, size_t offset, void* dst,
                           size_t n) {
  if (is_reduction(c)) {
    // Rank r sends (g + r) mod (n + 1) at element g. Over r < n these residues are all of 0..n but
    // (g + n) mod (n + 1), so the sum depends on g: n(n+1)/2 minus that one.
    // Running residue instead of a division per element: the fill of 1 GiB stays fast.
    const size_t m = static_cast<size_t>(ranks) + 1;
    size_t v = (offset + static_cast<size_t>(rank)) % m;
    for (size_t i = 0; i < n; ++i) {
      store(dtype, dst, i, static_cast<float>(v));
      if (++v == m) v = 0;
    }
    return;
  }
  if (c == Collective::Broadcast && rank != root) {
    for (size_t i = 0; i < n; ++i) store(dtype, dst, i, -1.0f);  // must be overwritten by the root's data
    return;
  }
  const int source = c == Collective::Broadcast ? root : rank;
  size_t v = (offset + static_cast<size_t>(source) * 7) % kGatherModulus;
  for (size_t i = 0; i < n; ++i) {
    store(dtype, dst, i, static_cast<float>(v));
    if (++v == kGatherModulus) v = 0;
  }
}

size_t count_collective_wrong(Collective c, DType dtype, int rank, int ranks, int root, size_t piece, size_t offset,
                              const void* got, size_t n) {
  size_t wrong = 0;
  if (is_reduction(c)) {
    // Exact while the whole sum fits the dtype's integers; beyond, within n unit roundoffs.
    const double top = static_cast<double>(ranks) * (ranks + 1) / 2;
    const double rel = top <= exact_integer_limit(dtype) ? 0.0 : ranks * unit_roundoff(dtype);
    const size_t first = c == Collective::ReduceScatter ? static_cast<size_t>(rank) * piece + offset : offset;
    const size_t m = static_cast<size_t>(ranks) + 1;
    size_t missing = (first + static_cast<size_t>(ranks)) % m;  // running: the residue no rank sent
    for (size_t i = 0; i < n; ++i) {
      const double want = top - static_cast<double>(missing);
      if (!(std::fabs(load(dtype, got, i) - want) <= rel * want)) ++wrong;
      if (++missing == m) missing = 0;
    }
    return wrong;
  }
  // all_gather: element g came from rank g / piece, at its index g % piece; broadcast: from the root.
  size_t source = c == Collective::AllGather ? offset / piece : static_cast<size_t>(root);
  size_t index = c == Collective::AllGather ? offset % piece : offset;
  size_t v = (index + source * 7) % kGatherModulus;
  for (size_t i = 0; i < n; ++i) {
    if (!(load(dtype, got, i) == static_cast<float>(v))) ++wrong;
    if (++v == kGatherModulus) v = 0;
    if (c == Collective::AllGather && ++index == piece) {
      index = 0;
      ++source;
      v = (source * 7) % kGatherModulus;
    }
  }
  return wrong;
}

CollectiveCheckLayout collective_check_layout(Collective c, const CollectiveShape& shape) {
  const bool gather = c == Collective::AllGather;
  const bool scatter = c == Collective::ReduceScatter;
  CollectiveCheckLayout l;
  l.input_is_piece = gather;
  l.output_is_piece = scatter;
  l.in_place = !gather && !scatter;
  l.in_count = gather ? shape.piece : shape.count;
  l.out_count = scatter ? shape.piece : shape.count;
  return l;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  if (values.size() % 2) return values[mid];
  const double upper = values[mid];
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2;
}

size_t collective_bench_buffer_bytes(size_t max_bytes, int ranks) {
  // One buffer of the largest size and one of a rank's piece of it (all_gather's input, reduce_scatter's output).
  return max_bytes + (max_bytes + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
}

}  // namespace shardlm

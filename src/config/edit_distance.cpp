// Levenshtein distance and the "did you mean" lookup of the nearest valid deck key.
#include <algorithm>
#include <numeric>

#include "config_internal.hpp"

namespace shardlm {

size_t edit_distance(const std::string& a, const std::string& b) {
  // Two rows of the classic dynamic programme: row[j] = distance(a[0..i), b[0..j)).
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  std::iota(prev.begin(), prev.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace config_detail {

static std::string after_dot(const std::string& s) {
  size_t dot = s.rfind('.');
  return dot == std::string::npos ? s : s.substr(dot + 1);
}

std::string nearest_key(const std::string& unknown) {
  const auto& keys = key_table();
  std::string best;
  size_t best_d = std::string::npos;
  for (const KeySpec& k : keys) {  // ties keep the first key in table order: deterministic hints
    size_t d = edit_distance(unknown, k.name);
    if (d < best_d) best_d = d, best = k.name;
  }
  if (best_d <= std::max<size_t>(2, unknown.size() / 3)) return best;

  // A right key in the wrong (or no) section, e.g. "lr" before any [train]: match the key part
  // exactly, but only when one section has it, so the hint is never a guess between sections.
  std::string tail = after_dot(unknown), match;
  for (const KeySpec& k : keys) {
    if (after_dot(k.name) != tail) continue;
    if (!match.empty()) return "";
    match = k.name;
  }
  return match;
}

}  // namespace config_detail
}  // namespace shardlm

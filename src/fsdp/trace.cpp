// The step timeline's summary and its Chrome trace-event JSON (run.trace_step; FsdpEngine::trace_begin).
#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>
#include <utility>

#include "shardlm/fsdp.hpp"

namespace shardlm {
namespace {

using Intervals = std::vector<std::pair<double, double>>;

// The spans of the given lanes merged into disjoint intervals, in order.
Intervals merged(const StepTrace& t, std::initializer_list<const char*> lanes) {
  Intervals v;
  for (const TraceSpan& s : t.spans)
    for (const char* lane : lanes)
      if (s.lane == lane && s.end_ms > s.begin_ms) v.emplace_back(s.begin_ms, s.end_ms);
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& iv : v) {
    if (!out.empty() && iv.first <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else
      out.push_back(iv);
  }
  return out;
}

double length(const Intervals& v) {
  double total = 0;
  for (const auto& iv : v) total += iv.second - iv.first;
  return total;
}

// Length of the intersection of two sets of disjoint, ordered intervals.
double overlap(const Intervals& a, const Intervals& b) {
  double total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) total += hi - lo;
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return total;
}

}  // namespace

TraceSummary summarize_trace(const StepTrace& t) {
  const Intervals compute = merged(t, {"compute"}), comm = merged(t, {"comm", "replicate", "gather"});
  TraceSummary r;
  r.step_ms = t.step_ms;
  r.compute_ms = length(compute);
  r.comm_ms = length(comm);
  r.overlap_ms = overlap(compute, comm);
  r.exposed_comm_ms = r.comm_ms - r.overlap_ms;
  r.compute_idle_ms = std::max(0.0, r.step_ms - r.compute_ms);
  r.host_ms = length(merged(t, {"host"}));
  r.copy_ms = length(merged(t, {"down", "up"}));
  for (const TraceSpan& s : t.spans) {
    if (s.lane != "comm" && s.lane != "replicate" && s.lane != "gather") continue;
    (s.name.rfind("all-gather", 0) == 0 ? r.gather_ms : r.reduce_ms) += s.end_ms - s.begin_ms;
  }
  return r;
}

std::string trace_json(const StepTrace& t, int rank) {
  nlohmann::json events = nlohmann::json::array();
  // One thread per lane the step used, in kTraceLanes' order.
  const int lanes = static_cast<int>(std::size(kTraceLanes));
  auto tid_of = [&](const std::string& lane) {
    return static_cast<int>(std::find(kTraceLanes, kTraceLanes + lanes, lane) - kTraceLanes);
  };
  for (int i = 0; i < lanes; ++i) {
    const bool used = std::any_of(t.spans.begin(), t.spans.end(), [&](const TraceSpan& s) { return tid_of(s.lane) == i; });
    if (used)
      events.push_back(
          {{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", i}, {"args", {{"name", kTraceLanes[i]}}}});
  }
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", concat("rank ", rank)}}}});
  for (const TraceSpan& s : t.spans) {
    events.push_back({{"name", s.name}, {"ph", "X"}, {"pid", rank}, {"tid", tid_of(s.lane)},
                      {"ts", s.begin_ms * 1000.0}, {"dur", std::max(0.0, s.end_ms - s.begin_ms) * 1000.0}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace shardlm

// StepTracer: the step timeline's marks and their times (FsdpEngine::trace_begin .. trace_end).
#include "step_trace.hpp"

#include <algorithm>

namespace shardlm {

void StepTracer::begin() {
  marks_.clear();
  origin_ = be_.make_timing_event();
  const Stream compute = streams_[static_cast<int>(Lane::Compute)];
  origin_->record(compute);
  be_.synchronize(compute);  // the origin is reached now: the host lane's clock starts with it
  host_origin_ = std::chrono::steady_clock::now();
  tracing_ = true;
}

StepTrace StepTracer::end(const std::vector<Stream>& others) {
  const Stream compute = streams_[static_cast<int>(Lane::Compute)];
  tracing_ = false;
  std::unique_ptr<BackendEvent> joined = be_.make_event();
  for (Stream s : others) {
    joined->record(s);
    joined->wait_on(compute);
  }
  std::unique_ptr<BackendEvent> end = be_.make_timing_event();
  end->record(compute);
  be_.synchronize(compute);
  StepTrace t;
  t.step_ms = be_.elapsed_ms(*origin_, *end);
  for (Mark& k : marks_) {
    if (k.lane == Lane::Host)
      t.spans.push_back({k.name, lane_name(k.lane), k.host_begin_ms, std::min(k.host_end_ms, t.step_ms)});
    else
      t.spans.push_back({k.name, lane_name(k.lane), be_.elapsed_ms(*origin_, *k.begin), be_.elapsed_ms(*origin_, *k.end)});
  }
  marks_.clear();
  origin_.reset();
  return t;
}

int StepTracer::mark_begin(const char* what, long unit, Lane lane) {
  if (!tracing_) return -1;
  Mark m;
  m.name = unit >= 0 ? concat(what, " ", unit) : std::string(what);
  m.lane = lane;
  if (lane == Lane::Host) {
    m.host_begin_ms = host_ms();
  } else {
    m.begin = be_.make_timing_event();
    m.end = be_.make_timing_event();
    m.begin->record(lane_stream(lane));
  }
  std::lock_guard<std::mutex> lock(marks_mutex_);
  marks_.push_back(std::move(m));
  return static_cast<int>(marks_.size()) - 1;
}

void StepTracer::mark_end(int i) {
  if (i < 0) return;
  std::lock_guard<std::mutex> lock(marks_mutex_);
  Mark& m = marks_[static_cast<size_t>(i)];
  if (m.lane == Lane::Host) m.host_end_ms = host_ms();
  else m.end->record(lane_stream(m.lane));
}

}  // namespace shardlm

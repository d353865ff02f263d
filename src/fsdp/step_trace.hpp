// StepTracer: the step timeline's spans as the schedule opens and closes them (trace_begin ..
// trace_end), one lane per stream and one for offload's host worker.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>

#include "shardlm/fsdp.hpp"

namespace shardlm {

class StepTracer {
 public:
  enum class Lane { Compute, Comm, Down, Up, Host, Replicate, Gather };  // kTraceLanes' order

  StepTracer(Backend& be, Stream compute, Stream comm) : be_(be) {
    streams_[static_cast<int>(Lane::Compute)] = compute;
    streams_[static_cast<int>(Lane::Comm)] = comm;
  }
  // CPU offload's copy streams (the Down and Up lanes).
  void set_copy_streams(Stream down, Stream up) {
    streams_[static_cast<int>(Lane::Down)] = down;
    streams_[static_cast<int>(Lane::Up)] = up;
  }
  // The replicate group's own stream (the Replicate lane).
  void set_replicate_stream(Stream s) { streams_[static_cast<int>(Lane::Replicate)] = s; }
  // The all-gathers' own stream (the Gather lane).
  void set_gather_stream(Stream s) { streams_[static_cast<int>(Lane::Gather)] = s; }

  // The step starts: its origin recorded on the compute stream, which must be idle.
  void begin();
  // After begin(): the step ends once `others` reach the compute stream; its spans, timed from the origin.
  StepTrace end(const std::vector<Stream>& others);
  bool tracing() const { return tracing_; }

  // Opens a span "what unit" (what alone for unit < 0) on a lane, returns its index (or -1 when not
  // tracing).
  int mark_begin(const char* what, long unit, Lane lane);
  void mark_end(int i);

 private:
  // A span's two timing events, recorded on its stream, or on the host lane (offload's worker) its two
  // times on the host's clock from begin(). The worker opens and closes spans too: `marks_` is guarded
  // by marks_mutex_.
  struct Mark {
    std::string name;
    Lane lane = Lane::Compute;
    std::unique_ptr<BackendEvent> begin, end;
    double host_begin_ms = 0, host_end_ms = 0;
  };
  static const char* lane_name(Lane l) { return kTraceLanes[static_cast<int>(l)]; }
  Stream lane_stream(Lane l) const { return streams_[static_cast<int>(l == Lane::Host ? Lane::Compute : l)]; }
  double host_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_origin_).count();
  }

  Backend& be_;
  Stream streams_[7] = {};  // per lane (the host's unused)
  std::atomic<bool> tracing_{false};
  std::unique_ptr<BackendEvent> origin_;
  std::chrono::steady_clock::time_point host_origin_;
  std::mutex marks_mutex_;
  std::vector<Mark> marks_;
};

}  // namespace shardlm

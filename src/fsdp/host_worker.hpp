// HostWorker: one host thread that runs tasks in the order they are posted (CPU offload's host side:
// gradient accumulation, AdamW, the copies of updated slices), with tickets to wait for one task.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace shardlm {

class HostWorker {
 public:
  using Ticket = uint64_t;  // task n (1-based, in posting order); 0 names no task

  // `setup` runs first on the worker thread (Backend::bind_thread).
  explicit HostWorker(std::function<void()> setup = nullptr);
  // Runs the tasks still queued (a failed worker skips them), then joins.
  ~HostWorker();
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  Ticket post(std::function<void()> task);
  // The calling thread waits until task `t` and every task before it have run (0: returns at once).
  // Rethrows, on every wait from then on, the exception the first failing task threw; the tasks
  // posted after a failure are skipped.
  void wait(Ticket t);
  void drain() { wait(posted()); }
  Ticket posted() const;
  bool idle() const;  // every posted task has run

 private:
  void loop(std::function<void()> setup);

  mutable std::mutex mutex_;
  std::condition_variable queued_, finished_;
  std::deque<std::function<void()>> tasks_;
  Ticket posted_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace shardlm

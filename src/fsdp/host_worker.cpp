// HostWorker: a FIFO of tasks on one thread, tickets to wait for them, the first error kept.
#include "host_worker.hpp"

#include <utility>

#include "shardlm/core.hpp"

namespace shardlm {

HostWorker::HostWorker(std::function<void()> setup) : thread_([this, s = std::move(setup)] { loop(s); }) {}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  queued_.notify_all();
  thread_.join();
}

HostWorker::Ticket HostWorker::post(std::function<void()> task) {
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    t = ++posted_;
  }
  queued_.notify_one();
  return t;
}

void HostWorker::wait(Ticket t) {
  std::unique_lock<std::mutex> lock(mutex_);
  SHARDLM_CHECK(t <= posted_, "HostWorker::wait: task ", t, " was never posted (", posted_, " so far)");
  finished_.wait(lock, [&] { return done_ >= t; });
  if (error_) std::rethrow_exception(error_);
}

HostWorker::Ticket HostWorker::posted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return posted_;
}

bool HostWorker::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ == posted_;
}

void HostWorker::loop(std::function<void()> setup) {
  if (setup) {
    try {
      setup();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
  }
  for (;;) {
    std::function<void()> task;
    bool failed;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
      failed = static_cast<bool>(error_);
    }
    std::exception_ptr error;
    if (!failed) {
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error && !error_) error_ = error;
      ++done_;
    }
    finished_.notify_all();
  }
}

}  // namespace shardlm

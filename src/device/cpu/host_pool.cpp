#include "host_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace shardlm {
namespace {

class HostPool {
 public:
  ~HostPool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  void run(size_t pieces, int threads, const std::function<void(size_t)>& body) {
    const int helpers = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(1, threads)), pieces)) - 1;
    if (helpers <= 0) {
      for (size_t i = 0; i < pieces; ++i) body(i);
      return;
    }
    std::lock_guard<std::mutex> one_pass(pass_);
    while (static_cast<int>(threads_.size()) < helpers) {
      const int index = static_cast<int>(threads_.size());
      threads_.emplace_back([this, index] { helper(index); });
    }
    {
      std::lock_guard<std::mutex> lock(m_);
      body_ = &body;
      pieces_ = pieces;
      next_ = 0;
      wanted_ = helpers;
      active_ = helpers;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    work();  // the caller's share; it never throws (work() keeps the first exception)
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [&] { return active_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    for (size_t i = next_++; i < pieces_; i = next_++) {
      try {
        (*body_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m_);
        if (!error_) error_ = std::current_exception();
        next_ = pieces_;  // hand out no more pieces
      }
    }
  }

  void helper(int index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= wanted_) continue;  // this pass wants fewer threads
      lock.unlock();
      work();
      lock.lock();
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::mutex pass_;  // one pass at a time
  std::mutex m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(size_t)>* body_ = nullptr;
  size_t pieces_ = 0;
  std::atomic<size_t> next_{0};
  int wanted_ = 0, active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace

void host_parallel_for(size_t pieces, int threads, const std::function<void(size_t)>& body) {
  static HostPool pool;
  pool.run(pieces, threads, body);
}

}  // namespace shardlm

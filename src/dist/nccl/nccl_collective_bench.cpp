// NcclCollectiveBench: ncclAllGather, ncclReduceScatter, ncclAllReduce (in place) and ncclBroadcast
// through NcclCommunicator, back to back on its stream with a CUDA event between iterations.
#include "nccl_collective_bench.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda_check.hpp"

namespace shardlm::cuda {

namespace {

// The check run's pattern goes through host memory in pieces of this size (not a 1 GiB copy).
constexpr size_t kStagingBytes = size_t{64} << 20;

class Events {
 public:
  explicit Events(size_t n) : events_(n) {
    for (cudaEvent_t& e : events_) SHARDLM_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (cudaEvent_t e : events_)
      if (e) cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

// GPU bytes of the bench itself: cudaMalloc'd directly, as dist/ sits below device/ and its
// counted buffers (the bench is not part of a run's memory plan).
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t n) {
    if (n > 0) SHARDLM_CUDA_CHECK(cudaMalloc(&p_, n));
  }
  ~DeviceBytes() {
    if (p_) cudaFree(p_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }

 private:
  void* p_ = nullptr;
};

class NcclCollectiveBench : public CollectiveBench {
 public:
  NcclCollectiveBench(NcclCommunicator& group, size_t max_bytes)
      : group_(group),
        max_bytes_(max_bytes),
        whole_(max_bytes),
        piece_(collective_bench_buffer_bytes(max_bytes, group.size()) - max_bytes) {
    staging_.resize(std::max<size_t>(std::min(max_bytes, kStagingBytes), 8));  // at least one element
  }

  CollectiveTimes run(Collective c, const CollectiveShape& shape, const CollectiveBenchSettings& s) override {
    SHARDLM_CHECK(shape.bytes <= max_bytes_, "comm-test: ", shape.bytes, " bytes exceed the bench's buffers (",
                  max_bytes_, ")");
    auto once = [&] {
      switch (c) {
        case Collective::AllGather: group_.all_gather(piece_.data(), whole_.data(), shape.piece, s.dtype); break;
        case Collective::ReduceScatter:
          group_.reduce_scatter(whole_.data(), piece_.data(), shape.piece, s.dtype, ReduceOp::Sum);
          break;
        case Collective::AllReduce: group_.all_reduce(whole_.data(), shape.piece, s.dtype, ReduceOp::Sum); break;
        case Collective::Broadcast: group_.broadcast(whole_.data(), shape.piece, s.dtype, s.root); break;
      }
    };

    CollectiveTimes out;
    if (s.check) out.wrong = check_run(c, shape, s, once);
    for (int i = 0; i < s.warmup; ++i) once();
    group_.wait();
    // Enqueued back to back with an event between iterations: no host round trip inside the timing.
    const Events events(static_cast<size_t>(s.iters) + 1);
    SHARDLM_CUDA_CHECK(cudaEventRecord(events[0], group_.stream()));
    for (int i = 0; i < s.iters; ++i) {
      once();
      SHARDLM_CUDA_CHECK(cudaEventRecord(events[static_cast<size_t>(i) + 1], group_.stream()));
    }
    group_.wait();
    out.iteration_us.reserve(static_cast<size_t>(s.iters));
    for (int i = 0; i < s.iters; ++i) {
      float ms = 0;
      SHARDLM_CUDA_CHECK(cudaEventElapsedTime(&ms, events[static_cast<size_t>(i)], events[static_cast<size_t>(i) + 1]));
      out.iteration_us.push_back(static_cast<double>(ms) * 1e3);
      if (s.progress) s.progress(i + 1, s.iters);
    }
    return out;
  }

 private:
  // Fills the input with the pattern (the output with NaN bits) chunk by chunk through the host,
  // runs once, and counts the wrong elements of the output, again chunk by chunk.
  template <typename Once>
  size_t check_run(Collective c, const CollectiveShape& shape, const CollectiveBenchSettings& s, Once& once) {
    const size_t word = dtype_size(s.dtype);
    const CollectiveCheckLayout l = collective_check_layout(c, shape);
    const size_t in_count = l.in_count, out_count = l.out_count;
    uint8_t* input = l.input_is_piece ? piece_.data() : whole_.data();
    uint8_t* output = l.output_is_piece ? piece_.data() : whole_.data();
    const size_t chunk = staging_.size() / word;
    const int rank = group_.rank(), ranks = group_.size();
    if (!l.in_place) SHARDLM_CUDA_CHECK(cudaMemsetAsync(output, 0xff, out_count * word, group_.stream()));
    for (size_t at = 0; at < in_count; at += chunk) {
      const size_t n = std::min(chunk, in_count - at);
      fill_collective_input(c, s.dtype, rank, ranks, s.root, at, staging_.data(), n);
      SHARDLM_CUDA_CHECK(cudaMemcpyAsync(input + at * word, staging_.data(), n * word, cudaMemcpyHostToDevice,
                                         group_.stream()));
      SHARDLM_CUDA_CHECK(cudaStreamSynchronize(group_.stream()));  // the staging buffer is reused
    }
    once();
    group_.wait();
    size_t wrong = 0;
    for (size_t at = 0; at < out_count; at += chunk) {
      const size_t n = std::min(chunk, out_count - at);
      SHARDLM_CUDA_CHECK(cudaMemcpy(staging_.data(), output + at * word, n * word, cudaMemcpyDeviceToHost));
      wrong += count_collective_wrong(c, s.dtype, rank, ranks, s.root, shape.piece, at, staging_.data(), n);
    }
    return wrong;
  }

  NcclCommunicator& group_;
  size_t max_bytes_;
  DeviceBytes whole_;  // all_gather's output, reduce_scatter's input, all_reduce, broadcast
  DeviceBytes piece_;  // one rank's piece: all_gather's input, reduce_scatter's output
  std::vector<uint8_t> staging_;
};

}  // namespace

std::unique_ptr<CollectiveBench> make_nccl_collective_bench(NcclCommunicator& group, size_t max_bytes) {
  return std::make_unique<NcclCollectiveBench>(group, max_bytes);
}

size_t device_free_bytes() {
  size_t free = 0, total = 0;
  SHARDLM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

std::string current_device_text() {
  int device = 0;
  SHARDLM_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  SHARDLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return concat("GPU ", device, ": ", prop.name);
}

std::string nccl_version_text() {
  int v = 0;
  ncclGetVersion(&v);
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return concat("NCCL ", v / 10000, ".", v / 100 % 100, ".", v % 100);
}

}  // namespace shardlm::cuda

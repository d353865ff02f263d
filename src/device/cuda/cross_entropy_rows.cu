// The LM head's cross-entropy rows: loss and, for backward, grad_scale (softmax - onehot) written in place
// over the fp32 logits, in two kernels:
//   - two_pass_rows_kernel: one block a row, which reads the row once for its softmax state and again for
//     the gradient. A 128k-vocabulary row is 513 KB and hundreds of rows are in flight, so the second read
//     comes from memory too: 8 bytes read and 2 written a logit (bf16 gradient).
//   - cluster_rows_kernel (sm_90+): a cluster of C blocks a row, each holding its part of the row in
//     registers; the blocks merge their softmax states through distributed shared memory and write the
//     gradient from the registers: 4 bytes read and 2 written a logit.
// Both merge partial states in a fixed order, so each gives the same results from run to run (the two
// kernels differ from each other by rounding only).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "cross_entropy_rows.hpp"
#include "cuda_check.hpp"
#include "dtype_cuda.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kRowThreads = 512;

// Row r's target if it is one of [0, V), else -1. Ids >= V never come from the data module; they are
// treated like -1 rather than read out of bounds.
__device__ __forceinline__ int row_target(const int32_t* targets, int r, int V) {
  const int t = targets[r];
  return t >= 0 && t < V ? t : -1;
}

// The softmax state of a block, merged over its warps in a fixed order; every thread gets it.
__device__ __forceinline__ void block_merge_softmax_state(float& m, float& s) {
  __shared__ float shared_m[kRowThreads / 32], shared_s[kRowThreads / 32];
  const int tid = threadIdx.x;
  warp_merge_softmax_state(m, s);
  if (tid % 32 == 0) {
    shared_m[tid / 32] = m;
    shared_s[tid / 32] = s;
  }
  __syncthreads();
  m = shared_m[0];
  s = shared_s[0];
  for (int w = 1; w < kRowThreads / 32; ++w) merge_softmax_state(m, s, shared_m[w], shared_s[w]);
}

// One block per row. With `backward`, element j of the row is overwritten by its gradient in T.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    two_pass_rows_kernel(float* logits, int V, const int32_t* targets, float grad_scale, bool backward,
                         float* row_loss, int* row_has_target) {
  const int r = blockIdx.x, tid = threadIdx.x;
  float* row = logits + static_cast<size_t>(r) * V;
  T* out = reinterpret_cast<T*>(row);
  const int target = row_target(targets, r, V);
  if (target < 0) {
    if (tid == 0) {
      row_loss[r] = 0.0f;
      row_has_target[r] = 0;
    }
    if (backward)  // writes only: nothing of the row is read, so narrowing in place cannot race
      for (int j = tid; j < V; j += kRowThreads) out[j] = from_float<T>(0.0f);
    return;
  }

  // Running max and sum of exp per thread, then over the block.
  float m = -INFINITY, s = 0.0f;
  for (int j = tid; j < V; j += kRowThreads) add_to_softmax_state(row[j], m, s);
  block_merge_softmax_state(m, s);
  if (tid == 0) {
    row_loss[r] = m + logf(s) - row[target];
    row_has_target[r] = 1;
  }
  if (!backward) return;
  __syncthreads();  // the target logit and every value of pass 1 are read before the row is overwritten

  const float inv_s = 1.0f / s;
  for (int base = 0; base < V; base += kRowThreads) {
    const int j = base + tid;
    float g = 0.0f;
    if (j < V) g = grad_scale * (expf(row[j] - m) * inv_s - (j == target ? 1.0f : 0.0f));
    // A 16-bit element j overwrites fp32 element j/2 <= j: every thread reads its value of this stride
    // before any writes (earlier strides were read before earlier barriers).
    if (sizeof(T) < sizeof(float)) __syncthreads();
    if (j < V) out[j] = from_float<T>(g);
  }
}

// One cluster of C blocks per row (blocks r*C .. r*C + C-1); block k of the cluster holds elements
// [k * ITEMS * kRowThreads, (k+1) * ITEMS * kRowThreads) of the row, ITEMS to a thread (coalesced: item i of
// thread t is element i * kRowThreads + t of the block's part). Reads every logit once.
template <typename T, int ITEMS, int MIN_BLOCKS>
__global__ void __launch_bounds__(kRowThreads, MIN_BLOCKS)
    cluster_rows_kernel(float* logits, int V, const int32_t* targets, float grad_scale, bool backward,
                        float* row_loss, int* row_has_target) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int r = static_cast<int>(blockIdx.x) / C, tid = threadIdx.x;
  float* row = logits + static_cast<size_t>(r) * V;
  T* out = reinterpret_cast<T*>(row);
  const int begin = rank * ITEMS * kRowThreads + tid;
  const int target = row_target(targets, r, V);
  if (target < 0) {  // the same branch in every block of the cluster: no cluster barrier is skipped
    if (rank == 0 && tid == 0) {
      row_loss[r] = 0.0f;
      row_has_target[r] = 0;
    }
    if (backward)  // writes only, as in the two-pass kernel
#pragma unroll
      for (int i = 0; i < ITEMS; ++i)
        if (begin + i * kRowThreads < V) out[begin + i * kRowThreads] = from_float<T>(0.0f);
    return;
  }

  float x[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int j = begin + i * kRowThreads;
    x[i] = j < V ? row[j] : -INFINITY;
  }
  const float target_logit = rank == 0 && tid == 0 ? row[target] : 0.0f;
  // The thread's state: its maximum, then x[i] becomes exp(x[i] - m) (0 past the row's end).
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) m = fmaxf(m, x[i]);
  float s = 0.0f;
  if (m != -INFINITY) {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      x[i] = expf(x[i] - m);
      s += x[i];
    }
  }
  const float thread_m = m;
  block_merge_softmax_state(m, s);

  // The blocks' states through distributed shared memory, merged in rank order by every block.
  __shared__ float2 block_state;
  if (tid == 0) block_state = make_float2(m, s);
  cluster.sync();  // every block's state is written and every logit of the row read (into registers)
  float total_m = -INFINITY, total_s = 0.0f;
  for (int k = 0; k < C; ++k) {
    const float2 other = *cluster.map_shared_rank(&block_state, k);
    merge_softmax_state(total_m, total_s, other.x, other.y);
  }
  cluster.sync();  // no block leaves (freeing its shared memory) while another still reads it
  if (rank == 0 && tid == 0) {
    row_loss[r] = total_m + logf(total_s) - target_logit;
    row_has_target[r] = 1;
  }
  if (!backward) return;

  // exp(x - total_m) / total_s = exp(x - thread_m) * exp(thread_m - total_m) / total_s. The row's logits were
  // all read before the first cluster barrier, so narrowing in place cannot race.
  const float scale = thread_m == -INFINITY ? 0.0f : grad_scale * expf(thread_m - total_m) / total_s;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int j = begin + i * kRowThreads;
    if (j < V) out[j] = from_float<T>(x[i] * scale - (j == target ? grad_scale : 0.0f));
  }
#else
  __trap();  // the launcher runs this kernel only where it was compiled for sm_90 or later
#endif
}

// The cluster kernel's two shapes: 32 logits a thread and two blocks an SM for V <= 8 x 16384, 64 and one
// block an SM above that.
struct ClusterShape {
  int items = 0, clusters = 0;  // logits a thread (0: no shape fits V); blocks a row
};

ClusterShape cluster_shape(int V) {
  constexpr int kMaxCluster = 8;  // the portable cluster size
  for (int items : {32, 64}) {
    const int per_block = items * kRowThreads;
    const int blocks = (V + per_block - 1) / per_block;
    if (blocks <= kMaxCluster) return {items, std::max(blocks, 1)};
  }
  return {};
}

template <typename T, int ITEMS>
auto cluster_kernel() {
  return cluster_rows_kernel<T, ITEMS, ITEMS == 32 ? 2 : 1>;
}

cudaLaunchConfig_t cluster_config(int rows, int clusters, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows) * static_cast<unsigned>(clusters));
  config.blockDim = dim3(kRowThreads);
  config.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(clusters);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

// Whether the current device can run shape `shape`'s kernel: a GPU of compute capability 9.0 or later, this
// binary's code for it compiled for sm_90 or later (not JIT-compiled from older PTX, where the kernel is
// empty), and at least one cluster of that size resident. Asked once per device and shape.
bool cluster_path_available(const ClusterShape& shape) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices][2][9];  // 0 unknown, 1 yes, 2 no
  int device = 0;
  SHARDLM_CUDA_CHECK(cudaGetDevice(&device));
  const int which = shape.items == 32 ? 0 : 1;
  std::atomic<int>* slot = device < kMaxDevices ? &cached[device][which][shape.clusters] : nullptr;
  if (const int known = slot != nullptr ? slot->load(std::memory_order_relaxed) : 0; known != 0) return known == 1;
  int major = 0;
  SHARDLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  bool ok = false;
  if (major >= 9) {
    auto probe = [&](auto kernel) {
      cudaFuncAttributes attributes{};
      if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess || attributes.ptxVersion < 90) return false;
      cudaLaunchAttribute attr;
      cudaLaunchConfig_t config = cluster_config(1, shape.clusters, nullptr, &attr);
      int active = 0;
      return cudaOccupancyMaxActiveClusters(&active, kernel, &config) == cudaSuccess && active > 0;
    };
    ok = which == 0 ? probe(cluster_kernel<float, 32>()) : probe(cluster_kernel<float, 64>());
    (void)cudaGetLastError();  // a refused probe leaves no error behind
  }
  if (slot != nullptr) slot->store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

template <typename T>
void launch_cluster_rows(const ClusterShape& shape, float* logits, int rows, int V, const int32_t* targets,
                         float grad_scale, bool backward, float* row_loss, int* row_has_target, cudaStream_t stream) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = cluster_config(rows, shape.clusters, stream, &attr);
  if (shape.items == 32)
    SHARDLM_CUDA_CHECK(cudaLaunchKernelEx(&config, cluster_kernel<T, 32>(), logits, V, targets, grad_scale, backward,
                                          row_loss, row_has_target));
  else
    SHARDLM_CUDA_CHECK(cudaLaunchKernelEx(&config, cluster_kernel<T, 64>(), logits, V, targets, grad_scale, backward,
                                          row_loss, row_has_target));
}

// The shape the cluster kernel takes for V where it can run here; items 0 where it cannot (the two-pass kernel).
ClusterShape runnable_cluster_shape(int V) {
  const ClusterShape shape = cluster_shape(V);
  return shape.items != 0 && cluster_path_available(shape) ? shape : ClusterShape{};
}

}  // namespace

CrossEntropyPath cross_entropy_auto_path(int V) {
  return runnable_cluster_shape(V).items != 0 ? CrossEntropyPath::kCluster : CrossEntropyPath::kTwoPass;
}

void cross_entropy_rows(float* logits, int rows, int V, const int32_t* targets, float grad_scale, bool backward,
                        float* row_loss, int* row_has_target, DType dt, cudaStream_t stream, CrossEntropyPath path) {
  SHARDLM_CHECK(rows >= 0 && V >= 1, "cross_entropy_rows: bad shape rows=", rows, " V=", V);
  if (rows == 0) return;
  const ClusterShape shape = path == CrossEntropyPath::kTwoPass ? ClusterShape{} : runnable_cluster_shape(V);
  if (path == CrossEntropyPath::kAuto) path = shape.items != 0 ? CrossEntropyPath::kCluster : CrossEntropyPath::kTwoPass;
  if (path == CrossEntropyPath::kCluster)
    SHARDLM_CHECK(shape.items != 0, "cross_entropy_rows: the cluster kernel cannot run here (V=", V, ", at most ",
                  kClusterMaxVocab, ", on a GPU of compute capability 9.0 or later with code built for it)");
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (path == CrossEntropyPath::kCluster) {
      launch_cluster_rows<T>(shape, logits, rows, V, targets, grad_scale, backward, row_loss, row_has_target, stream);
    } else {
      two_pass_rows_kernel<T>
          <<<rows, kRowThreads, 0, stream>>>(logits, V, targets, grad_scale, backward, row_loss, row_has_target);
      SHARDLM_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace shardlm::cuda

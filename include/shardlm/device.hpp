// device: the compute backends. The CPU backend (OpenBLAS GEMM, plain C++ kernels) and the CUDA
// backend (cuBLASLt, cuDNN, kernels of our own; src/device/cuda) behind the same small interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardlm/core.hpp"

namespace shardlm {

// Which backend runs the model and the FSDP schedule (deck key run.backend).
enum class BackendKind { Cpu, Cuda };

// A backend's stream of work: a cudaStream_t on the CUDA backend; nullptr on the CPU backend,
// which runs everything synchronously on the calling thread.
using Stream = void*;

// Row-major GEMM: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, op = transpose when set.
// lda/ldb/ldc are the row strides of A, B and C as stored.
void cpu_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);

// Threads the CPU backend's BLAS may use in this process (ranks sharing a node split the cores).
void cpu_set_threads(int threads);

// BLAS and host AdamW threads for one of `ranks_on_node` ranks on a node: the user's
// OPENBLAS_NUM_THREADS or OMP_NUM_THREADS if set, else the cores the rank is bound to if bound, else
// a fair share of the node, in either case at most SLURM_CPUS_PER_TASK where Slurm sets it.
int cpu_default_threads(int ranks_on_node);

// ---- the backend interface the FSDP engine runs on ------------------------------------------

// A point in a stream that another stream can wait for (nothing to wait for on the CPU).
class BackendEvent {
 public:
  virtual ~BackendEvent() = default;
  virtual void record(Stream s) = 0;
  virtual void wait_on(Stream s) = 0;  // work queued on s after this waits for the recorded point
  virtual void synchronize() = 0;      // the calling thread waits until the recorded point is reached
};

// One AdamW update of a stretch of a slice; see Backend::adamw.
struct AdamWRange {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  size_t numel = 0;
  double weight_decay = 0;     // 0 for biases and norms
  void* param_out = nullptr;   // when set, the updated parameter is also written here in out_dtype
};
struct AdamWHyper {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  long step = 1;               // 1-based, for the bias corrections
  float grad_scale = 1;        // gradients are multiplied by this first (clipping)
  DType out_dtype = DType::F32;
};

// One 8-bit AdamW update (train.optim = adamw_8bit) of a stretch of a slice; see Backend::adamw_8bit.
// The moments are kept as one code per element and one fp32 scale per kQuantBlock elements, the blocks
// counted from the stretch's element 0 (a block boundary of its slice).
constexpr size_t kQuantBlock = 256;
struct AdamW8bitRange {
  float* param = nullptr;
  const float* grad = nullptr;
  int8_t* exp_avg = nullptr;        // signed codes of exp_avg (square-root map, see host_adamw_8bit.cpp)
  uint8_t* exp_avg_sq = nullptr;    // codes of exp_avg_sq (fourth-root map)
  float* exp_avg_scale = nullptr;   // per block: the largest |exp_avg|
  float* exp_avg_sq_scale = nullptr;  // per block: the largest exp_avg_sq
  size_t numel = 0;
  // Elements [no_decay[2j] - position, no_decay[2j + 1] - position) of the stretch take no weight decay:
  // the slice's no-decay ranges (host memory, sorted; the CUDA backend passes them to its launches by
  // value), `position` the stretch's place in its slice.
  const uint64_t* no_decay = nullptr;
  size_t no_decay_count = 0;        // ranges, two numbers each
  size_t position = 0;
  double weight_decay = 0;
  void* param_out = nullptr;        // when set, the updated parameter is also written here in out_dtype
};

enum class CopyKind { HostToDevice, DeviceToHost };

// What the FSDP schedule (src/fsdp) needs of a backend: memory, three streams and events between
// them, casts and the element-wise updates of the gradient and optimizer. The CPU backend runs
// everything synchronously on the calling thread; its streams are nullptr and its events no-ops.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  // Its memory is host memory: the host reads it in place, no staging copies are needed.
  virtual bool host_memory() const = 0;
  // Streams run concurrently with the host and each other (the schedule then prefetches).
  virtual bool asynchronous() const = 0;
  // The dtype the models compute in for parameters stored in param_dtype (the CPU computes in fp32).
  virtual DType compute_dtype(DType param_dtype) const = 0;
  // What runs the work: the CUDA device's name ("NVIDIA H100 80GB HBM3"), or "cpu".
  virtual std::string device_name() const = 0;

  // Zero-filled memory whose bytes count as `kind`: zero for every stream when it returns (work queued on any
  // stream after it sees the zeros, never has them land on top of what it wrote).
  virtual DeviceArray allocate(size_t bytes, MemKind kind) = 0;
  // Bytes of backend memory allocated now and at most so far (this process).
  virtual size_t allocated_bytes() const = 0;
  virtual size_t peak_bytes() const = 0;
  // Memory the backend could still allocate: free GPU memory, or the host's available memory (0: unknown).
  virtual size_t available_bytes() const = 0;
  // Page-locks host memory for fast copies, until unpin_host (no-ops on the CPU).
  virtual void pin_host(void* p, size_t bytes) = 0;
  virtual void unpin_host(void* p) = 0;

  virtual Stream compute_stream() const = 0;
  virtual Stream comm_stream() const = 0;
  // The replicate group's all-reduces of block gradients (ProcessGroups::replicate_overlap), beside the
  // communication stream; a backend without one runs them on comm_stream().
  virtual Stream replicate_stream() const { return comm_stream(); }
  // The all-gathers (ProcessGroups::shard_gather), beside the reductions; a backend without one runs
  // them on comm_stream().
  virtual Stream gather_stream() const { return comm_stream(); }
  // CPU offload's copies, one stream per direction (so gradients going down and updated parameters
  // going up overlap each other and the compute and communication streams).
  virtual Stream copy_stream(CopyKind direction) const = 0;
  virtual std::unique_ptr<BackendEvent> make_event() = 0;
  // An event that also takes the time its point is reached, for the step timeline (run.trace_step),
  // and the milliseconds between two of them (both recorded and reached: synchronize first).
  virtual std::unique_ptr<BackendEvent> make_timing_event() = 0;
  virtual double elapsed_ms(BackendEvent& from, BackendEvent& to) = 0;
  virtual void synchronize(Stream s) = 0;
  // Points the calling thread at the backend's device (cudaSetDevice): a thread other than the one
  // that made the backend calls it before its first call (offload's host worker).
  virtual void bind_thread() = 0;
  // Threads the backend's host element-wise work (AdamW, offload's gradient accumulation) spreads over.
  virtual int host_threads() const = 0;

  virtual void zero(void* p, size_t bytes, Stream s) = 0;
  // Copies between host memory and backend memory (a plain copy on the CPU).
  virtual void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream s) = 0;
  // out[i] = in[i] converted (round to nearest even); in and out may be the same dtype.
  virtual void cast(const void* in, DType in_dtype, void* out, DType out_dtype, size_t n, Stream s) = 0;
  // x[i] += y[i] in fp32, y in y_dtype (fp32, bf16 or fp16).
  virtual void accumulate(float* x, const void* y, DType y_dtype, size_t n, Stream s) = 0;
  // *sum (backend memory, fp64) += sum of x[i]^2.
  virtual void sum_squares(const float* x, size_t n, double* sum, Stream s) = 0;
  // Decoupled weight decay as torch.optim.AdamW, on every range: p -= lr * wd * p;
  // m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p -= lr * (m / bc1) / (sqrt(v / bc2) + eps).
  virtual void adamw(const std::vector<AdamWRange>& ranges, const AdamWHyper& h, Stream s) = 0;
  // The same update with block-wise quantised moments: per block, dequantise the old codes, update as
  // adamw does in fp32, then quantise the new moments against the block's new largest values. Every
  // backend gives the same bits (host_adamw_8bit's formula, IEEE fp32 operations without contraction).
  virtual void adamw_8bit(const std::vector<AdamW8bitRange>& ranges, const AdamWHyper& h, Stream s) = 0;

  // ---- the token rows of a [rows, width] fp32 table's gradient (the FSDP engine reduces the embedding's
  // part of the root as these rows). ids[k], k < m, names row ids[k] (an id outside [0, rows): row 0, as
  // the embedding reads it); k is its row's first occurrence when no lower k names the row.
  // first (rows int32, backend memory) must be zero before the first call of a round; afterwards it
  // marks each named row's first occurrence (zero it again for the next round).
  virtual void rows_mark_first(const int32_t* ids, size_t m, int32_t* first, size_t rows, Stream s) = 0;
  // slots[i] = the first occurrence k, among the m ids first was marked with, of the row ids[i] names (i < n):
  // where a packed row (rows_pack's out) holds that row. Every row ids[i] names must be among the marked ones.
  virtual void rows_slots(const int32_t* ids, size_t n, const int32_t* first, size_t m, size_t rows, int32_t* slots,
                          Stream s) = 0;
  // out[k, :] (width values in out_dtype) = table row ids[k] at its first occurrence k, else zeros.
  virtual void rows_pack(const float* table, size_t width, const int32_t* ids, const int32_t* first, size_t m,
                         size_t rows, void* out, DType out_dtype, Stream s) = 0;
  // For each first occurrence k and column c: slice[pos + ids[k] * width + c] += in[k, c] (in_dtype),
  // where that index is inside [0, count) (the slice may hold part of the table).
  virtual void rows_unpack_add(const void* in, DType in_dtype, size_t width, const int32_t* ids, const int32_t* first,
                               size_t m, size_t rows, float* slice, long long pos, size_t count, Stream s) = 0;
  // Adds to *sum (fp64) the squares of the table elements the slice holds (slice[pos + row * width + c] inside
  // [0, count)): those of the named rows (named: each first occurrence's row, as rows_unpack_add adds them),
  // else those of every other row of [0, rows) (ids are not read then). Split in two, the squares of a
  // slice whose named rows change later: the others now, the named ones after.
  virtual void rows_sum_squares(size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows,
                                const float* slice, long long pos, size_t count, bool named, double* sum, Stream s) = 0;
  // Every named row of table set to zero.
  virtual void rows_zero(float* table, size_t width, const int32_t* ids, size_t m, size_t rows, Stream s) = 0;
};

// The CPU backend; `threads` spread its element-wise work (AdamW) over the host's cores.
// With `moments_dir`, its MemKind::Optimizer arrays (AdamW's moments) are memory-mapped files created in
// that directory and unlinked at once (nothing stays behind, even after a crash); the kernel pages them
// in and out, so host memory smaller than the moments suffices (fsdp.offload_dir).
std::unique_ptr<Backend> make_cpu_backend(int threads = 1, const std::string& moments_dir = "");

// ---- the host AdamW (cpu/host_adamw.cpp): the CPU backend's adamw, offloaded runs' optimizer ----

// The instruction sets the host AdamW has a path for; the best one the CPU has is chosen at run time.
enum class HostSimd { Scalar, Avx2, Avx512 };
const char* host_simd_name(HostSimd simd);
bool host_simd_available(HostSimd simd);  // this CPU runs it (AVX2 also needs F16C)
HostSimd host_simd_best();                 // AVX-512, else AVX2, else scalar
// Elements per work piece: threads take whole pieces, so any thread count gives the same bits.
constexpr size_t kHostAdamWPiece = size_t(1) << 16;
// Backend::adamw on the host with the GPU kernel's formula and fp32 scalars (src/device/cuda/adamw.cu),
// on `threads` threads with the `simd` path; every path and thread count gives the same bits.
void host_adamw(const std::vector<AdamWRange>& ranges, const AdamWHyper& h, int threads, HostSimd simd);

// ---- the host 8-bit AdamW (cpu/host_adamw_8bit.cpp): the CPU backend's adamw_8bit -----------

// Backend::adamw_8bit on the host, block by block over `threads` threads (any count gives the same bits).
void host_adamw_8bit(const std::vector<AdamW8bitRange>& ranges, const AdamWHyper& h, int threads);
// The maps between fp32 moments and their codes, for one block of n <= kQuantBlock elements:
// exp_avg m -> code round(sign(m) 127 sqrt(|m| / scale)), scale the block's largest |m|;
// exp_avg_sq v -> code round(255 (v / scale)^(1/4)), scale the block's largest v; a zero scale gives zero
// codes. Dequantising then quantising gives back the same codes and scale (checkpoints keep fp32 values).
void quantise_exp_avg(const float* m, size_t n, int8_t* codes, float* scale);
void quantise_exp_avg_sq(const float* v, size_t n, uint8_t* codes, float* scale);
void dequantise_exp_avg(const int8_t* codes, float scale, size_t n, float* m);
void dequantise_exp_avg_sq(const uint8_t* codes, float scale, size_t n, float* v);

// ---- offload's host gradients (cpu/host_grad.cpp) --------------------------------------------

// acc[i] = (overwrite ? 0 : acc[i]) + in[i] for a reduced gradient slice `in` in dtype (fp32, bf16 or
// fp16), in fp32 as the device's accumulate does it; when sum_squares is set it receives the fp64 sum
// of the new acc[i]^2, summed per kHostAdamWPiece piece and the pieces in order, so any thread count
// gives the same bits.
void host_accumulate_grad(float* acc, const void* in, DType dtype, size_t n, bool overwrite, double* sum_squares,
                          int threads);
// The fp64 sum of x[i]^2 in the same order as host_accumulate_grad's.
double host_sum_squares(const float* x, size_t n, int threads);

// ---- a GPU's dense peak, for the model FLOPs utilisation (gpu_peaks.cpp) ---------------------

// One GPU model's dense (no sparsity) tensor-core peak in TFLOP/s for bf16 and fp16 operands, for
// the devices whose CUDA name contains `name` (case-insensitive); 0 where it has none (V100 bf16).
struct GpuPeak {
  std::string name;
  double bf16_tflops = 0;
  double fp16_tflops = 0;
};

// NVIDIA's datasheet figures: H100 (SXM, PCIe, NVL), H200 (SXM, NVL), A100, V100 (SXM, PCIe, V100S).
const std::vector<GpuPeak>& builtin_gpu_peaks();
// A file of more, one per line: `<name substring> <bf16 TFLOP/s> <fp16 TFLOP/s>`, '#' to the end of
// a line a comment (the file SHARDLM_GPU_PEAKS names). Error naming the file and line of a bad line.
std::vector<GpuPeak> read_gpu_peaks(const std::string& path);
// The entry for a device: the longest name it contains among `user_entries`, else among the
// built-in ones ("H100 PCIe" before "H100"); nullptr when none matches.
const GpuPeak* find_gpu_peak(const std::string& device_name, const std::vector<GpuPeak>& user_entries);

#ifdef SHARDLM_HAVE_CUDA
// The CUDA backend on this process's current GPU (select it first): a compute and a
// communication stream, memory counted by the planned-buffer accounting of src/device/cuda. With
// blocking_waits a host thread waiting for the GPU (a stream, the device, an event of this backend)
// sleeps instead of spinning on a core: CPU offload, whose host AdamW wants every core.
std::unique_ptr<Backend> make_cuda_backend(bool blocking_waits = false);
#endif

}  // namespace shardlm

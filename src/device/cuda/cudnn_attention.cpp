// cuDNN fused flash attention through the backend (graph) API: see cudnn_attention.hpp. The graphs
// below are the operation patterns cuDNN's fused SDPA engines match (NVIDIA's cuDNN documentation,
// "Fused Flash Attention"); every tensor the kernels read or write is non-virtual and given by its
// dims and strides, so the engine reads q, k, v in the model's own layout.
#include "cudnn_attention.hpp"

#include <cudnn.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cuda_check.hpp"
#include "workspace_sizes.hpp"

namespace shardlm::cuda {
namespace {

[[noreturn]] void throw_cudnn(cudnnStatus_t rc, const char* what) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  throw Error(concat("cuDNN: ", what, ": ", cudnnGetErrorString(rc), detail[0] ? concat(" (", detail, ")") : ""));
}

void check(cudnnStatus_t rc, const char* what) {
  if (rc != CUDNN_STATUS_SUCCESS) throw_cudnn(rc, what);
}

cudnnDataType_t cudnn_type(DType dt) {
  switch (dt) {
    case DType::F32:
      return CUDNN_DATA_FLOAT;
    case DType::BF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::F16:
      return CUDNN_DATA_HALF;
  }
  return CUDNN_DATA_FLOAT;
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    check(cudnnBackendCreateDescriptor(type, &d_), "create descriptor");
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  template <typename T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values, int64_t n = 1) {
    check(cudnnBackendSetAttribute(d_, name, type, n, values), "set attribute");
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t raw = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw);
  }
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }
  Desc& finalize(const char* what) {
    check(try_finalize(), what);
    return *this;
  }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};
using DescPtr = std::shared_ptr<Desc>;

using Dims = std::vector<int64_t>;

// Unique ids of the tensors a call passes data for; virtual tensors are numbered from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kSlopes,
  kMaskValue,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kDQAccum,
  kOne,
  kBias,
  kWindow,
  kFirstVirtual = 100
};

// Builds one operation graph and its execution plan.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  DescPtr tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides, bool is_virtual = false,
                 bool by_value = false) {
    auto t = std::make_shared<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), static_cast<int64_t>(dims.size()))
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), static_cast<int64_t>(strides.size()))
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
    if (by_value) t->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
    t->finalize("tensor descriptor");
    keep_.push_back(t);
    return t;
  }
  DescPtr virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_++, type, dims, strides, true);
  }
  // A scalar passed by value at execution (a host pointer in the variant pack).
  DescPtr scalar(int64_t uid, cudnnDataType_t type) {
    return tensor(uid, type, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x, b) (t: BINARY_SELECT's condition; axis: GEN_INDEX's).
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t precision, const DescPtr& x, const DescPtr& b,
                 const DescPtr& y, const DescPtr& t = nullptr, int64_t axis = -1) {
    auto pw = std::make_shared<Desc>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision);
    if (axis >= 0) pw->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    pw->finalize("pointwise descriptor");
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x);
    if (b) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *y).finalize("pointwise operation");
    add(pw, op);
  }
  void matmul(const DescPtr& a, const DescPtr& b, const DescPtr& c) {
    auto mm = std::make_shared<Desc>(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    mm->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute).finalize("matmul descriptor");
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, *a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, *b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, *c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, *mm)
        .finalize("matmul operation");
    add(mm, op);
  }
  void reduce(cudnnReduceTensorOp_t mode, const DescPtr& x, const DescPtr& y) {
    auto red = std::make_shared<Desc>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    red->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute)
        .finalize("reduction descriptor");
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, *x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, *y)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *red)
        .finalize("reduction operation");
    add(red, op);
  }
  void reshape(const DescPtr& x, const DescPtr& y) {
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, *x)
        .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, *y)
        .finalize("reshape operation");
    add(nullptr, op);
  }

  // The operation graph, then the first engine configuration of cuDNN's heuristics that yields an
  // execution plan. Returns the plan, or null with `why` set when no engine takes the graph.
  DescPtr build(int64_t& workspace, std::string& why) {
    auto graph = std::make_shared<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph
        ->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(),
              static_cast<int64_t>(ops_.size()))
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle_);
    if (const cudnnStatus_t rc = graph->try_finalize(); rc != CUDNN_STATUS_SUCCESS) {
      why = last_error("operation graph", rc);
      return nullptr;
    }
    keep_.push_back(graph);
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph)
          .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
      if (const cudnnStatus_t rc = heur.try_finalize(); rc != CUDNN_STATUS_SUCCESS) {
        why = last_error("engine heuristics", rc);
        continue;
      }
      int64_t count = 0;
      check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                     &count, nullptr),
            "heuristics result count");
      std::vector<std::unique_ptr<Desc>> configs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (int64_t i = 0; i < count; ++i) {
        configs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        raw.push_back(configs.back()->get());
      }
      int64_t got = 0;
      if (count > 0)
        check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                       &got, raw.data()),
              "heuristics results");
      for (int64_t i = 0; i < got; ++i) {
        auto plan = std::make_shared<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        cudnnBackendDescriptor_t config = raw[i];
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle_)
            .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &config);
        if (const cudnnStatus_t rc = plan->try_finalize(); rc != CUDNN_STATUS_SUCCESS) {
          why = last_error("execution plan", rc);
          continue;
        }
        int64_t n = 0;
        check(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                       &workspace),
              "plan workspace size");
        keep_.push_back(plan);
        return plan;
      }
      if (got == 0 && why.empty()) why = "no engine supports this attention graph";
    }
    return nullptr;
  }

  // Every descriptor the plan was built from (kept alive beside it).
  std::vector<DescPtr>& kept() { return keep_; }

 private:
  void add(const DescPtr& attr, const DescPtr& op) {
    if (attr) keep_.push_back(attr);
    keep_.push_back(op);
    ops_.push_back(op->get());
  }
  static std::string last_error(const char* what, cudnnStatus_t rc) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof(detail));
    return concat(what, ": ", cudnnGetErrorString(rc), detail[0] ? concat(" (", detail, ")") : "");
  }

  cudnnHandle_t handle_;
  int64_t next_virtual_ = kFirstVirtual;
  std::vector<DescPtr> keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
};

// The dims and strides every graph shares, from the layout.
struct Geometry {
  int64_t B, H, KV, T, d;
  Dims q_dims, q_strides, kt_dims, kt_strides, v_dims, v_strides, vt_dims, vt_strides, o_dims, o_strides;
  Dims score_dims, score_strides, row_dims, row_strides;

  explicit Geometry(const AttentionLayout& l) : B(l.B), H(l.heads), KV(l.kv_heads), T(l.T), d(l.head_dim) {
    const int64_t seq = T * l.row;
    q_dims = {B, H, T, d};
    q_strides = {seq, l.head, l.row, 1};
    kt_dims = {B, KV, d, T};  // K^T: the engine's second operand of Q K^T
    kt_strides = {seq, l.head, 1, l.row};
    v_dims = {B, KV, T, d};
    v_strides = {seq, l.head, l.row, 1};
    vt_dims = {B, KV, d, T};
    vt_strides = {seq, l.head, 1, l.row};
    o_dims = {B, H, T, d};
    o_strides = {T * l.out_row, d, l.out_row, 1};
    score_dims = {B, H, T, T};
    score_strides = {H * T * T, T * T, T, 1};
    row_dims = {B, H, T, 1};
    row_strides = {H * T, T, 1, 1};
  }
  // [B, H, T(kv), T(q)] views of a score-shaped tensor, transposed (for P^T dO and dS^T Q).
  Dims transposed_strides() const { return {H * T * T, T * T, 1, T}; }
  // A packed [B, H, T, d] tensor.
  Dims packed_strides() const { return {H * T * d, T * d, d, 1}; }
};

// out = x^T b for a score-shaped x ([B, H, T, T], transposed by a reshape into the io dtype), summed
// over the query heads of each key/value head when they are grouped: dV = P^T dO and dK = dS^T Q.
void transposed_product(GraphBuilder& g, const Geometry& s, cudnnDataType_t io, const DescPtr& x, const DescPtr& b,
                        const DescPtr& out, bool grouped) {
  auto xt = g.virtual_tensor(io, s.score_dims, s.transposed_strides());
  g.reshape(x, xt);
  if (!grouped) return g.matmul(xt, b, out);
  auto full = g.virtual_tensor(io, {s.B, s.H, s.T, s.d}, s.packed_strides());
  g.matmul(xt, b, full);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

// New virtual tensors of the score shape [B, H, T, T] and the row shape [B, H, T, 1], each the
// output of one operation: what the graphs below are made of.
struct Ops {
  GraphBuilder& g;
  const Geometry& s;

  // y = mode(x, b) (t: BINARY_SELECT's condition; axis: GEN_INDEX's), y of the score shape.
  DescPtr score(cudnnPointwiseMode_t mode, const DescPtr& x, const DescPtr& b = nullptr,
                cudnnDataType_t type = CUDNN_DATA_FLOAT, cudnnDataType_t precision = CUDNN_DATA_FLOAT,
                const DescPtr& t = nullptr, int64_t axis = -1) {
    auto y = g.virtual_tensor(type, s.score_dims, s.score_strides);
    g.pointwise(mode, precision, x, b, y, t, axis);
    return y;
  }
  DescPtr row(cudnnPointwiseMode_t mode, const DescPtr& x, const DescPtr& b = nullptr) {
    auto y = g.virtual_tensor(CUDNN_DATA_FLOAT, s.row_dims, s.row_strides);
    g.pointwise(mode, CUDNN_DATA_FLOAT, x, b, y);
    return y;
  }
  // The reduction of a score-shaped x over its last axis (the keys).
  DescPtr row_reduce(cudnnReduceTensorOp_t op, const DescPtr& x) {
    auto y = g.virtual_tensor(CUDNN_DATA_FLOAT, s.row_dims, s.row_strides);
    g.reduce(op, x, y);
    return y;
  }
  DescPtr score_matmul(const DescPtr& a, const DescPtr& b) {
    auto y = g.virtual_tensor(CUDNN_DATA_FLOAT, s.score_dims, s.score_strides);
    g.matmul(a, b, y);
    return y;
  }
  DescPtr index(const DescPtr& x, int64_t axis, cudnnDataType_t precision) {
    return score(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, CUDNN_DATA_INT32, precision, nullptr, axis);
  }

  // scores = scale Q K^T (+ bias) (+ ALiBi), causally masked (and to a sliding window): the chain the
  // forward and the backward share, in the order of cuDNN's fused SDPA (scale, bias, ALiBi, masks).
  DescPtr masked_scores(const DescPtr& q, const DescPtr& kt, const DescPtr& scale, bool alibi, const DescPtr& slopes,
                        const DescPtr& bias, const DescPtr& window) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32;
    DescPtr cur = score(CUDNN_POINTWISE_MUL, score_matmul(q, kt), scale);
    if (bias) cur = score(CUDNN_POINTWISE_ADD, cur, bias);
    if (alibi) {  // + slope_h (j - i)
      auto dist = score(CUDNN_POINTWISE_SUB, index(cur, 3, i32), index(cur, 2, i32), i32, i32);
      cur = score(CUDNN_POINTWISE_ADD, cur, score(CUDNN_POINTWISE_MUL, dist, slopes));
    }
    // Causal: keep key j for query i where i >= j, the lowest float elsewhere.
    auto keep =
        score(CUDNN_POINTWISE_CMP_GE, index(cur, 2, f32), index(cur, 3, f32), CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    const DescPtr lowest = g.scalar(kMaskValue, f32);  // one tensor per unique id, both masks read it
    cur = score(CUDNN_POINTWISE_BINARY_SELECT, cur, lowest, f32, f32, keep);
    if (!window) return cur;
    // Sliding window, the diagonal band cuDNN's SDPA takes: keep key j for query i where j + window > i
    // (transformers' i - window < j), in int32 as cudnn-frontend builds the band before cuDNN 9.21.
    auto shifted = score(CUDNN_POINTWISE_ADD, index(cur, 3, i32), window, i32, i32);
    auto in_window =
        score(CUDNN_POINTWISE_CMP_GT, shifted, index(cur, 2, i32), CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    return score(CUDNN_POINTWISE_BINARY_SELECT, cur, lowest, f32, f32, in_window);
  }
};

// The tensors both graphs read: Q, K^T, O, the softmax statistics, the scale, (ALiBi) the slopes,
// (packed rows) the [B, 1, T, T] bias, broadcast over the heads, and (sliding window) the window.
struct Common {
  DescPtr q, kt, o, stats, scale, slopes, bias, window;
};
Common common_tensors(GraphBuilder& g, const Geometry& s, cudnnDataType_t io, bool alibi, bool bias, bool window) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  return {g.tensor(kQ, io, s.q_dims, s.q_strides),
          g.tensor(kK, io, s.kt_dims, s.kt_strides),
          g.tensor(kO, io, s.o_dims, s.o_strides),
          g.tensor(kStats, f32, s.row_dims, s.row_strides),
          g.scalar(kScale, f32),
          alibi ? g.tensor(kSlopes, f32, {1, s.H, 1, 1}, {s.H, 1, 1, 1}) : nullptr,
          bias ? g.tensor(kBias, io, {s.B, 1, s.T, s.T}, {s.T * s.T, s.T * s.T, s.T, 1}) : nullptr,
          window ? g.scalar(kWindow, CUDNN_DATA_INT32) : nullptr};
}

}  // namespace

AttentionLayout AttentionLayout::grouped(int B, int T, int heads, int kv_heads, int head_dim, DType dt) {
  AttentionLayout l;
  l.B = B, l.T = T, l.heads = heads, l.kv_heads = kv_heads, l.head_dim = head_dim, l.dt = dt;
  l.row = static_cast<long long>(heads + 2 * kv_heads) * head_dim;
  l.head = head_dim;
  l.q = 0, l.k = static_cast<long long>(heads) * head_dim, l.v = static_cast<long long>(heads + kv_heads) * head_dim;
  l.out_row = static_cast<long long>(heads) * head_dim;
  return l;
}

AttentionLayout AttentionLayout::interleaved_alibi(int B, int T, int heads, int head_dim, DType dt) {
  AttentionLayout l;
  l.B = B, l.T = T, l.heads = heads, l.kv_heads = heads, l.head_dim = head_dim, l.dt = dt, l.alibi = true;
  l.row = 3LL * heads * head_dim;
  l.head = 3LL * head_dim;
  l.q = 0, l.k = head_dim, l.v = 2LL * head_dim;
  l.out_row = static_cast<long long>(heads) * head_dim;
  return l;
}

struct CudnnAttention::Plan {
  std::vector<DescPtr> descriptors;  // the plan and everything it was built from
  DescPtr plan;
  int64_t workspace = 0;
};

struct CudnnAttention::Plans {
  std::string refused;  // why cuDNN refused the shape ("" when both plans exist)
  Plan forward, backward;
};

std::string CudnnAttention::unavailable_reason() {
  const size_t v = cudnnGetVersion();
  if (v < 90000) return concat("cuDNN ", v, " is older than 9.0");
  int device = 0, major = 0;
  SHARDLM_CUDA_CHECK(cudaGetDevice(&device));
  SHARDLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 8)
    return concat("the GPU has compute capability ", major, ".x; cuDNN's fused attention needs 8.0 or newer");
  return "";
}

std::string CudnnAttention::version() {
  const size_t v = cudnnGetVersion();
  return concat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
}

CudnnAttention::CudnnAttention() {
  if (const std::string why = unavailable_reason(); !why.empty()) throw Error(concat("cuDNN attention: ", why));
  cudnnHandle_t h = nullptr;
  check(cudnnCreate(&h), "cudnnCreate");
  handle_ = h;
}

CudnnAttention::~CudnnAttention() {
  cache_.clear();
  if (handle_) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

CudnnAttention::Plans& CudnnAttention::plans(const AttentionLayout& l) {
  auto it = cache_.find(l.key());
  if (it != cache_.end()) return *it->second;
  auto plans = std::make_unique<Plans>();
  const cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  const Geometry s(l);
  const cudnnDataType_t io = cudnn_type(l.dt), f32 = CUDNN_DATA_FLOAT;
  const bool grouped = l.kv_heads != l.heads;

  if (l.dt == DType::F32)
    plans->refused = "cuDNN's fused attention takes bf16 or fp16, not fp32";
  else if (l.head_dim % 8 != 0 || l.head_dim > 256)
    plans->refused = concat("head dimension ", l.head_dim, " (cuDNN's fused attention takes multiples of 8 up to 256)");
  else if (l.kv_heads <= 0 || l.heads % l.kv_heads != 0)
    plans->refused = concat(l.heads, " query heads do not group over ", l.kv_heads, " key/value heads");
  else if (l.window < 0 || (l.window > 0 && l.bias))
    plans->refused = concat("sliding window ", l.window,
                            l.window < 0 ? " < 0" : " with a bias (packed_attention_bias folds it into the bias)");

  if (plans->refused.empty()) {  // forward
    GraphBuilder g(handle);
    Ops op{g, s};
    const Common c = common_tensors(g, s, io, l.alibi, l.bias, l.window > 0);
    auto v = g.tensor(kV, io, s.v_dims, s.v_strides);
    auto scores = op.masked_scores(c.q, c.kt, c.scale, l.alibi, c.slopes, c.bias, c.window);
    // Softmax, saving the row's log-sum-exp: max, exp(s - max), sum, stats = max + log(sum), p = e / sum.
    auto max = op.row_reduce(CUDNN_REDUCE_TENSOR_MAX, scores);
    auto e = op.score(CUDNN_POINTWISE_EXP, op.score(CUDNN_POINTWISE_SUB, scores, max));
    auto sum = op.row_reduce(CUDNN_REDUCE_TENSOR_ADD, e);
    g.pointwise(CUDNN_POINTWISE_ADD, f32, max, op.row(CUDNN_POINTWISE_LOG, sum), c.stats);
    g.matmul(op.score(CUDNN_POINTWISE_DIV, e, sum, io), v, c.o);  // P V takes P in the io dtype
    std::string why;
    plans->forward.plan = g.build(plans->forward.workspace, why);
    plans->forward.descriptors = std::move(g.kept());
    if (!plans->forward.plan) plans->refused = concat("forward: ", why);
  }

  if (plans->refused.empty()) {  // backward
    GraphBuilder g(handle);
    Ops op{g, s};
    const Common c = common_tensors(g, s, io, l.alibi, l.bias, l.window > 0);
    auto vt = g.tensor(kV, io, s.vt_dims, s.vt_strides);
    auto d_o = g.tensor(kDO, io, s.o_dims, s.o_strides);
    auto dq = g.tensor(kDQ, io, s.q_dims, s.q_strides);
    auto dk = g.tensor(kDK, io, s.v_dims, s.v_strides);  // dK in K's [B, KV, T, d] layout
    auto dv = g.tensor(kDV, io, s.v_dims, s.v_strides);
    // softmax_sum = rowsum(dO * O), kept in our workspace.
    auto prod = g.virtual_tensor(f32, s.o_dims, {s.H * s.T * s.d, s.T * s.d, s.H * s.d, 1});  // as cuDNN's own
    g.pointwise(CUDNN_POINTWISE_MUL, f32, d_o, c.o, prod);
    auto softmax_sum = g.tensor(kSoftmaxSum, f32, s.row_dims, s.row_strides);
    g.pointwise(CUDNN_POINTWISE_MUL, f32, op.row_reduce(CUDNN_REDUCE_TENSOR_ADD, prod), g.scalar(kOne, f32),
                softmax_sum);
    // p = exp(scores - stats), recomputed.
    auto scores = op.masked_scores(c.q, c.kt, c.scale, l.alibi, c.slopes, c.bias, c.window);
    auto p = op.score(CUDNN_POINTWISE_EXP, op.score(CUDNN_POINTWISE_SUB, scores, c.stats));
    // dV = P^T dO (summed over the query heads of a group).
    transposed_product(g, s, io, p, d_o, dv, grouped);
    // dS = scale * p * (dO V^T - softmax_sum).
    auto centred = op.score(CUDNN_POINTWISE_SUB, op.score_matmul(d_o, vt), softmax_sum);
    auto ds = op.score(CUDNN_POINTWISE_MUL, op.score(CUDNN_POINTWISE_MUL, centred, p), c.scale);
    // dK = dS^T Q (summed over the group's query heads).
    transposed_product(g, s, io, ds, c.q, dk, grouped);
    // dQ = dS K, accumulated in fp32 in our workspace, then rounded into dQ.
    auto k = g.virtual_tensor(io, s.v_dims, s.v_strides);
    g.reshape(c.kt, k);
    auto dq_accum = g.tensor(kDQAccum, f32, s.q_dims, s.packed_strides());
    g.matmul(ds, k, dq_accum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, f32, dq_accum, nullptr, dq);
    std::string why;
    plans->backward.plan = g.build(plans->backward.workspace, why);
    plans->backward.descriptors = std::move(g.kept());
    if (!plans->backward.plan) plans->refused = concat("backward: ", why);
  }
  return *cache_.emplace(l.key(), std::move(plans)).first->second;
}

std::string CudnnAttention::prepare(const AttentionLayout& l) { return plans(l).refused; }

size_t CudnnAttention::workspace_bytes(const AttentionLayout& l) {
  const Plans& p = plans(l);
  if (!p.refused.empty()) return 0;
  const size_t own = cudnn_attention_own_bytes(l.B, l.T, l.heads, l.head_dim);
  return std::max<size_t>(align256(p.forward.workspace), own + align256(p.backward.workspace));
}

namespace {

// Executes `plan` with the data pointers of the given unique ids.
void execute(cudnnHandle_t handle, const Desc& plan, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
             void* workspace, cudaStream_t stream) {
  check(cudnnSetStream(handle, stream), "cudnnSetStream");
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<int64_t>(uids.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), static_cast<int64_t>(ptrs.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace)
      .finalize("variant pack");
  check(cudnnBackendExecute(handle, plan.get(), pack.get()), "execute attention plan");
}

void* at(const void* base, long long elements, DType dt) {
  return const_cast<char*>(static_cast<const char*>(base)) + elements * static_cast<long long>(dtype_size(dt));
}

// ALiBi's slopes, the packed rows' bias and the sliding window (a host int32), where the layout reads them.
void add_optional_inputs(const AttentionLayout& l, const float* slopes, const void* bias, int32_t* window,
                         std::vector<int64_t>& uids, std::vector<void*>& ptrs) {
  if (l.alibi) {
    uids.push_back(kSlopes);
    ptrs.push_back(const_cast<float*>(slopes));
  }
  if (l.bias) {
    SHARDLM_CHECK(bias != nullptr, "cuDNN attention: a layout with a bias was given none");
    uids.push_back(kBias);
    ptrs.push_back(const_cast<void*>(bias));
  }
  if (l.window > 0) {
    uids.push_back(kWindow);
    ptrs.push_back(window);
  }
}

void require_prepared(const std::string& refused) {
  if (!refused.empty()) throw Error(concat("cuDNN attention cannot run this shape: ", refused));
}

}  // namespace

void CudnnAttention::forward(const AttentionLayout& l, const void* qkv, void* ctx, float* lse, const float* slopes,
                             const void* bias, void* workspace, cudaStream_t stream) {
  if (l.B == 0 || l.T == 0) return;
  const Plans& p = plans(l);
  require_prepared(p.refused);
  float scale = l.scale > 0 ? l.scale : 1.0f / std::sqrt(static_cast<float>(l.head_dim));
  float mask_value = std::numeric_limits<float>::lowest();
  int32_t window = l.window;
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kMaskValue};
  std::vector<void*> ptrs = {at(qkv, l.q, l.dt), at(qkv, l.k, l.dt), at(qkv, l.v, l.dt), ctx, lse, &scale, &mask_value};
  add_optional_inputs(l, slopes, bias, &window, uids, ptrs);
  execute(static_cast<cudnnHandle_t>(handle_), *p.forward.plan, uids, ptrs, workspace, stream);
}

void CudnnAttention::backward(const AttentionLayout& l, const void* dctx, const void* qkv, const void* ctx,
                              const float* lse, void* dqkv, const float* slopes, const void* bias, void* workspace,
                              cudaStream_t stream) {
  if (l.B == 0 || l.T == 0) return;
  const Plans& p = plans(l);
  require_prepared(p.refused);
  const size_t rows = static_cast<size_t>(l.B) * l.heads * l.T;
  char* own = static_cast<char*>(workspace);
  float* softmax_sum = reinterpret_cast<float*>(own);
  float* dq_accum = reinterpret_cast<float*>(own + align256(rows * sizeof(float)));
  void* engine_workspace = own + cudnn_attention_own_bytes(l.B, l.T, l.heads, l.head_dim);
  SHARDLM_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, rows * l.head_dim * sizeof(float), stream));
  float scale = l.scale > 0 ? l.scale : 1.0f / std::sqrt(static_cast<float>(l.head_dim));
  float mask_value = std::numeric_limits<float>::lowest();
  float one = 1.0f;
  int32_t window = l.window;
  std::vector<int64_t> uids = {kQ,  kK,  kV,     kO,         kDO,         kStats,   kDQ,
                               kDK, kDV, kScale, kMaskValue, kSoftmaxSum, kDQAccum, kOne};
  std::vector<void*> ptrs = {at(qkv, l.q, l.dt),
                             at(qkv, l.k, l.dt),
                             at(qkv, l.v, l.dt),
                             const_cast<void*>(ctx),
                             const_cast<void*>(dctx),
                             const_cast<float*>(lse),
                             at(dqkv, l.q, l.dt),
                             at(dqkv, l.k, l.dt),
                             at(dqkv, l.v, l.dt),
                             &scale,
                             &mask_value,
                             softmax_sum,
                             dq_accum,
                             &one};
  add_optional_inputs(l, slopes, bias, &window, uids, ptrs);
  execute(static_cast<cudnnHandle_t>(handle_), *p.backward.plan, uids, ptrs, engine_workspace, stream);
}

}  // namespace shardlm::cuda

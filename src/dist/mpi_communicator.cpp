// The MPI implementation of the collective interface, with bf16/fp16 reductions in their own dtype.
#include <climits>

#include "shardlm/dist.hpp"

namespace shardlm {

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(concat(what, " failed: ", std::string(msg, len)));
}

namespace {

int mpi_count(size_t count, const char* what) {
  SHARDLM_CHECK(count <= static_cast<size_t>(INT_MAX), "MPI ", what, " of ", count,
                " elements exceeds MPI's int count limit");
  return static_cast<int>(count);
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float), bool IsMax>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = Load(a[i]), y = Load(b[i]);
    b[i] = Store(IsMax ? (x > y ? x : y) : x + y);
  }
}

}  // namespace

void Communicator::reduce_pieces(void* buf, const std::vector<size_t>& offsets, const std::vector<size_t>& counts,
                                 DType dtype, ReduceOp op) {
  SHARDLM_CHECK(offsets.size() == static_cast<size_t>(size()) && counts.size() == offsets.size(),
                "reduce_pieces: ", offsets.size(), " offsets and ", counts.size(), " counts for ", size(), " ranks");
  char* base = static_cast<char*>(buf);
  group_begin();
  for (int q = 0; q < size(); ++q) {
    if (counts[q] == 0) continue;
    void* piece = base + offsets[q] * dtype_size(dtype);
    reduce(piece, piece, counts[q], dtype, op, q);
  }
  group_end();
}

MPI_Datatype mpi_datatype(DType t) { return t == DType::F32 ? MPI_FLOAT : MPI_UINT16_T; }

// User-defined MPI ops for 16-bit floats, created once per process.
MPI_Op mpi_reduce_op(DType t, ReduceOp op) {
  if (t == DType::F32) return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
  static MPI_Op ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};
  int ti = t == DType::BF16 ? 0 : 1, oi = op == ReduceOp::Sum ? 0 : 1;
  if (ops[ti][oi] == MPI_OP_NULL) {
    MPI_User_function* fn = nullptr;
    if (t == DType::BF16)
      fn = op == ReduceOp::Sum ? reduce16<bf16_to_float, float_to_bf16, false>
                               : reduce16<bf16_to_float, float_to_bf16, true>;
    else
      fn = op == ReduceOp::Sum ? reduce16<fp16_to_float, float_to_fp16, false>
                               : reduce16<fp16_to_float, float_to_fp16, true>;
    check_mpi(MPI_Op_create(fn, 1, &ops[ti][oi]), "MPI Op_create");
  }
  return ops[ti][oi];
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&comm_);
}

void MpiCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  int n = mpi_count(count, "all-gather");
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
    return;
  }
  // In place (send is this rank's piece of recv, as NCCL allows): MPI says so with MPI_IN_PLACE.
  const bool in_place = send == static_cast<const char*>(recv) + static_cast<size_t>(rank_) * count * dtype_size(dtype);
  check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, mpi_datatype(dtype), recv, n, mpi_datatype(dtype), comm_),
            "MPI all-gather");
}

void MpiCommunicator::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  const int n = mpi_count(count, "all-to-all");
  check_mpi(MPI_Alltoall(send, n, mpi_datatype(dtype), recv, n, mpi_datatype(dtype), comm_), "MPI all-to-all");
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                     ReduceOp op) {
  int n = mpi_count(count, "reduce-scatter");
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
    return;
  }
  // In place (recv is this rank's piece of send, as NCCL allows): MPI_IN_PLACE leaves the piece at the
  // buffer's start, from where it moves to the rank's place.
  const size_t piece = count * dtype_size(dtype);
  char* whole = const_cast<char*>(static_cast<const char*>(send));
  if (recv == whole + static_cast<size_t>(rank_) * piece) {
    check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, whole, n, mpi_datatype(dtype), mpi_reduce_op(dtype, op), comm_),
              "MPI reduce-scatter");
    if (rank_ != 0) std::memmove(recv, whole, piece);
    return;
  }
  check_mpi(MPI_Reduce_scatter_block(send, recv, n, mpi_datatype(dtype), mpi_reduce_op(dtype, op), comm_),
            "MPI reduce-scatter");
}

void MpiCommunicator::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  int n = mpi_count(count, "all-reduce");
  if (size_ == 1) return;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, n, mpi_datatype(dtype), mpi_reduce_op(dtype, op), comm_),
            "MPI all-reduce");
}

void MpiCommunicator::reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) {
  int n = mpi_count(count, "reduce");
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
    return;
  }
  // In place on the root (recv == send, as NCCL allows).
  const void* from = rank_ == root && send == recv ? MPI_IN_PLACE : send;
  check_mpi(MPI_Reduce(from, rank_ == root ? recv : nullptr, n, mpi_datatype(dtype), mpi_reduce_op(dtype, op), root, comm_),
            "MPI reduce");
}

void MpiCommunicator::broadcast(void* buf, size_t count, DType dtype, int root) {
  int n = mpi_count(count, "broadcast");
  if (size_ == 1) return;
  check_mpi(MPI_Bcast(buf, n, mpi_datatype(dtype), root, comm_), "MPI broadcast");
}

double MpiCommunicator::host_sum(double v) const {
  double sum = 0.0;
  check_mpi(MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, comm_), "MPI host_sum");
  return sum;
}

}  // namespace shardlm

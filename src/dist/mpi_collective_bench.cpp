// The collective benchmark on MPI: MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce and
// MPI_Bcast on a group's communicator, called directly (even on one rank, where MpiCommunicator
// takes a shortcut), each iteration timed with the host clock.
#include <climits>
#include <cstring>

#include "shardlm/dist.hpp"

namespace shardlm {

namespace {

class MpiCollectiveBench : public CollectiveBench {
 public:
  MpiCollectiveBench(const MpiCommunicator& group, size_t max_bytes)
      : comm_(group.comm()), rank_(group.rank()), size_(group.size()), max_bytes_(max_bytes) {
    const size_t piece_bytes = collective_bench_buffer_bytes(max_bytes, size_) - max_bytes;
    whole_.allocate(max_bytes, MemKind::Comm);
    piece_.allocate(piece_bytes, MemKind::Comm);
  }

  CollectiveTimes run(Collective c, const CollectiveShape& shape, const CollectiveBenchSettings& s) override {
    SHARDLM_CHECK(shape.bytes <= max_bytes_, "comm-test: ", shape.bytes, " bytes exceed the bench's buffers (",
                  max_bytes_, ")");
    SHARDLM_CHECK(shape.piece <= static_cast<size_t>(INT_MAX), "comm-test: ", collective_name(c), " of ",
                  shape.piece, " elements exceeds MPI's int count limit; lower --max-bytes");
    const int n = static_cast<int>(shape.piece);
    const MPI_Datatype type = mpi_datatype(s.dtype);
    const MPI_Op op = mpi_reduce_op(s.dtype, ReduceOp::Sum);
    void* whole = whole_.data();
    void* piece = piece_.data();
    auto once = [&] {
      switch (c) {
        case Collective::AllGather:
          check_mpi(MPI_Allgather(piece, n, type, whole, n, type, comm_), "MPI_Allgather");
          break;
        case Collective::ReduceScatter:
          check_mpi(MPI_Reduce_scatter_block(whole, piece, n, type, op, comm_), "MPI_Reduce_scatter_block");
          break;
        case Collective::AllReduce:
          // In place, as the engine calls it; the timed runs keep summing (values grow, speed does not change).
          check_mpi(MPI_Allreduce(MPI_IN_PLACE, whole, n, type, op, comm_), "MPI_Allreduce");
          break;
        case Collective::Broadcast:
          check_mpi(MPI_Bcast(whole, n, type, s.root, comm_), "MPI_Bcast");
          break;
      }
    };

    CollectiveTimes out;
    if (s.check) out.wrong = check_run(c, shape, s, once);
    for (int i = 0; i < s.warmup; ++i) once();
    MPI_Barrier(comm_);
    out.iteration_us.reserve(static_cast<size_t>(s.iters));
    for (int i = 0; i < s.iters; ++i) {
      Timer t;
      once();
      out.iteration_us.push_back(t.seconds() * 1e6);
      if (s.progress) s.progress(i + 1, s.iters);
    }
    return out;
  }

 private:
  // Fills the input with the pattern (the output with NaN bits), runs once, counts wrong elements.
  template <typename Once>
  size_t check_run(Collective c, const CollectiveShape& shape, const CollectiveBenchSettings& s, Once& once) {
    const CollectiveCheckLayout l = collective_check_layout(c, shape);
    void* input = l.input_is_piece ? piece_.data() : whole_.data();
    void* output = l.output_is_piece ? piece_.data() : whole_.data();
    if (!l.in_place) std::memset(output, 0xff, l.out_count * dtype_size(s.dtype));
    fill_collective_input(c, s.dtype, rank_, size_, s.root, 0, input, l.in_count);
    once();
    return count_collective_wrong(c, s.dtype, rank_, size_, s.root, shape.piece, 0, output, l.out_count);
  }

  MPI_Comm comm_;
  int rank_;
  int size_;
  size_t max_bytes_;
  Buffer<uint8_t> whole_;  // the largest buffer: all_gather's output, reduce_scatter's input, all_reduce, broadcast
  Buffer<uint8_t> piece_;  // one rank's piece: all_gather's input, reduce_scatter's output
};

}  // namespace

std::unique_ptr<CollectiveBench> make_mpi_collective_bench(const MpiCommunicator& group, size_t max_bytes) {
  return std::make_unique<MpiCollectiveBench>(group, max_bytes);
}

}  // namespace shardlm

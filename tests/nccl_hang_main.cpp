// Run by test_nccl under mpirun -np 2: rank 1 never joins the all-reduce, so rank 0 must time out
// (3 s) and end the job with a message naming the group, instead of hanging: in the all-reduce call
// itself when its first use of the connection to rank 1 needs rank 1, else in the wait.
#include <unistd.h>

#include <cstdio>

#include "cuda_check.hpp"
#include "nccl_communicator.hpp"

int main(int argc, char** argv) {
  using namespace shardlm;
  MPI_Init(&argc, &argv);
  try {
    const Topology topo = make_topology(MPI_COMM_WORLD, 0);
    cuda::select_device(topo);
    cudaStream_t stream;
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cuda::NcclCommunicator world(MPI_COMM_WORLD, stream, 3.0, "world");
    float* buf = nullptr;
    SHARDLM_CUDA_CHECK(cudaMalloc(&buf, 1024 * sizeof(float)));
    if (topo.world_rank == 0) {
      world.all_reduce(buf, 1024, DType::F32, ReduceOp::Sum);
      world.wait();  // never returns: the watchdog aborts the job
      std::fprintf(stderr, "the hung all-reduce returned\n");
    } else {
      sleep(60);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  return 4;
}

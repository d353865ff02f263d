// Run by test_checkpoint under mpirun: writes checkpoint step 1, then step 2 with
// SHARDLM_FAULT_CHECKPOINT=after_units:2, which must kill every rank (exit code 86) mid-write.
#include <cstdio>
#include <cstdlib>

#include "checkpoint_test_model.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_fault_main DIR\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const shardlm::ModelConfig cfg = ckpt_test::tiny_bloom();
  const ckpt_test::Sharded state = ckpt_test::make_sharded(cfg, world, rank, true);
  try {
    shardlm::save_checkpoint(argv[1], 0, ckpt_test::tiny_meta(cfg, 1, world), state.units, MPI_COMM_WORLD);
    setenv("SHARDLM_FAULT_CHECKPOINT", "after_units:2", 1);
    shardlm::save_checkpoint(argv[1], 0, ckpt_test::tiny_meta(cfg, 2, world), state.units, MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  // Reaching this point means the fault was not injected.
  std::fprintf(stderr, "rank %d: the second checkpoint completed\n", rank);
  MPI_Finalize();
  return 4;
}

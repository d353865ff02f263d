// Run by test_checkpoint under mpirun: writes checkpoint step 1, then step 2 with
// SHARDLM_FAULT_CHECKPOINT set to FAULT (default after_units:2, which must kill every rank with exit
// code 86 mid-write). With any other fault (write_error:RANK:PIECE, reserve_error) or "none" (a
// real failure, such as a full disk), the second write must fail on every rank: rank 0 prints the
// agreed message as shardlm's main does and the program exits 1 through MPI_Finalize.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint_test_model.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_fault_main DIR [FAULT]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const std::string fault = argc == 3 ? argv[2] : "after_units:2";
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const shardlm::ModelConfig cfg = ckpt_test::tiny_bloom();
  const ckpt_test::Sharded state = ckpt_test::make_sharded(cfg, world, rank, true);
  int code = 4;  // the second checkpoint completed: the fault was not injected
  try {
    shardlm::save_checkpoint(argv[1], 0, ckpt_test::tiny_meta(cfg, 1, world), state.units, MPI_COMM_WORLD);
    if (fault != "none") setenv("SHARDLM_FAULT_CHECKPOINT", fault.c_str(), 1);
    shardlm::save_checkpoint(argv[1], 0, ckpt_test::tiny_meta(cfg, 2, world), state.units, MPI_COMM_WORLD);
  } catch (const shardlm::AgreedError& e) {
    if (rank == 0) std::fprintf(stderr, "shardlm: error: %s\n", e.what());
    code = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: not agreed: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  if (code == 4 && rank == 0) std::fprintf(stderr, "the second checkpoint completed\n");
  MPI_Finalize();
  return code;
}

// Boost.Test global fixture that brackets a suite with MPI_Init / MPI_Finalize.
#pragma once

#include <mpi.h>

#include <boost/test/unit_test.hpp>

#include "shardlm/core.hpp"

struct MpiFixture {
  MpiFixture() {
    MPI_Init(nullptr, nullptr);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    shardlm::set_log_rank(rank);
  }
  ~MpiFixture() { MPI_Finalize(); }
};
BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

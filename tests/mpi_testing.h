// MPI for test binaries: the first test that asks for a communicator starts one MpiSession, which
// lives until the process exits. Tests that never ask never touch MPI (and may spawn processes).
#pragma once

#include <mpi.h>

#include "parallel/mpi.h"

namespace tessera::testing {

// MPI_COMM_WORLD: one rank under plain ctest, several under `mpiexec -n N`.
inline MPI_Comm test_world() {
  static MpiSession session;
  return MPI_COMM_WORLD;
}

}  // namespace tessera::testing

// GridComms: one MpiCommunicator per group of a ProcessGrid (tp, cp, dp, pp, dp x cp), split from
// the world communicator the caller passes in; no global communicators.
#pragma once

#include <mpi.h>

#include "parallel/communicator.h"
#include "parallel/process_grid.h"
#include "parallel/watchdog.h"

namespace tessera {

// Collective over world (every rank constructs it, in the same order as other collectives). The
// rank of this process in each communicator is its position in the grid's matching group, e.g.
// tp.rank() == grid.tp_rank() and dp_cp.rank() == cp_rank + cp x dp_rank.
struct GridComms {
  GridComms(const ProcessGrid& grid, MPI_Comm world);

  // Every wait on these communicators is reported to watchdog, which must outlive them, under the
  // group's name and world ranks (grid: the one they were built from), allowed allowance_s each.
  // Groups of one rank wait on nobody and stay unwatched.
  void watch(Watchdog& watchdog, const ProcessGrid& grid, double allowance_s);

  MpiCommunicator tp, cp, dp, pp, dp_cp;
};

}  // namespace tessera

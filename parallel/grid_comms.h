// GridComms: one Communicator per group of a ProcessGrid (tp, cp, dp, pp, dp x cp, tp x cp,
// embedding, world), whatever the backend; a backend's factory builds it (MPI: mpi_grid_comms in
// parallel/mpi_communicator.h). No global communicators: its owner passes them where needed.
#pragma once

#include <memory>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/process_grid.h"
#include "parallel/watchdog.h"

namespace tessera {

// The rank of this process in each communicator is its position in the grid's matching group
// (process_grid.h), e.g. tp->rank() == grid.tp_rank(). Groups of one rank are communicators of
// size 1: their ops complete at once, so callers need not special-case them.
struct GridComms {
  std::unique_ptr<Communicator> tp;     // tensor parallel: the layers' region mappings
  std::unique_ptr<Communicator> cp;     // context parallel: the attention ring over sequence chunks
  std::unique_ptr<Communicator> dp;     // data parallel: the replicas (sums over the batch, ZeRO-1)
  std::unique_ptr<Communicator> pp;     // pipeline: the stages, in order (point-to-point)
  std::unique_ptr<Communicator> dp_cp;  // the gradient reduction: every replica and every chunk
  std::unique_ptr<Communicator> tp_cp;  // one stage of one replica: all heads and all chunks
  std::unique_ptr<Communicator> embedding;  // first and last stage: the tied embedding's gradient
  std::unique_ptr<Communicator> world;      // every rank: sums of scalars (votes, counts)

  // The communicators built, in the order above (for profilers, counters).
  std::vector<Communicator*> all() const;

  // Every wait on these communicators is reported to watchdog, which must outlive them, under the
  // group's name and world ranks (grid: the one they were built from), allowed allowance_s each.
  // Groups of one rank wait on nobody and stay unwatched.
  void watch(Watchdog& watchdog, const ProcessGrid& grid, double allowance_s);
};

// One group of a grid as GridComms holds it: the name the watchdog reports ("dp x cp group"), its
// member, and this rank's instance as world ranks (ascending: position i is rank i of the
// communicator).
struct GridGroup {
  const char* name;
  std::unique_ptr<Communicator> GridComms::*member;
  std::vector<int64_t> world_ranks;
};

// Every group of grid, in GridComms' member order: the order in which a factory creates them (the
// same on every rank, as collective creation needs).
std::vector<GridGroup> grid_groups(const ProcessGrid& grid);

}  // namespace tessera

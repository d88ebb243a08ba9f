// Tests parallel/host_sums.h: on one rank (no groups) nothing changes; under mpiexec -n 2 and -n 4
// (ctest HostSums.*_ranks) sum_over_grid sums over every rank of a grid whatever its layout, and
// sum_over_group over its group only.
#include "parallel/host_sums.h"

#include <gtest/gtest.h>

#include <vector>

#include "mpi_testing.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_grid.h"

namespace tessera {
namespace {

TEST(HostSums, OneRankOrAGroupOfOneLeavesTheValues) {
  std::vector<double> v = {1.5, -2.0};
  sum_over_grid(v, nullptr);
  sum_over_group(v, nullptr);
  EXPECT_EQ(v, (std::vector<double>{1.5, -2.0}));
}

TEST(HostSums, GridSumCoversEveryRankOfEveryLayout) {
  const MPI_Comm world = testing::test_world();
  const int64_t n = comm_size(world), rank = comm_rank(world);
  std::vector<GridDegrees> layouts = {{.tp = 1, .dp = n}, {.tp = n, .dp = 1}};
  if (n == 4) layouts.insert(layouts.end(), {{.tp = 2, .dp = 2}, {.tp = 2, .pp = 2, .dp = 1}, {.cp = 2, .dp = 2}});
  for (const GridDegrees& deg : layouts) {
    const ProcessGrid grid(deg, n, rank);
    GridComms comms = mpi_grid_comms(grid, world);
    std::vector<double> v = {1.0, static_cast<double>(rank)};
    sum_over_grid(v, &comms);
    EXPECT_EQ(v, (std::vector<double>{static_cast<double>(n), static_cast<double>(n * (n - 1) / 2)}))
        << "tp " << deg.tp << ", cp " << deg.cp << ", pp " << deg.pp;
    std::vector<double> d = {1.0};
    sum_over_group(d, comms.dp.get());
    EXPECT_EQ(d[0], static_cast<double>(grid.dp_size()));
  }
}

}  // namespace
}  // namespace tessera

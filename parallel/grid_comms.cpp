// GridComms: MPI_Comm_split per group, colored by the group's lowest world rank (unique per group)
// and keyed by world rank, so the ranks inside a communicator follow the grid's group order.
#include "parallel/grid_comms.h"

#include <vector>

#include "parallel/mpi.h"

namespace tessera {

namespace {

MpiCommunicator split_group(MPI_Comm world, const std::vector<int64_t>& group, int64_t world_rank) {
  return MpiCommunicator::split(world, static_cast<int>(group.front()), static_cast<int>(world_rank));
}

const ProcessGrid& check_world(const ProcessGrid& grid, MPI_Comm world) {
  TESSERA_CHECK(comm_size(world) == grid.world_size() && comm_rank(world) == grid.rank(), "GridComms: the grid is for rank ",
                grid.rank(), " of ", grid.world_size(), ", but this is rank ", comm_rank(world), " of ", comm_size(world));
  return grid;
}

}  // namespace

GridComms::GridComms(const ProcessGrid& grid, MPI_Comm world)
    : tp(split_group(world, check_world(grid, world).tp_group(), grid.rank())),
      cp(split_group(world, grid.cp_group(), grid.rank())),
      dp(split_group(world, grid.dp_group(), grid.rank())),
      pp(split_group(world, grid.pp_group(), grid.rank())),
      dp_cp(split_group(world, grid.dp_cp_group(), grid.rank())) {}

void GridComms::watch(Watchdog& watchdog, const ProcessGrid& grid, double allowance_s) {
  struct Group {
    MpiCommunicator& comm;
    const std::vector<int64_t>& world_ranks;
    const char* name;
  };
  const Group groups[] = {{tp, grid.tp_group(), "tp group"},
                          {cp, grid.cp_group(), "cp group"},
                          {dp, grid.dp_group(), "dp group"},
                          {pp, grid.pp_group(), "pp group"},
                          {dp_cp, grid.dp_cp_group(), "dp x cp group"}};
  for (const Group& g : groups) {
    TESSERA_CHECK(g.comm.size() == static_cast<int>(g.world_ranks.size()), "GridComms::watch: the ", g.name, " has ",
                  g.comm.size(), " ranks, but the grid's has ", g.world_ranks.size());
    if (g.comm.size() > 1) g.comm.set_wait_slot(&watchdog.add_slot(g.name, g.world_ranks, allowance_s));
  }
}

}  // namespace tessera

// GridComms: the table of a grid's groups (shared by every backend's factory and by watch), and
// putting each group under a watchdog.
#include "parallel/grid_comms.h"

#include <numeric>

#include "kernels/check.h"

namespace tessera {

std::vector<GridGroup> grid_groups(const ProcessGrid& grid) {
  std::vector<int64_t> everyone(static_cast<size_t>(grid.world_size()));
  std::iota(everyone.begin(), everyone.end(), int64_t{0});
  return {{"tp group", &GridComms::tp, grid.tp_group()},
          {"cp group", &GridComms::cp, grid.cp_group()},
          {"dp group", &GridComms::dp, grid.dp_group()},
          {"pp group", &GridComms::pp, grid.pp_group()},
          {"dp x cp group", &GridComms::dp_cp, grid.dp_cp_group()},
          {"tp x cp group", &GridComms::tp_cp, grid.tp_cp_group()},
          {"embedding group", &GridComms::embedding, grid.embedding_group()},
          {"world group", &GridComms::world, std::move(everyone)}};
}

std::vector<Communicator*> GridComms::all() const {
  std::vector<Communicator*> comms;
  for (Communicator* c : {tp.get(), cp.get(), dp.get(), pp.get(), dp_cp.get(), tp_cp.get(), embedding.get(), world.get()})
    if (c) comms.push_back(c);
  return comms;
}

void GridComms::watch(Watchdog& watchdog, const ProcessGrid& grid, double allowance_s) {
  for (GridGroup& g : grid_groups(grid)) {
    Communicator* comm = (this->*g.member).get();
    TESSERA_CHECK(comm, "GridComms::watch: the ", g.name, " has no communicator");
    TESSERA_CHECK(comm->size() == static_cast<int>(g.world_ranks.size()), "GridComms::watch: the ", g.name, " has ",
                  comm->size(), " ranks, but the grid's has ", g.world_ranks.size());
    if (comm->size() > 1) comm->set_wait_slot(&watchdog.add_slot(g.name, std::move(g.world_ranks), allowance_s));
  }
}

}  // namespace tessera

// Sums of a few host numbers over groups of ranks: the stop votes every rank must agree on, the
// step's loss and target counts. Small (tens of bytes), blocking, one all-reduce per call.
#pragma once

#include <vector>

#include "parallel/communicator.h"
#include "parallel/grid_comms.h"

namespace tessera {

// values summed element-wise over `group` (null: a group of one, nothing to do), in place.
void sum_over_group(std::vector<double>& values, Communicator* group);

// values summed element-wise over every rank of the grid, in place (null comms: one rank). Every
// rank must call it at the same point: the stop votes go through it. One all-reduce on the world
// communicator.
void sum_over_grid(std::vector<double>& values, GridComms* comms);

}  // namespace tessera

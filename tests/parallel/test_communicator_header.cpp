// Tests that the backend-neutral parallel headers stay free of <mpi.h>: this file includes them
// alone, and compiling it fails if MPI's header came with any of them (MPI_VERSION is the macro
// mpi.h defines). A NCCL or other backend, and the model code above parallel/, then build without
// MPI's headers.
#include "parallel/communicator.h"
#ifdef MPI_VERSION
#error "parallel/communicator.h includes <mpi.h>: the Communicator interface must stay backend-neutral"
#endif
#include "parallel/grid_comms.h"
#ifdef MPI_VERSION
#error "parallel/grid_comms.h includes <mpi.h>: GridComms must stay backend-neutral"
#endif
#include "parallel/tensor_parallel.h"
#ifdef MPI_VERSION
#error "parallel/tensor_parallel.h includes <mpi.h>: model/ includes it and must not need MPI"
#endif

#include <gtest/gtest.h>

#include <type_traits>

namespace tessera {
namespace {

// What a backend must provide is abstract in the interface; GridComms holds any backend's.
static_assert(std::is_abstract_v<Communicator>);
static_assert(std::is_abstract_v<CommRequest>);
static_assert(std::is_same_v<decltype(GridComms::world), std::unique_ptr<Communicator>>);

TEST(CommunicatorHeader, CompilesWithoutMpi) {
  const GridComms none;
  EXPECT_TRUE(none.all().empty());  // nothing built: no communicator to profile or count
}

}  // namespace
}  // namespace tessera

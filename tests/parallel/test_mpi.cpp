// Tests parallel/mpi.h: the session, rank/size, byte gathers and the all-ranks error agreement.
// Runs as one rank under ctest and again as `mpiexec -n 2` (tests/CMakeLists.txt).
#include "parallel/mpi.h"

#include <gtest/gtest.h>

#include "error_testing.h"
#include "kernels/check.h"
#include "mpi_testing.h"

namespace tessera {
namespace {

using testing::test_world;

TEST(Mpi, ASecondSessionLeavesMpiToTheFirst) {
  MPI_Comm comm = test_world();  // starts the test binary's session
  MpiSession inner;
  EXPECT_FALSE(inner.owns_mpi());
  EXPECT_GE(inner.thread_level(), MPI_THREAD_FUNNELED);
  EXPECT_GE(comm_size(comm), 1);
  EXPECT_LT(comm_rank(comm), comm_size(comm));
}

TEST(Mpi, GathersAndBroadcastsBytes) {
  MPI_Comm comm = test_world();
  const int rank = comm_rank(comm), size = comm_size(comm);
  const auto all = allgather_bytes(comm, std::string(static_cast<size_t>(rank), 'x') + std::to_string(rank));
  ASSERT_EQ(static_cast<int>(all.size()), size);
  for (int r = 0; r < size; ++r) EXPECT_EQ(all[static_cast<size_t>(r)], std::string(static_cast<size_t>(r), 'x') + std::to_string(r));
  EXPECT_EQ(broadcast_bytes(comm, rank == 0 ? "from rank 0" : "ignored", 0), "from rank 0");
  EXPECT_EQ(broadcast_bytes(comm, "", 0), "");
}

TEST(Mpi, EveryRankThrowsTheLowestFailingRanksMessage) {
  MPI_Comm comm = test_world();
  const int rank = comm_rank(comm), size = comm_size(comm);
  EXPECT_NO_THROW(throw_if_any_failed(comm, ""));
  // The last rank fails (and, with 3 or more ranks, rank 1 too: the lower one wins).
  const std::string mine = rank == size - 1 || rank == 1 ? "rank " + std::to_string(rank) + " failed" : "";
  const int expected = size >= 2 ? 1 : 0;
  EXPECT_EQ(testing::error_of([&] { throw_if_any_failed(comm, mine); }), "rank " + std::to_string(expected) + " failed");
}

}  // namespace
}  // namespace tessera

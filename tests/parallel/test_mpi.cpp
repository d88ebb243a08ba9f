// Tests parallel/mpi.h: the session, rank/size, byte gathers, the all-ranks error agreement, the
// node's CPUs and how ranks wait (spin or yield).
// Runs as one rank under ctest and again as `mpiexec -n 2` (tests/CMakeLists.txt).
#include "parallel/mpi.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

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

// Ranks x threads against the CPUs: yield only where they outnumber the CPUs (0 threads or CPUs
// count as 1).
TEST(Mpi, WaitsYieldOnlyWhereRanksOutnumberTheCpus) {
  EXPECT_EQ(mpi_wait_for(1, 1, 1), MpiWait::Spin);
  EXPECT_EQ(mpi_wait_for(2, 1, 2), MpiWait::Spin);
  EXPECT_EQ(mpi_wait_for(8, 2, 16), MpiWait::Spin);
  EXPECT_EQ(mpi_wait_for(4, 1, 2), MpiWait::Yield);   // 4 ranks on 2 cores
  EXPECT_EQ(mpi_wait_for(2, 2, 2), MpiWait::Yield);   // 2 ranks of 2 threads on 2 cores
  EXPECT_EQ(mpi_wait_for(9, 2, 16), MpiWait::Yield);
  EXPECT_EQ(mpi_wait_for(2, 0, 2), MpiWait::Spin);
  EXPECT_EQ(mpi_wait_for(2, 1, 0), MpiWait::Yield);
  EXPECT_STREQ(to_string(MpiWait::Spin), "spin");
  EXPECT_STREQ(to_string(MpiWait::Yield), "yield");
}

// Every test rank runs on this host: the node holds them all, and the CPUs they may run on are
// at least this rank's own.
TEST(Mpi, NodeCpusCountThisNodesRanksAndTheirCpus) {
  MPI_Comm comm = test_world();
  const NodeCpus node = node_cpus(comm);
  EXPECT_EQ(node.ranks_on_node, comm_size(comm));
  EXPECT_GE(node.cpus_allowed, 1);
  EXPECT_GE(node.cpus_of_node_ranks, node.cpus_allowed);
  EXPECT_EQ(mpi_wait_on_this_node(comm, 1), mpi_wait_for(node.ranks_on_node, 1, node.cpus_of_node_ranks));
  EXPECT_EQ(mpi_wait_on_this_node(comm, 1 << 20), MpiWait::Yield);  // more threads than any machine's CPUs
}

// parallel.mpi_wait: spin and yield as said, auto as the node says; anything else is an error
// naming the key and the values it takes.
TEST(Mpi, ResolveMpiWaitTakesTheSettingOrAsksTheNode) {
  MPI_Comm comm = test_world();
  EXPECT_EQ(resolve_mpi_wait("spin", comm, 1 << 20), MpiWait::Spin);
  EXPECT_EQ(resolve_mpi_wait("yield", comm, 1), MpiWait::Yield);
  EXPECT_EQ(resolve_mpi_wait("auto", comm, 1), mpi_wait_on_this_node(comm, 1));
  EXPECT_EQ(testing::error_of([&] { resolve_mpi_wait("fast", comm, 1); }),
            "parallel.mpi_wait = \"fast\": expected auto, spin or yield");
}

// barrier() returns on no rank before the last has entered it, waited for either way: rank 0
// enters 30 ms late, and every rank leaves after that (steady_clock: one clock for the host's
// processes).
TEST(Mpi, BarrierHoldsEveryRankUntilTheLastEntersEitherWay) {
  MPI_Comm comm = test_world();
  const int rank = comm_rank(comm);
  for (const MpiWait how : {MpiWait::Spin, MpiWait::Yield}) {
    barrier(comm, how);
    using clock = std::chrono::steady_clock;
    int64_t entered = 0;
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      entered = clock::now().time_since_epoch().count();
    }
    barrier(comm, how);
    const int64_t left = clock::now().time_since_epoch().count();
    check_mpi(MPI_Bcast(&entered, 1, MPI_INT64_T, 0, comm), "MPI_Bcast");
    EXPECT_GE(left, entered) << to_string(how);
  }
}

// wait_requests completes nonblocking requests either way: a ring of 4-byte messages.
TEST(Mpi, WaitRequestsCompletesARingEitherWay) {
  MPI_Comm comm = test_world();
  const int rank = comm_rank(comm), size = comm_size(comm);
  for (const MpiWait how : {MpiWait::Spin, MpiWait::Yield}) {
    int mine = 100 + rank, theirs = -1;
    MPI_Request r[2];
    check_mpi(MPI_Irecv(&theirs, 1, MPI_INT, (rank + size - 1) % size, 3, comm, &r[0]), "MPI_Irecv");
    check_mpi(MPI_Isend(&mine, 1, MPI_INT, (rank + 1) % size, 3, comm, &r[1]), "MPI_Isend");
    wait_requests(how, 2, r);
    EXPECT_EQ(theirs, 100 + (rank + size - 1) % size) << to_string(how);
    EXPECT_EQ(r[0], MPI_REQUEST_NULL);
    EXPECT_EQ(r[1], MPI_REQUEST_NULL);
  }
}

}  // namespace
}  // namespace tessera

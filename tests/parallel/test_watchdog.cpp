// Tests parallel/watchdog.h: a wait past its allowance is reported once, naming the op, its size,
// the group's world ranks, this rank and the peers; waits that end in time are not, however many;
// the per-wait cost. With 2 ranks (Watchdog.two_ranks, tests/CMakeLists.txt), a real MPI collective
// and a receive whose peer sleeps past the allowance are reported on the waiting rank only;
// GridComms::watch covers every group of several ranks. The reports go to a recorder here, not to
// MPI_Abort, so the test binary lives on.
#include "parallel/watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/check.h"
#include "mpi_testing.h"
#include "parallel/grid_comms.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_grid.h"
#include "parallel/mpi.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

// The reports a watchdog hands over, kept for the test instead of ending the job.
class Recorder {
 public:
  Watchdog::OnTimeout callback() {
    return [this](const std::string& report) {
      std::lock_guard lock(mutex_);
      reports_.push_back(report);
    };
  }
  std::vector<std::string> reports() {
    std::lock_guard lock(mutex_);
    return reports_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> reports_;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Watchdog, ReportsAWaitPastItsAllowanceOnce) {
  Recorder rec;
  Watchdog dog(3, rec.callback());
  WaitSlot& slot = dog.add_slot("dp group", {1, 3, 5}, 0.2);
  {
    WatchedWait wait(&slot, "all_reduce", 4 << 20);
    std::this_thread::sleep_for(700ms);  // more than 3 allowances: still one report
  }
  std::this_thread::sleep_for(100ms);
  const auto reports = rec.reports();
  ASSERT_EQ(reports.size(), 1u);
  const std::string& r = reports[0];
  EXPECT_TRUE(contains(r, "world rank 3 waited 0.")) << r;
  EXPECT_TRUE(contains(r, "(allowed 0.2 s, since ")) << r;
  EXPECT_TRUE(contains(r, "in all_reduce of 4.00 MiB on the dp group (world ranks 1, 3, 5)")) << r;
  EXPECT_TRUE(contains(r, "for world ranks 1, 5, one of which has not come (stopped, hung or dead)")) << r;
}

TEST(Watchdog, WaitsThatEndInTimeAreNotReportedHoweverMany) {
  Recorder rec;
  Watchdog dog(0, rec.callback());
  WaitSlot& slot = dog.add_slot("tp group", {0, 1}, 0.2);
  for (int i = 0; i < 30; ++i) {  // 0.6 s of waiting in all, 20 ms at a time
    WatchedWait wait(&slot, "all_gather", 64);
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(300ms);  // idle past the allowance: nothing is waiting
  EXPECT_TRUE(rec.reports().empty()) << rec.reports()[0];
}

TEST(Watchdog, PointToPointNamesThePeerAndOtherWaitsInFlight) {
  Recorder rec;
  Watchdog dog(1, rec.callback());
  WaitSlot& pp = dog.add_slot("pp group", {1, 5}, 0.2);
  WaitSlot& ckpt = dog.add_slot("world group", {0, 1, 5}, 100.0);
  std::thread writer([&] {
    WatchedWait wait(&ckpt, "checkpoint save");
    std::this_thread::sleep_for(600ms);
  });
  {
    WatchedWait wait(&pp, "recv", 1024, /*peer=*/1);
    std::this_thread::sleep_for(500ms);
  }
  writer.join();
  const auto reports = rec.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(contains(reports[0], "world rank 1 waited")) << reports[0];
  EXPECT_TRUE(contains(reports[0], "in recv of 1.00 KiB on the pp group (world ranks 1, 5) for world rank 5, which "
                                   "has not come")) << reports[0];
  EXPECT_TRUE(contains(reports[0], "; also waiting 0.")) << reports[0];
  EXPECT_TRUE(contains(reports[0], " in checkpoint save on the world group")) << reports[0];
}

TEST(Watchdog, RefusesAnAllowanceThatIsNotPositive) {
  Recorder rec;
  Watchdog dog(0, rec.callback());
  for (double bad : {0.0, -1.0, -std::numeric_limits<double>::infinity(), std::nan("")})
    EXPECT_THROW(dog.add_slot("dp group", {0, 1}, bad), Error) << bad;
  // Huge allowances mean never, without overflowing the nanoseconds.
  EXPECT_DOUBLE_EQ(dog.add_slot("dp group", {0, 1}, std::numeric_limits<double>::infinity()).allowance_s(), 1e9);
  EXPECT_DOUBLE_EQ(dog.add_slot("dp group", {0, 1}, 1e300).allowance_s(), 1e9);
}

// What a watched wait adds to a collective: one steady-clock read and a few atomic stores. Measured
// about 20-40 ns here; a collective takes microseconds at the least (MPI_Iallreduce of 4 bytes
// between two ranks on one node: ~1-5 us), so the bound of 1 us leaves room for a loaded machine.
TEST(Watchdog, AWatchedWaitCostsLessThanAMicrosecond) {
  Recorder rec;
  Watchdog dog(0, rec.callback());
  WaitSlot& slot = dog.add_slot("dp group", {0, 1}, 600.0);
  constexpr int kWaits = 1'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kWaits; ++i) WatchedWait wait(&slot, "all_reduce", i);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kWaits;
  std::printf("[ cost     ] %.1f ns per watched wait\n", ns);
  EXPECT_LT(ns, 1000.0);
  EXPECT_TRUE(rec.reports().empty());
}

// Under mpiexec -n 2: rank 1 arrives 1.5 s late with a 0.3 s allowance, at a blocking all-reduce,
// an asynchronous one waited on through its handle, and a receive. Rank 0 reports each wait once
// (naming itself and rank 1), rank 1 none, and the ops still complete correctly (the recorder
// does not end anything). One rank alone (plain ctest) has nobody to wait for: skipped.
TEST(Watchdog, TwoRanksTheOneWaitingForALatePeerReports) {
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  if (comm.size() != 2) GTEST_SKIP() << "needs exactly 2 ranks (Watchdog.two_ranks under mpiexec)";
  Recorder rec;
  Watchdog dog(comm.rank(), rec.callback());
  comm.set_wait_slot(&dog.add_slot("test group", {0, 1}, 0.3));
  const bool late = comm.rank() == 1;
  auto arrive = [&] {
    if (late) std::this_thread::sleep_for(1500ms);
  };

  std::vector<double> x = {static_cast<double>(comm.rank() + 1)};
  arrive();
  comm.all_reduce(Tensor(x.data(), DType::F64, {1}));
  EXPECT_EQ(x[0], 3.0);

  std::vector<float> y(1024, 1.0f);
  CommHandle h = comm.all_reduce_async(Tensor(y.data(), DType::F32, {1024}));
  arrive();
  h.wait();
  EXPECT_EQ(y[0], 2.0f);

  std::vector<float> z(16, static_cast<float>(comm.rank()));
  arrive();
  if (late) {
    comm.send(Tensor(z.data(), DType::F32, {16}), 0);
  } else {
    comm.recv(Tensor(z.data(), DType::F32, {16}), 1);
    EXPECT_EQ(z[0], 1.0f);
  }
  throw_if_any_failed(comm.comm(), "");  // both ranks are done before the reports are read

  const auto reports = rec.reports();
  if (late) {
    EXPECT_TRUE(reports.empty()) << reports[0];
    return;
  }
  ASSERT_EQ(reports.size(), 3u);
  for (const auto& r : reports) EXPECT_TRUE(contains(r, "world rank 0 waited")) << r;
  EXPECT_TRUE(contains(reports[0], "in all_reduce of 8 B on the test group (world ranks 0, 1) for world rank 1, which "
                                   "has not come")) << reports[0];
  EXPECT_TRUE(contains(reports[1], "in all_reduce of 4.00 KiB on the test group")) << reports[1];
  EXPECT_TRUE(contains(reports[2], "in recv of 64 B on the test group (world ranks 0, 1) for world rank 1")) << reports[2];
}

// GridComms::watch puts every group of several ranks under the watchdog, named after the group and
// with the grid's world ranks; groups of one wait on nobody and stay unwatched. Under 2 ranks each
// layout watches exactly three groups (one rank: none).
TEST(Watchdog, GridCommsWatchEveryGroupOfSeveralRanks) {
  MPI_Comm world = testing::test_world();
  const int64_t p = comm_size(world), r = comm_rank(world);
  Recorder rec;
  Watchdog dog(r, rec.callback());
  const std::vector<std::pair<GridDegrees, std::vector<std::string>>> layouts = {
      {{}, {"dp group", "dp x cp group", "world group"}},
      {{.tp = 2}, {"tp group", "tp x cp group", "world group"}},
      {{.pp = 2}, {"pp group", "embedding group", "world group"}}};
  for (const auto& [d, two_rank_groups] : layouts) {
    if (p % (d.tp * d.cp * d.pp) != 0) continue;
    const ProcessGrid grid(d, p, r);
    GridComms comms = mpi_grid_comms(grid, world);
    comms.watch(dog, grid, 600.0);
    std::vector<std::string> watched;
    for (const GridGroup& g : grid_groups(grid)) {
      const WaitSlot* slot = (comms.*g.member)->wait_slot();
      if (g.world_ranks.size() == 1) {
        EXPECT_EQ(slot, nullptr) << g.name;
        continue;
      }
      ASSERT_NE(slot, nullptr) << g.name;
      EXPECT_EQ(slot->group(), g.name);
      EXPECT_EQ(slot->world_ranks(), g.world_ranks) << g.name;
      watched.push_back(slot->group());
    }
    if (p == 1) {
      EXPECT_TRUE(watched.empty());
    } else if (p == 2) {
      EXPECT_EQ(watched, two_rank_groups);
    }
  }
  EXPECT_TRUE(rec.reports().empty());
}

// Under mpiexec -n 2, pp = 2: rank 1 comes 1 s late to an all-reduce over the embedding group,
// which rank 0 waits for through CommHandle::wait_on; rank 0 reports it on the embedding group.
TEST(Watchdog, TwoRanksAWaitOnTheEmbeddingGroupIsReportedByName) {
  MPI_Comm world = testing::test_world();
  if (comm_size(world) != 2) GTEST_SKIP() << "needs exactly 2 ranks (Watchdog.two_ranks under mpiexec)";
  const ProcessGrid grid({.pp = 2}, 2, comm_rank(world));
  Recorder rec;
  Watchdog dog(grid.rank(), rec.callback());
  GridComms comms = mpi_grid_comms(grid, world);
  comms.watch(dog, grid, 0.3);
  const bool late = grid.rank() == 1;
  std::vector<double> x = {1.0};
  if (late) std::this_thread::sleep_for(1000ms);
  CommHandle h = comms.embedding->all_reduce_async(Tensor(x.data(), DType::F64, {1}));
  h.wait_on(Exec::cpu());
  EXPECT_EQ(x[0], 2.0);
  throw_if_any_failed(world, "");
  const auto reports = rec.reports();
  if (late) {
    EXPECT_TRUE(reports.empty()) << reports[0];
    return;
  }
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(contains(reports[0], "in all_reduce of 8 B on the embedding group (world ranks 0, 1) for world rank 1"))
      << reports[0];
}

}  // namespace
}  // namespace tessera

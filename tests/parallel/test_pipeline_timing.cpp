// Tests parallel/pipeline_timing.h under mpiexec -n 2 (ctest PipelineTiming.two_ranks): the timer
// runs a real 1F1B schedule over MPI (each forward and backward spins for a while, the activations
// and gradients travel between the ranks), counting one step whose parts nest as defined (busy and
// wait are disjoint parts of the window; no timing is asserted beyond what the spins guarantee);
// reduce_pipeline_times gathers known numbers exactly and refuses ranks that timed different steps,
// on every rank.
#include "parallel/pipeline_timing.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <vector>

#include "error_testing.h"
#include "kernels/allocator.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "parallel/pipeline_schedule.h"

namespace tessera {
namespace {

// Keeps the core busy for at least `seconds`.
void spin(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
  }
}

TEST(PipelineTiming, TimesARealScheduleAsDefined) {
  MpiCommunicator pp = MpiCommunicator::duplicate(testing::test_world());
  const int64_t p = pp.size(), rank = pp.rank(), m = 4;
  constexpr double kForward = 0.002, kBackward = 0.004;
  Allocator alloc;
  std::map<std::pair<int64_t, bool>, Buffer> tensors;  // (micro-batch, gradient?) -> what moves
  const auto tensor = [&](int64_t mb, bool grad) -> Buffer& {
    Buffer& b = tensors[{mb, grad}];
    if (!b.defined()) b = Buffer(alloc, DType::F32, {4}, MemCategory::Activations);
    return b;
  };
  PipelineCallbacks cb;
  cb.forward = [&](int64_t, int64_t) { spin(kForward); };
  cb.backward = [&](const BackwardCall&) { spin(kBackward); };
  cb.p2p = [&](const std::vector<Action>& batch) {
    std::vector<P2POp> ops;
    for (const Action& a : batch) {
      const bool grad = a.kind == ActionKind::SendGrad || a.kind == ActionKind::RecvGrad;
      const int peer = static_cast<int>(peer_of(a, rank, p));
      const int tag = static_cast<int>(2 * a.micro_batch + (grad ? 1 : 0));
      ops.push_back(is_send(a) ? P2POp::send(tensor(a.micro_batch, grad), peer, tag)
                               : P2POp::recv(tensor(a.micro_batch, grad), peer, tag));
    }
    return pp.batch_send_recv_async(ops);
  };
  PipelineTimer timer;
  const Schedule schedule = pipeline_schedule(p, 1, m, PipelineKind::OneFOneB);
  timer.run(schedule.actions_of(rank), cb);
  const PipelineStepTimes t = timer.totals();
  EXPECT_EQ(t.steps, 1);
  EXPECT_GE(t.busy, static_cast<double>(m) * (kForward + kBackward));  // the spins alone take this long
  EXPECT_GT(t.wait, 0);  // at least one wait on a handle was timed
  EXPECT_LE(t.busy + t.wait, t.window);
  const PipelineBubble b = reduce_pipeline_times(timer.take(), &pp);
  EXPECT_EQ(timer.totals().steps, 0) << "take() starts the totals again";
  ASSERT_EQ(b.busy.size(), static_cast<size_t>(p));
  EXPECT_DOUBLE_EQ(b.busy[static_cast<size_t>(rank)], t.busy);
  EXPECT_DOUBLE_EQ(b.wait[static_cast<size_t>(rank)], t.wait);
  EXPECT_GE(b.makespan, t.window);
  double busy = 0;
  for (int64_t r = 0; r < p; ++r) {
    EXPECT_DOUBLE_EQ(b.idle[static_cast<size_t>(r)], b.makespan - b.busy[static_cast<size_t>(r)]);
    busy += b.busy[static_cast<size_t>(r)];
  }
  EXPECT_DOUBLE_EQ(b.bubble_fraction, 1.0 - busy / (static_cast<double>(p) * b.makespan));
  EXPECT_GT(b.bubble_fraction, 0);  // on p > 1 ranks someone waits for the first activation
  EXPECT_LT(b.bubble_fraction, 1);
}

TEST(PipelineTiming, ReductionGathersEveryRanksMeanTimes) {
  MpiCommunicator pp = MpiCommunicator::duplicate(testing::test_world());
  const int64_t p = pp.size(), rank = pp.rank();
  const double r = static_cast<double>(rank);
  const PipelineBubble b = reduce_pipeline_times({.window = 10 + r, .busy = 4 + 2 * r, .wait = 1 + r, .steps = 2}, &pp);
  ASSERT_EQ(b.busy.size(), static_cast<size_t>(p));
  const double makespan = (10.0 + static_cast<double>(p - 1)) / 2;  // the longest mean window
  EXPECT_DOUBLE_EQ(b.makespan, makespan);
  double busy = 0;
  for (int64_t q = 0; q < p; ++q) {
    const double want = (4.0 + 2.0 * static_cast<double>(q)) / 2;
    EXPECT_DOUBLE_EQ(b.busy[static_cast<size_t>(q)], want);
    EXPECT_DOUBLE_EQ(b.wait[static_cast<size_t>(q)], (1.0 + static_cast<double>(q)) / 2);
    EXPECT_DOUBLE_EQ(b.idle[static_cast<size_t>(q)], makespan - want);
    busy += want;
  }
  EXPECT_DOUBLE_EQ(b.bubble_fraction, 1 - busy / (static_cast<double>(p) * makespan));
  // Alone (no group): its own numbers.
  const PipelineBubble one = reduce_pipeline_times({.window = 4, .busy = 3, .wait = 0.5, .steps = 1}, nullptr);
  EXPECT_DOUBLE_EQ(one.makespan, 4);
  EXPECT_DOUBLE_EQ(one.bubble_fraction, 0.25);
  // No steps timed: zeros, not a division by zero.
  const PipelineBubble none = reduce_pipeline_times({}, &pp);
  EXPECT_EQ(none.bubble_fraction, 0);
  EXPECT_EQ(none.busy.size(), static_cast<size_t>(p));
}

TEST(PipelineTiming, RanksThatTimedDifferentStepsAreRefusedOnEveryRank) {
  MpiCommunicator pp = MpiCommunicator::duplicate(testing::test_world());
  const int64_t steps = pp.rank() == 1 ? 3 : 2;
  EXPECT_TRUE(testing::throws_with([&] { reduce_pipeline_times({.window = 1, .busy = 1, .steps = steps}, &pp); },
                                   {"pipeline rank 1 timed 3 steps, rank 0 2"}));
}

}  // namespace
}  // namespace tessera

// Tests parallel/schedule.h: the one-stage schedule's action order, and the executor calling the
// callbacks in that order with `last` on the last backward only; malformed schedules refused.
#include "parallel/schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_testing.h"

namespace tessera {
namespace {

TEST(Schedule, OneStageIsGradientAccumulation) {
  const Schedule one = one_stage_schedule(1);
  EXPECT_EQ(one.num_stages(), 1);
  EXPECT_EQ(one.micro_batches, 1);
  EXPECT_EQ(one.actions_of(0), (std::vector<Action>{forward_action(0), backward_action(0)}));
  const Schedule three = one_stage_schedule(3);
  EXPECT_EQ(to_string(three.actions_of(0)), "F0 B0 F1 B1 F2 B2");
  EXPECT_TRUE(testing::throws_with([] { one_stage_schedule(0); }, {"0 micro-batches"}));
  EXPECT_TRUE(testing::throws_with([&] { three.actions_of(1); }, {"stage 1 of a schedule of 1 stages"}));
}

// Records what the executor calls: "F2", "B2", "B2 last".
std::vector<std::string> run_logged(const std::vector<Action>& actions) {
  std::vector<std::string> log;
  run_schedule(actions, {[&](int64_t m) { log.push_back("F" + std::to_string(m)); },
                         [&](int64_t m, bool last) { log.push_back("B" + std::to_string(m) + (last ? " last" : "")); }});
  return log;
}

TEST(Schedule, ExecutorRunsTheActionsInOrderWithLastOnTheLastBackward) {
  EXPECT_EQ(run_logged(one_stage_schedule(1).actions_of(0)), (std::vector<std::string>{"F0", "B0 last"}));
  EXPECT_EQ(run_logged(one_stage_schedule(3).actions_of(0)),
            (std::vector<std::string>{"F0", "B0", "F1", "B1", "F2", "B2 last"}));
  // Any order the checks allow runs as given (a pipeline's warm-up runs several forwards first).
  EXPECT_EQ(run_logged({forward_action(0), forward_action(1), backward_action(0), forward_action(2),
                        backward_action(1), backward_action(2)}),
            (std::vector<std::string>{"F0", "F1", "B0", "F2", "B1", "B2 last"}));
}

TEST(Schedule, ExecutorRefusesABackwardBeforeItsForwardAndRepeats) {
  std::vector<std::string> log;
  const StepCallbacks record{[&](int64_t m) { log.push_back("F" + std::to_string(m)); },
                             [&](int64_t m, bool) { log.push_back("B" + std::to_string(m)); }};
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({forward_action(0), backward_action(1)}, record); },
                                   {"action 1 (B1) comes before micro-batch 1's forward"}));
  EXPECT_EQ(log, (std::vector<std::string>{"F0"})) << "nothing runs past the bad action";
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({forward_action(0), forward_action(0)}, record); },
                                   {"action 1 (F0) repeats micro-batch 0's forward"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { run_schedule({forward_action(0), backward_action(0), backward_action(0)}, record); },
      {"action 2 (B0) repeats micro-batch 0's backward"}));
}

}  // namespace
}  // namespace tessera

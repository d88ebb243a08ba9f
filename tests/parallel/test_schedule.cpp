// Tests parallel/schedule.h: the one-stage schedule's action order, and the executor calling the
// callbacks in that order with `last` on the last backward only; malformed schedules refused. The
// pipeline form: adjacent sends and receives handed over as one batch, each batch waited before
// what reads it and at the end, `last` per chunk, zero-bubble's split backward, the action names.
#include "parallel/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "error_testing.h"
#include "parallel/pipeline_schedule.h"

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

TEST(Schedule, ActionNamesAndPeers) {
  EXPECT_EQ(to_string(std::vector<Action>{forward_action(3), backward_action(0, 1), weight_action(2),
                                          send_activation(1), recv_activation(1, 2), send_grad(0), recv_grad(4, 1)}),
            "F3 B0c1 W2 sendA1 recvA1c2 sendG0 recvG4c1");
  EXPECT_TRUE(is_p2p(recv_grad(0)) && is_send(send_grad(0)));
  EXPECT_TRUE(!is_send(recv_activation(0)) && !is_p2p(weight_action(0)));
  // Activations go to the next rank and gradients to the previous one, wrapping around.
  EXPECT_EQ(peer_of(send_activation(0), 3, 4), 0);
  EXPECT_EQ(peer_of(recv_grad(0), 1, 4), 2);
  EXPECT_EQ(peer_of(recv_activation(0), 0, 4), 3);
  EXPECT_EQ(peer_of(send_grad(0), 2, 4), 1);
  // The last rank's chunk c feeds rank 0's chunk c + 1, whose gradient comes back to chunk c.
  EXPECT_EQ(receive_of(send_activation(5, 0), 3, 4), recv_activation(5, 1));
  EXPECT_EQ(receive_of(send_activation(5, 0), 1, 4), recv_activation(5, 0));
  EXPECT_EQ(receive_of(send_grad(5, 1), 0, 4), recv_grad(5, 0));
  EXPECT_EQ(receive_of(send_grad(5, 1), 2, 4), recv_grad(5, 1));
  EXPECT_TRUE(testing::throws_with([] { peer_of(forward_action(0), 0, 2); }, {"F0 is not a send or receive"}));
}

// A handle whose waits are written to the log: "wait #2", or "wait_on #2" with an Exec.
class LoggedRequest : public CommRequest {
 public:
  LoggedRequest(std::vector<std::string>& log, int id) : log_(log), id_(id) {}
  void wait() override { log_.push_back("wait #" + std::to_string(id_)); }
  bool test() override { return true; }
  void wait_on(const Exec&) override { log_.push_back("wait_on #" + std::to_string(id_)); }

 private:
  std::vector<std::string>& log_;
  int id_;
};

// Records every callback: "F2c1", "B0 last input_only", "W0 last", "p2p #1 [sendA0 recvG1]".
PipelineCallbacks recording(std::vector<std::string>& log) {
  PipelineCallbacks cb;
  const auto suffix = [](int64_t c) { return c != 0 ? "c" + std::to_string(c) : std::string(); };
  cb.forward = [&log, suffix](int64_t m, int64_t c) { log.push_back("F" + std::to_string(m) + suffix(c)); };
  cb.backward = [&log, suffix](const BackwardCall& b) {
    log.push_back("B" + std::to_string(b.micro_batch) + suffix(b.chunk) + (b.last ? " last" : "") +
                  (b.input_only ? " input_only" : ""));
  };
  cb.backward_weight = [&log, suffix](const BackwardCall& b) {
    log.push_back("W" + std::to_string(b.micro_batch) + suffix(b.chunk) + (b.last ? " last" : ""));
  };
  cb.recompute = [&log, suffix](int64_t m, int64_t c) { log.push_back("R" + std::to_string(m) + suffix(c)); };
  cb.p2p = [&log](const std::vector<Action>& batch) {
    const int id = static_cast<int>(std::count_if(log.begin(), log.end(), [](const std::string& s) {
      return s.rfind("p2p", 0) == 0;
    }));
    log.push_back("p2p #" + std::to_string(id) + " [" + to_string(batch) + "]");
    return CommHandle(std::make_unique<LoggedRequest>(log, id));
  };
  return cb;
}

// Rank 1 of 1F1B on two stages: adjacent sends and receives go out as one batch, a batch is waited
// right before the computation that reads what it received, and the rest (sends only) at the end.
TEST(Schedule, ExecutorBatchesAdjacentTransfersAndWaitsBeforeTheReader) {
  const Schedule f1b = pipeline_schedule(2, 1, 3, PipelineKind::OneFOneB);
  const std::vector<Action>& rank1 = f1b.actions_of(1);
  ASSERT_EQ(to_string(rank1), "recvA0 F0 B0 sendG0 recvA1 F1 B1 sendG1 recvA2 F2 B2 sendG2");
  std::vector<std::string> log;
  run_schedule(rank1, recording(log));
  EXPECT_EQ(log, (std::vector<std::string>{"p2p #0 [recvA0]", "wait #0", "F0", "B0", "p2p #1 [sendG0 recvA1]",
                                           "wait #1", "F1", "B1", "p2p #2 [sendG1 recvA2]", "wait #2", "F2", "B2 last",
                                           "p2p #3 [sendG2]", "wait #3"}));
  // A receive posted ahead of the computation after the next is waited there, not at once; the
  // batches nothing reads from are waited at the end, in order.
  log.clear();
  run_schedule({recv_activation(0), recv_activation(1), forward_action(0), send_activation(0), forward_action(1),
                send_activation(1), recv_grad(1), recv_grad(0), backward_action(0), backward_action(1)},
               recording(log));
  EXPECT_EQ(log, (std::vector<std::string>{"p2p #0 [recvA0 recvA1]", "wait #0", "F0", "p2p #1 [sendA0]", "F1",
                                           "p2p #2 [sendA1 recvG1 recvG0]", "wait #2", "B0", "B1 last", "wait #1"}));
  // With an Exec, the handles are waited on it (a stream backend only orders the stream then).
  log.clear();
  Exec ex;
  PipelineCallbacks on_stream = recording(log);
  on_stream.exec = &ex;
  run_schedule(rank1, on_stream);
  EXPECT_EQ(log[1], "wait_on #0");
  EXPECT_EQ(log.back(), "wait_on #3");
}

// Zero-bubble: a backward with its W later in the list computes the input gradient only; the
// chunk's gradients are final after the last W, which carries `last`.
TEST(Schedule, ExecutorSplitsTheBackwardWhenTheScheduleHasW) {
  std::vector<std::string> log;
  std::vector<Action> computations;
  const Schedule zb = pipeline_schedule(2, 1, 3, PipelineKind::ZeroBubbleH1);
  for (const Action& a : zb.actions_of(1))
    if (!is_p2p(a)) computations.push_back(a);
  ASSERT_EQ(to_string(computations), "F0 B0 F1 B1 W0 F2 B2 W1 W2");
  run_schedule(computations, recording(log));
  EXPECT_EQ(log, (std::vector<std::string>{"F0", "B0 input_only", "F1", "B1 input_only", "W0", "F2", "B2 input_only",
                                           "W1", "W2 last"}));
  // A backward without a W is whole, even next to split ones.
  log.clear();
  run_schedule({forward_action(0), forward_action(1), backward_action(0), backward_action(1), weight_action(1)},
               recording(log));
  EXPECT_EQ(log, (std::vector<std::string>{"F0", "F1", "B0", "B1 input_only", "W1 last"}));
}

// Interleaved: `last` marks each chunk's last backward (chunk 1 finishes before chunk 0), so each
// chunk's gradients can be reduced as soon as they are final.
TEST(Schedule, ExecutorMarksTheLastBackwardOfEachChunk) {
  std::vector<std::string> log;
  std::vector<Action> computations;
  const Schedule interleaved = pipeline_schedule(2, 2, 2, PipelineKind::Interleaved);
  for (const Action& a : interleaved.actions_of(0))
    if (!is_p2p(a)) computations.push_back(a);
  run_schedule(computations, recording(log));
  EXPECT_EQ(log, (std::vector<std::string>{"F0", "F1", "F0c1", "F1c1", "B0c1", "B1c1 last", "B0", "B1 last"}));
}

// Bubble recomputation (model.recompute = "bubble"): R reads nothing received, so it runs before
// the wait on its backward's output gradient (while that gradient travels); the backward after it
// is an ordinary one (the model finds the recomputed context). Misplaced Rs are refused.
TEST(Schedule, ExecutorRunsRecomputeBeforeWaitingForTheGradient) {
  std::vector<std::string> log;
  const PipelineCallbacks record = recording(log);
  run_schedule({forward_action(0), send_activation(0), recv_grad(0), recompute_action(0), backward_action(0)}, record);
  EXPECT_EQ(log, (std::vector<std::string>{"F0", "p2p #0 [sendA0 recvG0]", "R0", "wait #0", "B0 last"}));
  EXPECT_EQ(to_string(std::vector<Action>{recompute_action(2), recompute_action(0, 1)}), "R2 R0c1");
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({recompute_action(0), forward_action(0)}, record); },
                                   {"action 0 (R0) comes before micro-batch 0's forward"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { run_schedule({forward_action(0), backward_action(0), recompute_action(0)}, record); },
      {"action 2 (R0) comes after micro-batch 0's backward"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { run_schedule({forward_action(0), recompute_action(0), recompute_action(0)}, record); },
      {"action 2 (R0) repeats micro-batch 0's recomputation"}));
  PipelineCallbacks no_r = record;
  no_r.recompute = nullptr;
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({forward_action(0), recompute_action(0)}, no_r); },
                                   {"action 1 (R0) needs a recompute callback"}));
}

TEST(Schedule, ExecutorRefusesMisplacedTransfersAndMissingCallbacks) {
  std::vector<std::string> log;
  const PipelineCallbacks record = recording(log);
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({forward_action(0), recv_activation(0)}, record); },
                                   {"action 0 (F0) comes before the receive of micro-batch 0's activation"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { run_schedule({forward_action(0, 1), backward_action(0, 1), recv_grad(0, 1)}, record); },
      {"action 1 (B0c1) comes before the receive of micro-batch 0 (chunk 1)'s output gradient"}));
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({send_activation(0), forward_action(0)}, record); },
                                   {"action 0 (sendA0) comes before micro-batch 0's forward"}));
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({forward_action(0), send_grad(0), backward_action(0)}, record); },
                                   {"action 1 (sendG0) comes before micro-batch 0's backward"}));
  EXPECT_TRUE(
      testing::throws_with([&] { run_schedule({forward_action(0), weight_action(0), backward_action(0)}, record); },
                           {"action 1 (W0) comes before micro-batch 0's backward"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { run_schedule({forward_action(0), backward_action(0), weight_action(0), weight_action(0)}, record); },
      {"action 3 (W0) repeats micro-batch 0's weight gradient"}));
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({recv_grad(2), recv_grad(2)}, record); },
                                   {"action 1 (recvG2) repeats micro-batch 2's gradient receive"}));
  log.clear();
  PipelineCallbacks no_p2p = record;
  no_p2p.p2p = nullptr;
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({forward_action(0), send_activation(0)}, no_p2p); },
                                   {"action 1 (sendA0) needs a p2p callback"}));
  EXPECT_EQ(log, (std::vector<std::string>{"F0"}));
  PipelineCallbacks no_w = record;
  no_w.backward_weight = nullptr;
  EXPECT_TRUE(testing::throws_with(
      [&] { run_schedule({forward_action(0), backward_action(0), weight_action(0)}, no_w); },
      {"action 2 (W0) needs a backward_weight callback"}));
  // The one-stage callbacks run chunk 0's forwards and backwards only.
  const StepCallbacks plain{[](int64_t) {}, [](int64_t, bool) {}};
  EXPECT_TRUE(testing::throws_with([&] { run_schedule({forward_action(0, 1)}, plain); },
                                   {"action 0 (F0c1) needs PipelineCallbacks"}));
  EXPECT_TRUE(
      testing::throws_with([&] { run_schedule({forward_action(0), backward_action(0), weight_action(0)}, plain); },
                           {"action 2 (W0) needs PipelineCallbacks"}));
}

}  // namespace
}  // namespace tessera

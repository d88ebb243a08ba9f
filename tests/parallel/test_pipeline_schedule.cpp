// Tests parallel/pipeline_schedule.h: the generated action lists (exact lists for two stages, the
// one-stage case, every computation once in a valid order, the 1F1B phases), the names and the
// refusal of impossible parameters. Running the lists together is tested in test_pipeline_sim.cpp.
#include "parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "error_testing.h"
#include "pipeline_testing.h"

namespace tessera {
namespace {

using testing::kKinds;
using testing::valid;

TEST(PipelineSchedule, NamesRoundTrip) {
  for (PipelineKind k : kKinds) EXPECT_EQ(parse_pipeline_kind(pipeline_kind_name(k)), k);
  EXPECT_EQ(pipeline_kind_name(PipelineKind::OneFOneB), "1f1b");
  EXPECT_EQ(pipeline_kind_name(PipelineKind::ZeroBubbleH1), "zb-h1");
  EXPECT_TRUE(testing::throws_with([] { parse_pipeline_kind("1F1B"); },
                                   {"parallel.pp_schedule = \"1F1B\" is not a pipeline schedule",
                                    "\"gpipe\", \"1f1b\", \"interleaved\" or \"zb-h1\""}));
}

TEST(PipelineSchedule, OneStageOneFOneBIsGradientAccumulation) {
  for (int64_t m = 1; m <= 5; ++m) {
    const Schedule s = pipeline_schedule(1, 1, m, PipelineKind::OneFOneB);
    EXPECT_EQ(s.stages, one_stage_schedule(m).stages) << m << " micro-batches";
    EXPECT_EQ(s.vpp, 1);
  }
  EXPECT_EQ(to_string(pipeline_schedule(1, 1, 3, PipelineKind::GPipe).actions_of(0)), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(to_string(pipeline_schedule(1, 1, 3, PipelineKind::ZeroBubbleH1).actions_of(0)),
            "F0 B0 W0 F1 B1 W1 F2 B2 W2");
}

// The lists in full for two stages: the phases, and the sends and receives grouped into batches
// (the adjacent ones) that pair up between the two ranks.
TEST(PipelineSchedule, TwoStageListsInFull) {
  const Schedule f1b = pipeline_schedule(2, 1, 3, PipelineKind::OneFOneB);
  // Rank 0: one warm-up forward, then 1F1B, then the last backward; rank 1 (the last stage) runs
  // each backward right after its forward. The batches pair up as Megatron's: [sendA1 recvG0]
  // (send_forward_recv_backward) with [sendG0 recvA1] (send_backward_recv_forward).
  EXPECT_EQ(to_string(f1b.actions_of(0)), "F0 sendA0 F1 sendA1 recvG0 B0 F2 sendA2 recvG1 B1 recvG2 B2");
  EXPECT_EQ(to_string(f1b.actions_of(1)), "recvA0 F0 B0 sendG0 recvA1 F1 B1 sendG1 recvA2 F2 B2 sendG2");
  const Schedule gpipe = pipeline_schedule(2, 1, 3, PipelineKind::GPipe);
  EXPECT_EQ(to_string(gpipe.actions_of(0)), "F0 sendA0 F1 sendA1 F2 sendA2 recvG0 B0 recvG1 B1 recvG2 B2");
  EXPECT_EQ(to_string(gpipe.actions_of(1)), "recvA0 F0 recvA1 F1 recvA2 F2 B0 sendG0 B1 sendG1 B2 sendG2");
  // ZB-H1: rank 1 runs W(j) after B(j + 1), filling the cool-down; rank 0 right after B(j).
  const Schedule zb = pipeline_schedule(2, 1, 3, PipelineKind::ZeroBubbleH1);
  EXPECT_EQ(to_string(zb.actions_of(0)), "F0 sendA0 F1 sendA1 recvG0 B0 W0 F2 sendA2 recvG1 B1 W1 recvG2 B2 W2");
  EXPECT_EQ(to_string(zb.actions_of(1)), "recvA0 F0 B0 sendG0 recvA1 F1 B1 sendG1 W0 recvA2 F2 B2 sendG2 W1 W2");
  // Interleaved, 2 chunks: rank 1's chunk 0 feeds rank 0's chunk 1 (virtual stage 2), whose
  // gradient goes back to rank 1's chunk 0; both kinds share the pair of ranks, in posting order.
  const Schedule il = pipeline_schedule(2, 2, 2, PipelineKind::Interleaved);
  EXPECT_EQ(il.vpp, 2);
  EXPECT_EQ(to_string(il.actions_of(0)),
            "F0 sendA0 F1 sendA1 recvA0c1 F0c1 sendA0c1 recvA1c1 F1c1 sendA1c1 recvG0c1 B0c1 sendG0c1 recvG1c1 "
            "B1c1 sendG1c1 recvG0 B0 recvG1 B1");
  EXPECT_EQ(to_string(il.actions_of(1)),
            "recvA0 F0 sendA0 recvA1 F1 sendA1 recvA0c1 F0c1 B0c1 sendG0c1 recvA1c1 F1c1 B1c1 sendG1c1 recvG0 B0 "
            "sendG0 recvG1 B1 sendG1");
}

// 1F1B's phases on rank r of pp: pp - r - 1 warm-up forwards, then alternating, then backwards.
TEST(PipelineSchedule, OneFOneBPhases) {
  const int64_t pp = 4, m = 8;
  const Schedule s = pipeline_schedule(pp, 1, m, PipelineKind::OneFOneB);
  for (int64_t r = 0; r < pp; ++r) {
    std::string computations;
    for (const Action& a : s.actions_of(r))
      if (!is_p2p(a)) computations += to_string(a) + " ";
    std::string expected;
    const int64_t warmup = pp - r - 1;
    for (int64_t i = 0; i < warmup; ++i) expected += "F" + std::to_string(i) + " ";
    for (int64_t i = 0; i < m - warmup; ++i)
      expected += "F" + std::to_string(warmup + i) + " B" + std::to_string(i) + " ";
    for (int64_t i = m - warmup; i < m; ++i) expected += "B" + std::to_string(i) + " ";
    EXPECT_EQ(computations, expected) << "rank " << r;
  }
}

// Every rank runs each (micro-batch, chunk) forward and backward once (and W once under zb-h1),
// forward before backward before W; sends follow what they send, receives precede what reads them,
// and only the first virtual stage has no activation to receive, only the last no gradient.
TEST(PipelineSchedule, EveryComputationOnceInOrder) {
  int64_t checked = 0;
  for (int64_t pp = 1; pp <= 8; ++pp)
    for (int64_t vpp = 1; vpp <= 4; ++vpp)
      for (int64_t m = 1; m <= 16; ++m)
        for (PipelineKind kind : kKinds) {
          if (!valid(pp, vpp, m, kind)) continue;
          ++checked;
          const Schedule s = pipeline_schedule(pp, vpp, m, kind);
          ASSERT_EQ(s.num_stages(), pp);
          ASSERT_EQ(s.micro_batches, m);
          for (int64_t r = 0; r < pp; ++r) {
            std::map<std::tuple<ActionKind, int64_t, int64_t>, size_t> at;  // action -> position
            const std::vector<Action>& list = s.actions_of(r);
            for (size_t i = 0; i < list.size(); ++i)
              ASSERT_TRUE(at.emplace(std::tuple{list[i].kind, list[i].micro_batch, list[i].chunk}, i).second)
                  << to_string(list[i]) << " repeats on rank " << r;
            for (int64_t mb = 0; mb < m; ++mb)
              for (int64_t c = 0; c < vpp; ++c) {
                const std::string where = std::string(pipeline_kind_name(kind)) + " pp " + std::to_string(pp) +
                                          " vpp " + std::to_string(vpp) + " m " + std::to_string(m) + " rank " +
                                          std::to_string(r) + " micro-batch " + std::to_string(mb) + " chunk " +
                                          std::to_string(c);
                const auto pos = [&](ActionKind k) {
                  auto it = at.find({k, mb, c});
                  return it == at.end() ? -1 : static_cast<int64_t>(it->second);
                };
                const int64_t stage = c * pp + r, f = pos(ActionKind::Forward), b = pos(ActionKind::Backward),
                              w = pos(ActionKind::BackwardWeight);
                ASSERT_GE(f, 0) << where;
                ASSERT_GT(b, f) << where;
                if (kind == PipelineKind::ZeroBubbleH1)
                  ASSERT_GT(w, b) << where;
                else
                  ASSERT_EQ(w, -1) << where;
                const int64_t recv_a = pos(ActionKind::RecvActivation), send_a = pos(ActionKind::SendActivation),
                              recv_g = pos(ActionKind::RecvGrad), send_g = pos(ActionKind::SendGrad);
                if (stage == 0) {
                  ASSERT_EQ(recv_a, -1) << where;
                  ASSERT_EQ(send_g, -1) << where;
                } else {
                  ASSERT_TRUE(recv_a >= 0 && recv_a < f) << where;
                  ASSERT_GT(send_g, b) << where;
                }
                if (stage == pp * vpp - 1) {
                  ASSERT_EQ(send_a, -1) << where;
                  ASSERT_EQ(recv_g, -1) << where;
                } else {
                  ASSERT_GT(send_a, f) << where;
                  ASSERT_TRUE(recv_g >= 0 && recv_g < b) << where;
                }
              }
            // Nothing but these: 2 or 3 computations and up to 4 transfers per (micro-batch, chunk).
            size_t expected = 0;
            for (int64_t c = 0; c < vpp; ++c) {
              const int64_t stage = c * pp + r;
              expected += static_cast<size_t>(m) * ((kind == PipelineKind::ZeroBubbleH1 ? 3 : 2) +
                                                    (stage > 0 ? 2 : 0) + (stage < pp * vpp - 1 ? 2 : 0));
            }
            ASSERT_EQ(list.size(), expected);
          }
        }
  EXPECT_EQ(checked, 128 + 100 + 78 + 100) << "gpipe, 1f1b, interleaved, zb-h1";
}

// model.recompute = "bubble": every backward gets its R right before it in the rank's computations
// (the other computations in the same order as without), and the receive of its output gradient
// comes before that R, so R runs while the gradient travels; nothing else changes.
TEST(PipelineSchedule, BubbleRecomputationPutsEachRJustBeforeItsBackward) {
  const auto computations = [](const std::vector<Action>& list, bool keep_r) {
    std::vector<Action> out;
    for (const Action& a : list)
      if (!is_p2p(a) && (keep_r || a.kind != ActionKind::Recompute)) out.push_back(a);
    return out;
  };
  int64_t checked = 0;
  for (int64_t pp = 1; pp <= 6; ++pp)
    for (int64_t vpp = 1; vpp <= 3; ++vpp)
      for (int64_t m = 1; m <= 12; ++m)
        for (PipelineKind kind : kKinds) {
          if (!valid(pp, vpp, m, kind)) continue;
          ++checked;
          const Schedule plain = pipeline_schedule(pp, vpp, m, kind), bubble = pipeline_schedule(pp, vpp, m, kind, true);
          for (int64_t r = 0; r < pp; ++r) {
            const std::string where = std::string(pipeline_kind_name(kind)) + " pp " + std::to_string(pp) + " vpp " +
                                      std::to_string(vpp) + " m " + std::to_string(m) + " rank " + std::to_string(r);
            ASSERT_EQ(computations(bubble.actions_of(r), false), computations(plain.actions_of(r), false)) << where;
            const std::vector<Action> with_r = computations(bubble.actions_of(r), true);
            int64_t rs = 0;
            for (size_t i = 0; i < with_r.size(); ++i) {
              if (with_r[i].kind == ActionKind::Recompute) ++rs;
              if (with_r[i].kind != ActionKind::Backward) continue;
              ASSERT_GT(i, 0u) << where;
              ASSERT_EQ(with_r[i - 1], recompute_action(with_r[i].micro_batch, with_r[i].chunk)) << where;
            }
            ASSERT_EQ(rs, m * vpp) << where;
            const std::vector<Action>& list = bubble.actions_of(r);
            for (size_t i = 0; i < list.size(); ++i) {
              if (list[i].kind != ActionKind::RecvGrad) continue;
              const auto at_r = std::find(list.begin(), list.end(), recompute_action(list[i].micro_batch, list[i].chunk));
              ASSERT_TRUE(at_r != list.end() && static_cast<size_t>(at_r - list.begin()) > i)
                  << where << ": " << to_string(list[i]) << " after its R";
            }
          }
        }
  EXPECT_GT(checked, 100);
  // Two stages, 1F1B, 3 micro-batches: rank 0 recomputes micro-batch m while its gradient travels
  // (the receive posted first); rank 1, the last, right before each backward.
  const Schedule s = pipeline_schedule(2, 1, 3, PipelineKind::OneFOneB, true);
  EXPECT_EQ(to_string(s.actions_of(0)), "F0 sendA0 F1 sendA1 recvG0 R0 B0 F2 sendA2 recvG1 R1 B1 recvG2 R2 B2");
  EXPECT_EQ(to_string(s.actions_of(1)), "recvA0 F0 R0 B0 sendG0 recvA1 F1 R1 B1 sendG1 recvA2 F2 R2 B2 sendG2");
}

// model.recompute_ahead = K >= 2: R moves into earlier waits, at most K recomputed micro-batches
// held. For every valid (pp, vpp, m, kind) and K in 2, 3 and unbounded (m vpp): the computations
// without R are the plain schedule's in its order; one R per backward, after its forward and before
// its backward, the R's in the order of their backwards; never more than K held; a tensor's receive
// precedes the R's right before its reader.
TEST(PipelineSchedule, RecomputeAheadHoldsAtMostKAndKeepsTheOrder) {
  const auto computations = [](const std::vector<Action>& list, bool keep_r) {
    std::vector<Action> out;
    for (const Action& a : list)
      if (!is_p2p(a) && (keep_r || a.kind != ActionKind::Recompute)) out.push_back(a);
    return out;
  };
  int64_t checked = 0, moved = 0;
  for (int64_t pp = 1; pp <= 6; ++pp)
    for (int64_t vpp = 1; vpp <= 3; ++vpp)
      for (int64_t m = 1; m <= 12; ++m)
        for (PipelineKind kind : kKinds) {
          if (!valid(pp, vpp, m, kind)) continue;
          const Schedule plain = pipeline_schedule(pp, vpp, m, kind);
          for (int64_t k : {int64_t{2}, int64_t{3}, m * vpp}) {
            ++checked;
            const Schedule s = pipeline_schedule(pp, vpp, m, kind, true, k);
            for (int64_t r = 0; r < pp; ++r) {
              const std::string where = std::string(pipeline_kind_name(kind)) + " pp " + std::to_string(pp) +
                                        " vpp " + std::to_string(vpp) + " m " + std::to_string(m) + " K " +
                                        std::to_string(k) + " rank " + std::to_string(r);
              ASSERT_EQ(computations(s.actions_of(r), false), computations(plain.actions_of(r), false)) << where;
              std::set<std::pair<int64_t, int64_t>> forwarded, held, backwarded;
              std::vector<std::pair<int64_t, int64_t>> r_order, b_order;
              for (const Action& a : computations(s.actions_of(r), true)) {
                const std::pair<int64_t, int64_t> key{a.micro_batch, a.chunk};
                if (a.kind == ActionKind::Forward) forwarded.insert(key);
                if (a.kind == ActionKind::Recompute) {
                  ASSERT_TRUE(forwarded.count(key)) << where << ": " << to_string(a) << " before its forward";
                  ASSERT_TRUE(held.insert(key).second) << where << ": " << to_string(a) << " twice";
                  ASSERT_LE(static_cast<int64_t>(held.size()), k) << where << " at " << to_string(a);
                  r_order.push_back(key);
                }
                if (a.kind == ActionKind::Backward) {
                  ASSERT_EQ(held.erase(key), 1u) << where << ": " << to_string(a) << " without its R";
                  b_order.push_back(key);
                }
              }
              ASSERT_EQ(r_order, b_order) << where;
              ASSERT_EQ(static_cast<int64_t>(r_order.size()), m * vpp) << where;
              // Each receive comes before the run of R's right before the computation that reads it.
              const std::vector<Action>& list = s.actions_of(r);
              for (size_t i = 0; i < list.size(); ++i) {
                if (list[i].kind != ActionKind::RecvGrad && list[i].kind != ActionKind::RecvActivation) continue;
                const ActionKind reader = list[i].kind == ActionKind::RecvGrad ? ActionKind::Backward
                                                                               : ActionKind::Forward;
                const auto at = std::find(list.begin(), list.end(), Action{reader, list[i].micro_batch, list[i].chunk});
                ASSERT_TRUE(at != list.end()) << where;
                size_t first = static_cast<size_t>(at - list.begin());
                while (first > 0 && list[first - 1].kind == ActionKind::Recompute) --first;
                ASSERT_LT(i, first) << where << ": " << to_string(list[i]) << " after the R's before its reader";
              }
              const std::vector<Action> one = computations(pipeline_schedule(pp, vpp, m, kind, true).actions_of(r), true);
              if (computations(s.actions_of(r), true) != one) ++moved;
            }
          }
        }
  EXPECT_GT(checked, 300);
  EXPECT_GT(moved, 100);  // K >= 2 does move R's on most ranks
  // Two stages, 1F1B, 3 micro-batches, K = 2: rank 0 waits for the gradient of B0 two steps (rank
  // 1 runs F0 R0 B0 after F1's input), R0 and R1 fill it; the last rank never waits (as K = 1).
  const Schedule s = pipeline_schedule(2, 1, 3, PipelineKind::OneFOneB, true, 2);
  EXPECT_EQ(to_string(s.actions_of(0)), "F0 sendA0 F1 sendA1 recvG0 R0 R1 B0 F2 sendA2 recvG1 R2 B1 recvG2 B2");
  EXPECT_EQ(to_string(s.actions_of(1)), "recvA0 F0 R0 B0 sendG0 recvA1 F1 R1 B1 sendG1 recvA2 F2 R2 B2 sendG2");
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(2, 1, 4, PipelineKind::OneFOneB, true, 0); },
                                   {"model.recompute_ahead = 0", "at least 1"}));
}

TEST(PipelineSchedule, RefusesImpossibleParameters) {
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(4, 1, 3, PipelineKind::OneFOneB); },
                                   {"parallel.pp_schedule = \"1f1b\" needs at least parallel.pp = 4 micro-batches",
                                    "got 3 micro-batches per step (train.global_batch / (train.micro_batch x dp))",
                                    "parallel.pp_schedule = \"gpipe\""}));
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(3, 1, 2, PipelineKind::ZeroBubbleH1); },
                                   {"parallel.pp_schedule = \"zb-h1\" needs at least parallel.pp = 3", "got 2"}));
  EXPECT_NO_THROW(pipeline_schedule(4, 1, 3, PipelineKind::GPipe));  // any number
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(2, 2, 4, PipelineKind::OneFOneB); },
                                   {"parallel.vpp = 2 model chunks per rank needs parallel.pp_schedule = "
                                    "\"interleaved\"; parallel.pp_schedule = \"1f1b\" runs one chunk"}));
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(2, 3, 4, PipelineKind::GPipe); }, {"parallel.vpp = 3"}));
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(2, 1, 4, PipelineKind::Interleaved); },
                                   {"\"interleaved\" needs parallel.vpp >= 2", "got parallel.vpp = 1", "\"1f1b\""}));
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(1, 2, 4, PipelineKind::Interleaved); },
                                   {"\"interleaved\" needs parallel.pp >= 2 pipeline stages; got parallel.pp = 1"}));
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(4, 2, 6, PipelineKind::Interleaved); },
                                   {"\"interleaved\" runs micro-batches in groups of parallel.pp = 4",
                                    "as Megatron-LM's", "a multiple of 4; got 6 micro-batches per step"}));
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(0, 1, 4, PipelineKind::OneFOneB); }, {"parallel.pp = 0"}));
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(2, 0, 4, PipelineKind::OneFOneB); }, {"parallel.vpp = 0"}));
  EXPECT_TRUE(testing::throws_with([] { pipeline_schedule(2, 1, 0, PipelineKind::GPipe); },
                                   {"at least 1 micro-batch; got 0 micro-batches per step"}));
}

}  // namespace
}  // namespace tessera

// Tests parallel/pipeline_sim.h on the generated schedules: no deadlock for a grid of sizes (with
// batches waited where the executor waits, and with every batch blocking), every send received by
// the receive that names it, data dependencies honoured in time, activations in flight bounded,
// and the bubble against the formulas; a deadlock and a mismatched message are reported.
#include "parallel/pipeline_sim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "error_testing.h"
#include "pipeline_testing.h"
#include "parallel/pipeline_schedule.h"

namespace tessera {
namespace {

using testing::kKinds;
using testing::valid;

std::string name(int64_t pp, int64_t vpp, int64_t m, PipelineKind kind) {
  return std::string(pipeline_kind_name(kind)) + " pp " + std::to_string(pp) + " vpp " + std::to_string(vpp) +
         " m " + std::to_string(m);
}

SimResult sim(int64_t pp, int64_t vpp, int64_t m, PipelineKind kind, SimOptions o = {}) {
  return simulate(pipeline_schedule(pp, vpp, m, kind), o);
}

// The computations' spans happen in data order: micro-batch m's forward on virtual stage s ends
// before it starts on s + 1, its backward on s + 1 ends before it starts on s, the last stage's
// backward follows its forward, and W follows B.
void expect_data_order(const SimResult& r, int64_t pp, int64_t vpp, int64_t m, const std::string& where) {
  std::map<std::tuple<ActionKind, int64_t, int64_t>, SimSpan> span;  // (kind, m, virtual stage)
  for (const SimSpan& s : r.spans) span[{s.action.kind, s.action.micro_batch, s.action.chunk * pp + s.rank}] = s;
  const int64_t stages = pp * vpp;
  for (int64_t mb = 0; mb < m; ++mb) {
    for (int64_t s = 0; s + 1 < stages; ++s) {
      ASSERT_LE(span.at({ActionKind::Forward, mb, s}).end, span.at({ActionKind::Forward, mb, s + 1}).start) << where;
      ASSERT_LE(span.at({ActionKind::Backward, mb, s + 1}).end, span.at({ActionKind::Backward, mb, s}).start) << where;
    }
    ASSERT_LE(span.at({ActionKind::Forward, mb, stages - 1}).end, span.at({ActionKind::Backward, mb, stages - 1}).start)
        << where;
    for (int64_t s = 0; s < stages; ++s) {
      if (span.count({ActionKind::BackwardWeight, mb, s})) {
        ASSERT_LE(span.at({ActionKind::Backward, mb, s}).end, span.at({ActionKind::BackwardWeight, mb, s}).start)
            << where;
      }
    }
  }
}

// Every valid (pp 1..8, vpp 1..4, micro-batches 1..16, kind) runs to the end with its batches
// waited where run_schedule waits them and, stricter, each waited as soon as it is posted (a
// blocking batch_send_recv); the simulator matches every receive to the send it names (in posting
// order between two ranks) and a send nobody receives would leave its batch waiting (a deadlock).
TEST(PipelineSim, GridRunsWithoutDeadlock) {
  int64_t runs = 0;
  for (int64_t pp = 1; pp <= 8; ++pp)
    for (int64_t vpp = 1; vpp <= 4; ++vpp)
      for (int64_t m = 1; m <= 16; ++m)
        for (PipelineKind kind : kKinds) {
          if (!valid(pp, vpp, m, kind)) continue;
          const Schedule s = pipeline_schedule(pp, vpp, m, kind);
          for (P2pWait wait : {P2pWait::AtUse, P2pWait::AtPost}) {
            const std::string where = name(pp, vpp, m, kind) + (wait == P2pWait::AtPost ? " blocking" : "");
            SimOptions o;
            o.wait = wait;
            const SimResult r = simulate(s, o);
            ASSERT_FALSE(r.deadlock) << where << ": " << (r.stuck.empty() ? "" : r.stuck[0]);
            ASSERT_EQ(r.spans.size(), static_cast<size_t>(pp * vpp * m * (kind == PipelineKind::ZeroBubbleH1 ? 3 : 2)))
                << where;
            expect_data_order(r, pp, vpp, m, where);
            ++runs;
          }
        }
  EXPECT_EQ(runs, 2 * 406);
}

// 1F1B keeps at most pp - r micro-batches' activations on rank r (pp on the first), GPipe all m,
// ZB-H1 at most pp on every rank (1F1B's peak), interleaved (vpp - 1) pp + 2 (pp - r - 1) + 1
// chunks' (its warm-up, plus one).
TEST(PipelineSim, ActivationsInFlight) {
  for (int64_t pp = 1; pp <= 8; ++pp)
    for (int64_t m = pp; m <= 16; ++m) {
      const SimResult f1b = sim(pp, 1, m, PipelineKind::OneFOneB), gpipe = sim(pp, 1, m, PipelineKind::GPipe),
                      zb = sim(pp, 1, m, PipelineKind::ZeroBubbleH1);
      for (int64_t r = 0; r < pp; ++r) {
        const size_t k = static_cast<size_t>(r);
        EXPECT_EQ(f1b.ranks[k].peak_in_flight, pp - r) << name(pp, 1, m, PipelineKind::OneFOneB) << " rank " << r;
        EXPECT_EQ(gpipe.ranks[k].peak_in_flight, m) << name(pp, 1, m, PipelineKind::GPipe) << " rank " << r;
        EXPECT_LE(zb.ranks[k].peak_in_flight, pp) << name(pp, 1, m, PipelineKind::ZeroBubbleH1) << " rank " << r;
      }
      EXPECT_EQ(zb.ranks[0].peak_in_flight, pp);
    }
  for (int64_t pp = 2; pp <= 8; ++pp)
    for (int64_t vpp = 2; vpp <= 4; ++vpp)
      for (int64_t m = pp; m <= 16; m += pp) {
        const SimResult r = sim(pp, vpp, m, PipelineKind::Interleaved);
        for (int64_t k = 0; k < pp; ++k)
          EXPECT_EQ(r.ranks[static_cast<size_t>(k)].peak_in_flight,
                    std::min((vpp - 1) * pp + 2 * (pp - k - 1) + 1, vpp * m))
              << name(pp, vpp, m, PipelineKind::Interleaved) << " rank " << k;
      }
}

// With f = b and w folded into the backward, GPipe and 1F1B idle (p - 1)/(m + p - 1) of the step
// on every rank; the formula holds for any f and b (checked at b = 2f and b = f, w = 0 and w = f).
TEST(PipelineSim, BubbleOfGPipeAndOneFOneB) {
  for (const SimOptions& o : {SimOptions{1, 1, 0}, SimOptions{1, 1, 1}, SimOptions{1, 2, 0}})
    for (int64_t pp = 1; pp <= 8; ++pp)
      for (int64_t m = 1; m <= 16; ++m)
        for (PipelineKind kind : {PipelineKind::GPipe, PipelineKind::OneFOneB}) {
          if (!valid(pp, 1, m, kind)) continue;
          const SimResult r = sim(pp, 1, m, kind, o);
          const double p = static_cast<double>(pp), n = static_cast<double>(m);
          EXPECT_NEAR(r.bubble_fraction, (p - 1) / (n + p - 1), 1e-12) << name(pp, 1, m, kind);
          EXPECT_NEAR(r.makespan, (n + p - 1) * (o.forward + o.backward + o.weight), 1e-9) << name(pp, 1, m, kind);
          for (const SimRank& k : r.ranks) EXPECT_NEAR(k.idle, (p - 1) * (o.forward + o.backward + o.weight), 1e-9);
        }
}

// Full recomputation costs one forward more per backward. "bubble" moves it into R actions placed
// before the wait for each backward's gradient: every schedule still runs to the end (batches waited
// at use and, stricter, at post), the ranks do the same work as under "full", and the step is never
// longer than under "full" nor shorter than without recomputation. Two stages, 1F1B, 4
// micro-batches, f = b = w = 1: none 15, full 20, bubble 19 (rank 0's R0 fills its warm-up wait;
// the last rank has no wait before a backward, so its R lengthens its chain as under full).
TEST(PipelineSim, BubbleRecomputationFillsWaitsBeforeBackwards) {
  int64_t shorter = 0, checked = 0;
  for (int64_t pp = 2; pp <= 6; ++pp)
    for (int64_t vpp = 1; vpp <= 3; ++vpp)
      for (int64_t m = 1; m <= 12; ++m)
        for (PipelineKind kind : kKinds) {
          if (!valid(pp, vpp, m, kind)) continue;
          ++checked;
          SimOptions o{1, 1, 1};
          const SimResult none = simulate(pipeline_schedule(pp, vpp, m, kind), o);
          o.full_recompute = true;
          const SimResult full = simulate(pipeline_schedule(pp, vpp, m, kind), o);
          const Schedule bubble_schedule = pipeline_schedule(pp, vpp, m, kind, true);
          const SimResult bubble = simulate(bubble_schedule, o);
          o.wait = P2pWait::AtPost;
          const SimResult blocking = simulate(bubble_schedule, o);
          const std::string where = name(pp, vpp, m, kind);
          ASSERT_FALSE(bubble.deadlock || blocking.deadlock) << where;
          EXPECT_LE(bubble.makespan, full.makespan + 1e-9) << where;
          EXPECT_GE(bubble.makespan, none.makespan - 1e-9) << where;
          for (size_t r = 0; r < bubble.ranks.size(); ++r)
            EXPECT_NEAR(bubble.ranks[r].busy, full.ranks[r].busy, 1e-9) << where << " rank " << r;
          if (bubble.makespan < full.makespan - 1e-9) ++shorter;
        }
  EXPECT_GT(shorter, checked / 2) << "bubble recomputation shortens most steps";
  SimOptions o{1, 1, 1};
  EXPECT_NEAR(sim(2, 1, 4, PipelineKind::OneFOneB, o).makespan, 15, 1e-9);
  o.full_recompute = true;
  EXPECT_NEAR(sim(2, 1, 4, PipelineKind::OneFOneB, o).makespan, 20, 1e-9);
  EXPECT_NEAR(simulate(pipeline_schedule(2, 1, 4, PipelineKind::OneFOneB, true), o).makespan, 19, 1e-9);
}

// model.recompute_ahead = K: R's moved into earlier waits, at most K held. For every schedule and
// K = 1, 2, 3 and unbounded (m vpp), with f = b = w = 1 (the costs the generator places R by): it
// runs to the end (batches waited at use and at post), the same busy time per rank as "full", at
// most K held, never longer than "full" nor shorter than "none", and the step does not lengthen as
// K grows. K > 1 shortens no step there (each wait K = 1 fills is at least an R long, and the last
// rank, which never waits before a backward, is on the critical path: docs/parallel.md).
// With a latency of 1 per message (the generator does not know it; a smaller grid): the same for
// gpipe, 1f1b and zb-h1, where K > 1 shortens some steps (zb-h1 pp 4, m 8: 48, 47, 44 for K = 1,
// 2, unbounded), except "none" as a floor (a receive posted before the R's ahead of its reader
// hides latency that "none", which posts it later, waits out). Interleaved under latency is only
// run for deadlock, busy time and K: there R can lengthen the step (pp 2 vpp 3 m 6: full 48, K = 1
// 50) and a larger K can too (pp 6 vpp 2 m 12: K = 1 83, K = 2 85.5).
TEST(PipelineSim, RecomputeAheadFillsEarlierWaitsAndNeverLengthensTheStep) {
  for (double latency : {0.0, 1.0}) {
    int64_t shorter = 0;
    for (int64_t pp = 2; pp <= (latency > 0 ? 4 : 6); ++pp)
      for (int64_t vpp = 1; vpp <= 3; ++vpp)
        for (int64_t m = 1; m <= (latency > 0 ? 8 : 12); ++m)
          for (PipelineKind kind : kKinds) {
            if (!valid(pp, vpp, m, kind)) continue;
            const bool ordered = latency == 0 || kind != PipelineKind::Interleaved;
            SimOptions o{1, 1, 1};
            o.latency = latency;
            const double none = simulate(pipeline_schedule(pp, vpp, m, kind), o).makespan;
            o.full_recompute = true;
            const SimResult full = simulate(pipeline_schedule(pp, vpp, m, kind), o);
            double previous = full.makespan, one = 0;
            for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{3}, m * vpp}) {
              const Schedule schedule = pipeline_schedule(pp, vpp, m, kind, true, k);
              SimOptions at_post = o;
              at_post.wait = P2pWait::AtPost;
              const SimResult r = simulate(schedule, o), blocking = simulate(schedule, at_post);
              const std::string where = name(pp, vpp, m, kind) + " K " + std::to_string(k) + " latency " +
                                        std::to_string(latency);
              ASSERT_FALSE(r.deadlock || blocking.deadlock) << where;
              if (latency == 0) EXPECT_GE(r.makespan, none - 1e-9) << where;
              if (ordered)
                EXPECT_LE(r.makespan, previous + 1e-9) << where << " (full, or the step with a smaller K: " << previous
                                                       << ")";
              for (size_t q = 0; q < r.ranks.size(); ++q) {
                EXPECT_NEAR(r.ranks[q].busy, full.ranks[q].busy, 1e-9) << where << " rank " << q;
                EXPECT_LE(r.ranks[q].peak_recomputed, k) << where << " rank " << q;
              }
              previous = r.makespan;
              if (k == 1) one = r.makespan;
              if (k > 1 && r.makespan < one - 1e-9) ++shorter;
            }
          }
    if (latency == 0) EXPECT_EQ(shorter, 0) << "unit costs: K > 1 shortens no step";
    if (latency > 0) EXPECT_GT(shorter, 0) << "with latency, K > 1 shortens some steps";
  }
  SimOptions o{1, 1, 1};
  o.full_recompute = true;
  o.latency = 1;
  const auto step = [&](int64_t k) { return simulate(pipeline_schedule(4, 1, 8, PipelineKind::ZeroBubbleH1, true, k), o); };
  EXPECT_NEAR(step(1).makespan, 48, 1e-9);
  EXPECT_NEAR(step(2).makespan, 47, 1e-9);
  EXPECT_NEAR(step(8).makespan, 44, 1e-9);
  EXPECT_EQ(step(2).ranks[0].peak_recomputed, 2);
  EXPECT_EQ(step(1).ranks[0].peak_recomputed, 1);
}

// bubble_schedule_for_costs: R placed by the simulator's costs (and latency) instead of the unit
// timeline, never a longer step than each R right before its B (recompute_ahead = 1), by the
// simulator itself as the oracle, on the grid (pp 2-5, vpp 1-3, m 1-8, every kind, K = 2, 3 and
// unbounded) for unit costs without and with latency and for unequal ones (B twice F, W half, a
// cheaper R, latency 0.5); nor longer than the unit-timeline placement of the same K; no more than K
// recomputed micro-batches held; no deadlock waiting where the executor does or at every post. And
// the costs matter: with latency the cost-walked placement beats both on some cases (among them
// the interleaved pp 6, vpp 2, m 12 that the unit placement lengthens from 83 to 85.5).
TEST(PipelineSim, BubbleScheduleForCostsIsNeverLongerThanEachRBeforeItsBackward) {
  SimOptions unequal{1, 2, 0.5};
  unequal.latency = 0.5;
  SimOptions latency{1, 1, 1};
  latency.latency = 1;
  int64_t cost_wins = 0;
  for (const SimOptions& costs : {SimOptions{1, 1, 1}, latency, unequal}) {
    for (int64_t pp = 2; pp <= 5; ++pp)
      for (int64_t vpp = 1; vpp <= 3; ++vpp)
        for (int64_t m = 1; m <= 8; ++m)
          for (PipelineKind kind : kKinds) {
            if (!valid(pp, vpp, m, kind)) continue;
            SimOptions o = costs;
            o.full_recompute = true;
            if (o.weight == 0.5) {  // unequal: every chunk's own costs, its R at 0.75 of its forward
              const double v = static_cast<double>(vpp);
              o.chunks.assign(static_cast<size_t>(pp * vpp), ChunkCost{1 / v, 2 / v, 0.5 / v, 0.75 / v});
            }
            const double one = simulate(pipeline_schedule(pp, vpp, m, kind, true, 1), o).makespan;
            for (int64_t k : {int64_t{2}, int64_t{3}, m * vpp}) {
              const std::string where = name(pp, vpp, m, kind) + " K " + std::to_string(k) + " latency " +
                                        std::to_string(o.latency) + " b " + std::to_string(o.backward);
              const Schedule s = bubble_schedule_for_costs(pp, vpp, m, kind, k, o);
              SimOptions at_post = o;
              at_post.wait = P2pWait::AtPost;
              const SimResult r = simulate(s, o);
              ASSERT_FALSE(r.deadlock || simulate(s, at_post).deadlock) << where;
              const double unit = simulate(pipeline_schedule(pp, vpp, m, kind, true, k), o).makespan;
              EXPECT_LE(r.makespan, one + 1e-9) << where << ": each R before its B takes " << one;
              EXPECT_LE(r.makespan, unit + 1e-9) << where << ": the unit placement takes " << unit;
              for (const SimRank& q : r.ranks) EXPECT_LE(q.peak_recomputed, k) << where;
              if (r.makespan < std::min(one, unit) - 1e-9) ++cost_wins;
            }
          }
  }
  EXPECT_GT(cost_wins, 0) << "placing by the costs never beat both the unit placement and K = 1";
  SimOptions o{1, 1, 1};
  o.full_recompute = true;
  o.latency = 1;
  const auto step = [&](const Schedule& s) { return simulate(s, o).makespan; };
  EXPECT_NEAR(step(pipeline_schedule(6, 2, 12, PipelineKind::Interleaved, true, 1)), 83, 1e-9);
  EXPECT_NEAR(step(pipeline_schedule(6, 2, 12, PipelineKind::Interleaved, true, 2)), 85.5, 1e-9);
  EXPECT_LE(step(bubble_schedule_for_costs(6, 2, 12, PipelineKind::Interleaved, 2, o)), 83 + 1e-9);
}

// Interleaving cuts the fill and drain into chunk-sized steps: the idle time is 1F1B's divided by
// vpp, (p - 1)(f + b + w) / v, so the bubble relative to the work is (p - 1)/(v m). Measured exactly
// so with equal costs and with b = 2f.
TEST(PipelineSim, BubbleOfInterleaved) {
  for (const SimOptions& o : {SimOptions{1, 1, 1}, SimOptions{1, 2, 0}})
    for (int64_t pp = 2; pp <= 8; ++pp)
      for (int64_t vpp = 2; vpp <= 4; ++vpp)
        for (int64_t m = pp; m <= 16; m += pp) {
          const SimResult r = sim(pp, vpp, m, PipelineKind::Interleaved, o);
          const double p = static_cast<double>(pp), v = static_cast<double>(vpp), n = static_cast<double>(m);
          const double step = o.forward + o.backward + o.weight;
          for (const SimRank& k : r.ranks) {
            EXPECT_NEAR(k.idle, (p - 1) * step / v, 1e-9) << name(pp, vpp, m, PipelineKind::Interleaved);
            EXPECT_NEAR(k.idle / k.busy, (p - 1) / (v * n), 1e-9);
          }
        }
}

// ZB-H1 at f = b = w idles (p - 1)(f + b - w) per rank: a third of 1F1B's (p - 1)(f + b + w); and
// it stays at or under 1F1B's idle time for other costs (b = 1.2, w = 0.8; W free).
TEST(PipelineSim, BubbleOfZeroBubbleH1) {
  for (int64_t pp = 2; pp <= 8; ++pp)
    for (int64_t m = pp; m <= 16; ++m) {
      const SimResult zb = sim(pp, 1, m, PipelineKind::ZeroBubbleH1), f1b = sim(pp, 1, m, PipelineKind::OneFOneB);
      for (size_t k = 0; k < zb.ranks.size(); ++k) {
        EXPECT_NEAR(zb.ranks[k].idle, static_cast<double>(pp - 1), 1e-9) << name(pp, 1, m, PipelineKind::ZeroBubbleH1);
        EXPECT_NEAR(zb.ranks[k].idle / f1b.ranks[k].idle, 1.0 / 3.0, 1e-9);
      }
      for (const SimOptions& o : {SimOptions{1, 1.2, 0.8}, SimOptions{1, 1, 0}}) {
        const double zb_idle = sim(pp, 1, m, PipelineKind::ZeroBubbleH1, o).ranks[0].idle;
        EXPECT_LE(zb_idle, sim(pp, 1, m, PipelineKind::OneFOneB, o).ranks[0].idle + 1e-9)
            << name(pp, 1, m, PipelineKind::ZeroBubbleH1) << " b " << o.backward << " w " << o.weight;
      }
    }
}

// Per-chunk costs (SimOptions::chunks, the planner's unequal stages): equal entries give the uniform
// result; a stage twice as slow as the others sets the pace of the steady phase. 1F1B over 2 stages
// with stage 1 at (f, b, w) = (2, 2, 2) and stage 0 at (1, 1, 1), m = 4: stage 1 computes 4 x 6 = 24
// and waits for stage 0's first forward (1), then runs back to back; stage 0's last backward follows
// stage 1's: 1 + 24 + 2 = 27.
TEST(PipelineSim, PerChunkCosts) {
  for (PipelineKind kind : {PipelineKind::GPipe, PipelineKind::OneFOneB, PipelineKind::ZeroBubbleH1}) {
    SimOptions same;
    same.chunks.assign(4, ChunkCost{1, 1, 1});
    const SimResult a = sim(4, 1, 8, kind), b = sim(4, 1, 8, kind, same);
    EXPECT_NEAR(a.makespan, b.makespan, 1e-12) << pipeline_kind_name(kind);
    EXPECT_NEAR(a.bubble_fraction, b.bubble_fraction, 1e-12) << pipeline_kind_name(kind);
  }
  SimOptions halves;  // interleaved: a chunk's entry is its own time (1/vpp of the stage's above)
  halves.chunks.assign(8, ChunkCost{0.5, 0.5, 0.5});
  EXPECT_NEAR(sim(4, 2, 8, PipelineKind::Interleaved, halves).makespan, sim(4, 2, 8, PipelineKind::Interleaved).makespan,
              1e-12);
  SimOptions slow_last;
  slow_last.chunks = {ChunkCost{1, 1, 1}, ChunkCost{2, 2, 2}};
  const SimResult r = sim(2, 1, 4, PipelineKind::OneFOneB, slow_last);
  EXPECT_NEAR(r.makespan, 27.0, 1e-12);
  EXPECT_NEAR(r.ranks[1].busy, 24.0, 1e-12);
  EXPECT_NEAR(r.ranks[0].busy, 12.0, 1e-12);
  SimOptions wrong;
  wrong.chunks.assign(3, ChunkCost{1, 1, 1});
  EXPECT_TRUE(testing::throws_with([&] { sim(2, 1, 4, PipelineKind::OneFOneB, wrong); }, {"3 chunk costs for 2 x 1"}));
}

// Every transfer crosses a link, and the fill and drain cross 2 (pp - 1) of them in a row.
TEST(PipelineSim, LatencyLengthensTheStep) {
  for (PipelineKind kind : {PipelineKind::GPipe, PipelineKind::OneFOneB, PipelineKind::ZeroBubbleH1}) {
    SimOptions slow;
    slow.latency = 0.25;
    const double base = sim(4, 1, 8, kind).makespan, with = sim(4, 1, 8, kind, slow).makespan;
    EXPECT_GE(with, base + 2 * 3 * 0.25 - 1e-9) << pipeline_kind_name(kind);
    EXPECT_FALSE(sim(4, 1, 8, kind, slow).deadlock);
  }
}

// Hand-made lists: a deadlock names each stuck rank, its batch and what it waits for.
TEST(PipelineSim, ReportsADeadlockWithTheStuckActions) {
  // Rank 0 waits for the gradient before sending the activation that would produce it.
  Schedule s{1, {{forward_action(0), recv_grad(0), backward_action(0), send_activation(0)},
                 {recv_activation(0), forward_action(0), backward_action(0), send_grad(0)}}};
  for (P2pWait wait : {P2pWait::AtUse, P2pWait::AtPost}) {
    SimOptions o;
    o.wait = wait;
    const SimResult r = simulate(s, o);
    ASSERT_TRUE(r.deadlock);
    ASSERT_EQ(r.stuck.size(), 2u);
    EXPECT_EQ(r.stuck[0], "rank 0 waits for its batch [recvG0] (actions 1-1): rank 1 has not posted sendG0 (it "
                          "waits for its batch [recvA0])");
    EXPECT_EQ(r.stuck[1], "rank 1 waits for its batch [recvA0] (actions 0-0): rank 0 has not posted sendA0 (it "
                          "waits for its batch [recvG0])");
  }
  // A send nobody receives leaves its batch waiting at the end of the step.
  Schedule lost{1,
                {{forward_action(0), send_activation(0), backward_action(0)}, {forward_action(0), backward_action(0)}}};
  const SimResult r = simulate(lost);
  ASSERT_TRUE(r.deadlock);
  EXPECT_EQ(r.stuck, (std::vector<std::string>{"rank 0 waits for its batch [sendA0] (actions 1-1): rank 1 has not "
                                               "posted recvA0 (it has finished)"}));
}

TEST(PipelineSim, RefusesMismatchedMessagesAndMalformedLists) {
  // Rank 1 posts its receives in another order than rank 0 sends: the first receive would get the
  // other micro-batch's activation (same size, wrong data: the simulator refuses it).
  Schedule swapped = pipeline_schedule(2, 1, 2, PipelineKind::GPipe);
  swapped.stages[1] = {recv_activation(1), recv_activation(0), forward_action(0), forward_action(1),
                       backward_action(0), send_grad(0), backward_action(1), send_grad(1)};
  EXPECT_TRUE(testing::throws_with([&] { simulate(swapped); },
                                   {"rank 1's action 0 (recvA1) would receive rank 0's action 1 (sendA0)",
                                    "match in the order they are posted"}));
  Schedule bad = pipeline_schedule(2, 1, 2, PipelineKind::GPipe);
  std::swap(bad.stages[0][0], bad.stages[0][1]);  // sendA0 before F0
  EXPECT_TRUE(testing::throws_with(
      [&] { simulate(bad); }, {"simulate: rank 0: run_schedule: action 0 (sendA0) comes before micro-batch 0's forward"}));
}

TEST(PipelineSim, TimelineJson) {
  const Schedule s = pipeline_schedule(2, 1, 2, PipelineKind::OneFOneB);
  const SimOptions o;
  const std::string json = timeline_json(s, simulate(s, o), "1f1b", o);
  EXPECT_NE(json.find("\"schedule\": \"1f1b\", \"pp\": 2, \"vpp\": 1, \"micro_batches\": 2"), std::string::npos);
  EXPECT_NE(json.find("\"deadlock\": false, \"makespan\": 9, \"bubble_fraction\": 0.333333333333"), std::string::npos)
      << json;
  EXPECT_NE(json.find("{\"rank\": 1, \"kind\": \"B\", \"micro_batch\": 1, \"chunk\": 0, \"start\": 5, \"end\": 7}"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"recompute\": \"none\""), std::string::npos) << json;
  // Bubble recomputation: the R spans are drawn (scripts/pipeline_timeline.py), named as such.
  SimOptions full;
  full.full_recompute = true;
  const Schedule b = pipeline_schedule(2, 1, 2, PipelineKind::OneFOneB, true);
  const std::string bubble = timeline_json(b, simulate(b, full), "1f1b", full);
  EXPECT_NE(bubble.find("\"recompute\": \"bubble\""), std::string::npos) << bubble;
  EXPECT_NE(bubble.find("\"kind\": \"R\", \"micro_batch\": 0"), std::string::npos) << bubble;
  EXPECT_NE(timeline_json(s, simulate(s, full), "1f1b", full).find("\"recompute\": \"full\""), std::string::npos);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// An R action takes the chunk's own recompute time when given (the planner's: the recomputed
// blocks, not the embedding or head), else its forward. GPipe, 2 stages, 1 micro-batch, f = 1,
// b = 2 (w = 0), R before each B: rank 1 runs F [1, 2], R [2, 2 + r], B [2 + r, 4 + r]; rank 0's R
// fills its wait, its B [4 + r, 6 + r].
TEST(PipelineSim, RecomputeActionsTakeTheirOwnCost) {
  const Schedule s = pipeline_schedule(2, 1, 1, PipelineKind::GPipe, true);
  SimOptions o;
  o.chunks.assign(2, ChunkCost{1, 2, 0, 0.5});
  EXPECT_NEAR(simulate(s, o).makespan, 6.5, 1e-12);
  o.chunks.assign(2, ChunkCost{1, 2, 0});  // no recompute time given: the forward's
  EXPECT_NEAR(simulate(s, o).makespan, 7.0, 1e-12);
}

}  // namespace
}  // namespace tessera

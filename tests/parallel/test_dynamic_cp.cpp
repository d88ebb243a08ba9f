// Tests parallel/dynamic_cp.h: the pairs a split member holds (against counting every (query, key)
// pair), hand-computed plans (short rows stay whole, a long row is split only when the ring is
// cheap), the planner against an exhaustive search over every placement on small cases, and the
// passes' global order.
#include "parallel/dynamic_cp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/check.h"

namespace tessera {
namespace {

// Counts visible pairs directly: query p sees key j iff start(p) <= j <= p.
int64_t count_pairs(const std::vector<int64_t>& docs, const std::vector<int64_t>& positions) {
  std::vector<int64_t> start_of;
  int64_t s = 0;
  for (int64_t d : docs) {
    for (int64_t i = 0; i < d; ++i) start_of.push_back(s);
    s += d;
  }
  int64_t pairs = 0;
  for (int64_t p : positions)
    for (int64_t j = 0; j <= p; ++j) pairs += j >= start_of[static_cast<size_t>(p)] ? 1 : 0;
  return pairs;
}

TEST(DynamicCp, RowPairsCountEveryVisiblePair) {
  const std::vector<int64_t> docs = {5, 11, 3, 13};  // 32 positions
  std::vector<int64_t> all(32);
  for (int64_t i = 0; i < 32; ++i) all[static_cast<size_t>(i)] = i;
  EXPECT_EQ(cp_row_pairs(docs, 32, 1, 0), count_pairs(docs, all));
  EXPECT_EQ(cp_row_pairs(docs, 32, 1, 0), 15 + 66 + 6 + 91);
  for (int64_t ranks : {2, 4, 8}) {
    const int64_t c = 32 / (2 * ranks);
    int64_t total = 0;
    for (int64_t i = 0; i < ranks; ++i) {
      std::vector<int64_t> mine;
      for (int64_t p = i * c; p < (i + 1) * c; ++p) mine.push_back(p);
      for (int64_t p = (2 * ranks - 1 - i) * c; p < (2 * ranks - i) * c; ++p) mine.push_back(p);
      const int64_t got = cp_row_pairs(docs, 32, ranks, i);
      EXPECT_EQ(got, count_pairs(docs, mine)) << ranks << " ranks, member " << i;
      total += got;
    }
    EXPECT_EQ(total, cp_row_pairs(docs, 32, 1, 0)) << ranks;
  }
  // One document over the whole row: the load-balanced chunks give every member the same pairs.
  EXPECT_EQ(cp_row_pairs({32}, 32, 4, 0), cp_row_pairs({32}, 32, 4, 3));
  EXPECT_THROW(cp_row_pairs({5, 5}, 12, 1, 0), Error);  // documents not covering the row
  EXPECT_THROW(cp_row_pairs({12}, 12, 4, 0), Error);    // 12 not a multiple of 8
}

TEST(DynamicCp, SplitSizesDivideCpAndTheRow) {
  EXPECT_EQ(cp_split_sizes(4, 64), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(cp_split_sizes(4, 12), (std::vector<int64_t>{2}));  // 12 % 8 != 0
  EXPECT_EQ(cp_split_sizes(6, 48), (std::vector<int64_t>{2, 3, 6}));
  EXPECT_TRUE(cp_split_sizes(1, 64).empty());
}

// Pure attention cost (1 s per pair) and a ring step of `ring` seconds.
CpCostModel model(double ring, double token = 0) { return {token, 1.0, ring, 0.0}; }

TEST(DynamicCp, HandComputedPlans) {
  // cp 2, four rows of short documents, equal: two whole rows per rank, nothing split.
  const std::vector<int64_t> shorts = {4, 4, 4, 4};  // 4 x 10 = 40 pairs
  CpPlan p = plan_dynamic_cp({shorts, shorts, shorts, shorts}, 16, 2, model(1.0));
  EXPECT_EQ(p.split_rows(), 0);
  EXPECT_EQ(p.rank_s, (std::vector<double>{80, 80}));
  EXPECT_TRUE(p.optimal);
  // cp 2, a row of one 16-token document (136 pairs; split in chunks of 4, member 0 holds 0..3 and
  // 12..15: 10 + 58 = 68 pairs, member 1 4..7 and 8..11: 26 + 42 = 68) and two rows of shorts (40;
  // split: 20 a member). Ring step 10: the long row split (68 + 10 each) and the short rows either
  // whole, one on each rank, or in the same pass (20 + 20 each, no further ring step): 118.
  p = plan_dynamic_cp({{16}, shorts, shorts}, 16, 2, model(10.0));
  EXPECT_EQ(p.rows[0], (CpPlacement{0, 2}));
  EXPECT_DOUBLE_EQ(p.max_s(), 118);
  // Ring step 100: splitting the long row costs 168 a rank, more than 136 whole: nothing split.
  p = plan_dynamic_cp({{16}, shorts, shorts}, 16, 2, model(100.0));
  EXPECT_EQ(p.split_rows(), 0);
  EXPECT_DOUBLE_EQ(p.max_s(), 136);
  // cp 4, one row of a 32-token document (528 pairs; 132 per member over 4, 264 over 2) and four
  // rows of 8 x 4 (80 each). Ring step 1: over all 4 (132 + 3), a short row whole on each (or every
  // row in the one pass over 4: 132 + 4 x 20 + 3): 215.
  const std::vector<int64_t> s8 = {4, 4, 4, 4, 4, 4, 4, 4};
  const std::vector<std::vector<int64_t>> rows = {s8, {32}, s8, s8, s8};
  p = plan_dynamic_cp(rows, 32, 4, model(1.0));
  EXPECT_EQ(p.rows[1], (CpPlacement{0, 4}));
  EXPECT_DOUBLE_EQ(p.max_s(), 215);
  // Ring step 200: over 4 costs 732 a rank, over 2 464, whole 528: over a pair, the other pair
  // takes two short rows each (160).
  p = plan_dynamic_cp(rows, 32, 4, model(200.0));
  EXPECT_EQ(p.rows[1].ranks, 2);
  EXPECT_EQ(p.split_rows(), 1);
  EXPECT_DOUBLE_EQ(p.max_s(), 464);
  // Ring step 1000: whole (528) beats over 2 (1264).
  p = plan_dynamic_cp(rows, 32, 4, model(1000.0));
  EXPECT_EQ(p.split_rows(), 0);
  EXPECT_DOUBLE_EQ(p.max_s(), 528);
}

// A split pass's ring step is paid once however many rows it carries (their K/V travel in the same
// messages); the per-position term once per row.
TEST(DynamicCp, RowsOfOnePassShareItsRingStep) {
  // cp 2, rows of 16: two of one document (136 pairs whole, 68 a member split), one of shorts (40;
  // 20 a member), ring step 10 and 0.25 per K/V position (1 step x 8 positions: 2 a row).
  const std::vector<int64_t> shorts = {4, 4, 4, 4};
  const std::vector<std::vector<int64_t>> rows = {{16}, {16}, shorts};
  const CpCostModel m{0, 1.0, 10.0, 0.25};
  EXPECT_EQ(cp_rank_seconds(rows, 16, 2, {{0, 2}, {0, 2}, {0, 2}}, m),
            (std::vector<double>{68 + 68 + 20 + 3 * 2 + 10, 68 + 68 + 20 + 3 * 2 + 10}));
  EXPECT_EQ(cp_rank_seconds(rows, 16, 2, {{0, 2}, {0, 1}, {1, 1}}, m), (std::vector<double>{68 + 2 + 10 + 136, 68 + 2 + 10 + 40}));
  // cp 4: two subgroups, a pass each.
  EXPECT_EQ(cp_rank_seconds(rows, 16, 4, {{0, 2}, {2, 2}, {2, 2}}, m),
            (std::vector<double>{68 + 2 + 10, 68 + 2 + 10, 68 + 20 + 4 + 10, 68 + 20 + 4 + 10}));
  EXPECT_DOUBLE_EQ(cp_pass_s(4, m), 30);
  EXPECT_DOUBLE_EQ(cp_pass_s(1, m), 0);
  // The plan (ring step 10, no per-position term): whole at best {136 + 40, 136}: 176; all three in
  // one pass 68 + 68 + 20 + 10 = 166 a rank, the least (any split adds 10 to both ranks' 312 / 2).
  // Were the step paid per row (3 x 10), whole would win.
  const CpPlan p = plan_dynamic_cp(rows, 16, 2, model(10.0));
  EXPECT_EQ(p.split_rows(), 3);
  EXPECT_DOUBLE_EQ(p.max_s(), 166);
}

// The best slowest rank over every assignment of a placement to each row: an independent
// exhaustive search (the placements enumerated here, costs from cp_rank_seconds).
double brute_force(const std::vector<std::vector<int64_t>>& rows, int64_t length, int64_t cp, const CpCostModel& m) {
  std::vector<CpPlacement> options;
  for (int64_t r = 0; r < cp; ++r) options.push_back({r, 1});
  for (int64_t s = 2; s <= cp; ++s)
    if (cp % s == 0 && length % (2 * s) == 0)
      for (int64_t f = 0; f < cp; f += s) options.push_back({f, s});
  std::vector<size_t> pick(rows.size(), 0);
  double best = 1e300;
  while (true) {
    std::vector<CpPlacement> ps;
    for (size_t i : pick) ps.push_back(options[i]);
    const std::vector<double> load = cp_rank_seconds(rows, length, cp, ps, m);
    best = std::min(best, *std::max_element(load.begin(), load.end()));
    size_t k = 0;
    while (k < pick.size() && ++pick[k] == options.size()) pick[k++] = 0;
    if (k == pick.size()) break;
  }
  return best;
}

// Random rows of long-tailed documents: mostly short, some the whole row.
std::vector<int64_t> random_row(std::mt19937& rng, int64_t length) {
  std::vector<int64_t> docs;
  int64_t left = length;
  while (left > 0) {
    const bool long_doc = rng() % 5 == 0;
    int64_t d = long_doc ? length : 1 + static_cast<int64_t>(rng() % 6);
    d = std::min(d, left);
    docs.push_back(d);
    left -= d;
  }
  return docs;
}

TEST(DynamicCp, PlannerAgainstExhaustiveSearch) {
  std::mt19937 rng(7);
  int cases = 0, greedy_exact = 0;
  for (int64_t cp : {2, 4})
    for (int64_t rows_n : {2, 3, 4, 5})
      for (double ring : {0.0, 5.0, 40.0, 400.0})
        for (int rep = 0; rep < 3; ++rep) {
          const int64_t length = 32;
          std::vector<std::vector<int64_t>> rows;
          for (int64_t i = 0; i < rows_n; ++i) rows.push_back(random_row(rng, length));
          const CpCostModel m{0.5, 1.0, ring, 0.25};
          const CpPlan plan = plan_dynamic_cp(rows, length, cp, m);
          const double best = brute_force(rows, length, cp, m);
          // The plan's own numbers are its placements' (not a separate bookkeeping).
          EXPECT_EQ(plan.rank_s, cp_rank_seconds(rows, length, cp, plan.rows, m));
          ASSERT_TRUE(plan.optimal);  // small cases: the search finishes
          EXPECT_NEAR(plan.max_s(), best, 1e-9 * best) << "cp " << cp << ", " << rows_n << " rows, ring " << ring;
          // The greedy start alone (no search nodes) is a valid plan, never better than the optimum.
          const CpPlan greedy = plan_dynamic_cp(rows, length, cp, m, 0);
          EXPECT_FALSE(greedy.optimal);
          EXPECT_GE(greedy.max_s(), best * (1 - 1e-12));
          greedy_exact += greedy.max_s() <= best * (1 + 1e-9) ? 1 : 0;
          ++cases;
        }
  std::printf("greedy start alone optimal in %d of %d cases\n", greedy_exact, cases);
}

// fit_cp_cost on synthetic timings of a row of 64 (hand-computed): one document has 64 x 65 / 2 =
// 2080 pairs, eight of 8 have 8 x 36 = 288; split over 2 each member holds 1040 pairs (chunks of
// 16: 1..16 and 49..64, or 17..48), over 4 each 520. From token 1 ms, pair 10 us, ring step 2 ms +
// 50 us per position: whole 84.8 and 66.88 ms; over 2: 32 + 10.4 + 1 x (2 + 1.6) = 46 ms; over 4:
// 16 + 5.2 + 3 x (2 + 0.8) = 29.6 ms.
TEST(DynamicCp, CostFitRecoversHandComputedTimings) {
  CpTimings t;
  t.length = 64;
  t.docs_a = {64};
  t.docs_b = std::vector<int64_t>(8, 8);
  t.whole_a_s = 0.0848;
  t.whole_b_s = 0.06688;
  t.split_ranks = {2, 4};
  t.split_s = {0.046, 0.0296};
  const auto near = [](double got, double want) { EXPECT_NEAR(got, want, 1e-9 * std::max(1e-12, want)) << want; };
  CpCostModel m = fit_cp_cost(t);
  near(m.token_s, 1e-3);
  near(m.pair_s, 1e-5);
  near(m.ring_step_s, 2e-3);
  near(m.ring_token_s, 5e-5);
  // The fitted model predicts each split's slowest member as measured (the point of the fit).
  for (size_t i = 0; i < t.split_ranks.size(); ++i) {
    const std::vector<double> c = cp_row_cost(t.docs_a, 64, t.split_ranks[i], m);
    near(*std::max_element(c.begin(), c.end()) + cp_pass_s(t.split_ranks[i], m), t.split_s[i]);
  }
  // One size (cp 2): the whole overhead per ring step, 3.6 ms, on ring_step_s.
  t.split_ranks = {2};
  t.split_s = {0.046};
  m = fit_cp_cost(t);
  near(m.ring_step_s, 3.6e-3);
  EXPECT_EQ(m.ring_token_s, 0);
  // Overhead per step growing with the subgroup (4 ms over 2, 5 ms per step over 4, y = 4 and 15 ms):
  // the unconstrained slope is negative; step alone: (1 x 4 + 3 x 15) / (1 + 9) = 4.9 ms, residual
  // 0.9e-6, against per position alone (32 x 4 + 48 x 15) / (32^2 + 48^2) ms, residual 2.5e-5.
  t.split_ranks = {2, 4};
  t.split_s = {0.0424 + 0.004, 0.0212 + 0.015};
  m = fit_cp_cost(t);
  near(m.ring_step_s, 4.9e-3);
  EXPECT_EQ(m.ring_token_s, 0);
  // Splits faster than their share of the whole row's work: no ring cost (never negative).
  t.split_s = {0.040, 0.020};
  m = fit_cp_cost(t);
  EXPECT_EQ(m.ring_step_s, 0);
  EXPECT_EQ(m.ring_token_s, 0);
  t.split_s = {0.040};
  EXPECT_THROW(fit_cp_cost(t), Error);  // a time per size
}

TEST(DynamicCp, PassesFollowOneGlobalOrder) {
  CpPlan plan;
  plan.rows = {{2, 1}, {0, 2}, {0, 4}, {2, 2}, {0, 2}, {3, 1}};
  plan.rank_s.assign(4, 0.0);
  const std::vector<CpPass> r0 = cp_passes(plan, 0);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[0].group, (CpPlacement{0, 2}));
  EXPECT_EQ(r0[0].rows, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(r0[1].group, (CpPlacement{0, 4}));
  const std::vector<CpPass> r2 = cp_passes(plan, 2);
  ASSERT_EQ(r2.size(), 3u);
  EXPECT_EQ(r2[0].group, (CpPlacement{0, 4}));
  EXPECT_EQ(r2[1].group, (CpPlacement{2, 2}));
  EXPECT_EQ(r2[2].group, (CpPlacement{2, 1}));  // its whole rows last
  EXPECT_EQ(r2[2].rows, (std::vector<int64_t>{0}));
  EXPECT_EQ(cp_passes(plan, 3).back().rows, (std::vector<int64_t>{5}));
  EXPECT_EQ(cp_passes(plan, 1).size(), 2u);  // no whole rows: no whole pass
}

}  // namespace
}  // namespace tessera

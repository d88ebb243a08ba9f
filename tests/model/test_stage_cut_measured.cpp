// Tests model/stage_cut_measured.h: stage times add up the parts; the cut by time equals hand-computed
// optima, and on random part times with random memory limits its slowest stage equals the best of
// every cut tried one by one (brute force), and among those its sum of squared stage times is the
// least; the memory limit is kept; a vision-language model's
// stage 0 may hold no block; ties go to the earlier stages holding fewer blocks; with a head (or a
// vision tower) slower than the FLOPs formula says, the measured cut differs from the FLOPs cut
// (model/stage_cut.h) and its slowest stage is faster.
#include "model/stage_cut_measured.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "error_testing.h"
#include "model/stage_cut.h"

namespace tessera {
namespace {

using testing::throws_with;

PartTimes uniform(int64_t L, double block, double embedding = 0, double head = 0, double vision = 0) {
  PartTimes t;
  t.blocks.assign(static_cast<size_t>(L), block);
  t.embedding = embedding;
  t.head = head;
  t.vision = vision;
  return t;
}

double slowest(const PartTimes& t, const std::vector<int64_t>& blocks) {
  const std::vector<double> s = stage_times(t, blocks);
  return *std::max_element(s.begin(), s.end());
}

// The sum of squared stage times, stage 0 first (the order the rule adds them in).
double squares(const PartTimes& t, const std::vector<int64_t>& blocks) {
  double q = 0;
  for (double s : stage_times(t, blocks)) q += s * s;
  return q;
}

// Every cut of L blocks into pp stages (each at least one block, stage 0 at least zero with
// encoder_stage) that fits, in turn.
void each_cut(int64_t L, int64_t pp, bool encoder_stage, const StageFits& fits,
              const std::function<void(const std::vector<int64_t>&)>& visit) {
  std::vector<int64_t> blocks(static_cast<size_t>(pp), 0);
  std::function<void(int64_t, int64_t)> place = [&](int64_t r, int64_t left) {
    if (r == pp - 1) {
      if (left < 1 || (fits && !fits(r, left))) return;
      blocks[static_cast<size_t>(r)] = left;
      visit(blocks);
      return;
    }
    for (int64_t n = (r == 0 && encoder_stage) ? 0 : 1; n <= left - (pp - 1 - r); ++n) {
      if (fits && !fits(r, n)) continue;
      blocks[static_cast<size_t>(r)] = n;
      place(r + 1, left - n);
    }
  };
  place(0, L);
}

TEST(StageCutMeasured, StageTimesAddTheirParts) {
  PartTimes t;
  t.blocks = {1, 2, 3, 4, 5};
  t.embedding = 0.5;
  t.vision = 0.25;
  t.head = 10;
  EXPECT_EQ(stage_times(t, {2, 3}), (std::vector<double>{0.75 + 3, 12 + 10}));
  EXPECT_EQ(stage_times(t, {0, 1, 4}), (std::vector<double>{0.75, 1, 14 + 10}));
  EXPECT_EQ(stage_times(t, {5}), (std::vector<double>{0.75 + 15 + 10}));
  EXPECT_TRUE(throws_with([&] { stage_times(t, {2, 2}); }, {"4 blocks", "5"}));
}

TEST(StageCutMeasured, HandComputedCuts) {
  // Identical blocks, nothing else: the even split.
  EXPECT_EQ(cut_by_time(uniform(6, 1.0), 3, false), (std::vector<int64_t>{2, 2, 2}));
  // A head worth 4 blocks on 8 blocks over 2 stages: max(k, 8 - k + 4) is least at k = 6.
  EXPECT_EQ(cut_by_time(uniform(8, 1.0, 0, 4), 2, false), (std::vector<int64_t>{6, 2}));
  // A slow first block: [5 | 1 1 1 1 1] balances at 5 against 5.
  PartTimes skew;
  skew.blocks = {5, 1, 1, 1, 1, 1};
  EXPECT_EQ(cut_by_time(skew, 2, false), (std::vector<int64_t>{1, 5}));
  // Four stages of 1, 2, ..., 8 (36): 10 is impossible (greedy stages under 10: [1..4], [5], [6],
  // [7], [8] are five), 11 is reached by [1 2 3 4 | 5 6 | 7 | 8] = 10, 11, 7, 8.
  PartTimes ramp;
  ramp.blocks = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int64_t> cut = cut_by_time(ramp, 4, false);
  EXPECT_EQ(slowest(ramp, cut), 11.0);
  EXPECT_EQ(cut, (std::vector<int64_t>{4, 2, 1, 1}));
  // A vision tower worth 6 blocks, 6 blocks on 3 stages: its stage holds no block, and of the cuts
  // reaching 6 ([0, 1, 5], [0, 2, 4], [0, 3, 3], ...) the evenest is taken.
  EXPECT_EQ(cut_by_time(uniform(6, 1.0, 0, 0, 6), 3, true), (std::vector<int64_t>{0, 3, 3}));
  // The same without the encoder stage allowed: one block on stage 0 (7), then 3 | 2 or 2 | 3 (the
  // fewer on the earlier stage).
  const std::vector<int64_t> no_encoder = cut_by_time(uniform(6, 1.0, 0, 0, 6), 3, false);
  EXPECT_EQ(no_encoder, (std::vector<int64_t>{1, 2, 3}));
}

TEST(StageCutMeasured, TiesGoToFewerBlocksOnEarlierStages) {
  // All zero: every cut ties (slowest and squares); the earlier stages hold one block each (none for
  // the encoder's), the last the rest.
  EXPECT_EQ(cut_by_time(uniform(7, 0.0), 3, false), (std::vector<int64_t>{1, 1, 5}));
  EXPECT_EQ(cut_by_time(uniform(7, 0.0), 3, true), (std::vector<int64_t>{0, 1, 6}));
}

TEST(StageCutMeasured, MemoryLimitIsKept) {
  // Unlimited: [6, 2] (above). Stage 0 may hold at most 4 blocks: [4, 4] (stage 1: 4 + 4 = 8).
  const PartTimes t = uniform(8, 1.0, 0, 4);
  const StageFits at_most_4_first = [](int64_t r, int64_t n) { return r != 0 || n <= 4; };
  EXPECT_EQ(cut_by_time(t, 2, false, at_most_4_first), (std::vector<int64_t>{4, 4}));
  // Stage 1 at most 1: [7, 1].
  EXPECT_EQ(cut_by_time(t, 2, false, [](int64_t r, int64_t n) { return r != 1 || n <= 1; }),
            (std::vector<int64_t>{7, 1}));
  // Nothing fits: refused naming the key.
  EXPECT_TRUE(throws_with([&] { cut_by_time(t, 2, false, [](int64_t, int64_t n) { return n <= 3; }); },
                          {"parallel.pp_cut", "fits in memory", "model.n_layer = 8", "parallel.pp = 2"}));
  EXPECT_TRUE(throws_with([&] { cut_by_time(t, 9, false); }, {"parallel.pp = 9", "model.n_layer = 8"}));
}

// Random part times and memory limits (a per-stage cap on the block count, sometimes none), L up to
// 9 and pp up to 4: the slowest stage of cut_by_time's cut equals the least over every cut that
// fits, its cut fits, and a problem with no fitting cut is refused.
TEST(StageCutMeasured, EqualsBruteForceOnSmallCases) {
  std::mt19937 rng(20261206);
  std::uniform_real_distribution<double> cost(0.0, 10.0);
  std::uniform_int_distribution<int> coin(0, 3);
  int checked = 0, refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t L = 1 + trial % 9, pp = 1 + (trial / 9) % 4;
    if (pp > L) continue;
    const bool encoder = coin(rng) == 0 && pp > 1;
    PartTimes t;
    for (int64_t l = 0; l < L; ++l) t.blocks.push_back(cost(rng));
    t.embedding = cost(rng) * 0.3;
    t.vision = encoder ? cost(rng) * 2 : 0.0;
    t.head = cost(rng) * (coin(rng) + 1);
    std::vector<int64_t> cap(static_cast<size_t>(pp), L);
    if (coin(rng) != 0)
      for (int64_t& c : cap) c = 1 + static_cast<int64_t>(rng() % static_cast<unsigned>(L));
    const StageFits fits = [&](int64_t r, int64_t n) { return n <= cap[static_cast<size_t>(r)]; };
    double best = -1;
    each_cut(L, pp, encoder, fits, [&](const std::vector<int64_t>& b) {
      const double s = slowest(t, b);
      if (best < 0 || s < best) best = s;
    });
    double evenest = -1;  // the least sum of squared stage times among the cuts reaching best
    each_cut(L, pp, encoder, fits, [&](const std::vector<int64_t>& b) {
      if (slowest(t, b) != best) return;
      const double q = squares(t, b);
      if (evenest < 0 || q < evenest) evenest = q;
    });
    if (best < 0) {
      EXPECT_TRUE(throws_with([&] { cut_by_time(t, pp, encoder, fits); }, {"parallel.pp_cut"})) << "trial " << trial;
      ++refused;
      continue;
    }
    const std::vector<int64_t> got = cut_by_time(t, pp, encoder, fits);
    ASSERT_EQ(static_cast<int64_t>(got.size()), pp) << "trial " << trial;
    int64_t sum = 0;
    for (int64_t r = 0; r < pp; ++r) {
      EXPECT_TRUE(fits(r, got[static_cast<size_t>(r)])) << "trial " << trial << " stage " << r;
      EXPECT_GE(got[static_cast<size_t>(r)], r == 0 && encoder ? 0 : 1) << "trial " << trial;
      sum += got[static_cast<size_t>(r)];
    }
    EXPECT_EQ(sum, L) << "trial " << trial;
    EXPECT_EQ(slowest(t, got), best) << "trial " << trial << ": L " << L << ", pp " << pp;
    EXPECT_EQ(squares(t, got), evenest) << "trial " << trial << ": L " << L << ", pp " << pp;
    ++checked;
  }
  EXPECT_GT(checked, 200);
  EXPECT_GT(refused, 0);
}

// The FLOPs rule's cut, as block counts.
std::vector<int64_t> flops_cut(const ModelConfig& cfg, int64_t T, int64_t pp) {
  std::vector<int64_t> out;
  for (const StageSpec& s : cut_stages(cfg, T, pp)) out.push_back(s.layers());
  return out;
}

// What the FLOPs rule assumes of each part in seconds, with a block worth `block` seconds: its
// weight (model/stage_cut.h LayerCosts::weight) in blocks.
PartTimes flops_times(const ModelConfig& cfg, int64_t T, double block) {
  const LayerCosts c = layer_costs(cfg, T);
  PartTimes t = uniform(cfg.n_layer, block, block * c.weight(c.embedding), block * c.weight(c.head),
                        block * c.weight(c.vision));
  return t;
}

// A GPT-2 whose head is slower than its FLOPs and activations say (e.g. a memory-bound cross-entropy
// over a large vocabulary): injected times 4 blocks above the formula's. The measured cut moves
// blocks off the last stage; its slowest stage is faster than the FLOPs cut's under those times.
// Where the times are the formula's own, the two cuts agree.
TEST(StageCutMeasured, SlowHeadMovesTheCutAndBalancesBetterThanFlops) {
  ModelConfig cfg;
  cfg.n_layer = 8;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.vocab_size = 1024;
  cfg.max_seq_len = 128;
  cfg = resolve(cfg);
  const int64_t T = 128, pp = 2;
  const std::vector<int64_t> by_flops = flops_cut(cfg, T, pp);
  PartTimes formula = flops_times(cfg, T, 1e-3);
  EXPECT_EQ(slowest(formula, cut_by_time(formula, pp, false)), slowest(formula, by_flops));
  PartTimes measured = formula;
  measured.head += 4e-3;
  const std::vector<int64_t> by_time = cut_by_time(measured, pp, false);
  EXPECT_NE(by_time, by_flops);
  EXPECT_GT(by_time[0], by_flops[0]);
  EXPECT_LT(slowest(measured, by_time), slowest(measured, by_flops) - 0.5e-3);
}

// A vision-language model whose tower is 5 blocks slower than the formula: the measured cut gives
// the encoder's stage fewer blocks than the FLOPs cut, and is better balanced.
TEST(StageCutMeasured, SlowVisionTowerMovesTheCutAndBalancesBetterThanFlops) {
  ModelConfig cfg;
  cfg.kind = "vlm";
  cfg.n_layer = 8;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.vocab_size = 512;
  cfg.max_seq_len = 128;
  cfg = resolve(cfg);
  const int64_t T = 128, pp = 2;
  const std::vector<int64_t> by_flops = flops_cut(cfg, T, pp);
  PartTimes measured = flops_times(cfg, T, 1e-3);
  measured.vision += 5e-3;
  const std::vector<int64_t> by_time = cut_by_time(measured, pp, true);
  EXPECT_NE(by_time, by_flops);
  EXPECT_LT(by_time[0], by_flops[0]);
  EXPECT_LT(slowest(measured, by_time), slowest(measured, by_flops) - 0.5e-3);
}

}  // namespace
}  // namespace tessera

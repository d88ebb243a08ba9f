// Tests model/stage_cut_measured.h: stage times add up the parts; the cut by time equals hand-computed
// optima, and on random part times with random memory limits its slowest stage equals the best of
// every cut tried one by one (brute force), and among those its sum of squared stage times is the
// least; the memory limit is kept; a vision-language model's
// stage 0 may hold no block; ties go to the earlier stages holding fewer blocks; with a head (or a
// vision tower) slower than the FLOPs formula says, the measured cut differs from the FLOPs cut
// (model/stage_cut.h) and its slowest stage is faster. With virtual chunks (parallel.vpp > 1): a
// stage's time is its chunks' sum; the cut equals brute force over every chunk cut in the
// parallel.pp_layers form (equal chunks per stage), and a slow head moves it off the FLOPs cut.
// choose_cut keeps the FLOPs cut unless the measured one is predicted faster or the FLOPs cut does
// not fit.
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

// Interleaved: chunk c on rank c % pp, the embedding and vision on chunk 0, the head on the last.
TEST(StageCutMeasured, StageTimesSumEachStagesChunks) {
  PartTimes t;
  t.blocks = {1, 2, 3, 4, 5, 6};
  t.embedding = 0.5;
  t.head = 10;
  // Chunks [1 | 2 3 | 4 | 5 6] on 2 ranks: rank 0 holds chunks 0 and 2, rank 1 chunks 1 and 3.
  EXPECT_EQ(rank_times(t, {1, 2, 1, 2}, 2), (std::vector<double>{0.5 + 1 + 4, 2 + 3 + 5 + 6 + 10}));
  // The same cut in the pp_layers form: [2, 4] with vpp = 2.
  EXPECT_EQ(stage_chunks({2, 4}, 2), (std::vector<int64_t>{1, 2, 1, 2}));
  EXPECT_EQ(stage_times(t, {2, 4}, 2), rank_times(t, {1, 2, 1, 2}, 2));
  // vpp = 3 on 2 ranks: [1 | 1 | 1 | 1 | 1 | 1], rank 0 the odd blocks.
  EXPECT_EQ(stage_times(t, {3, 3}, 3), (std::vector<double>{0.5 + 1 + 3 + 5, 2 + 4 + 6 + 10}));
  EXPECT_TRUE(throws_with([&] { stage_times(t, {3, 3}, 2); }, {"stage 0", "3 blocks", "multiple of vpp = 2"}));
  EXPECT_TRUE(throws_with([&] { rank_times(t, {1, 2, 3}, 2); }, {"3 chunks", "2 ranks"}));
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

TEST(StageCutMeasured, HandComputedInterleavedCuts) {
  // Blocks 1..8 over 2 stages of 2 chunks: stage 0 holds the first a blocks of each round of 4,
  // a = 1: 1 + 5 = 6 against 30; a = 2: 1 + 2 + 5 + 6 = 14 against 22; a = 3: 24 against 12.
  PartTimes ramp;
  ramp.blocks = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(cut_by_time(ramp, 2, false, {}, 2), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(stage_times(ramp, {4, 4}, 2), (std::vector<double>{14, 22}));
  // Identical blocks and a head worth 4 over 2 x 2 chunks: 2a against 2 (4 - a) + 4, equal at a = 3.
  EXPECT_EQ(cut_by_time(uniform(8, 1.0, 0, 4), 2, false, {}, 2), (std::vector<int64_t>{6, 2}));
  // A head worth 2: a = 2 (4 | 6) and a = 3 (6 | 4) tie on the slowest and the squares; the fewer
  // blocks on stage 0 win.
  EXPECT_EQ(cut_by_time(uniform(8, 1.0, 0, 2), 2, false, {}, 2), (std::vector<int64_t>{4, 4}));
  // vpp = 3, 12 blocks, 2 stages, a head worth 4: 3a against 3 (4 - a) + 4, best at a = 3 (9 | 7).
  EXPECT_EQ(cut_by_time(uniform(12, 1.0, 0, 4), 2, false, {}, 3), (std::vector<int64_t>{9, 3}));
  // The memory limit reads the stage's blocks (all its chunks'): stage 0 at most 4 of them.
  EXPECT_EQ(cut_by_time(uniform(8, 1.0, 0, 4), 2, false, [](int64_t r, int64_t n) { return r != 0 || n <= 4; }, 2),
            (std::vector<int64_t>{4, 4}));
  // Refused: a depth that vpp does not divide, and more chunks than blocks.
  EXPECT_TRUE(throws_with([&] { cut_by_time(uniform(7, 1.0), 2, false, {}, 2); },
                          {"parallel.pp_cut", "parallel.vpp = 2", "model.n_layer = 7", "multiple"}));
  EXPECT_TRUE(throws_with([&] { cut_by_time(uniform(6, 1.0), 2, false, {}, 6); },
                          {"parallel.pp = 2", "parallel.vpp = 6", "model.n_layer = 6"}));
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

// Every cut of L blocks into pp x vpp chunks (each at least one block), in turn, as chunk counts in
// model order: all compositions, not only the pp_layers form (the caller filters).
void each_chunk_cut(int64_t L, int64_t chunks, const std::function<void(const std::vector<int64_t>&)>& visit) {
  std::vector<int64_t> blocks(static_cast<size_t>(chunks), 0);
  std::function<void(int64_t, int64_t)> place = [&](int64_t c, int64_t left) {
    if (c == chunks - 1) {
      blocks[static_cast<size_t>(c)] = left;
      if (left >= 1) visit(blocks);
      return;
    }
    for (int64_t n = 1; n <= left - (chunks - 1 - c); ++n) {
      blocks[static_cast<size_t>(c)] = n;
      place(c + 1, left - n);
    }
  };
  place(0, L);
}

// Random part times and memory limits with vpp = 2 and 3 (L = vpp x M, M up to 6, pp up to 4):
// brute force over every chunk cut, kept where each stage's chunks are equal (the pp_layers form,
// what the trainer can run) and every stage fits, priced by rank_times; cut_by_time's cut reaches
// the least slowest stage and, among those, the least sum of squares, and is in that form.
TEST(StageCutMeasured, InterleavedEqualsBruteForceOnSmallCases) {
  std::mt19937 rng(20261207);
  std::uniform_real_distribution<double> cost(0.0, 10.0);
  std::uniform_int_distribution<int> coin(0, 3);
  int checked = 0, refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t vpp = 2 + trial % 2, M = 1 + (trial / 2) % 6, pp = 1 + (trial / 12) % 4, L = vpp * M;
    if (pp > M) continue;
    PartTimes t;
    for (int64_t l = 0; l < L; ++l) t.blocks.push_back(cost(rng));
    t.embedding = cost(rng) * 0.3;
    t.head = cost(rng) * (coin(rng) + 1);
    std::vector<int64_t> cap(static_cast<size_t>(pp), L);
    if (coin(rng) != 0)
      for (int64_t& c : cap) c = vpp * (1 + static_cast<int64_t>(rng() % static_cast<unsigned>(M)));
    const StageFits fits = [&](int64_t r, int64_t n) { return n <= cap[static_cast<size_t>(r)]; };
    // The cuts the trainer can run, each as stage totals.
    std::vector<std::vector<int64_t>> runnable;
    each_chunk_cut(L, pp * vpp, [&](const std::vector<int64_t>& chunks) {
      std::vector<int64_t> stages(static_cast<size_t>(pp), 0);
      for (size_t c = 0; c < chunks.size(); ++c) {
        if (chunks[c] != chunks[c % static_cast<size_t>(pp)]) return;  // unequal chunks on one stage
        stages[c % static_cast<size_t>(pp)] += chunks[c];
      }
      for (int64_t r = 0; r < pp; ++r)
        if (!fits(r, stages[static_cast<size_t>(r)])) return;
      runnable.push_back(stages);
    });
    const auto times = [&](const std::vector<int64_t>& stages) { return rank_times(t, stage_chunks(stages, vpp), pp); };
    double best = -1;
    for (const auto& b : runnable) {
      const std::vector<double> s = times(b);
      const double m = *std::max_element(s.begin(), s.end());
      if (best < 0 || m < best) best = m;
    }
    double evenest = -1;
    for (const auto& b : runnable) {
      const std::vector<double> s = times(b);
      if (*std::max_element(s.begin(), s.end()) != best) continue;
      double q = 0;
      for (double x : s) q += x * x;
      if (evenest < 0 || q < evenest) evenest = q;
    }
    if (runnable.empty()) {
      EXPECT_TRUE(throws_with([&] { cut_by_time(t, pp, false, fits, vpp); }, {"parallel.pp_cut", "fits in memory"}))
          << "trial " << trial;
      ++refused;
      continue;
    }
    const std::vector<int64_t> got = cut_by_time(t, pp, false, fits, vpp);
    EXPECT_NE(std::find(runnable.begin(), runnable.end(), got), runnable.end())
        << "trial " << trial << ": not a runnable cut that fits";
    const std::vector<double> s = times(got);
    double q = 0;
    for (double x : s) q += x * x;
    EXPECT_EQ(*std::max_element(s.begin(), s.end()), best) << "trial " << trial << ": L " << L << ", pp " << pp << ", vpp " << vpp;
    EXPECT_EQ(q, evenest) << "trial " << trial << ": L " << L << ", pp " << pp << ", vpp " << vpp;
    ++checked;
  }
  EXPECT_GT(checked, 100);
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

// The same GPT-2 on 2 stages of 2 chunks (interleaved). The FLOPs rule balances chunks (each
// chunk's weight), not stages: under a head 4 blocks slower than the formula, the measured cut
// (stage totals, in equal chunks) differs from the FLOPs rule's chunks and its slowest stage is
// faster.
TEST(StageCutMeasured, SlowHeadMovesTheInterleavedCutAndBalancesBetterThanFlops) {
  ModelConfig cfg;
  cfg.n_layer = 8;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.vocab_size = 1024;
  cfg.max_seq_len = 128;
  cfg = resolve(cfg);
  const int64_t T = 128, pp = 2, vpp = 2;
  std::vector<int64_t> by_flops;  // chunks, model order
  for (const StageSpec& s : cut_stages(cfg, T, pp, vpp)) by_flops.push_back(s.layers());
  PartTimes measured = flops_times(cfg, T, 1e-3);
  measured.head += 4e-3;
  const std::vector<int64_t> by_time = cut_by_time(measured, pp, false, {}, vpp);
  const std::vector<double> flops_stages = rank_times(measured, by_flops, pp), time_stages = stage_times(measured, by_time, vpp);
  EXPECT_NE(stage_chunks(by_time, vpp), by_flops);
  EXPECT_LT(*std::max_element(time_stages.begin(), time_stages.end()),
            *std::max_element(flops_stages.begin(), flops_stages.end()) - 0.5e-3)
      << "measured chunks " << ::testing::PrintToString(stage_chunks(by_time, vpp)) << ", FLOPs chunks "
      << ::testing::PrintToString(by_flops);
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

// choose_cut on hand numbers (seconds): the simulated steps decide when both are known, else the
// slowest stages; ties keep the FLOPs cut; a FLOPs cut over the memory limit is not kept.
TEST(StageCutMeasured, ChooseCutKeepsTheFlopsCutUnlessTheMeasuredIsFaster) {
  // The slow test's interleaved case (docs/parallel.md): the FLOPs cut's step 1.258 ms against 1.528.
  CutChoice c = choose_cut({0.382e-3, 0.1864e-3}, 1.528e-3, {0.2946e-3, 0.2738e-3}, 1.258e-3, -1);
  EXPECT_TRUE(c.flops);
  EXPECT_NE(c.why.find("the FLOPs rule's cut: its predicted simulated step 1.258 ms <= the measured cut's 1.528 ms"),
            std::string::npos) << c.why;
  // The step decides, not the slowest stage: the measured cut's slowest stage is lower (3 < 4) but
  // its step longer (10 > 9), and the other way round.
  EXPECT_TRUE(choose_cut({3, 2}, 10, {4, 1}, 9, -1).flops);
  c = choose_cut({4, 1}, 9, {3, 2}, 10, -1);
  EXPECT_FALSE(c.flops);
  EXPECT_NE(c.why.find("the measured cut: its predicted simulated step 9000 ms < the FLOPs cut's 1e+04 ms"),
            std::string::npos) << c.why;
  EXPECT_TRUE(choose_cut({3, 2}, 9, {4, 1}, 9, -1).flops);  // a tie: the FLOPs cut
  // No simulated step (0 on either side): the slowest stages, 2.9 against 3.
  c = choose_cut({3, 2}, 0, {2.5, 2.9}, 8, -1);
  EXPECT_TRUE(c.flops);
  EXPECT_NE(c.why.find("slowest stage 2900 ms <= the measured cut's 3000 ms"), std::string::npos) << c.why;
  EXPECT_FALSE(choose_cut({2.5, 2.9}, 0, {3, 2}, 0, -1).flops);
  EXPECT_TRUE(choose_cut({3, 2}, 0, {2, 3}, 0, -1).flops);  // equal slowest stages
  // The FLOPs cut faster but its stage 1 over the memory limit: the measured cut runs.
  c = choose_cut({0.382e-3, 0.1864e-3}, 1.528e-3, {0.2946e-3, 0.2738e-3}, 1.258e-3, 1);
  EXPECT_FALSE(c.flops);
  EXPECT_NE(c.why.find("but its stage 1 does not fit in memory"), std::string::npos) << c.why;
}

}  // namespace
}  // namespace tessera

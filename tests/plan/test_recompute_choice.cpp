// Tests plan/recompute_choice.h: the bisection finds the least k that fits, as a scan of every k
// does, in about log2 of the range of memory estimates; the most blocks a chunk of a cut holds; the
// dynamic programme's frontier of per-block options is every mix's Pareto frontier, enumerated.
#include "plan/recompute_choice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/check.h"

namespace tessera::plan {
namespace {

TEST(RecomputeChoice, LeastLayersIsTheScansAnswer) {
  for (int64_t lo : {0, 1})
    for (int64_t hi = lo - 1; hi <= 40; ++hi)
      for (int64_t threshold = lo - 1; threshold <= hi + 2; ++threshold) {
        const auto fits = [&](int64_t k) { return k >= threshold; };
        int64_t scan = -1;
        for (int64_t k = lo; k <= hi; ++k)
          if (fits(k)) {
            scan = k;
            break;
          }
        int64_t asked = 0;
        const RecomputeChoice c = least_recompute_layers(lo, hi, [&](int64_t k) {
          EXPECT_GE(k, lo);
          EXPECT_LE(k, hi);
          ++asked;
          return fits(k);
        });
        EXPECT_EQ(c.layers, scan) << lo << ".." << hi << " from " << threshold;
        EXPECT_EQ(c.estimates, asked);
        const int64_t n = hi - lo + 1;
        EXPECT_LE(asked, n <= 0 ? 0 : int64_t(std::floor(std::log2(double(n)))) + 1) << lo << ".." << hi;
      }
}

TEST(RecomputeChoice, MostBlocksOfAChunk) {
  EXPECT_EQ(max_chunk_blocks({}, 12), 12);
  const std::vector<StageSpec> cut = {StageSpec{0, 3, true, false}, StageSpec{3, 8, false, false},
                                      StageSpec{8, -1, false, true}};
  EXPECT_EQ(max_chunk_blocks(cut, 12), 5);
  EXPECT_EQ(max_chunk_blocks(cut, 16), 8);  // the last runs to the model's end
}

// Every mix of `blocks` blocks over the options (counts summing to blocks), brute force.
void every_mix(const std::vector<BlockOption>& options, int64_t blocks, std::vector<int64_t>& counts, size_t o,
               std::vector<RecomputeMix>& out) {
  if (o + 1 == options.size()) {
    counts[o] = blocks;
    RecomputeMix m{counts, 0, 0};
    for (size_t i = 0; i < options.size(); ++i) {
      m.seconds += double(counts[i]) * options[i].seconds;
      m.saved += double(counts[i]) * options[i].saved;
    }
    out.push_back(m);
    return;
  }
  for (int64_t k = 0; k <= blocks; ++k) {
    counts[o] = k;
    every_mix(options, blocks - k, counts, o + 1, out);
  }
}

// The frontier equals the brute-force frontier of every mix: for each budget of bytes to free, the
// least seconds of a mix that frees at least that much is the frontier's (its first point freeing
// enough), on random options (integers, so sums are exact) with ties and dominated options.
TEST(RecomputeChoice, FrontierIsEveryMixsParetoFrontier) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(0, 12);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + size_t(trial % 5);
    std::vector<BlockOption> options;
    for (size_t i = 0; i < n; ++i) options.push_back({double(value(rng)), double(value(rng))});
    const int64_t blocks = trial % 7;
    const std::vector<RecomputeMix> f = recompute_frontier(options, blocks);
    std::vector<RecomputeMix> all;
    std::vector<int64_t> counts(n, 0);
    every_mix(options, blocks, counts, 0, all);
    ASSERT_FALSE(f.empty());
    for (size_t i = 0; i < f.size(); ++i) {
      int64_t sum = 0;
      for (int64_t c : f[i].counts) sum += c;
      EXPECT_EQ(sum, blocks);
      if (i > 0) {
        EXPECT_GT(f[i].seconds, f[i - 1].seconds);
        EXPECT_GT(f[i].saved, f[i - 1].saved);
      }
    }
    double most = 0;
    for (const RecomputeMix& m : all) most = std::max(most, m.saved);
    for (double need = 0; need <= most; need += 1) {
      double best = INFINITY;
      for (const RecomputeMix& m : all)
        if (m.saved >= need) best = std::min(best, m.seconds);
      const auto first = std::find_if(f.begin(), f.end(), [&](const RecomputeMix& m) { return m.saved >= need; });
      ASSERT_NE(first, f.end()) << trial << " need " << need;
      EXPECT_EQ(first->seconds, best) << trial << " need " << need;
    }
  }
}

TEST(RecomputeChoice, FrontierRefusesNegativeOptions) {
  EXPECT_THROW(recompute_frontier({{-1, 2}}, 3), Error);
  EXPECT_THROW(recompute_frontier({{1, -2}}, 3), Error);
  EXPECT_EQ(recompute_frontier({{1, 2}, {0, 0}}, 0).size(), 1u);  // no blocks: the empty mix
}

}  // namespace
}  // namespace tessera::plan

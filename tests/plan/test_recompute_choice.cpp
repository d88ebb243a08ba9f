// Tests plan/recompute_choice.h: the bisection finds the least k that fits, as a scan of every k
// does, in about log2 of the range of memory estimates; the most blocks a chunk of a cut holds.
#include "plan/recompute_choice.h"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace tessera::plan

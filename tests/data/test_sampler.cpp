// Tests data/sampler.h: each epoch is a permutation, data-parallel shares are disjoint and cover
// the global batch for dp = 1..8, epochs differ, and a resumed sampler continues exactly.
#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "testing.h"

namespace tessera {

TEST(Sampler, EachEpochIsAPermutation) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    Sampler s(n, 11);
    std::vector<int64_t> seen;
    for (int64_t q = 0; q < n; ++q) seen.push_back(s.sample_at(q));
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << "n = " << n;
  }
}

TEST(Sampler, ShufflesDifferentlyPerEpochAndSeed) {
  Sampler a(1000, 1), b(1000, 2);
  int same_seed_diff = 0, same_epoch_diff = 0, in_order = 0;
  for (int64_t q = 0; q < 1000; ++q) {
    same_seed_diff += a.sample_at(q) != b.sample_at(q);
    same_epoch_diff += a.sample_at(q) != a.sample_at(q + 1000);
    in_order += a.sample_at(q) == q;
  }
  EXPECT_GT(same_seed_diff, 950);
  EXPECT_GT(same_epoch_diff, 950);
  EXPECT_LT(in_order, 20);
  EXPECT_EQ(a.epoch_of(1999), 1);
  Sampler ordered(10, 1, false);
  EXPECT_EQ(ordered.sample_at(13), 3);
}

// For dp = 1..8, the ranks' micro-batches of a step are disjoint and together are exactly the
// step's global positions; consecutive steps continue without gap.
TEST(Sampler, DataParallelSharesAreDisjointAndComplete) {
  const int64_t n = 509;  // prime: epochs do not align with batches
  Sampler s(n, 3);
  for (int64_t dp = 1; dp <= 8; ++dp) {
    const int64_t G = 8 * 3, mb = 3;
    if (G % (mb * dp)) continue;
    std::vector<int64_t> got;
    for (int64_t step = 0; step < 40; ++step) {  // crosses an epoch boundary
      for (int64_t r = 0; r < dp; ++r) {
        BatchLayout l{G, mb, dp, r};
        validate(l);
        for (int64_t m = 0; m < l.micro_batches(); ++m) {
          auto idx = s.micro_batch(step * G, m, l);
          got.insert(got.end(), idx.begin(), idx.end());
        }
      }
    }
    std::vector<int64_t> want;
    for (int64_t q = 0; q < 40 * G; ++q) want.push_back(s.sample_at(q));
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want) << "dp = " << dp;
    // Within one epoch no sample repeats.
    std::set<int64_t> first_epoch(want.begin(), want.end());
    EXPECT_EQ(static_cast<int64_t>(first_epoch.size()), n) << "dp = " << dp;
  }
}

TEST(Sampler, ResumeFromConsumedCountContinuesExactly) {
  Sampler s(100, 5), resumed(100, 5);
  BatchLayout l{8, 2, 2, 1};
  for (int64_t step = 0; step < 30; ++step)
    for (int64_t m = 0; m < l.micro_batches(); ++m)
      EXPECT_EQ(s.micro_batch(step * 8, m, l), resumed.micro_batch(step * 8, m, l));
}

TEST(Sampler, LayoutErrors) {
  EXPECT_THROW(validate({10, 4, 1, 0}), Error);
  EXPECT_THROW(validate({8, 2, 2, 2}), Error);
  EXPECT_THROW(Sampler(0, 1), Error);
}

}  // namespace tessera

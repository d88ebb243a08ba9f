// Tests data/bpe.h: the merge table, GPT-2's one-pass-per-rank merging on small hand-checked words
// (overlapping pairs included), and scan == heap on random words and merge tables.
#include "data/bpe.h"

#include <random>

#include "testing.h"

namespace tessera {
namespace {

using Ids = std::vector<int32_t>;

Ids scan(const BpeMerges& m, Ids s) {
  bpe_merge_scan(m, &s);
  return s;
}
Ids heap(const BpeMerges& m, Ids s) {
  bpe_merge_heap(m, &s);
  return s;
}

TEST(BpeMerges, FindsPairsInRankOrderAndRejectsDuplicates) {
  BpeMerges m;
  EXPECT_EQ(m.find(1, 2), nullptr);
  for (int32_t i = 0; i < 3000; ++i) ASSERT_TRUE(m.add(i, i + 1, 10000 + i));
  EXPECT_FALSE(m.add(5, 6, 1));
  EXPECT_EQ(m.size(), 3000);
  ASSERT_NE(m.find(5, 6), nullptr);
  EXPECT_EQ(m.find(5, 6)->rank, 5);
  EXPECT_EQ(m.find(5, 6)->merged, 10005);
  EXPECT_EQ(m.find(6, 5), nullptr);
}

TEST(BpeMerge, AppliesTheLowestRankEverywhereBeforeTheNext) {
  // a=0 b=1: rank 0 (a,a)->2 "aa", rank 1 (aa,a)->3, rank 2 (a,b)->4
  BpeMerges m;
  m.add(0, 0, 2);
  m.add(2, 0, 3);
  m.add(0, 1, 4);
  for (auto* f : {&scan, &heap}) {
    EXPECT_EQ(f(m, {0, 0, 0}), (Ids{3}));        // aa a -> aaa
    EXPECT_EQ(f(m, {0, 0, 0, 0}), (Ids{2, 2}));  // left to right, non-overlapping: aa aa
    EXPECT_EQ(f(m, {0, 0, 0, 1}), (Ids{3, 1}));  // (a,a) before (a,b): aa a b -> aaa b
    EXPECT_EQ(f(m, {1, 0, 1}), (Ids{1, 4}));
    EXPECT_EQ(f(m, {}), Ids{});
    EXPECT_EQ(f(m, {7}), (Ids{7}));
  }
  // A table no BPE training makes: (aa, a)-like pair (5, 3) ranks below (3, 4), which makes 5.
  // encoder.py merges every (3, 4) of the round first, so 5 3 never forms: [5, 5], not [6, 4].
  BpeMerges odd;
  odd.add(5, 3, 6);
  odd.add(3, 4, 5);
  EXPECT_EQ(scan(odd, {3, 4, 3, 4}), (Ids{5, 5}));
  EXPECT_EQ(heap(odd, {3, 4, 3, 4}), (Ids{5, 5}));
}

TEST(BpeMerge, ScanAndHeapAgreeOnRandomTables) {
  std::mt19937_64 rng(9);
  for (int table = 0; table < 20; ++table) {
    // Random merges over an alphabet of 4 symbols; results get fresh ids, ranks in random order.
    BpeMerges m;
    std::vector<int32_t> tokens = {0, 1, 2, 3};
    for (int32_t next = 4; next < 60;) {
      int32_t l = tokens[rng() % tokens.size()], r = tokens[rng() % tokens.size()];
      if (m.add(l, r, next)) tokens.push_back(next++);
    }
    for (int word = 0; word < 50; ++word) {
      Ids w(1 + rng() % 200);
      for (auto& x : w) x = static_cast<int32_t>(rng() % 4);
      ASSERT_EQ(scan(m, w), heap(m, w)) << "table " << table << " word " << word;
    }
  }
}

}  // namespace
}  // namespace tessera

// Tests data/token_batching.h: documents found at end-of-text ids, the packer (budget respected,
// every input token used exactly once per epoch, long documents cut with continuing positions,
// determinism by seed, dp balance) and the packed micro-batch read from an indexed dataset.
#include "data/token_batching.h"

#include <map>
#include <random>
#include <set>

#include "data/indexed_dataset.h"
#include "temp_files.h"
#include "testing.h"

namespace tessera {
namespace {

constexpr int32_t kEot = 99;

TEST(FindDocuments, SplitsAfterEachEndOfTextAndTilesTheInputs) {
  // Stream 5 6 eot 7 eot eot 8 9: inputs [0, 7) cut after each eot (a target) -> the eot is the next
  // document's first input.
  const std::vector<int32_t> t = {5, 6, kEot, 7, kEot, kEot, 8, 9};
  const std::vector<DocumentSpan> d = find_documents(t.data(), static_cast<int64_t>(t.size()), kEot);
  const std::vector<DocumentSpan> want = {{0, 2}, {2, 2}, {4, 1}, {5, 2}};
  EXPECT_EQ(d, want);
  // Ending on an eot: no empty trailing document.
  const std::vector<int32_t> u = {5, kEot, 6, kEot};
  EXPECT_EQ(find_documents(u.data(), 4, kEot), (std::vector<DocumentSpan>{{0, 1}, {1, 2}}));
}

// Log-normal lengths (median ~20, a tail past seq_len), as docs/data.md's benchmark.
std::vector<DocumentSpan> random_documents(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<double> len(3.0, 1.0);
  std::vector<DocumentSpan> docs;
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto l = std::max<int64_t>(1, static_cast<int64_t>(len(rng)));
    docs.push_back({at, l});
    at += l;
  }
  return docs;
}

PackingShape shape(int64_t L, int64_t R, int64_t M, int64_t dp, int64_t period) {
  return PackingShape{L, R, M, dp, period};
}

TEST(TokenPacker, RespectsTheBudgetAndUsesEveryTokenOncePerEpoch) {
  const std::vector<DocumentSpan> docs = random_documents(300, 1);
  int64_t total = 0;
  for (const DocumentSpan& d : docs) total += d.length;
  const PackingShape s = shape(32, 3, 2, 2, 128);
  const TokenPacker packer(docs, 7, true, s);
  std::map<int64_t, int> used;  // input stream position -> times used
  PackCursor c;
  int64_t steps = 0, tokens = 0;
  while (c.document < packer.num_documents()) {  // one epoch
    const StepPlan plan = packer.plan_step(c);
    ASSERT_EQ(plan.ranks.size(), 2u);
    for (const auto& rank : plan.ranks) {
      ASSERT_EQ(rank.size(), 2u);
      for (const MicroBatchPlan& mb : rank) {
        ASSERT_EQ(mb.rows.size(), 3u);
        for (const auto& row : mb.rows) {
          int64_t n = 0;
          for (const DocumentPiece& p : row) {
            EXPECT_LE(p.length, 32);
            n += p.length;
            for (int64_t i = 0; i < p.length; ++i) ++used[p.begin + i];
          }
          EXPECT_LE(n, 32) << "a row holds at most seq_len tokens";
        }
      }
    }
    EXPECT_LE(plan.tokens(), s.step_capacity());
    EXPECT_GT(plan.tokens(), 0);
    tokens += plan.tokens();
    ASSERT_TRUE(plan.next.document > c.document || plan.next.piece > c.piece) << "the cursor moves on";
    c = plan.next;
    ++steps;
  }
  EXPECT_EQ(c, (PackCursor{packer.num_documents(), 0})) << "an epoch ends at a document boundary";
  EXPECT_EQ(tokens, total);
  EXPECT_EQ(static_cast<int64_t>(used.size()), total);
  for (const auto& [pos, times] : used) ASSERT_EQ(times, 1) << "stream position " << pos;
  // Packing fills the steps: all but the last hold most of their capacity.
  EXPECT_LT(steps, total / (s.step_capacity() * 7 / 10) + 2);
}

TEST(TokenPacker, CutsLongDocumentsIntoPiecesWhosePositionsContinue) {
  // One document of 100 inputs, seq_len 16, positions wrapping every 64 (model.max_seq_len 64+).
  const TokenPacker packer({{0, 100}}, 1, false, shape(16, 2, 1, 1, 64));
  const std::vector<DocumentPiece> p = packer.pieces_at(0);
  ASSERT_EQ(p.size(), 7u);
  for (size_t j = 0; j < p.size(); ++j) {
    EXPECT_EQ(p[j].begin, 16 * int64_t(j));
    EXPECT_EQ(p[j].length, j < 6 ? 16 : 4);
    EXPECT_EQ(p[j].position, (16 * int64_t(j)) % 64) << "piece " << j;
  }
  // A step of 2 rows takes two pieces and stops mid-document; the next starts at the third piece.
  const StepPlan first = packer.plan_step({});
  EXPECT_EQ(first.tokens(), 32);
  EXPECT_EQ(first.next, (PackCursor{0, 2}));
  const StepPlan second = packer.plan_step(first.next);
  EXPECT_EQ(second.ranks[0][0].rows[0][0].position, 32);
  EXPECT_EQ(second.next, (PackCursor{0, 4}));
}

TEST(TokenPacker, DeterministicBySeedAndResumableFromTheCursor) {
  const std::vector<DocumentSpan> docs = random_documents(200, 2);
  const PackingShape s = shape(32, 2, 2, 2, 32);
  const TokenPacker a(docs, 11, true, s), b(docs, 11, true, s), other(docs, 12, true, s);
  PackCursor ca, cb, co;
  bool differs = false;
  std::vector<PackCursor> cursors;
  for (int step = 0; step < 20; ++step) {
    const StepPlan pa = a.plan_step(ca), pb = b.plan_step(cb), po = other.plan_step(co);
    for (size_t r = 0; r < pa.ranks.size(); ++r)
      for (size_t m = 0; m < pa.ranks[r].size(); ++m) {
        EXPECT_EQ(pa.ranks[r][m].rows, pb.ranks[r][m].rows);
        differs |= pa.ranks[r][m].rows != po.ranks[r][m].rows;
      }
    cursors.push_back(ca);
    ca = pa.next, cb = pb.next, co = po.next;
  }
  EXPECT_TRUE(differs) << "another seed, another order";
  // A plan depends on its cursor only: step 13 planned afresh from its cursor is step 13.
  const StepPlan again = a.plan_step(cursors[13]);
  PackCursor c;
  for (int step = 0; step < 13; ++step) c = a.plan_step(c).next;
  EXPECT_EQ(again.ranks[1][1].rows, a.plan_step(c).ranks[1][1].rows);
}

TEST(TokenPacker, BalancesRealTokensOverDataParallelRanks) {
  const std::vector<DocumentSpan> docs = random_documents(2000, 3);
  const TokenPacker packer(docs, 5, true, shape(64, 4, 2, 4, 64));
  PackCursor c;
  double worst = 0;
  for (int step = 0; step < 20; ++step) {
    const StepPlan plan = packer.plan_step(c);
    worst = std::max(worst, plan.imbalance());
    c = plan.next;
  }
  // Longest-first into the least-loaded rank: each rank within one short piece of the others.
  EXPECT_LT(worst, 0.05);
  StepPlan one;
  one.rank_tokens = {30, 10};
  EXPECT_DOUBLE_EQ(one.imbalance(), 0.5);
}

TEST(TokenPacker, RefusesBadShapes) {
  EXPECT_THROW(TokenPacker({}, 1, true, shape(16, 1, 1, 1, 16)), Error);
  EXPECT_THROW(TokenPacker({{0, 4}}, 1, true, shape(16, 1, 1, 1, 24)), Error);  // period not a multiple
  EXPECT_THROW(TokenPacker({{0, 4}}, 1, true, shape(16, 0, 1, 1, 16)), Error);
}

TEST(MakePackedBatch, RowsHoldPiecesWithTheirDocumentsPositionsAndPadding) {
  testing::TempDir dir("token_batching");
  const std::string prefix = dir / "docs";
  {
    IndexedDatasetBuilder b(prefix, TokenDType::kUInt16);
    b.add_document(std::vector<int32_t>{1, 2, 3, kEot});
    b.add_document(std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, kEot});
    b.finalize();
  }
  const auto ds = open_token_dataset({prefix}, 4, 100);
  const std::vector<DocumentSpan> docs = find_documents(*ds, kEot);
  ASSERT_EQ(docs, (std::vector<DocumentSpan>{{0, 3}, {3, 8}}));  // 1 2 3 -> 2 3 eot; eot 4 .. 10 -> 4 .. eot
  // Rows of 6: the first document, then the second's two pieces (6 + 2, positions 0 and 6).
  const TokenPacker packer(docs, 0, false, shape(6, 3, 1, 1, 12));
  const StepPlan plan = packer.plan_step({});
  const Batch b = make_packed_batch(*ds, plan.ranks[0][0], 6, kEot);
  ASSERT_EQ(b.B, 3);
  ASSERT_EQ(b.T, 6);
  // Longest first: the 6-token piece takes row 0; the 3-token document row 1; the 2-token piece row 1 too.
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{kEot, 4, 5, 6, 7, 8, 1, 2, 3, 9, 10, kEot, kEot, kEot, kEot, kEot, kEot,
                                            kEot}));
  const int32_t x = kIgnoreTarget;
  EXPECT_EQ(b.targets, (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 2, 3, kEot, 10, kEot, x, x, x, x, x, x, x}));
  EXPECT_EQ(b.doc_start, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 5, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(b.doc_position, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 6, 6, 0, 0, 0, 0, 0, 0, 0}));
}

// The loader's producer (packed_batches) delivers one dp rank's micro-batches of consecutive steps,
// from its cursor on, and nothing once cancelled.
TEST(PackedBatches, DeliverOneRanksMicroBatchesStepAfterStep) {
  testing::TempDir dir("packed_batches");
  const std::string prefix = dir / "docs";
  {
    IndexedDatasetBuilder b(prefix, TokenDType::kUInt16);
    for (int d = 0; d < 12; ++d) {
      std::vector<int32_t> ids;
      for (int i = 0; i < 2 + (d * 5) % 9; ++i) ids.push_back(1 + (d + i) % 50);
      ids.push_back(kEot);
      b.add_document(ids);
    }
    b.finalize();
  }
  const std::shared_ptr<const TokenWindowDataset> ds = open_token_dataset({prefix}, 4, 100);
  const auto packer = std::make_shared<const TokenPacker>(find_documents(*ds, kEot), 3, true, shape(8, 1, 2, 2, 8));
  const StepPlan first = packer->plan_step({});
  const StepPlan second = packer->plan_step(first.next);
  auto produce = packed_batches(ds, packer, first.next, 1, kEot);  // rank 1 from the second step
  std::atomic<bool> cancel{false};
  for (int m = 0; m < 2; ++m) {
    const std::optional<Batch> b = produce(cancel);
    ASSERT_TRUE(b.has_value());
    const Batch want = make_packed_batch(*ds, second.ranks[1][static_cast<size_t>(m)], 8, kEot);
    EXPECT_EQ(b->tokens, want.tokens) << "micro-batch " << m;
    EXPECT_EQ(b->targets, want.targets) << "micro-batch " << m;
  }
  const Batch third = *produce(cancel);  // the next step's first micro-batch
  EXPECT_EQ(third.tokens, make_packed_batch(*ds, packer->plan_step(second.next).ranks[1][0], 8, kEot).tokens);
  cancel = true;
  EXPECT_FALSE(produce(cancel).has_value());
  EXPECT_THROW(packed_batches(ds, packer, {}, 2, kEot), Error);
}

}  // namespace
}  // namespace tessera

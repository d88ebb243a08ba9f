// Tests parallel/sequence_layout.h: the chunk arithmetic of sequence parallelism inside tp (one
// chunk per rank), of context parallelism's load-balanced two-chunk layout and of a split of it,
// the runs and views positions are applied through, packed documents (runs cut at document starts,
// positions within the document, carried through splits), and the refused layouts.
#include "parallel/sequence_layout.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "error_testing.h"
#include "parallel/tensor_parallel.h"

namespace tessera {
namespace {

using testing::throws_with;

std::vector<int64_t> positions(const SequenceLayout& s) {
  std::vector<int64_t> p;
  for (int64_t r = 0; r < s.length(); ++r) p.push_back(s.position(r));
  return p;
}

std::vector<int64_t> range(int64_t begin, int64_t end) {
  std::vector<int64_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

TEST(SequenceLayout, ContiguousSequenceAndDecodingStep) {
  const SequenceLayout whole = SequenceLayout::contiguous(12);
  EXPECT_EQ(whole.length(), 12);
  EXPECT_EQ(whole.chunks(), (std::vector<SequenceChunk>{{0, 12}}));
  EXPECT_EQ(whole.end_position(), 12);
  EXPECT_EQ(positions(whole), range(0, 12));
  const SequenceLayout step = SequenceLayout::contiguous(2, 7);  // a KV cache holding 7 positions
  EXPECT_EQ(positions(step), range(7, 9));
  EXPECT_EQ(step.end_position(), 9);
  EXPECT_EQ(step.str(), "[7, 9)");
  EXPECT_TRUE(SequenceLayout().empty());
  EXPECT_EQ(SequenceLayout().end_position(), 0);
}

// Sequence parallelism inside tp: rank r of tp holds [r T / tp, (r + 1) T / tp), as
// TensorParallel::local_seq did, and now with the positions.
TEST(SequenceLayout, SequenceParallelChunks) {
  const SequenceLayout whole = SequenceLayout::contiguous(12);
  for (int64_t tp : {1, 2, 3, 4}) {
    int64_t covered = 0;
    for (int64_t r = 0; r < tp; ++r) {
      const SequenceLayout part = whole.split(tp, r);
      EXPECT_EQ(part.chunks(), (std::vector<SequenceChunk>{{r * 12 / tp, 12 / tp}})) << "tp " << tp << " rank " << r;
      covered += part.length();
    }
    EXPECT_EQ(covered, 12);
  }
  // TensorParallel hands a rank its part only under sequence parallelism (and tp > 1).
  const TensorParallel none;
  EXPECT_EQ(none.shard_sequence(whole), whole);
  EXPECT_TRUE(throws_with([&] { whole.split(5, 0); }, {"12 rows", "5 equal parts"}));
  EXPECT_TRUE(throws_with([&] { whole.split(2, 2); }, {"part 2 of 2"}));
}

// Context parallelism's load balance: rank r of cp holds chunks r and 2 cp - 1 - r of 2 cp; a
// split inside tp (sequence parallelism under cp) cuts through them with the right positions.
TEST(SequenceLayout, LoadBalancedTwoChunkLayout) {
  const SequenceLayout r0 = SequenceLayout::load_balanced(16, 2, 0), r1 = SequenceLayout::load_balanced(16, 2, 1);
  EXPECT_EQ(r0.chunks(), (std::vector<SequenceChunk>{{0, 4}, {12, 4}}));
  EXPECT_EQ(r0.str(), "[0, 4) [12, 16)");
  EXPECT_EQ(r0.length(), 8);
  EXPECT_EQ(r0.end_position(), 16);
  EXPECT_EQ(r1.chunks(), (std::vector<SequenceChunk>{{4, 8}}));  // [4, 8) and [8, 12) continue each other
  std::vector<int64_t> want = range(0, 4);
  for (int64_t p : range(12, 16)) want.push_back(p);
  EXPECT_EQ(positions(r0), want);
  // Every position held exactly once over the ranks.
  std::vector<int> held(16, 0);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t p : positions(SequenceLayout::load_balanced(16, 4, r))) ++held[static_cast<size_t>(p)];
  EXPECT_EQ(held, std::vector<int>(16, 1));
  // tp 2 inside the cp rank: its rows [0, 4) and [4, 8), i.e. one chunk each.
  EXPECT_EQ(r0.split(2, 0).chunks(), (std::vector<SequenceChunk>{{0, 4}}));
  EXPECT_EQ(r0.split(2, 1).chunks(), (std::vector<SequenceChunk>{{12, 4}}));
  // tp 4 halves the chunks; tp 1 leaves them; an odd cut crosses from one chunk into the other.
  EXPECT_EQ(r0.split(4, 1).chunks(), (std::vector<SequenceChunk>{{2, 2}}));
  EXPECT_EQ(r0.split(1, 0), r0);
  const SequenceLayout odd = SequenceLayout({{0, 3}, {9, 3}}).split(3, 1);  // rows [2, 4)
  EXPECT_EQ(odd.chunks(), (std::vector<SequenceChunk>{{2, 1}, {9, 1}}));
  EXPECT_TRUE(throws_with([&] { SequenceLayout::load_balanced(12, 4, 0); }, {"12", "2 x 4 equal chunks"}));
}

TEST(SequenceLayout, RunsAndViews) {
  // One chunk: one run over the whole batch, the tensor itself.
  const SequenceLayout step = SequenceLayout::contiguous(3, 5);
  const auto one = step.runs(2);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].b_begin, 0);
  EXPECT_EQ(one[0].b_end, 2);
  EXPECT_EQ(one[0].position, 5);
  std::vector<float> data(2 * 3 * 4);
  std::iota(data.begin(), data.end(), 0.0f);
  const Tensor t(data.data(), DType::F32, {2, 3, 4});
  EXPECT_EQ(run_view(t, one[0]).data, t.data);
  EXPECT_EQ(run_view(t, one[0]).shape, t.shape);
  // Two chunks: a run per sequence and chunk, each view the rows of that sequence.
  const SequenceLayout two({{0, 1}, {6, 2}});
  const auto runs = two.runs(2);
  ASSERT_EQ(runs.size(), 4u);
  const SequenceRun& r = runs[3];  // sequence 1, chunk [6, 8): local rows [1, 3)
  EXPECT_EQ(r.b_begin, 1);
  EXPECT_EQ(r.row, 1);
  EXPECT_EQ(r.length, 2);
  EXPECT_EQ(r.position, 6);
  const Tensor v = run_view(t, r);
  EXPECT_EQ(v.shape, (Shape{1, 2, 4}));
  EXPECT_EQ(v.ptr<float>()[0], data[(1 * 3 + 1) * 4]);
  EXPECT_TRUE(throws_with([&] { run_view(t, {0, 2, 1, 2, 6}); }, {"run_view", "(2, 3, 4)"}));
}

// (b, row, length, position) of each run, for comparing.
std::vector<std::vector<int64_t>> run_list(const SequenceLayout& s, int64_t B) {
  std::vector<std::vector<int64_t>> out;
  for (const SequenceRun& r : s.runs(B)) {
    EXPECT_EQ(r.b_end, r.b_begin + 1);
    out.push_back({r.b_begin, r.row, r.length, r.position});
  }
  return out;
}

TEST(SequenceLayout, DocumentsCutRunsAndRestartPositions) {
  // Sequence 0: documents [0, 3) [3, 8); sequence 1: [0, 1) [1, 2) [2, 8).
  const SequenceLayout whole = SequenceLayout::contiguous(8).with_documents(
      2, {0, 0, 0, 3, 3, 3, 3, 3, /**/ 0, 1, 2, 2, 2, 2, 2, 2});
  EXPECT_TRUE(whole.has_documents());
  EXPECT_EQ(whole.str(), "[0, 8) with documents");
  EXPECT_EQ(run_list(whole, 2), (std::vector<std::vector<int64_t>>{
                                    {0, 0, 3, 0}, {0, 3, 5, 0}, {1, 0, 1, 0}, {1, 1, 1, 0}, {1, 2, 6, 0}}));
  EXPECT_EQ(whole.doc_starts().shape, (Shape{2, 8}));
  EXPECT_EQ(whole.doc_starts().ptr<int32_t>()[9], 1);
  // Context parallel rank 0 of 2 holds [0, 2) [6, 8): the second chunk continues the document
  // that began at 3 (position 6 is its fourth token) or at 2 (the fifth).
  const SequenceLayout cp0 = SequenceLayout::load_balanced(8, 2, 0).with_documents(2, {0, 0, 3, 3, 0, 1, 2, 2});
  EXPECT_EQ(run_list(cp0, 2), (std::vector<std::vector<int64_t>>{
                                  {0, 0, 2, 0}, {0, 2, 2, 3}, {1, 0, 1, 0}, {1, 1, 1, 0}, {1, 2, 2, 4}}));
  // A split (sequence parallelism) keeps the documents of its rows.
  const SequenceLayout half = whole.split(2, 1);
  EXPECT_EQ(half.chunks(), (std::vector<SequenceChunk>{{4, 4}}));
  EXPECT_EQ(run_list(half, 2), (std::vector<std::vector<int64_t>>{{0, 0, 4, 1}, {1, 0, 4, 2}}));
  // Equality looks at the documents; same_chunks does not.
  EXPECT_FALSE(whole == SequenceLayout::contiguous(8));
  EXPECT_TRUE(whole.same_chunks(SequenceLayout::contiguous(8)));
  EXPECT_TRUE(throws_with([&] { whole.runs(3); }, {"3 sequences", "documents are marked for 2"}));
}

// Variable-length batches: a document's position (doc_position) shifts its runs' positions, is
// kept by a split and by equality, and counts in end_position().
TEST(SequenceLayout, DocumentPositionsContinuePieces) {
  // Documents [0, 3) at position 0 and [3, 8) continuing a document at position 16.
  const std::vector<int32_t> starts = {0, 0, 0, 3, 3, 3, 3, 3};
  const SequenceLayout s = SequenceLayout::contiguous(8).with_documents(1, starts, {0, 0, 0, 16, 16, 16, 16, 16});
  EXPECT_EQ(run_list(s, 1), (std::vector<std::vector<int64_t>>{{0, 0, 3, 0}, {0, 3, 5, 16}}));
  EXPECT_EQ(s.end_position(), 21);
  EXPECT_EQ(SequenceLayout::contiguous(8).with_documents(1, starts).end_position(), 8);
  EXPECT_EQ(run_list(s.split(2, 1), 1), (std::vector<std::vector<int64_t>>{{0, 0, 4, 17}}));
  EXPECT_FALSE(s == SequenceLayout::contiguous(8).with_documents(1, starts));
  EXPECT_TRUE(s == SequenceLayout::contiguous(8).with_documents(1, starts, {0, 0, 0, 16, 16, 16, 16, 16}));
  EXPECT_TRUE(throws_with([&] { SequenceLayout::contiguous(8).with_documents(1, starts, {0, 0}); },
                          {"2 document positions"}));
  EXPECT_TRUE(throws_with([&] { SequenceLayout::contiguous(8).with_documents(1, starts, {0, 0, 0, 16, 2, 16, 16, 16}); },
                          {"row 4", "document position 2"}));
}

TEST(SequenceLayout, RefusesInconsistentDocuments) {
  const SequenceLayout s = SequenceLayout::contiguous(4);
  EXPECT_TRUE(throws_with([&] { s.with_documents(1, {0, 0, 0}); }, {"3 document starts for 1 sequences of 4 rows"}));
  EXPECT_TRUE(throws_with([&] { s.with_documents(1, {0, 0, 3, 3}); }, {"row 2 (position 2)", "at 3, not in [0, 2]"}));
  EXPECT_TRUE(throws_with([&] { s.with_documents(1, {0, 1, 0, 0}); }, {"row 2 (position 2)", "neither its own position"}));
}

TEST(SequenceLayout, RefusesOverlappingOrEmptyChunks) {
  EXPECT_TRUE(throws_with([] { SequenceLayout({{0, 4}, {2, 4}}); }, {"[2, 6) overlaps [0, 4)"}));
  EXPECT_TRUE(throws_with([] { SequenceLayout({{3, 0}}); }, {"[3, 3)", "non-empty"}));
  EXPECT_TRUE(throws_with([] { SequenceLayout({{-1, 2}}); }, {"[-1, 1)", "positions >= 0"}));
  EXPECT_TRUE(throws_with([] { SequenceLayout::contiguous(3).position(3); }, {"row 3 outside [0, 3)"}));
}

}  // namespace
}  // namespace tessera

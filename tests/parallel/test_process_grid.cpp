// Tests parallel/process_grid.h without MPI: the doc comment's worked example (computed by hand),
// rank <-> coordinate round trips, group memberships (tp x cp and embedding groups included), every
// validation message, validate_grid's tp checks.
#include "parallel/process_grid.h"

#include <gtest/gtest.h>

#include <set>

#include "error_testing.h"
#include "kernels/check.h"

namespace tessera {
namespace {

using Ranks = std::vector<int64_t>;

TEST(ProcessGrid, WorkedExampleFromTheDocComment) {
  const ProcessGrid g({.tp = 2, .cp = 1, .pp = 2}, 16, 13);
  EXPECT_EQ(g.dp_size(), 4);
  EXPECT_EQ(g.coords(), (GridCoords{.tp = 1, .cp = 0, .dp = 2, .pp = 1}));
  EXPECT_EQ(g.tp_group(), (Ranks{12, 13}));
  EXPECT_EQ(g.cp_group(), (Ranks{13}));
  EXPECT_EQ(g.dp_group(), (Ranks{9, 11, 13, 15}));
  EXPECT_EQ(g.pp_group(), (Ranks{5, 13}));
  EXPECT_EQ(g.dp_cp_group(), (Ranks{9, 11, 13, 15}));
  EXPECT_EQ(g.coords().str(), "(tp 1, cp 0, dp 2, pp 1)");
}

TEST(ProcessGrid, ExampleWithContextParallel) {
  // 16 ranks, tp 2, cp 2, pp 2 -> dp 2. 11 = 1 + 2 x (1 + 2 x (0 + 2 x 1)).
  const ProcessGrid g({.tp = 2, .cp = 2, .pp = 2}, 16, 11);
  EXPECT_EQ(g.dp_size(), 2);
  EXPECT_EQ(g.coords(), (GridCoords{.tp = 1, .cp = 1, .dp = 0, .pp = 1}));
  EXPECT_EQ(g.tp_group(), (Ranks{10, 11}));
  EXPECT_EQ(g.cp_group(), (Ranks{9, 11}));
  EXPECT_EQ(g.dp_group(), (Ranks{11, 15}));
  EXPECT_EQ(g.pp_group(), (Ranks{3, 11}));
  EXPECT_EQ(g.dp_cp_group(), (Ranks{9, 11, 13, 15}));
}

TEST(ProcessGrid, ExplicitDpAndDefaults) {
  const ProcessGrid one({}, 1, 0);
  EXPECT_EQ(one.degrees().dp, 1);
  EXPECT_EQ(one.dp_cp_group(), (Ranks{0}));
  const ProcessGrid g({.tp = 2, .dp = 3}, 6, 5);
  EXPECT_EQ(g.coords(), (GridCoords{.tp = 1, .cp = 0, .dp = 2, .pp = 0}));
  EXPECT_EQ(g.dp_group(), (Ranks{1, 3, 5}));
}

TEST(ProcessGrid, RoundTripsAndGroupsForManyLayouts) {
  for (int64_t tp : {1, 2, 4})
    for (int64_t cp : {1, 2})
      for (int64_t pp : {1, 2, 3})
        for (int64_t dp : {1, 2, 3}) {
          const int64_t world = tp * cp * pp * dp;
          const ProcessGrid g0({.tp = tp, .cp = cp, .pp = pp}, world, 0);
          std::set<std::vector<int64_t>> seen;
          for (int64_t r = 0; r < world; ++r) {
            const GridCoords c = g0.coords_of(r);
            ASSERT_EQ(g0.rank_of(c), r);
            seen.insert({c.tp, c.cp, c.dp, c.pp});
            const ProcessGrid g({.tp = tp, .cp = cp, .pp = pp, .dp = dp}, world, r);
            ASSERT_EQ(g.coords(), c);
            ASSERT_EQ(static_cast<int64_t>(g.tp_group().size()), tp);
            ASSERT_EQ(static_cast<int64_t>(g.cp_group().size()), cp);
            ASSERT_EQ(static_cast<int64_t>(g.dp_group().size()), dp);
            ASSERT_EQ(static_cast<int64_t>(g.pp_group().size()), pp);
            ASSERT_EQ(static_cast<int64_t>(g.dp_cp_group().size()), dp * cp);
            // Position in a group is the varying coordinate; the other coordinates are ours.
            for (int64_t i = 0; i < tp; ++i) {
              GridCoords m = c;
              m.tp = i;
              ASSERT_EQ(g.tp_group()[static_cast<size_t>(i)], g.rank_of(m));
            }
            for (int64_t i = 0; i < pp; ++i) {
              GridCoords m = c;
              m.pp = i;
              ASSERT_EQ(g.pp_group()[static_cast<size_t>(i)], g.rank_of(m));
            }
            for (int64_t i = 0; i < dp * cp; ++i) {
              GridCoords m = c;
              m.cp = i % cp;
              m.dp = i / cp;
              ASSERT_EQ(g.dp_cp_group()[static_cast<size_t>(i)], g.rank_of(m));
            }
          }
          EXPECT_EQ(static_cast<int64_t>(seen.size()), world) << "coordinates must be distinct";
        }
}

// The doc comment's tp x cp and embedding groups: pp = 2 (the embedding group is the whole pp
// group) and pp = 3 (first and last stage; the middle stage alone).
TEST(ProcessGrid, TpCpAndEmbeddingGroupsOfTheWorkedExamples) {
  const ProcessGrid g({.tp = 2, .cp = 1, .pp = 2}, 16, 13);
  EXPECT_EQ(g.tp_cp_group(), (Ranks{12, 13}));
  EXPECT_EQ(g.embedding_group(), (Ranks{5, 13}));
  EXPECT_EQ(ProcessGrid({.tp = 2, .cp = 1, .pp = 2}, 16, 5).embedding_group(), (Ranks{5, 13}));

  const ProcessGrid middle({.tp = 2, .cp = 1, .pp = 3}, 12, 5);
  EXPECT_EQ(middle.dp_size(), 2);
  EXPECT_EQ(middle.coords(), (GridCoords{.tp = 1, .cp = 0, .dp = 0, .pp = 1}));
  EXPECT_EQ(middle.pp_group(), (Ranks{1, 5, 9}));
  EXPECT_EQ(middle.embedding_group(), (Ranks{5}));
  EXPECT_EQ(ProcessGrid({.tp = 2, .cp = 1, .pp = 3}, 12, 9).embedding_group(), (Ranks{1, 9}));
  EXPECT_EQ(ProcessGrid({.tp = 2, .cp = 1, .pp = 3}, 12, 1).embedding_group(), (Ranks{1, 9}));
  EXPECT_EQ(ProcessGrid({.tp = 2, .cp = 1, .pp = 3}, 12, 2).embedding_group(), (Ranks{2, 10}));  // dp 1

  // With cp: 16 ranks, tp 2, cp 2, pp 2 (dp 2); rank 11 = (tp 1, cp 1, dp 0, pp 1).
  const ProcessGrid cp({.tp = 2, .cp = 2, .pp = 2}, 16, 11);
  EXPECT_EQ(cp.tp_cp_group(), (Ranks{8, 9, 10, 11}));
  EXPECT_EQ(cp.embedding_group(), (Ranks{3, 11}));
  // pp = 1: every rank is alone in its embedding group.
  EXPECT_EQ(ProcessGrid({.tp = 2, .cp = 2}, 8, 6).embedding_group(), (Ranks{6}));
  EXPECT_EQ(ProcessGrid({}, 1, 0).embedding_group(), (Ranks{0}));
}

// Over many layouts, both new groups partition the world (each rank in exactly one, every member
// agreeing on it: what MPI_Comm_split's coloring by the lowest rank needs), tp x cp lists
// tp_rank + tp x cp_rank in order, and the embedding group holds the first and last stage.
TEST(ProcessGrid, TpCpAndEmbeddingGroupsPartitionTheWorld) {
  for (int64_t tp : {1, 2, 4})
    for (int64_t cp : {1, 2})
      for (int64_t pp : {1, 2, 3, 4})
        for (int64_t dp : {1, 2}) {
          const int64_t world = tp * cp * pp * dp;
          const GridDegrees d{.tp = tp, .cp = cp, .pp = pp, .dp = dp};
          for (int64_t r = 0; r < world; ++r) {
            const ProcessGrid g(d, world, r);
            const GridCoords c = g.coords();
            ASSERT_EQ(static_cast<int64_t>(g.tp_cp_group().size()), tp * cp);
            for (int64_t i = 0; i < tp * cp; ++i) {
              GridCoords m = c;
              m.tp = i % tp;
              m.cp = i / tp;
              ASSERT_EQ(g.tp_cp_group()[static_cast<size_t>(i)], g.rank_of(m));
            }
            const bool end_stage = pp > 1 && (c.pp == 0 || c.pp == pp - 1);
            GridCoords first = c, last = c;
            first.pp = 0;
            last.pp = pp - 1;
            ASSERT_EQ(g.embedding_group(), end_stage ? (Ranks{g.rank_of(first), g.rank_of(last)}) : (Ranks{r}));
            for (const Ranks* group : {&g.tp_cp_group(), &g.embedding_group()})
              for (int64_t member : *group) {
                const ProcessGrid other(d, world, member);
                ASSERT_EQ(group == &g.tp_cp_group() ? other.tp_cp_group() : other.embedding_group(), *group);
              }
          }
        }
}

TEST(ProcessGrid, TpGroupsAreConsecutiveRanks) {
  const ProcessGrid g({.tp = 4, .pp = 2}, 16, 6);
  EXPECT_EQ(g.tp_group(), (Ranks{4, 5, 6, 7}));
}

TEST(ProcessGrid, RejectsCoordinatesAndRanksOutsideTheGrid) {
  const ProcessGrid g({.tp = 2}, 4, 0);
  EXPECT_THROW(g.coords_of(4), Error);
  EXPECT_THROW(g.coords_of(-1), Error);
  EXPECT_THROW(g.rank_of({.tp = 2}), Error);
  EXPECT_THROW(ProcessGrid({.tp = 2}, 4, 4), Error);
}

using testing::error_of;

const GridLimits kLimits{.n_head = 12, .n_kv_head = 4, .n_layer = 12, .virtual_stages = 1, .seq_len = 1024,
                         .vocab_size = 50257};

TEST(ValidateGrid, AcceptsFittingLayouts) {
  EXPECT_NO_THROW(validate_grid({.tp = 4, .cp = 2, .pp = 2}, 32, kLimits));
  EXPECT_NO_THROW(validate_grid({}, 1, kLimits));
  // Fewer KV heads than tp: replicated, tp a multiple of n_kv_head.
  EXPECT_NO_THROW(validate_grid({.tp = 12}, 12, {.n_head = 12, .n_kv_head = 4, .n_layer = 1}));
  // n_kv_head = 0 means n_head.
  EXPECT_NO_THROW(validate_grid({.tp = 3}, 3, {.n_head = 12, .n_kv_head = 0, .n_layer = 1}));
}

TEST(ValidateGrid, ProductOfDegreesMustBeTheWorld) {
  EXPECT_EQ(error_of([] { validate_grid({.tp = 2, .cp = 1, .pp = 2, .dp = 3}, 8, kLimits); }),
            "parallel.tp x parallel.cp x parallel.pp x parallel.dp = 2 x 1 x 2 x 3 = 12, but mpirun started 8 ranks");
  EXPECT_EQ(error_of([] { ProcessGrid({.tp = 2, .dp = 3}, 8, 0); }),
            "parallel.tp x parallel.cp x parallel.pp x parallel.dp = 2 x 1 x 1 x 3 = 6, but mpirun started 8 ranks");
}

TEST(ValidateGrid, RestOfTheWorldMustDivide) {
  EXPECT_EQ(error_of([] { validate_grid({.tp = 2, .pp = 3}, 8, kLimits); }),
            "parallel.tp x parallel.cp x parallel.pp = 2 x 1 x 3 = 6 does not divide the 8 ranks mpirun started "
            "(parallel.dp = -1 takes the rest)");
}

TEST(ValidateGrid, DegreesMustBePositive) {
  EXPECT_EQ(error_of([] { validate_grid({.tp = 0}, 8, kLimits); }), "parallel.tp = 0 must be at least 1");
  EXPECT_EQ(error_of([] { validate_grid({.cp = -2}, 8, kLimits); }), "parallel.cp = -2 must be at least 1");
  EXPECT_EQ(error_of([] { validate_grid({.pp = 0}, 8, kLimits); }), "parallel.pp = 0 must be at least 1");
  EXPECT_EQ(error_of([] { validate_grid({.dp = 0}, 8, kLimits); }),
            "parallel.dp = 0 must be at least 1, or -1 (the rest of the world)");
}

TEST(ValidateGrid, HeadsMustSplitOverTp) {
  EXPECT_EQ(error_of([] { validate_grid({.tp = 5}, 5, {.n_head = 12, .n_layer = 1}); }),
            "model.n_head = 12 is not divisible by parallel.tp = 5");
  EXPECT_EQ(error_of([] { validate_grid({.tp = 4}, 4, {.n_head = 12, .n_kv_head = 6, .n_layer = 1}); }),
            "model.n_kv_head = 6 is not divisible by parallel.tp = 4");
  EXPECT_EQ(error_of([] { validate_grid({.tp = 6}, 6, {.n_head = 12, .n_kv_head = 4, .n_layer = 1}); }),
            "parallel.tp = 6 is not a multiple of model.n_kv_head = 4 (with fewer KV heads than tp ranks each KV "
            "head is replicated, so tp must be a multiple of n_kv_head)");
}

// Stages are cut by cost (model/stage_cut.h), so n_layer need not divide evenly: a block per chunk.
TEST(ValidateGrid, EveryChunkNeedsABlock) {
  GridLimits l = kLimits;
  l.n_layer = 10;
  EXPECT_NO_THROW(validate_grid({.pp = 4}, 4, l));
  l.n_layer = 3;
  EXPECT_EQ(error_of([&] { validate_grid({.pp = 4}, 4, l); }),
            "parallel.pp x parallel.vpp = 4 x 1 = 4 model chunks need at least one block each, but model.n_layer = 3");
  l.n_layer = 7;
  l.virtual_stages = 4;
  EXPECT_EQ(error_of([&] { validate_grid({.pp = 2}, 2, l); }),
            "parallel.pp x parallel.vpp = 2 x 4 = 8 model chunks need at least one block each, but model.n_layer = 7");
  l.virtual_stages = 0;
  EXPECT_EQ(error_of([&] { validate_grid({}, 1, l); }), "parallel.vpp = 0 must be at least 1");
}

TEST(ValidateGrid, SequenceMustSplitInto2CpChunks) {
  GridLimits l = kLimits;
  l.seq_len = 1000;
  EXPECT_EQ(error_of([&] { validate_grid({.cp = 8}, 8, l); }),
            "train.seq_len = 1000 is not divisible by 2 x parallel.cp = 2 x 8 = 16 (context parallel cuts the "
            "sequence into 2 x cp chunks)");
  l.seq_len = 7;  // odd is fine without context parallelism
  EXPECT_NO_THROW(validate_grid({}, 1, l));
  // Under sequence parallelism each cp rank's positions split over tp.
  l.seq_len = 12;
  l.sequence_parallel = true;
  EXPECT_EQ(error_of([&] { validate_grid({.tp = 4, .cp = 2}, 8, l); }),
            "train.seq_len / parallel.cp = 12 / 2 = 6 positions per context-parallel rank are not divisible by "
            "parallel.tp = 4 (parallel.sequence_parallel shards each cp rank's positions over the tensor-parallel "
            "ranks)");
}

TEST(ValidateGrid, MlpAndSequenceMustSplitOverTp) {
  GridLimits l = kLimits;
  l.ffn_hidden = 3002;
  EXPECT_EQ(error_of([&] { validate_grid({.tp = 4}, 4, l); }),
            "model.ffn_hidden = 3002 is not divisible by parallel.tp = 4");
  l.ffn_hidden = 3072;
  l.seq_len = 1022;
  EXPECT_NO_THROW(validate_grid({.tp = 4}, 4, l));  // the sequence is split only under sequence parallelism
  l.sequence_parallel = true;
  EXPECT_EQ(error_of([&] { validate_grid({.tp = 4}, 4, l); }),
            "train.seq_len = 1022 is not divisible by parallel.tp = 4 (parallel.sequence_parallel shards the "
            "sequence over the tensor-parallel ranks)");
  EXPECT_NO_THROW(validate_grid({.tp = 1}, 1, l));
}

}  // namespace
}  // namespace tessera

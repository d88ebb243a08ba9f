// parallel/tp_overlap.h: the key's refusals, the chunk geometry (every position in exactly one
// chunk, remainders first), and, on 2 and 4 ranks, the chunked edges against the blocking ones
// (parallel/tensor_parallel.h) bit for bit: the all-gather moves values, and each reduce-scatter
// element sums the same tp values (tp2: a + b either way; tp4: MPICH's per-element order,
// observed equal here for every chunk size used).
#include "parallel/tp_overlap.h"

#include <gtest/gtest.h>

#include <vector>

#include "error_testing.h"
#include "kernels/elementwise.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "testing.h"

namespace tessera {
namespace {
using testing::kCpu;
using testing::throws_with;

TEST(TpOverlap, RefusesChunkCountsTheLayoutCannotUse) {
  EXPECT_NO_THROW(check_tp_overlap(1, 1, false, 64));  // the default: no overlap, any layout
  EXPECT_NO_THROW(check_tp_overlap(4, 2, true, 64));
  EXPECT_NO_THROW(check_tp_overlap(3, 2, true, 10));  // 5 positions per rank: chunks of 2, 2, 1
  EXPECT_TRUE(throws_with([] { check_tp_overlap(0, 2, true, 64); }, {"parallel.tp_overlap_chunks = 0", "at least 1"}));
  EXPECT_TRUE(throws_with([] { check_tp_overlap(2, 1, true, 64); }, {"parallel.tp_overlap_chunks = 2", "parallel.tp = 1"}));
  EXPECT_TRUE(throws_with([] { check_tp_overlap(2, 2, false, 64); },
                          {"parallel.tp_overlap_chunks = 2", "parallel.sequence_parallel = true"}));
  EXPECT_TRUE(throws_with([] { check_tp_overlap(9, 2, true, 16); }, {"parallel.tp_overlap_chunks = 9", "at most 8"}));
}

TEST(TpOverlap, ChunksCoverEveryPositionOnceRemaindersFirst) {
  const SequenceChunks c(2, 1, 12, 4);  // Tl = 6: chunks of 2, 2, 1, 1
  ASSERT_EQ(c.count(), 4);
  EXPECT_EQ(c.local_length(), 6);
  const std::vector<int64_t> starts{0, 2, 4, 5}, lengths{2, 2, 1, 1};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(c.start(i), starts[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(c.length(i), lengths[static_cast<size_t>(i)]) << i;
  }
  EXPECT_EQ(SequenceChunks(4, 2, 8, 5).count(), 2);  // at most one chunk per local position
}

TEST(TpOverlap, PackThenUnpackRestoresTheSequence) {
  const int64_t R = 2, B = 2, T = 10, X = 3;
  const SequenceChunks c(R, B, T, 3);  // Tl = 5: 2, 2, 1
  testing::HostTensor<float> full({B, T, X}), back({B, T, X});
  for (int64_t i = 0; i < full.t().numel(); ++i) full.t().ptr<float>()[i] = static_cast<float>(i);
  for (int64_t i = 0; i < c.count(); ++i) {
    testing::HostTensor<float> rows({R * B, c.length(i), X});
    c.pack(kCpu, rows.t(), full.t(), i);
    // Row block r, batch b, position p: full's (b, r Tl + start + p).
    for (int64_t r = 0; r < R; ++r)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t p = 0; p < c.length(i); ++p)
          ASSERT_EQ(rows.t().ptr<float>()[((r * B + b) * c.length(i) + p) * X],
                    static_cast<float>((b * T + r * 5 + c.start(i) + p) * X));
    c.unpack(kCpu, back.t(), rows.t(), i);
  }
  for (int64_t i = 0; i < full.t().numel(); ++i) ASSERT_EQ(back.t().ptr<float>()[i], full.t().ptr<float>()[i]) << i;
}

double value(int64_t b, int64_t t, int64_t c, int rank) { return 0.1 * b + 1.7 * t - 0.3 * c + 1.1 * rank + 1.0 / (3 + t); }

// Several ranks: the chunked gather (with a GEMM that doubles its rows) and reduce-scatter against
// gather_sequence and reduce_scatter_sequence, for chunk counts with and without remainders.
TEST(TpOverlapRanks, ChunkedEdgesEqualTheBlockingOnes) {
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  const int R = comm.size(), r = comm.rank();
  if (R == 1) GTEST_SKIP() << "needs several ranks (mpiexec -n 2 or 4)";
  Allocator alloc;
  const int64_t B = 2, Tl = 5, T = Tl * R, C = 3;
  testing::HostTensor<double> local({B, Tl, C});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tl; ++t)
      for (int64_t c = 0; c < C; ++c) local.t().ptr<double>()[(b * Tl + t) * C + c] = value(b, r * Tl + t, c, 0);
  testing::HostTensor<double> want_full({B, T, C}), partial({B, T, C}), want_local({B, Tl, C});
  const TensorParallel blocking{&comm, true};
  gather_sequence(kCpu, blocking, alloc, want_full.t(), local.t());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) partial.t().ptr<double>()[(b * T + t) * C + c] = value(b, t, c, r);
  reduce_scatter_sequence(kCpu, blocking, alloc, want_local.t(), partial.t());
  for (int64_t k : {2, 3, 5}) {
    const TensorParallel tp{&comm, true, k};
    testing::HostTensor<double> doubled({B, T, C}), kept({B, T, C}), got_local({B, Tl, C});
    gather_then_gemms(kCpu, tp, alloc, local.t(),
                      {{doubled.t(), [](const Tensor& y, const Tensor& x) {
                         copy(kCpu, y, x);
                         scale(kCpu, y, 2.0);
                       }}}, kept.t());
    for (int64_t i = 0; i < want_full.t().numel(); ++i) {
      ASSERT_EQ(kept.t().ptr<double>()[i], want_full.t().ptr<double>()[i]) << "k " << k << " element " << i;
      ASSERT_EQ(doubled.t().ptr<double>()[i], 2.0 * want_full.t().ptr<double>()[i]) << "k " << k << " element " << i;
    }
    gemms_then_reduce_scatter(kCpu, tp, alloc, got_local.t(),
                              {{partial.t(), [](const Tensor& y, const Tensor& x) { copy(kCpu, y, x); }}});
    for (int64_t i = 0; i < want_local.t().numel(); ++i)
      ASSERT_EQ(got_local.t().ptr<double>()[i], want_local.t().ptr<double>()[i]) << "k " << k << " element " << i;
  }
  // The blocking layout refuses the chunked calls (no silent fallback).
  EXPECT_TRUE(throws_with([&] { gather_then_gemms(kCpu, blocking, alloc, local.t(), {}); }, {"tp_overlap_chunks > 1"}));
}

}  // namespace
}  // namespace tessera

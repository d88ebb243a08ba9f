// Tests parallel/tensor_parallel.h under 1, 2 and 4 ranks (the world is one tp group): the
// sequence gather puts each rank's (B, T / tp, C) chunk at its positions of every sequence, the
// reduce-scatter hands each rank the sum of its positions, and the region edges pair up (plain
// tp: identity / all-reduce; sequence parallel: gather / reduce-scatter).
#include "parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <vector>

#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "testing.h"

namespace tessera {
using testing::kCpu;
namespace {

using testing::test_world;

constexpr int64_t kB = 2, kTl = 3, kC = 4;

// The value of element (b, t, c) of the full sequence as rank `owner` contributes it.
float value(int64_t b, int64_t t, int64_t c, int owner) { return static_cast<float>(1000 * owner + 100 * b + 10 * t + c); }

TEST(TensorParallel, GatherAndReduceScatterAlongTheSequence) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const int p = comm.size(), r = comm.rank();
  const TensorParallel tp{&comm, true};
  Allocator alloc;
  const int64_t T = kTl * p;
  // Gather: rank r holds positions [r Tl, (r + 1) Tl) of both sequences.
  std::vector<float> local(kB * kTl * kC), full(kB * T * kC);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kTl; ++t)
      for (int64_t c = 0; c < kC; ++c) local[(b * kTl + t) * kC + c] = value(b, r * kTl + t, c, 0);
  gather_sequence(kCpu, tp, alloc, Tensor(full.data(), DType::F32, {kB, T, kC}),
                  Tensor(local.data(), DType::F32, {kB, kTl, kC}));
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < kC; ++c) ASSERT_EQ(full[(b * T + t) * kC + c], value(b, t, c, 0)) << b << " " << t << " " << c;
  // Reduce-scatter: every rank contributes a different full tensor; rank r gets the sum of its positions.
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < kC; ++c) full[(b * T + t) * kC + c] = value(b, t, c, r);
  reduce_scatter_sequence(kCpu, tp, alloc, Tensor(local.data(), DType::F32, {kB, kTl, kC}),
                          Tensor(full.data(), DType::F32, {kB, T, kC}));
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kTl; ++t)
      for (int64_t c = 0; c < kC; ++c) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += value(b, r * kTl + t, c, q);
        ASSERT_EQ(local[(b * kTl + t) * kC + c], want) << b << " " << t << " " << c;
      }
  EXPECT_THROW(gather_sequence(kCpu, tp, alloc, Tensor(full.data(), DType::F32, {kB, T + 1, kC}),
                               Tensor(local.data(), DType::F32, {kB, kTl, kC})),
               Error);
}

TEST(TensorParallel, PlainRegionEdgesAreIdentityAndAllReduce) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const int p = comm.size(), r = comm.rank();
  const TensorParallel tp{&comm, false};
  Allocator alloc;
  std::vector<float> x(kB * kTl * kC, static_cast<float>(r + 1));
  const Tensor xt(x.data(), DType::F32, {kB, kTl, kC});
  Buffer unused;
  EXPECT_EQ(enter_region(kCpu, tp, alloc, unused, xt, kTl).data, xt.data);  // no copy
  EXPECT_FALSE(unused.defined());
  leave_region(kCpu, tp, alloc, xt, xt);  // the sum over ranks, in place
  for (float v : x) ASSERT_EQ(v, static_cast<float>(p * (p + 1) / 2));
  // The rows a rank holds between regions (TensorParallel::local_seq before SequenceLayout).
  EXPECT_EQ(tp.shard_sequence(SequenceLayout::contiguous(12)).length(), 12);
  const TensorParallel sp{&comm, true};
  EXPECT_EQ(sp.shard_sequence(SequenceLayout::contiguous(12)).length(), p > 1 ? 12 / p : 12);
}

}  // namespace
}  // namespace tessera

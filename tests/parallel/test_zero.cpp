// Tests parallel/zero.h under 1, 2 and 4 ranks: a ZeRO-1 step equals plain AdamW on the gradients
// summed over ranks (segments cut by shard boundaries, decay and no-decay mixed, a buffer that
// needs padding), the global norm from the shards, gathered and reloaded moments, and the shard's
// segments.
#include "parallel/zero.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/elementwise.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "testing.h"

namespace tessera {
using testing::kCpu;
namespace {

using testing::test_world;

// N = 27 elements in five parameters. Shard boundaries for p = 2 (S = 14) cut [8, 19); for p = 4
// (S = 7) they cut [5, 8), [8, 19) and [20, 27). 27 is a multiple of neither: 1 element of padding.
const std::vector<ParamSegment> kSegments = {{0, 5, true}, {5, 3, false}, {8, 11, true}, {19, 1, false}, {20, 7, true}};
constexpr int64_t kN = 27;
const AdamWOptions kOpt{0.9, 0.95, 1e-8, 0.1};

// Rank r's gradient for element i at step s: multiples of 1/8 below 2^10, so every sum over up to
// four ranks is exact in float and any summation order gives the same gradient.
float grad_of(int r, int64_t i, int s) { return static_cast<float>(((r + 1) * (i + 3) * (s + 2)) % 23 - 11) / 8.0f; }
float param_of(int64_t i) { return static_cast<float>(i % 7) * 0.25f - 0.5f; }

std::vector<float> tensor_values(const Tensor& t) {
  const float* p = t.ptr<float>();
  return std::vector<float>(p, p + t.numel());
}

TEST(Zero, ShardSegmentsIntersectAndPad) {
  // p = 4, shard 1 = [7, 14): the end of the no-decay [5, 8) and the start of [8, 19).
  EXPECT_EQ(shard_segments(kSegments, 7, 14), (std::vector<ParamSegment>{{0, 1, false}, {1, 6, true}}));
  // Shard 3 = [21, 28): the rest of [20, 27), then one element of padding without decay.
  EXPECT_EQ(shard_segments(kSegments, 21, 28), (std::vector<ParamSegment>{{0, 6, true}, {6, 1, false}}));
  // A shard wholly inside one segment, and one wholly in the padding.
  EXPECT_EQ(shard_segments(kSegments, 9, 12), (std::vector<ParamSegment>{{0, 3, true}}));
  EXPECT_EQ(shard_segments(kSegments, 30, 33), (std::vector<ParamSegment>{{0, 3, false}}));
  EXPECT_EQ(zero_padded_numel(27, 4), 28);
  EXPECT_EQ(zero_padded_numel(28, 4), 28);
  EXPECT_EQ(zero_padded_numel(27, 1), 27);
}

TEST(Zero, StepsEqualAdamWOnSummedGradients) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const int p = comm.size(), r = comm.rank();
  const int64_t padded = zero_padded_numel(kN, p);
  Allocator alloc;
  std::vector<float> params(padded, 0.0f), grads(padded, 0.0f), ref_params(kN), ref_grads(kN);
  for (int64_t i = 0; i < kN; ++i) params[i] = ref_params[i] = param_of(i);
  const Tensor pt(params.data(), DType::F32, {padded}), gt(grads.data(), DType::F32, {padded});
  ZeroAdamW zero(pt, gt, kSegments, comm, alloc, kOpt);
  AdamW ref(Tensor(ref_params.data(), DType::F32, {kN}), Tensor(ref_grads.data(), DType::F32, {kN}), kSegments, alloc,
            kOpt);
  EXPECT_EQ(zero.shard_size(), padded / p);
  EXPECT_EQ(zero.shard_begin(), r * padded / p);
  EXPECT_EQ(alloc.counter(MemCategory::OptimizerState).current, (2u * kN + 2u * padded / p) * 4);

  for (int s = 0; s < 3; ++s) {
    for (int64_t i = 0; i < kN; ++i) {
      grads[i] = grad_of(r, i, s);
      ref_grads[i] = 0;
      for (int q = 0; q < p; ++q) ref_grads[i] += grad_of(q, i, s);
    }
    zero.reduce_grads();
    std::vector<double> sq = {0.0};
    zero.shard_grad_sq_norm(kCpu, Tensor(sq.data(), DType::F64, {1}));
    comm.all_reduce(Tensor(sq.data(), DType::F64, {1}));
    EXPECT_NEAR(sq[0], testing::squared_norm_of(Tensor(ref_grads.data(), DType::F32, {kN})), 1e-9 * sq[0])
        << "step " << s;
    const double lr = 0.01 * (s + 1), scale = s == 1 ? 0.5 : 1.0;
    zero.step(kCpu, lr, scale);
    ref.step(kCpu, lr, scale);
    for (int64_t i = 0; i < kN; ++i) ASSERT_FLOAT_EQ(params[i], ref_params[i]) << "element " << i << ", step " << s;
    for (int64_t i = kN; i < padded; ++i) ASSERT_EQ(params[i], 0.0f) << "padding " << i;
  }
  EXPECT_EQ(zero.steps_taken(), 3);

  // The gathered moments are AdamW's.
  std::vector<float> m(padded), v(padded);
  zero.gather_moments(Tensor(m.data(), DType::F32, {padded}), Tensor(v.data(), DType::F32, {padded}));
  const auto ref_m = tensor_values(ref.exp_avg()), ref_v = tensor_values(ref.exp_avg_sq());
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_FLOAT_EQ(m[i], ref_m[i]) << "exp_avg " << i;
    ASSERT_FLOAT_EQ(v[i], ref_v[i]) << "exp_avg_sq " << i;
  }
  for (int64_t i = kN; i < padded; ++i) ASSERT_EQ(m[i] + v[i], 0.0f) << "padding " << i;

  // A fresh ZeRO optimizer loading AdamW's full (unpadded) moments continues as AdamW does.
  std::vector<float> params2(params), grads2(padded, 0.0f);
  ZeroAdamW resumed(Tensor(params2.data(), DType::F32, {padded}), Tensor(grads2.data(), DType::F32, {padded}),
                    kSegments, comm, alloc, kOpt);
  std::vector<float> full_m(ref_m), full_v(ref_v);
  resumed.load_moments(kCpu, Tensor(full_m.data(), DType::F32, {kN}), Tensor(full_v.data(), DType::F32, {kN}));
  resumed.set_steps_taken(ref.steps_taken());
  for (int64_t i = 0; i < kN; ++i) {
    grads2[i] = grad_of(r, i, 3);
    ref_grads[i] = 0;
    for (int q = 0; q < p; ++q) ref_grads[i] += grad_of(q, i, 3);
  }
  resumed.reduce_grads();
  resumed.step(kCpu, 0.02);
  ref.step(kCpu, 0.02);
  for (int64_t i = 0; i < kN; ++i) ASSERT_FLOAT_EQ(params2[i], ref_params[i]) << "resumed, element " << i;
}

TEST(Zero, CommunicationVolume) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  const int p = comm.size();
  const int64_t padded = zero_padded_numel(kN, p);
  Allocator alloc;
  std::vector<float> params(padded, 0.0f), grads(padded, 0.0f);
  ZeroAdamW zero(Tensor(params.data(), DType::F32, {padded}), Tensor(grads.data(), DType::F32, {padded}), kSegments,
                 comm, alloc, kOpt);
  zero.reduce_grads();
  zero.step(kCpu, 0.01);
  // Reduce-scatter and all-gather each send (p - 1) / p of the padded buffer: together what a
  // ring all-reduce of it sends.
  EXPECT_EQ(comm.counters().reduce_scatter, (p - 1) * padded / p * 4);
  EXPECT_EQ(comm.counters().all_gather, (p - 1) * padded / p * 4);
  EXPECT_EQ(comm.counters().all_reduce, 0);
}

TEST(Zero, RejectsAnUnpaddedBufferAndBadSegments) {
  MpiCommunicator comm = MpiCommunicator::duplicate(test_world());
  Allocator alloc;
  const int64_t padded = zero_padded_numel(kN, comm.size());
  std::vector<float> params(padded + 1), grads(padded + 1);
  const Tensor pt(params.data(), DType::F32, {padded}), gt(grads.data(), DType::F32, {padded});
  if (comm.size() > 1) {
    const Tensor odd_p(params.data(), DType::F32, {padded + 1}), odd_g(grads.data(), DType::F32, {padded + 1});
    EXPECT_THROW(ZeroAdamW(odd_p, odd_g, kSegments, comm, alloc, kOpt), Error);
  }
  EXPECT_THROW(ZeroAdamW(pt, gt, {{0, 5, true}, {6, 3, true}}, comm, alloc, kOpt), Error);  // a gap
  EXPECT_THROW(ZeroAdamW(pt, gt, {{0, padded + 1, true}}, comm, alloc, kOpt), Error);      // too long
}

}  // namespace
}  // namespace tessera

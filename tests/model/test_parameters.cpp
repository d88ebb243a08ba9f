// Tests model/parameters.h: flat layout, layout-independent initialization (a tensor-parallel
// shard equals the slice of the 1-rank tensor), and registration errors.
#include "model/parameters.h"

#include <cmath>

#include "testing.h"

namespace tessera {
using testing::kCpu;

namespace {
void register_example(ParameterStore& ps) {
  ps.add({"col.weight", {6, 4}, ShardSpec::tp(0), ParamKind::Matrix, InitKind::Normal, 0.02});
  ps.add({"row.weight", {4, 6}, ShardSpec::tp(1), ParamKind::Matrix, InitKind::Normal, 0.5});
  ps.add({"norm.weight", {4}, ShardSpec::replicated(), ParamKind::Norm, InitKind::Ones, 0.0});
  ps.add({"col.bias", {6}, ShardSpec::tp(0), ParamKind::Bias, InitKind::Zeros, 0.0});
}
}  // namespace

TEST(ParameterStore, FlatLayoutIsContiguous) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  register_example(ps);
  ps.finalize();
  int64_t offset = 0;
  for (const ParamEntry& e : ps.entries()) {
    EXPECT_EQ(e.offset, offset) << e.spec.name;
    offset += e.local_shape.numel();
  }
  EXPECT_EQ(ps.numel(), offset);
  EXPECT_EQ(alloc.counter(MemCategory::Parameters).current, static_cast<size_t>(offset) * 4);
  EXPECT_EQ(alloc.counter(MemCategory::Gradients).current, static_cast<size_t>(offset) * 4);
  EXPECT_EQ(ps.param(1).data, static_cast<float*>(ps.flat_params().data) + 24);
  EXPECT_EQ(ps.find("norm.weight"), 2);
  EXPECT_EQ(ps.find("missing"), -1);
}

TEST(ParameterStore, PaddedBuffersEndInZeros) {
  // 24 + 24 + 4 + 6 = 58 elements, padded to a multiple of 4 (ZeRO-1 over 4 ranks): 60.
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  register_example(ps);
  ps.finalize(4);
  ps.initialize(kCpu, 7);
  EXPECT_EQ(ps.numel(), 58);
  EXPECT_EQ(ps.padded_numel(), 60);
  EXPECT_EQ(ps.flat_params().numel(), 58);
  EXPECT_EQ(ps.flat_grads().numel(), 58);
  EXPECT_EQ(ps.padded_flat_params().data, ps.flat_params().data);
  EXPECT_EQ(ps.padded_flat_grads().numel(), 60);
  EXPECT_EQ(alloc.counter(MemCategory::Parameters).current, 60u * 4);
  const float* p = ps.padded_flat_params().ptr<float>();
  EXPECT_EQ(p[58], 0.0f);
  EXPECT_EQ(p[59], 0.0f);
  EXPECT_THROW(ParameterStore(alloc, DType::F32).finalize(0), Error);
}

TEST(ParameterStore, FrozenMatricesHaveNoGradientBuffer) {
  // register_example: 24 + 24 (matrices) + 4 (norm) + 6 elements. Freeze the second matrix and the
  // norm: the matrix comes first and has no gradient, the norm keeps its (unused) gradient.
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  register_example(ps);
  ps.freeze(1);
  ps.freeze(2);
  ps.finalize(4);
  EXPECT_FALSE(ps.entry(1).has_grad());
  EXPECT_TRUE(ps.entry(2).has_grad());
  EXPECT_EQ(ps.entry(1).offset, 0);
  EXPECT_EQ(ps.no_grad_numel(), 24);
  EXPECT_EQ(ps.frozen_numel(), 28);
  EXPECT_FALSE(ps.grad(1).defined());
  EXPECT_EQ(ps.padded_numel(), 28 + 32);  // the trainable 30 padded to 32
  EXPECT_EQ(ps.padded_flat_grads().numel(), 4 + 32);
  EXPECT_EQ(alloc.counter(MemCategory::Gradients).current, (4u + 32) * 4);
  EXPECT_EQ(ps.trainable_flat_grads().numel(), 30);
  // The trainable gradients are views at the trainable parameters' place, less the no-grad prefix.
  EXPECT_EQ(ps.grad(0).data, static_cast<float*>(ps.padded_flat_grads().data) + 4);
  EXPECT_EQ(ps.grad(2).data, ps.padded_flat_grads().data);
  EXPECT_EQ(ps.trainable_flat_grads().data, ps.grad(0).data);
}

TEST(ParameterStore, InitializationIsDeterministicAndDistributedAsAsked) {
  Allocator alloc;
  ParameterStore a(alloc, DType::F64), b(alloc, DType::F64), c(alloc, DType::F64);
  for (ParameterStore* ps : {&a, &b, &c}) {
    ps->add({"big.weight", {200, 100}, ShardSpec::replicated(), ParamKind::Matrix, InitKind::Normal, 0.5});
    ps->add({"norm.weight", {10}, ShardSpec::replicated(), ParamKind::Norm, InitKind::Ones, 0.0});
    ps->finalize();
  }
  a.initialize(kCpu, 42);
  b.initialize(kCpu, 42);
  c.initialize(kCpu, 43);
  const double* pa = a.flat_params().ptr<double>();
  const double* pb = b.flat_params().ptr<double>();
  const double* pc = c.flat_params().ptr<double>();
  int same_as_other_seed = 0;
  double mean = 0, sq = 0;
  const int64_t n = 20000;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(pa[i], pb[i]);
    same_as_other_seed += pa[i] == pc[i];
    mean += pa[i];
    sq += pa[i] * pa[i];
  }
  EXPECT_EQ(same_as_other_seed, 0);
  mean /= n;
  const double stddev = std::sqrt(sq / n - mean * mean);
  // Sampling error of the mean is 0.5/sqrt(n) = 0.0035 and of the std ~0.5/sqrt(2n) = 0.0025:
  // bounds at about 4 sigma.
  EXPECT_NEAR(mean, 0.0, 0.015);
  EXPECT_NEAR(stddev, 0.5, 0.01);
  for (int64_t i = n; i < n + 10; ++i) EXPECT_EQ(pa[i], 1.0);
}

// Megatron's test_initialization idea: each tensor-parallel shard equals the matching slice of
// the tensor a single rank initializes.
TEST(ParameterStore, TensorParallelShardsEqualSlicesOfTheWholeTensor) {
  Allocator alloc;
  ParameterStore whole(alloc, DType::F32);
  register_example(whole);
  whole.finalize();
  whole.initialize(kCpu, 5);
  const int tp = 2;
  for (int rank = 0; rank < tp; ++rank) {
    ParameterStore shard(alloc, DType::F32, {tp, rank});
    register_example(shard);
    shard.finalize();
    shard.initialize(kCpu, 5);
    // Column-parallel (6, 4) split on dim 0: this rank's 3 rows.
    const float* col = shard.param(0).ptr<float>();
    const float* col_all = whole.param(0).ptr<float>();
    ASSERT_EQ(shard.param(0).shape, Shape({3, 4}));
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) EXPECT_EQ(col[i * 4 + j], col_all[(rank * 3 + i) * 4 + j]);
    // Row-parallel (4, 6) split on dim 1: this rank's 3 columns.
    const float* row = shard.param(1).ptr<float>();
    const float* row_all = whole.param(1).ptr<float>();
    ASSERT_EQ(shard.param(1).shape, Shape({4, 3}));
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(row[i * 3 + j], row_all[i * 6 + rank * 3 + j]);
    EXPECT_EQ(shard.param(2).shape, Shape({4}));  // replicated
    EXPECT_EQ(shard.param(3).shape, Shape({3}));
  }
}

TEST(ParameterStore, RejectsDuplicatesAndIndivisibleShards) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32, {4, 0});
  ps.add({"a", {8, 2}, ShardSpec::tp(0)});
  EXPECT_THROW(ps.add({"a", {8, 2}, ShardSpec::tp(0)}), Error);
  EXPECT_THROW(ps.add({"b", {6, 2}, ShardSpec::tp(0)}), Error);
  ps.finalize();
  EXPECT_THROW(ps.add({"c", {4}, ShardSpec::replicated()}), Error);
}

}  // namespace tessera

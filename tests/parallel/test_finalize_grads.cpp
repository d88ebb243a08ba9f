// Tests parallel/finalize_grads.h against hand-computed sums and norms: on one rank (nothing to
// sum, every parameter in the norm once), and under mpiexec (ctest FinalizeGrads.two_ranks: tp = 2,
// dp = 2, two pipeline stages sharing an embedding; FinalizeGrads.four_ranks: tp 2 x dp 2,
// replicated and ZeRO-1). Gradients are multiples of 1/4, so every sum is exact and the norms are
// compared to 1e-12.
#include "parallel/finalize_grads.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "error_testing.h"
#include "kernels/elementwise.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_grid.h"
#include "testing.h"

namespace tessera {
using testing::kCpu;
namespace {

// Gradient element i of a tensor as computed by the rank(s) `key` names: a multiple of 1/4.
double value(int key, int64_t i) { return static_cast<double>((i * 5 + key * 3 + 1) % 9 - 4) / 4.0; }

FlatParam param(int64_t numel, bool tp_sharded = false, bool tp_partial = false, bool embedding = false) {
  return {0, numel, tp_sharded, tp_partial, embedding};
}

// One rank's flat buffers (offsets filled in from the sizes, padded for ZeRO-1 over `group`) and
// its optimizer over `group`.
struct Rank {
  Allocator alloc;
  Buffer params_buf, grads_buf;
  FlatParams flat;
  std::unique_ptr<DataParallelOptimizer> opt;
  Rank(std::vector<FlatParam> entries, bool zero, Communicator* group) {
    int64_t n = 0;
    std::vector<ParamSegment> segs;
    for (FlatParam& e : entries) {
      e.offset = n;
      segs.push_back({n, e.numel, true});
      n += e.numel;
    }
    // Buckets of a few parameters: the replicated path finishes several in reduce_grads.
    DpOptimizerOptions opts{zero, 16.0 / (1 << 20), true};
    const int64_t pad = DataParallelOptimizer::pad_multiple(opts, group ? group->size() : 1);
    const int64_t padded = (n + pad - 1) / pad * pad;
    params_buf = Buffer(alloc, DType::F32, {padded}, MemCategory::Parameters);
    grads_buf = Buffer(alloc, DType::F32, {padded}, MemCategory::Gradients);
    flat = {params_buf.tensor().slice_rows(0, n), grads_buf.tensor().slice_rows(0, n), params_buf.tensor(),
            grads_buf.tensor(), std::move(entries), Tensor()};
    for (int64_t i = 0; i < n; ++i) flat.params.ptr<float>()[i] = static_cast<float>(value(7, i));
    opt = std::make_unique<DataParallelOptimizer>(flat, segs, AdamWOptions{}, opts, group, alloc);
  }
  // Parameter id's gradient, set to value(key, .) or read.
  void set(int id, int key) {
    const FlatParam& e = flat.entries.at(static_cast<size_t>(id));
    for (int64_t i = 0; i < e.numel; ++i) flat.grads.ptr<float>()[e.offset + i] = static_cast<float>(value(key, i));
  }
  double grad(int id, int64_t i) const {
    return flat.grads.ptr<float>()[flat.entries.at(static_cast<size_t>(id)).offset + i];
  }
  // As the trainer: the last backward's hook marks everything final, then finalize_grads. Returns
  // the squared norm it left on the device.
  double finalize(const GradGroups& groups) {
    if (auto hook = opt->grads_ready_hook()) hook(0, flat.size());
    const Buffer sq(alloc, DType::F64, {1}, MemCategory::Workspace);
    finalize_grads(kCpu, flat, *opt, groups, alloc, sq);
    return read_scalar(kCpu, sq);
  }
};

// sum over i < n of (sum over keys of value(key, i))^2: the squared norm of a summed tensor.
double sq_of_sum(int64_t n, const std::vector<int>& keys) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = 0;
    for (int k : keys) v += value(k, i);
    s += v * v;
  }
  return s;
}

void expect_grad_is_sum(const Rank& r, int id, const std::vector<int>& keys, const std::string& what) {
  for (int64_t i = 0; i < r.flat.entries[static_cast<size_t>(id)].numel; ++i) {
    double want = 0;
    for (int k : keys) want += value(k, i);
    ASSERT_EQ(r.grad(id, i), want) << what << ", element " << i;
  }
}

int world_size() { return comm_size(testing::test_world()); }

// One rank: every group is of one rank, so the gradients stay as they are and every parameter
// counts in the norm once, whatever its flags (tp rank 0, first stage).
TEST(FinalizeGrads, OnOneRankTheNormOfEverything) {
  for (bool zero : {false, true}) {
    Rank r({param(6, true), param(4, false, true), param(3), param(2, false, false, true)}, zero, nullptr);
    for (int id = 0; id < 4; ++id) r.set(id, id);
    const double sq = r.finalize({});
    for (int id = 0; id < 4; ++id) expect_grad_is_sum(r, id, {id}, "zero " + std::to_string(zero));
    EXPECT_NEAR(sq, sq_of_sum(6, {0}) + sq_of_sum(4, {1}) + sq_of_sum(3, {2}) + sq_of_sum(2, {3}), 1e-12);
  }
}

// tp = 2 (under mpiexec -n 2): a tp-sharded tensor (each rank its own part), a tp-partial one
// (summed over tp) and a replica (equal on both ranks, counted once).
TEST(FinalizeGrads, TensorParallelSumsThePartialGradientsAndCountsReplicasOnce) {
  if (world_size() != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (FinalizeGrads.two_ranks)";
  MpiCommunicator tp = MpiCommunicator::duplicate(testing::test_world());
  const int t = tp.rank();
  for (bool zero : {false, true}) {
    const std::string what = "zero " + std::to_string(zero) + ", tp rank " + std::to_string(t);
    Rank r({param(6, true), param(4, false, true), param(3)}, zero, nullptr);
    r.set(0, 10 + t);  // this rank's shard
    r.set(1, 20 + t);  // this rank's part of the gradient
    r.set(2, 30);      // the whole gradient, on both ranks
    const double sq = r.finalize({.tp = &tp});
    expect_grad_is_sum(r, 0, {10 + t}, what);
    expect_grad_is_sum(r, 1, {20, 21}, what);  // fails when the tp-partial sum is skipped
    expect_grad_is_sum(r, 2, {30}, what);
    EXPECT_NEAR(sq, sq_of_sum(6, {10}) + sq_of_sum(6, {11}) + sq_of_sum(4, {20, 21}) + sq_of_sum(3, {30}), 1e-12)
        << what;
  }
}

// dp = 2 (under mpiexec -n 2): everything summed over the dp x cp group; the tp-partial flag does
// nothing without a tp group. ZeRO-1 holds only its shard of the sum, so the norm and the update
// (equal to the replicated one) are what shows it.
TEST(FinalizeGrads, DataParallelSumsEverythingOverTheGroup) {
  if (world_size() != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (FinalizeGrads.two_ranks)";
  MpiCommunicator dp = MpiCommunicator::duplicate(testing::test_world());
  const int d = dp.rank();
  const std::vector<FlatParam> entries = {param(6), param(4, false, true), param(3)};  // 13: padded under ZeRO-1
  Rank replicated(entries, false, &dp), sharded(entries, true, &dp);
  ASSERT_TRUE(sharded.opt->sharded());
  for (Rank* r : {&replicated, &sharded}) {
    for (int id = 0; id < 3; ++id) r->set(id, 10 * id + d);
    const double sq = r->finalize({.dp_cp = &dp});
    EXPECT_NEAR(sq, sq_of_sum(6, {0, 1}) + sq_of_sum(4, {10, 11}) + sq_of_sum(3, {20, 21}), 1e-12)
        << "zero " << r->opt->sharded();
    r->opt->step(kCpu, 1e-2, 1.0);
  }
  for (int id = 0; id < 3; ++id) expect_grad_is_sum(replicated, id, {10 * id, 10 * id + 1}, "replicated");
  for (int64_t i = 0; i < replicated.flat.numel(); ++i)
    ASSERT_FLOAT_EQ(sharded.flat.params.ptr<float>()[i], replicated.flat.params.ptr<float>()[i]) << "element " << i;
  // The reduction runs over the optimizer's own group: another one is a wiring mistake.
  Rank fresh(entries, false, &dp);
  const Buffer sq(fresh.alloc, DType::F64, {1}, MemCategory::Workspace);
  EXPECT_TRUE(testing::throws_with([&] { finalize_grads(kCpu, fresh.flat, *fresh.opt, {}, fresh.alloc, sq); },
                                   {"the dp x cp group is not the optimizer's"}));
}

// Two pipeline stages (under mpiexec -n 2) sharing a tied embedding E, laid out differently on
// each: E is summed over the embedding group and counted on the first stage only; each stage's
// own layers count on that stage, and the norm sums the stages.
TEST(FinalizeGrads, PipelineStagesSumTheEmbeddingGroupAndTheNorm) {
  if (world_size() != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (FinalizeGrads.two_ranks)";
  MpiCommunicator pp = MpiCommunicator::duplicate(testing::test_world()),
                  embedding = MpiCommunicator::duplicate(testing::test_world());
  const int stage = pp.rank();
  for (bool zero : {false, true}) {
    const std::string what = "zero " + std::to_string(zero) + ", stage " + std::to_string(stage);
    // Stage 0: E (4), then its layer X (5). Stage 1: its layer Y (3), then E.
    const FlatParam e = param(4, false, false, true);
    Rank r(stage == 0 ? std::vector<FlatParam>{e, param(5)} : std::vector<FlatParam>{param(3), e}, zero, nullptr);
    const int e_id = stage == 0 ? 0 : 1, own_id = 1 - e_id;
    r.set(e_id, 40 + stage);
    r.set(own_id, 50 + stage);
    const double sq = r.finalize({.pp = &pp, .embedding = &embedding});
    expect_grad_is_sum(r, e_id, {40, 41}, what);  // fails when the embedding sum is skipped
    expect_grad_is_sum(r, own_id, {50 + stage}, what);
    EXPECT_NEAR(sq, sq_of_sum(4, {40, 41}) + sq_of_sum(5, {50}) + sq_of_sum(3, {51}), 1e-12) << what;
  }
}

// tp 2 x dp 2 (under mpiexec -n 4): the tp-partial sum must land before ZeRO-1's reduce-scatter
// (after it each rank holds only its shard) and after the replicated all-reduce; either way the
// result is the sum over all four ranks, and ZeRO-1 steps as the replicated optimizer does.
TEST(FinalizeGrads, TensorAndDataParallelComposeInEitherOptimizer) {
  if (world_size() != 4) GTEST_SKIP() << "runs under mpiexec -n 4 (FinalizeGrads.four_ranks)";
  const MPI_Comm world = testing::test_world();
  const ProcessGrid grid({.tp = 2, .dp = 2}, 4, comm_rank(world));
  const int me = static_cast<int>(grid.rank());
  MpiCommunicator tp = MpiCommunicator::split(world, static_cast<int>(grid.tp_group().front()), me),
                  dp = MpiCommunicator::split(world, static_cast<int>(grid.dp_group().front()), me);
  const int t = static_cast<int>(grid.tp_rank()), d = static_cast<int>(grid.dp_rank());
  const std::vector<FlatParam> entries = {param(6, true), param(4, false, true), param(3)};
  Rank replicated(entries, false, &dp), sharded(entries, true, &dp);
  for (Rank* r : {&replicated, &sharded}) {
    r->set(0, 10 + 2 * t + d);  // tp shard t, dp replica d
    r->set(1, 20 + 2 * t + d);  // partial over tp
    r->set(2, 30 + d);          // whole on every tp rank
    const double sq = r->finalize({.tp = &tp, .dp_cp = &dp});
    // tp shard 0's sum over dp, tp shard 1's, the partial tensor summed over all four ranks, the replica over dp.
    EXPECT_NEAR(sq, sq_of_sum(6, {10, 11}) + sq_of_sum(6, {12, 13}) + sq_of_sum(4, {20, 21, 22, 23}) +
                        sq_of_sum(3, {30, 31}), 1e-12)
        << "zero " << r->opt->sharded() << ", tp rank " << t << ", dp rank " << d;
    r->opt->step(kCpu, 1e-2, 1.0);
  }
  expect_grad_is_sum(replicated, 0, {10 + 2 * t, 11 + 2 * t}, "replicated");
  expect_grad_is_sum(replicated, 1, {20, 21, 22, 23}, "replicated");
  expect_grad_is_sum(replicated, 2, {30, 31}, "replicated");
  for (int64_t i = 0; i < replicated.flat.numel(); ++i)
    ASSERT_FLOAT_EQ(sharded.flat.params.ptr<float>()[i], replicated.flat.params.ptr<float>()[i]) << "element " << i;
}

}  // namespace
}  // namespace tessera

// Tests app/dp_optimizer.h on 1 rank and under `mpiexec -n 2` (ctest DpOptimizer.two_ranks): the
// ZeRO-1 and the replicated optimizer take the same steps from the same gradients, report the
// same global norm and the same full moments, and a state read into state_buffers() continues.
#include "app/dp_optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "kernels/elementwise.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "testing.h"

namespace tessera {
using testing::kCpu;
namespace {

// Three parameters of 5 x 3, 7 and 1 elements: 23, odd, so ZeRO-1 pads for 2 ranks.
struct Model {
  Allocator alloc;
  ParameterStore params{alloc, DType::F32};
  std::unique_ptr<DataParallelOptimizer> opt;
  Model(int64_t zero, Communicator* dp) {
    params.add({"w", {5, 3}, ShardSpec::replicated(), ParamKind::Matrix, InitKind::Normal, 0.5});
    params.add({"b", {7}, ShardSpec::replicated(), ParamKind::Bias, InitKind::Normal, 0.5});
    params.add({"g", {1}, ShardSpec::replicated(), ParamKind::Norm, InitKind::Ones, 0.0});
    ParallelConfig cfg;
    cfg.zero = zero;
    params.finalize(DataParallelOptimizer::pad_multiple(cfg, dp ? dp->size() : 1));
    params.initialize(kCpu, 3);
    std::vector<ParamSegment> segs;
    for (const ParamEntry& e : params.entries()) segs.push_back({e.offset, e.local_shape.numel(), e.spec.name == "w"});
    opt = std::make_unique<DataParallelOptimizer>(params, segs, AdamWOptions{}, cfg, dp, alloc);
  }
  // Rank r's gradients at step s (multiples of 1/4: sums over ranks are exact).
  void set_grads(int r, int s) {
    float* g = params.flat_grads().ptr<float>();
    for (int64_t i = 0; i < params.numel(); ++i) g[i] = static_cast<float>((i * 7 + r * 3 + s) % 9 - 4) / 4.0f;
  }
  // The optimizer's squared gradient norm (grad_sq_norm), read back to the host.
  double sq_norm(const std::function<bool(const ParamEntry&)>& counts) {
    const Buffer out(alloc, DType::F64, {1}, MemCategory::Workspace);
    opt->grad_sq_norm(kCpu, out, counts);
    return read_scalar(kCpu, out);
  }
  std::vector<float> values() const {
    const float* p = params.flat_params().ptr<float>();
    return std::vector<float>(p, p + params.numel());
  }
};

std::vector<float> head(const Tensor& t, int64_t n) { return std::vector<float>(t.ptr<float>(), t.ptr<float>() + n); }

TEST(DpOptimizer, ZeroOneStepsAsTheReplicatedOptimizer) {
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  Communicator* dp = comm.size() > 1 ? &comm : nullptr;
  Model zero(1, dp), plain(0, dp);
  EXPECT_EQ(DataParallelOptimizer::sharded({.zero = 1}, comm.size()), comm.size() > 1);
  EXPECT_EQ(zero.params.padded_numel() % comm.size(), 0);
  for (int s = 0; s < 3; ++s) {
    for (Model* m : {&zero, &plain}) {
      m->set_grads(comm.rank(), s);
      if (auto hook = m->opt->grads_ready_hook()) hook(0, m->params.size());
      m->opt->reduce_grads();
    }
    auto all = [](const ParamEntry&) { return true; };
    const double sq = zero.sq_norm(all);
    EXPECT_NEAR(sq, plain.sq_norm(all), 1e-6 * sq) << "step " << s;
    // A filter leaves parameters out of the sum on every path (tp replicas on tp ranks > 0).
    auto first_out = [](const ParamEntry& e) { return e.offset > 0; };
    EXPECT_NEAR(zero.sq_norm(first_out), plain.sq_norm(first_out), 1e-6 * sq) << "step " << s;
    EXPECT_LT(plain.sq_norm(first_out), sq);
    zero.opt->step(kCpu, 1e-2, 0.5);
    plain.opt->step(kCpu, 1e-2, 0.5);
    const auto a = zero.values(), b = plain.values();
    for (size_t i = 0; i < a.size(); ++i) ASSERT_FLOAT_EQ(a[i], b[i]) << "element " << i << ", step " << s;
  }
  const FullOptimizerState zs = zero.opt->gather_state(), ps = plain.opt->gather_state();
  EXPECT_EQ(zs.state.steps, 3);
  EXPECT_EQ(ps.state.steps, 3);
  const int64_t n = plain.params.numel();
  EXPECT_EQ(head(zs.state.exp_avg, n), head(ps.state.exp_avg, n));
  EXPECT_EQ(head(zs.state.exp_avg_sq, n), head(ps.state.exp_avg_sq, n));

  // A fresh ZeRO-1 optimizer loading the replicated moments (as restore_training_state would,
  // into state_buffers()) continues identically.
  Model resumed(1, dp);
  const auto trained = plain.values();
  std::copy(trained.begin(), trained.end(), resumed.params.flat_params().ptr<float>());
  const FullOptimizerState buffers = resumed.opt->state_buffers();
  std::copy_n(ps.state.exp_avg.ptr<float>(), n, buffers.state.exp_avg.ptr<float>());
  std::copy_n(ps.state.exp_avg_sq.ptr<float>(), n, buffers.state.exp_avg_sq.ptr<float>());
  resumed.opt->load_state(kCpu, buffers.state, 3);
  for (Model* m : {&resumed, &plain}) {
    m->set_grads(comm.rank(), 3);
    if (auto hook = m->opt->grads_ready_hook()) hook(0, m->params.size());
    m->opt->reduce_grads();
    m->opt->step(kCpu, 1e-2, 1.0);
  }
  const auto a = resumed.values(), b = plain.values();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_FLOAT_EQ(a[i], b[i]) << "resumed, element " << i;
}

TEST(DpOptimizer, ReplicatedStateMustBeReadInPlace) {
  Model plain(0, nullptr);
  std::vector<float> elsewhere(2 * plain.params.numel());
  const OptimizerState other{Tensor(elsewhere.data(), DType::F32, {plain.params.numel()}),
                             Tensor(elsewhere.data() + plain.params.numel(), DType::F32, {plain.params.numel()}), 0};
  EXPECT_THROW(plain.opt->load_state(kCpu, other, 1), Error);
  plain.opt->load_state(kCpu, plain.opt->state_buffers().state, 4);
  EXPECT_EQ(plain.opt->gather_state().state.steps, 4);
}

}  // namespace
}  // namespace tessera

// Tests parallel/dp_optimizer.h on 1 rank and under `mpiexec -n 2` (ctest DpOptimizer.two_ranks):
// the ZeRO-1 and the replicated optimizer take the same steps from the same gradients, report the
// same global norm and the same full moments, and a state read into state_buffers() continues.
#include "parallel/dp_optimizer.h"

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

// Three parameters of 5 x 3, 7 and 1 elements in flat buffers (as ParameterStore lays them out):
// 23, odd, so ZeRO-1 pads for 2 ranks.
struct Model {
  Allocator alloc;
  Buffer params_buf, grads_buf;  // (P), zero-filled: the padding stays zero
  FlatParams flat;
  std::unique_ptr<DataParallelOptimizer> opt;
  Model(int64_t zero, Communicator* dp) {
    DpOptimizerOptions opts;
    opts.zero = zero == 1;
    const int64_t n = 23, pad = DataParallelOptimizer::pad_multiple(opts, dp ? dp->size() : 1);
    const int64_t padded = (n + pad - 1) / pad * pad;
    params_buf = Buffer(alloc, DType::F32, {padded}, MemCategory::Parameters);
    grads_buf = Buffer(alloc, DType::F32, {padded}, MemCategory::Gradients);
    flat = {params_buf.tensor().slice_rows(0, n), grads_buf.tensor().slice_rows(0, n), params_buf.tensor(),
            grads_buf.tensor(), {{0, 15}, {15, 7}, {22, 1}}, Tensor()};
    // w and b from a fixed pattern, the norm weight g one (any values that every model shares).
    float* p = flat.params.ptr<float>();
    for (int64_t i = 0; i < 22; ++i) p[i] = static_cast<float>((i * 5) % 11 - 5) / 8.0f;
    p[22] = 1.0f;
    const std::vector<ParamSegment> segs = {{0, 15, true}, {15, 7, false}, {22, 1, false}};  // decay on w
    opt = std::make_unique<DataParallelOptimizer>(flat, segs, AdamWOptions{}, opts, dp, alloc);
  }
  // Rank r's gradients at step s (multiples of 1/4: sums over ranks are exact).
  void set_grads(int r, int s) {
    float* g = flat.grads.ptr<float>();
    for (int64_t i = 0; i < flat.numel(); ++i) g[i] = static_cast<float>((i * 7 + r * 3 + s) % 9 - 4) / 4.0f;
  }
  // The optimizer's squared gradient norm (grad_sq_norm), read back to the host.
  double sq_norm(const std::function<bool(const FlatParam&)>& counts) {
    const Buffer out(alloc, DType::F64, {1}, MemCategory::Workspace);
    opt->grad_sq_norm(kCpu, out, counts);
    return read_scalar(kCpu, out);
  }
  std::vector<float> values() const {
    const float* p = flat.params.ptr<float>();
    return std::vector<float>(p, p + flat.numel());
  }
};

std::vector<float> head(const Tensor& t, int64_t n) { return std::vector<float>(t.ptr<float>(), t.ptr<float>() + n); }

TEST(DpOptimizer, ZeroOneStepsAsTheReplicatedOptimizer) {
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  Communicator* dp = comm.size() > 1 ? &comm : nullptr;
  Model zero(1, dp), plain(0, dp);
  EXPECT_EQ(DataParallelOptimizer::sharded({.zero = 1}, comm.size()), comm.size() > 1);
  EXPECT_EQ(zero.flat.padded_params.numel() % comm.size(), 0);
  for (int s = 0; s < 3; ++s) {
    for (Model* m : {&zero, &plain}) {
      m->set_grads(comm.rank(), s);
      if (auto hook = m->opt->grads_ready_hook()) hook(0, m->flat.size());
      m->opt->reduce_grads();
    }
    auto all = [](const FlatParam&) { return true; };
    const double sq = zero.sq_norm(all);
    EXPECT_NEAR(sq, plain.sq_norm(all), 1e-6 * sq) << "step " << s;
    // A filter leaves parameters out of the sum on every path (tp replicas on tp ranks > 0).
    auto first_out = [](const FlatParam& e) { return e.offset > 0; };
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
  const int64_t n = plain.flat.numel();
  EXPECT_EQ(head(zs.state.exp_avg, n), head(ps.state.exp_avg, n));
  EXPECT_EQ(head(zs.state.exp_avg_sq, n), head(ps.state.exp_avg_sq, n));

  // A fresh ZeRO-1 optimizer loading the replicated moments (as restore_training_state would,
  // into state_buffers()) continues identically.
  Model resumed(1, dp);
  const auto trained = plain.values();
  std::copy(trained.begin(), trained.end(), resumed.flat.params.ptr<float>());
  const FullOptimizerState buffers = resumed.opt->state_buffers();
  std::copy_n(ps.state.exp_avg.ptr<float>(), n, buffers.state.exp_avg.ptr<float>());
  std::copy_n(ps.state.exp_avg_sq.ptr<float>(), n, buffers.state.exp_avg_sq.ptr<float>());
  resumed.opt->load_state(kCpu, buffers.state, 3);
  for (Model* m : {&resumed, &plain}) {
    m->set_grads(comm.rank(), 3);
    if (auto hook = m->opt->grads_ready_hook()) hook(0, m->flat.size());
    m->opt->reduce_grads();
    m->opt->step(kCpu, 1e-2, 1.0);
  }
  const auto a = resumed.values(), b = plain.values();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_FLOAT_EQ(a[i], b[i]) << "resumed, element " << i;
}

TEST(DpOptimizer, ReplicatedStateMustBeReadInPlace) {
  Model plain(0, nullptr);
  std::vector<float> elsewhere(2 * plain.flat.numel());
  const OptimizerState other{Tensor(elsewhere.data(), DType::F32, {plain.flat.numel()}),
                             Tensor(elsewhere.data() + plain.flat.numel(), DType::F32, {plain.flat.numel()}), 0};
  EXPECT_THROW(plain.opt->load_state(kCpu, other, 1), Error);
  plain.opt->load_state(kCpu, plain.opt->state_buffers().state, 4);
  EXPECT_EQ(plain.opt->gather_state().state.steps, 4);
}

}  // namespace
}  // namespace tessera

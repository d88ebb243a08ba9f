// Tensor (and sequence) parallel GPT = the 1-rank GPT. Under `mpiexec -n 2` and `-n 4` the world
// is one tp group: every rank builds the tp-sharded model and the whole model, in double
// precision, and checks that each shard starts as the slice of the whole tensor, that the loss is
// the same, and that each shard's gradient (summed over tp where ParamSpec says so) is the slice
// of the whole gradient. Padding rows of the vocabulary shards must stay exactly zero. Pipeline
// stages on the same tp layout, chained by hand, equal the one-stage shard.
// Under plain ctest (one rank) the same code checks the tp = 1 path against itself.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cross_entropy.h"
#include "model/gpt.h"
#include "model/memory.h"
#include "mpi_testing.h"
#include "parallel/mpi_communicator.h"
#include "testing.h"
#include "tp_model_testing.h"

namespace tessera {
using testing::kCpu;
namespace {

struct Case {
  std::string preset;
  bool sequence_parallel;
  Recompute recompute;
};


// Element `local` of shard entry e against the whole tensor w (global row-major): padding -> 0.
double whole_value(const ParamEntry& e, const std::vector<double>& w, int64_t local) {
  return e.is_padding(local) ? 0.0 : w[static_cast<size_t>(global_index(e, local))];
}

class GptTensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(GptTensorParallel, ShardsEqualTheWholeModel) {
  const Case c = GetParam();
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  const int tp = comm.size(), rank = comm.rank();
  const ModelConfig cfg = testing::tp_model_config(c.preset, 8);
  testing::TpModel whole(cfg, {}, c.recompute, {});
  testing::TpModel shard(cfg, {tp, rank}, c.recompute, TensorParallel{&comm, c.sequence_parallel});

  // Initialization: each shard is the slice of the whole tensor (padding rows zero).
  for (int id = 0; id < shard.ps.size(); ++id) {
    const ParamEntry& e = shard.ps.entry(id);
    const int wid = whole.ps.find(e.spec.name);
    ASSERT_GE(wid, 0) << e.spec.name;
    const Tensor w = whole.ps.param(wid);
    const std::vector<double> wv(w.ptr<double>(), w.ptr<double>() + w.numel());
    const double* p = shard.ps.param(id).ptr<double>();
    for (int64_t i = 0; i < e.local_shape.numel(); ++i)
      ASSERT_EQ(p[i], whole_value(e, wv, i)) << e.spec.name << " element " << i << " on rank " << rank;
  }

  // The same batch on every rank (the tp group shares its data), some targets ignored.
  auto tokens = testing::random_ids({2, 8}, cfg.vocab_size, 5);
  auto targets = testing::random_ids({2, 8}, cfg.vocab_size, 6);
  targets[3] = kIgnoreIndex;
  GptCtx wctx, sctx;
  whole.gpt.forward(kCpu, wctx, whole.alloc, tokens.t(), targets.t());
  shard.gpt.forward(kCpu, sctx, shard.alloc, tokens.t(), targets.t());
  const LossSums wsums = read_loss_sums(kCpu, wctx.loss_sums), ssums = read_loss_sums(kCpu, sctx.loss_sums);
  const double want = wsums.mean(), got = ssums.mean();
  EXPECT_NEAR(got, want, 1e-12 * std::abs(want)) << "rank " << rank;
  EXPECT_EQ(ssums.targets, wsums.targets);
  const double scale = 1.0 / static_cast<double>(wsums.targets);
  whole.gpt.backward(kCpu, wctx, whole.alloc, scale);
  shard.gpt.backward(kCpu, sctx, shard.alloc, scale);

  double largest = 0;
  for (int64_t i = 0; i < whole.ps.numel(); ++i)
    largest = std::max(largest, std::abs(whole.ps.flat_grads().ptr<double>()[i]));
  for (int id = 0; id < shard.ps.size(); ++id) {
    const ParamEntry& e = shard.ps.entry(id);
    const Tensor g = shard.ps.grad(id);
    if (e.spec.sum_grad_over_tp) comm.all_reduce(g, ReduceOp::Sum);
    const Tensor w = whole.ps.grad(whole.ps.find(e.spec.name));
    const std::vector<double> wv(w.ptr<double>(), w.ptr<double>() + w.numel());
    double err = 0;
    for (int64_t i = 0; i < e.local_shape.numel(); ++i) err = std::max(err, std::abs(g.ptr<double>()[i] - whole_value(e, wv, i)));
    EXPECT_LT(err, 1e-12 * largest) << e.spec.name << " on rank " << rank << " of " << tp;
  }
}

// model/memory.h on this layout: this rank's parameters, what its forward keeps and the peak of
// its forward + backward equal the allocator's counts exactly (the sequence-parallel staging
// buffers, replicated KV projections and vocabulary-parallel loss temporaries included).
TEST_P(GptTensorParallel, MemoryEqualsTheAnalyticModel) {
  const Case c = GetParam();
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  const int tp = comm.size(), rank = comm.rank();
  const ModelConfig cfg = testing::tp_model_config(c.preset, 8);
  testing::TpModel shard(cfg, {tp, rank}, c.recompute, TensorParallel{&comm, c.sequence_parallel});
  const int64_t B = 2, T = 8;
  const ModelMemory m = model_memory(cfg, {B, T, tp, c.sequence_parallel, c.recompute});
  EXPECT_EQ(m.parameters, shard.ps.numel()) << "rank " << rank;
  const size_t state = shard.alloc.total_current(), bytes = sizeof(double);
  auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 5);
  auto targets = testing::random_ids({B, T}, cfg.vocab_size, 6);
  GptCtx ctx;
  shard.gpt.forward(testing::kCpu, ctx, shard.alloc, tokens.t(), targets.t());
  EXPECT_EQ(shard.alloc.counter(MemCategory::Activations).current, bytes * static_cast<size_t>(m.activations))
      << "rank " << rank;
  shard.gpt.backward(testing::kCpu, ctx, shard.alloc, 0.01);
  EXPECT_EQ(shard.alloc.total_peak() - state, bytes * static_cast<size_t>(m.training_peak) + ModelMemory::kLossSumsBytes)
      << "rank " << rank;
}

// Pipeline stages on this tp layout: the model split into 2 stages (each on its own store, tp-sharded
// as the one-stage model), activations (B, T / tp, C) under sequence parallelism and gradients
// chained by hand, equals the one-stage shard: the loss and every gradient bit for bit, except the
// tied gpt2 table (first stage + the last stage's copy: the head's and the embedding's parts
// reassociated, see tests/model/test_gpt_stages.cpp), to 1e-14 of its largest gradient.
TEST_P(GptTensorParallel, TwoStagesEqualTheOneStageShard) {
  const Case c = GetParam();
  MpiCommunicator comm = MpiCommunicator::duplicate(testing::test_world());
  const int tp = comm.size(), rank = comm.rank();
  const ModelConfig cfg = testing::tp_model_config(c.preset, 8);
  const TensorParallel group{&comm, c.sequence_parallel};
  testing::TpModel one(cfg, {tp, rank}, c.recompute, group);
  testing::TpModel s0(cfg, {tp, rank}, c.recompute, group, StageSpec::split(cfg.n_layer, 2, 0));
  testing::TpModel s1(cfg, {tp, rank}, c.recompute, group, StageSpec::split(cfg.n_layer, 2, 1));
  const int64_t B = 2, T = 8, Tl = c.sequence_parallel ? T / tp : T;
  auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 15);
  auto targets = testing::random_ids({B, T}, cfg.vocab_size, 16);
  GptCtx ctx, c0, c1;
  one.gpt.forward(kCpu, ctx, one.alloc, tokens.t(), targets.t());
  const LossSums want = read_loss_sums(kCpu, ctx.loss_sums);
  const double scale = 1.0 / static_cast<double>(want.targets);
  one.gpt.backward(kCpu, ctx, one.alloc, scale);

  const Tensor x = s0.gpt.forward(kCpu, c0, s0.alloc, tokens.t(), Tensor());
  EXPECT_EQ(x.shape, (Shape{B, Tl, cfg.n_embd}));
  s1.gpt.forward(kCpu, c1, s1.alloc, x, targets.t(), SequenceLayout::contiguous(T));
  EXPECT_EQ(read_loss_sums(kCpu, c1.loss_sums).loss_sum, want.loss_sum) << "rank " << rank;
  testing::HostTensor<double> dx({B, Tl, cfg.n_embd});
  s1.gpt.backward(kCpu, c1, s1.alloc, Gpt::OutputGrad::loss(scale), dx.t());
  s0.gpt.backward(kCpu, c0, s0.alloc, Gpt::OutputGrad::output(dx.t()), Tensor());

  for (int id = 0; id < one.ps.size(); ++id) {
    const std::string& name = one.ps.entry(id).spec.name;
    const Tensor w = one.ps.grad(id);
    std::vector<double> sum(static_cast<size_t>(w.numel()), 0.0);
    int holders = 0;
    for (const testing::TpModel* s : {&s0, &s1}) {
      const int sid = s->ps.find(name);
      if (sid < 0) continue;
      ++holders;
      for (int64_t i = 0; i < w.numel(); ++i) sum[static_cast<size_t>(i)] += s->ps.grad(sid).ptr<double>()[i];
    }
    const bool tied = name == "wte.weight" && c.preset == "gpt2";
    ASSERT_EQ(holders, tied ? 2 : 1) << name;
    double largest = 0, diff = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      largest = std::max(largest, std::abs(w.ptr<double>()[i]));
      diff = std::max(diff, std::abs(sum[static_cast<size_t>(i)] - w.ptr<double>()[i]));
    }
    EXPECT_LE(diff, tied ? 1e-14 * largest : 0.0) << name << " on rank " << rank << " of " << tp;
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.preset + (info.param.sequence_parallel ? "_sp" : "") +
         (info.param.recompute == Recompute::Full ? "_recompute" : "") +
         (info.param.recompute == Recompute::Selective ? "_selective" : "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, GptTensorParallel,
                         ::testing::Values(Case{"gpt2", false, Recompute::None}, Case{"gpt2", true, Recompute::None},
                                           Case{"llama", false, Recompute::None}, Case{"llama", true, Recompute::None},
                                           Case{"gpt2", true, Recompute::Full}, Case{"llama", true, Recompute::Selective}),
                         case_name);

}  // namespace
}  // namespace tessera

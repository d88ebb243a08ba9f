// Tests the pipeline stages of model/gpt.h (StageSpec): a tiny gpt2 (tied embeddings, learned
// positions) and a tiny llama (untied head, RoPE, grouped-query attention) split into 2 and 3
// stages in one process, each stage on its own ParameterStore holding the whole model's values
// (copied by name), forward activations and backward gradients chained by hand: the loss and
// every parameter gradient equal the whole model's. Also: what each stage registers, the tied
// copy's marks and initial values, GradsReady per stage, and the refused stage specs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "error_testing.h"
#include "kernels/cross_entropy.h"
#include "model/gpt.h"
#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;
using testing::throws_with;
namespace {

constexpr int64_t kB = 2, kT = 6, kLayers = 4;

ModelConfig stage_config(const std::string& preset) {
  ModelConfig c;
  c.preset = preset;
  c.vocab_size = 13;
  c.n_layer = kLayers;
  c.n_head = 2;
  c.n_kv_head = preset == "llama" ? 1 : 0;
  c.n_embd = 8;
  c.ffn_hidden = 12;
  c.max_seq_len = 8;
  c.init_std = 0.3;  // large enough that every path carries a visible gradient
  return c;
}

// One model instance on its own store: the whole model or one stage.
struct Part {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  Part(const ModelConfig& cfg, DType dt, StageSpec stage, std::vector<Recompute> rc = {})
      : ps(alloc, dt), gpt(cfg, ps, std::move(rc), {}, stage) {
    ps.finalize();
    ps.initialize(kCpu, 7);
  }
};

std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[static_cast<size_t>(i)] = t.dtype == DType::F64 ? t.ptr<double>()[i] : t.ptr<float>()[i];
  return v;
}

void copy_by_name(const ParameterStore& from, ParameterStore& to) {
  for (int id = 0; id < to.size(); ++id) {
    const int src = from.find(to.entry(id).spec.name);
    ASSERT_GE(src, 0) << to.entry(id).spec.name << " is not a parameter of the whole model";
    copy(kCpu, to.param(id), from.param(src));
  }
}

struct Case {
  std::string preset;
  int stages;
  DType dtype;
  Recompute recompute;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return i.param.preset + "_" + std::to_string(i.param.stages) + "stages_" +
         (i.param.dtype == DType::F64 ? "f64" : "f32") + (i.param.recompute == Recompute::Full ? "_recompute" : "") +
         (i.param.recompute == Recompute::Selective ? "_selective" : "");
}

class GptStages : public ::testing::TestWithParam<Case> {};

// Chains the stages' forwards and backwards by hand and compares with the whole model.
// Bit-exact: the loss and every gradient except the tied token embedding's, since each stage runs
// the same kernels on the same values in the same order as the whole model does. The tied one
// is the first stage's gradient plus the last stage's copy's, (embedding part) + (head part),
// where the whole model accumulates head part + embedding parts into one buffer: the same terms
// reassociated, which costs at most one rounding per occurrence of a token (<= B T = 12 here)
// relative to the largest term: 12 x 6e-8 in f32, 12 x 1.1e-16 in f64; tolerances 2e-6 and 1e-14
// of the tensor's largest gradient (measured: 2.7e-8 and 6.7e-17, half an ulp).
TEST_P(GptStages, ChainedStagesEqualTheWholeModel) {
  const Case c = GetParam();
  const ModelConfig cfg = stage_config(c.preset);
  const std::vector<Recompute> rc(kLayers, c.recompute);
  Part whole(cfg, c.dtype, {}, rc);
  std::vector<std::unique_ptr<Part>> stages;
  for (int s = 0; s < c.stages; ++s) {
    stages.push_back(std::make_unique<Part>(cfg, c.dtype, StageSpec::split(kLayers, c.stages, s), rc));
    copy_by_name(whole.ps, stages.back()->ps);
  }
  auto tokens = testing::random_ids({kB, kT}, 13, 31);
  auto targets = testing::random_ids({kB, kT}, 13, 32);
  targets[3] = kIgnoreIndex;

  GptCtx whole_ctx;
  whole.gpt.forward(kCpu, whole_ctx, whole.alloc, tokens.t(), targets.t());
  const LossSums want = read_loss_sums(kCpu, whole_ctx.loss_sums);
  const double scale = 1.0 / static_cast<double>(want.targets);
  whole.gpt.backward(kCpu, whole_ctx, whole.alloc, scale);

  // Forward: tokens into the first stage, each stage's output into the next, the loss at the last.
  std::vector<GptCtx> ctx(static_cast<size_t>(c.stages));
  Tensor x;
  for (int s = 0; s < c.stages; ++s) {
    Part& p = *stages[static_cast<size_t>(s)];
    const bool last = s == c.stages - 1;
    const Tensor out = p.gpt.forward(kCpu, ctx[s], p.alloc, s == 0 ? tokens.t() : x, last ? targets.t() : Tensor(),
                                     s == 0 ? SequenceLayout() : SequenceLayout::contiguous(kT));
    EXPECT_EQ(out.defined(), !last) << "stage " << s;
    if (!last) {
      EXPECT_EQ(out.shape, (Shape{kB, kT, cfg.n_embd})) << "stage " << s;
      x = out;
    }
  }
  const LossSums got = read_loss_sums(kCpu, ctx.back().loss_sums);
  EXPECT_EQ(got.loss_sum, want.loss_sum);
  EXPECT_EQ(got.targets, want.targets);

  // Backward: the loss scale into the last stage, each input gradient into the stage before.
  std::vector<std::unique_ptr<HostTensor<double>>> dx64;
  std::vector<std::unique_ptr<HostTensor<float>>> dx32;
  auto grad_buffer = [&]() -> Tensor {
    if (c.dtype == DType::F64) return dx64.emplace_back(std::make_unique<HostTensor<double>>(Shape{kB, kT, 8}))->t();
    return dx32.emplace_back(std::make_unique<HostTensor<float>>(Shape{kB, kT, 8}))->t();
  };
  Tensor dy;
  for (int s = c.stages - 1; s >= 0; --s) {
    Part& p = *stages[static_cast<size_t>(s)];
    const Tensor dx = s == 0 ? Tensor() : grad_buffer();
    std::vector<int> reported(static_cast<size_t>(p.ps.size()), 0);
    const Gpt::OutputGrad from = s == c.stages - 1 ? Gpt::OutputGrad::loss(scale) : Gpt::OutputGrad::output(dy);
    p.gpt.backward(kCpu, ctx[s], p.alloc, from, dx, [&](int first, int end) {
      for (int id = first; id < end; ++id) ++reported[static_cast<size_t>(id)];
    });
    for (int id = 0; id < p.ps.size(); ++id)
      EXPECT_EQ(reported[static_cast<size_t>(id)], 1) << "stage " << s << ": " << p.ps.entry(id).spec.name;
    dy = dx;
  }

  // Every whole-model gradient against the stages' (summed for the tied token embedding).
  const double tied_tol = c.dtype == DType::F64 ? 1e-14 : 2e-6;
  for (int id = 0; id < whole.ps.size(); ++id) {
    const std::string& name = whole.ps.entry(id).spec.name;
    const std::vector<double> w = values(whole.ps.grad(id));
    std::vector<double> sum(w.size(), 0.0);
    int holders = 0;
    for (const auto& p : stages) {
      const int sid = p->ps.find(name);
      if (sid < 0) continue;
      ++holders;
      const std::vector<double> g = values(p->ps.grad(sid));
      for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
    const bool tied_split = name == "wte.weight" && cfg.preset == "gpt2";
    ASSERT_EQ(holders, tied_split ? 2 : 1) << name;
    if (!tied_split) {
      EXPECT_EQ(sum, w) << name;
      continue;
    }
    double scale_max = 0, diff = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      scale_max = std::max(scale_max, std::abs(w[i]));
      diff = std::max(diff, std::abs(sum[i] - w[i]));
    }
    EXPECT_GT(scale_max, 0.0);
    EXPECT_LE(diff, tied_tol * scale_max) << name << ": first stage + last stage's copy";
  }
}

INSTANTIATE_TEST_SUITE_P(Splits, GptStages,
                         ::testing::Values(Case{"gpt2", 2, DType::F64, Recompute::None},
                                           Case{"gpt2", 3, DType::F64, Recompute::None},
                                           Case{"gpt2", 3, DType::F32, Recompute::None},
                                           Case{"gpt2", 3, DType::F32, Recompute::Full},
                                           Case{"gpt2", 3, DType::F32, Recompute::Selective},
                                           Case{"llama", 2, DType::F64, Recompute::None},
                                           Case{"llama", 3, DType::F64, Recompute::None},
                                           Case{"llama", 3, DType::F32, Recompute::None},
                                           Case{"llama", 3, DType::F32, Recompute::Full},
                                           Case{"llama", 2, DType::F32, Recompute::Selective}),
                         case_name);

// What each stage of a 3-stage gpt2 registers: its blocks under their global names, the
// embedding on the first, ln_f and a marked copy of wte (same initial values) on the last.
TEST(GptStageParameters, EachStageRegistersItsPartUnderGlobalNames) {
  const ModelConfig cfg = stage_config("gpt2");
  Part whole(cfg, DType::F32, {});
  std::map<std::string, int> seen;
  for (int s = 0; s < 3; ++s) {
    const StageSpec spec = StageSpec::split(kLayers, 3, s);
    Part p(cfg, DType::F32, spec);
    EXPECT_EQ(p.gpt.stage().first_layer, std::vector<int64_t>({0, 2, 3})[static_cast<size_t>(s)]);
    for (int id = 0; id < p.ps.size(); ++id) {
      const ParamSpec& e = p.ps.entry(id).spec;
      ++seen[e.name];
      if (e.name.rfind("blocks.", 0) == 0) {
        const int64_t layer = std::stoll(e.name.substr(7));
        EXPECT_TRUE(layer >= spec.first_layer && layer < spec.end_layer) << e.name << " on stage " << s;
      }
      const bool wte = e.name == "wte.weight";
      EXPECT_EQ(e.sum_grad_over_embedding_group, wte) << e.name << " on stage " << s;
      EXPECT_EQ(e.stage_copy, wte && s == 2) << e.name << " on stage " << s;
      // Initialization is keyed by the name: the copy starts equal to the owner's table.
      const int wid = whole.ps.find(e.name);
      ASSERT_GE(wid, 0) << e.name;
      EXPECT_EQ(values(p.ps.param(id)), values(whole.ps.param(wid))) << e.name;
    }
    EXPECT_EQ(p.ps.find("wpe.weight") >= 0, s == 0);
    EXPECT_EQ(p.ps.find("ln_f.weight") >= 0, s == 2);
    // The copy does not count: the stages' parameter counts add up to the model's.
    seen["#numel"] += static_cast<int>(p.ps.global_numel());
  }
  for (int id = 0; id < whole.ps.size(); ++id) {
    const std::string& name = whole.ps.entry(id).spec.name;
    EXPECT_EQ(seen[name], name == "wte.weight" ? 2 : 1) << name;
    EXPECT_FALSE(whole.ps.entry(id).spec.sum_grad_over_embedding_group) << name << ": one stage, nothing to sum";
  }
  EXPECT_EQ(seen["#numel"], whole.ps.global_numel());
  // Untied (llama): the last stage holds lm_head, no copy; nothing is summed over the group.
  Part last(stage_config("llama"), DType::F32, StageSpec::split(kLayers, 2, 1));
  EXPECT_GE(last.ps.find("lm_head.weight"), 0);
  EXPECT_LT(last.ps.find("wte.weight"), 0);
}

TEST(GptStageParameters, RefusesStagesWithoutBlocksOrOutsideTheModel) {
  const ModelConfig cfg = stage_config("gpt2");
  auto build = [&](StageSpec s) { Part p(cfg, DType::F32, s); };
  EXPECT_TRUE(throws_with([&] { build({0, 0, true, false}); }, {"layers [0, 0)", "holds no block"}));
  EXPECT_TRUE(throws_with([&] { build({3, 2, false, false}); }, {"layers [3, 2)", "holds no block"}));
  EXPECT_TRUE(throws_with([&] { build({-1, 2, true, false}); }, {"layers [-1, 2)", "outside", "[0, 4)"}));
  EXPECT_TRUE(throws_with([&] { build({2, 5, false, true}); }, {"layers [2, 5)", "outside", "model.n_layer = 4"}));
  EXPECT_TRUE(throws_with([&] { build({1, 3, true, false}); }, {"layers [1, 3)", "cannot hold the embedding"}));
  EXPECT_TRUE(throws_with([&] { build({0, 2, false, false}); }, {"layers [0, 2)", "must hold the embedding"}));
  EXPECT_TRUE(throws_with([&] { build({2, 4, false, false}); }, {"layers [2, 4)", "must hold the head"}));
  EXPECT_TRUE(throws_with([&] { build({0, 2, true, true}); }, {"layers [0, 2)", "cannot hold the head"}));
  EXPECT_TRUE(throws_with([&] { StageSpec::split(4, 5, 0); }, {"4 layers into 5", "at least one block"}));
  EXPECT_TRUE(throws_with([&] { StageSpec::split(4, 2, 2); }, {"stage 2 outside [0, 2)"}));
}

// The stage calls are refused where they do not fit the stage.
TEST(GptStageParameters, RefusesCallsThatDoNotFitTheStage) {
  const ModelConfig cfg = stage_config("gpt2");
  Part first(cfg, DType::F32, StageSpec::split(kLayers, 2, 0));
  Part last(cfg, DType::F32, StageSpec::split(kLayers, 2, 1));
  auto tokens = testing::random_ids({kB, kT}, 13, 1);
  GptCtx ctx;
  EXPECT_TRUE(throws_with([&] { first.gpt.forward(kCpu, ctx, first.alloc, tokens.t(), tokens.t()); },
                          {"targets", "no head"}));
  HostTensor<float> act({kB, kT, 8});
  EXPECT_TRUE(throws_with([&] { last.gpt.forward(kCpu, ctx, last.alloc, act.t(), Tensor()); },
                          {"layers [2, 4)", "sequence layout"}));
  EXPECT_TRUE(throws_with(
      [&] { last.gpt.forward(kCpu, ctx, last.alloc, act.t(), Tensor(), SequenceLayout::contiguous(kT + 1)); },
      {"input", "(2, 7, 8)"}));
  EXPECT_TRUE(first.gpt.forward(kCpu, ctx, first.alloc, tokens.t(), Tensor()).defined());
  EXPECT_TRUE(throws_with([&] { first.gpt.backward(kCpu, ctx, first.alloc, 1.0); }, {"dy"}));
  EXPECT_TRUE(throws_with([&] { first.gpt.backward(kCpu, ctx, first.alloc, Gpt::OutputGrad::output(act.t()), act.t()); },
                          {"dx must be undefined"}));
  EXPECT_TRUE(throws_with([&] { last.gpt.make_cache(last.alloc, 4); }, {"whole model"}));
}

// Gpt::forward's sequence layout: the whole sequence given explicitly is the default; positions
// beyond the model are refused, and so are chunks of a longer sequence, which need
// context-parallel attention (this attention sees a whole sequence [0, T)).
TEST(GptSequenceLayout, WholeSequenceIsTheDefaultAndChunksAreRefused) {
  Part m(stage_config("llama"), DType::F32, {});
  auto tokens = testing::random_ids({kB, kT}, 13, 41);
  auto targets = testing::random_ids({kB, kT}, 13, 42);
  GptCtx a, b;
  m.gpt.forward(kCpu, a, m.alloc, tokens.t(), targets.t());
  m.gpt.forward(kCpu, b, m.alloc, tokens.t(), targets.t(), SequenceLayout::contiguous(kT));
  EXPECT_EQ(values(a.logits), values(b.logits));
  EXPECT_EQ(read_loss_sums(kCpu, a.loss_sums).loss_sum, read_loss_sums(kCpu, b.loss_sums).loss_sum);
  auto four = testing::random_ids({kB, 4}, 13, 43);
  GptCtx c;
  EXPECT_TRUE(throws_with(
      [&] { m.gpt.forward(kCpu, c, m.alloc, four.t(), Tensor(), SequenceLayout::load_balanced(8, 2, 0)); },
      {"[0, 2) [6, 8)", "context-parallel attention"}));
  EXPECT_TRUE(throws_with([&] { m.gpt.forward(kCpu, c, m.alloc, four.t(), Tensor(), SequenceLayout::contiguous(4, 2)); },
                          {"[2, 6)", "context-parallel attention"}));
  EXPECT_TRUE(throws_with([&] { m.gpt.forward(kCpu, c, m.alloc, four.t(), Tensor(), SequenceLayout::contiguous(4, 6)); },
                          {"[6, 10)", "model.max_seq_len = 8"}));
  EXPECT_TRUE(throws_with([&] { m.gpt.forward(kCpu, c, m.alloc, four.t(), Tensor(), SequenceLayout::contiguous(5)); },
                          {"tokens (2, 4)", "5 positions"}));
}

}  // namespace
}  // namespace tessera

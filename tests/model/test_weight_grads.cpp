// Tests zero-bubble's split backward (model/weight_grads.h, Gpt::backward with `deferred` and
// Gpt::backward_weight): a tiny gpt2 (tied head, biases, learned positions) and a tiny llama (untied
// head, SwiGLU, grouped-query attention), whole and as 2 stages chained by hand, with and without
// full recomputation, two micro-batches each run as B0 B1 W0 W1 (ZB-H1's deferral) against
// whole backwards: every gradient and every input gradient passed between stages bitwise equal,
// the ranges reported by W those of the whole backward in the same order, the deferred bytes the
// analytic count and the only activations left between B and W.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "error_testing.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "model/gpt.h"
#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;
namespace {

constexpr int64_t kB = 2, kT = 6, kLayers = 4, kMicroBatches = 2;

ModelConfig tiny(const std::string& preset) {
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

// One stage (or the whole model) on its own store, initialized by name: every instance of a
// parameter starts with the same values.
struct Part {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  // bf16: mixed precision as train.dtype = "bf16" runs it (the GEMMs read a bf16 copy).
  Part(const ModelConfig& cfg, StageSpec stage, Recompute rc, bool bf16)
      : ps(alloc, DType::F32), gpt(cfg, ps, std::vector<Recompute>(kLayers, rc), {}, stage) {
    ps.finalize();
    if (bf16) ps.enable_compute_copy(DType::BF16);
    ps.initialize(kCpu, 7);
    if (bf16) ps.refresh_compute_copy(kCpu);
  }
  size_t activations() const { return alloc.counter(MemCategory::Activations).current; }
};

using Ranges = std::vector<std::pair<int, int>>;

// The stages of one model and what a step through them left: the gradients in the stores, the
// input gradient each stage passed back per micro-batch, the ranges each stage reported ready.
struct Pipeline {
  std::vector<std::unique_ptr<Part>> stages;
  std::vector<std::vector<std::vector<float>>> dx;  // [micro-batch][stage]: stage's input gradient
  std::vector<Ranges> reported;                     // per stage, over the whole step
  std::vector<int64_t> deferred_bytes;              // per micro-batch (split only), after its B
  Pipeline(const ModelConfig& cfg, int n, Recompute rc, bool bf16 = false) : reported(static_cast<size_t>(n)) {
    for (int s = 0; s < n; ++s)
      stages.push_back(
          std::make_unique<Part>(cfg, n == 1 ? StageSpec{} : StageSpec::split(kLayers, n, s), rc, bf16));
  }
  Part& stage(int s) { return *stages[static_cast<size_t>(s)]; }
  int size() const { return static_cast<int>(stages.size()); }
};

// Micro-batch m's forward through every stage, then its backward from the last stage to the first:
// whole (deferred null) or B alone, recording into deferred[s].
void forward_backward(Pipeline& p, int m, double scale, std::vector<WeightGrads>* deferred) {
  const auto tokens = testing::random_ids({kB, kT}, 13, 31 + 2 * m);
  auto targets = testing::random_ids({kB, kT}, 13, 32 + 2 * m);
  targets[static_cast<size_t>(3 + m)] = kIgnoreIndex;
  const int n = p.size();
  std::vector<GptCtx> ctx(static_cast<size_t>(n));
  Tensor x;
  for (int s = 0; s < n; ++s) {
    const bool last = s == n - 1;
    x = p.stage(s).gpt.forward(kCpu, ctx[s], p.stage(s).alloc, s == 0 ? tokens.t() : x, last ? targets.t() : Tensor(),
                               s == 0 ? SequenceLayout() : SequenceLayout::contiguous(kT));
  }
  std::vector<std::unique_ptr<HostTensor<float>>> grads;
  p.dx.emplace_back(static_cast<size_t>(n));
  Tensor dy;
  for (int s = n - 1; s >= 0; --s) {
    Part& part = p.stage(s);
    const Tensor dx = s == 0 ? Tensor() : grads.emplace_back(std::make_unique<HostTensor<float>>(Shape{kB, kT, 8}))->t();
    const Gpt::OutputGrad from = s == n - 1 ? Gpt::OutputGrad::loss(scale) : Gpt::OutputGrad::output(dy);
    Ranges& r = p.reported[static_cast<size_t>(s)];
    if (deferred)
      part.gpt.backward(kCpu, ctx[s], part.alloc, from, dx, {}, &(*deferred)[static_cast<size_t>(s)]);
    else
      part.gpt.backward(kCpu, ctx[s], part.alloc, from, dx, [&](int first, int end) { r.emplace_back(first, end); });
    if (dx.defined()) p.dx.back()[static_cast<size_t>(s)].assign(dx.ptr<float>(), dx.ptr<float>() + dx.numel());
    dy = dx;
  }
}

// The step as a pipeline rank under ZB-H1 orders it on each stage: B of every micro-batch, then
// their Ws in micro-batch order (the deferral only moves the weight GEMMs later). split = false:
// whole backwards.
void step(Pipeline& p, bool split) {
  std::vector<std::vector<WeightGrads>> deferred(static_cast<size_t>(kMicroBatches));
  const double scale = 1.0 / 20.0;
  for (int m = 0; m < kMicroBatches; ++m) {
    if (!split) {
      forward_backward(p, m, scale, nullptr);
      continue;
    }
    for (int s = 0; s < p.size(); ++s) deferred[m].emplace_back(p.stage(s).alloc);
    forward_backward(p, m, scale, &deferred[m]);
    int64_t bytes = 0;
    for (const WeightGrads& d : deferred[m]) bytes += d.bytes();
    p.deferred_bytes.push_back(bytes);
  }
  if (!split) return;
  // Between the Bs and the Ws the deferred copies are the only activations alive.
  for (int s = 0; s < p.size(); ++s) {
    size_t held = 0;
    for (int m = 0; m < kMicroBatches; ++m) held += static_cast<size_t>(deferred[m][s].bytes());
    EXPECT_GT(held, 0u) << "stage " << s;
    EXPECT_EQ(p.stage(s).activations(), held) << "stage " << s;
  }
  for (int m = 0; m < kMicroBatches; ++m)
    for (int s = 0; s < p.size(); ++s) {
      Ranges& r = p.reported[static_cast<size_t>(s)];
      p.stage(s).gpt.backward_weight(kCpu, deferred[m][s], [&](int first, int end) { r.emplace_back(first, end); });
      EXPECT_TRUE(deferred[m][s].empty());
      EXPECT_EQ(deferred[m][s].bytes(), 0);
    }
  for (int s = 0; s < p.size(); ++s) EXPECT_EQ(p.stage(s).activations(), 0u) << "stage " << s << " after the Ws";
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

struct Case {
  std::string preset;
  int stages;
  Recompute recompute;
  bool bf16 = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return i.param.preset + "_" + std::to_string(i.param.stages) + "stages" +
         (i.param.recompute == Recompute::Full ? "_recompute" : "") + (i.param.bf16 ? "_bf16" : "");
}

class SplitBackward : public ::testing::TestWithParam<Case> {};

// Bitwise: B computes each input gradient with the GEMM the whole backward uses for it, and W runs
// linear_backward's own dW GEMM and bias sum on copies of the same x and dy, in the same order, so
// every sum is formed from the same terms in the same order. The one exception is the whole gpt2's
// tied wte.weight, which both the LM head (a W GEMM) and the embedding (a B scatter-add) accumulate:
// split, the head's GEMM adds after the embedding's scatter instead of before, the same terms
// reassociated: at most one rounding per token occurrence (<= 2 B T = 24 over the step) of the
// tensor's largest gradient, 24 x 6e-8 in f32; tolerance 2e-6. On a pipeline the tied copies sit on
// different stages and are bitwise equal too.
TEST_P(SplitBackward, BThenWEqualsTheWholeBackward) {
  const Case c = GetParam();
  const ModelConfig cfg = tiny(c.preset);
  Pipeline whole(cfg, c.stages, c.recompute, c.bf16), split(cfg, c.stages, c.recompute, c.bf16);
  step(whole, false);
  step(split, true);
  for (int s = 0; s < c.stages; ++s) {
    const ParameterStore &w = whole.stage(s).ps, &g = split.stage(s).ps;
    for (int id = 0; id < w.size(); ++id) {
      const std::string& name = w.entry(id).spec.name;
      if (c.stages == 1 && cfg.preset == "gpt2" && name == "wte.weight") {
        const Tensor a = w.grad(id), b = g.grad(id);
        double big = 0, diff = 0;
        for (int64_t i = 0; i < a.numel(); ++i) {
          big = std::max(big, double(std::abs(a.ptr<float>()[i])));
          diff = std::max(diff, double(std::abs(a.ptr<float>()[i] - b.ptr<float>()[i])));
        }
        EXPECT_GT(big, 0.0);
        EXPECT_LE(diff, 2e-6 * big) << name;
        continue;
      }
      EXPECT_TRUE(bitwise_equal(w.grad(id), g.grad(id))) << "stage " << s << ": " << name;
    }
    // W reports what the whole backward reports, in its order: every parameter once per micro-batch.
    EXPECT_EQ(split.reported[static_cast<size_t>(s)], whole.reported[static_cast<size_t>(s)]) << "stage " << s;
    std::vector<int> count(static_cast<size_t>(w.size()), 0);
    for (const auto& [first, end] : split.reported[static_cast<size_t>(s)])
      for (int id = first; id < end; ++id) ++count[static_cast<size_t>(id)];
    for (int id = 0; id < w.size(); ++id) EXPECT_EQ(count[static_cast<size_t>(id)], kMicroBatches) << w.entry(id).spec.name;
  }
  ASSERT_EQ(split.dx.size(), whole.dx.size());
  for (size_t m = 0; m < whole.dx.size(); ++m)
    for (int s = 1; s < c.stages; ++s) {
      EXPECT_FALSE(whole.dx[m][s].empty());
      EXPECT_EQ(split.dx[m][s], whole.dx[m][s]) << "micro-batch " << m << ", stage " << s << "'s input gradient";
    }
}

INSTANTIATE_TEST_SUITE_P(Models, SplitBackward,
                         ::testing::Values(Case{"gpt2", 1, Recompute::None}, Case{"gpt2", 2, Recompute::None},
                                           Case{"gpt2", 2, Recompute::Full}, Case{"llama", 1, Recompute::None},
                                           Case{"llama", 2, Recompute::None}, Case{"llama", 2, Recompute::Full},
                                           Case{"gpt2", 2, Recompute::None, true}, Case{"llama", 1, Recompute::None, true}),
                         case_name);

// What one micro-batch's B keeps for its W, per block (tokens N = B T, kv = KV heads x D, F the MLP
// width): the layers' inputs, the normalized inputs of q, k, v and of the MLP's first layers saved
// once each, attention's output, the MLP's hidden activation: 3C + F; their output gradients: dq,
// dk, dv, the two projections': 3C + 2 kv, plus dh (gelu) or dgate and dup (swiglu): F or 2F. The
// head: its input (N, C) and the logits' gradient (N, V). In f32 bytes.
TEST(SplitBackward, DeferredBytesAreTheAnalyticCount) {
  for (const std::string preset : {"gpt2", "llama"}) {
    const ModelConfig cfg = resolve(tiny(preset));
    const int64_t N = kB * kT, C = cfg.n_embd, kv = cfg.kv_heads() * cfg.head_dim(), F = cfg.ffn_hidden;
    const int64_t per_block = 3 * C + F + 3 * C + 2 * kv + (preset == "gpt2" ? F : 2 * F);
    const int64_t want = 4 * N * (kLayers * per_block + C + cfg.vocab_size);
    Pipeline p(cfg, 1, Recompute::None);
    step(p, true);
    EXPECT_EQ(p.deferred_bytes, std::vector<int64_t>(kMicroBatches, want)) << preset;
  }
}

// A split backward finalizes nothing itself: a GradsReady given with `deferred` is refused, and so
// is a WeightGrads still holding another backward's work.
TEST(SplitBackward, RefusesOnReadyAndAFullStore) {
  const ModelConfig cfg = tiny("llama");
  Part part(cfg, {}, Recompute::None, false);
  const auto tokens = testing::random_ids({kB, kT}, 13, 1), targets = testing::random_ids({kB, kT}, 13, 2);
  WeightGrads deferred(part.alloc);
  GptCtx ctx;
  part.gpt.forward(kCpu, ctx, part.alloc, tokens.t(), targets.t());
  EXPECT_TRUE(testing::throws_with(
      [&] { part.gpt.backward(kCpu, ctx, part.alloc, Gpt::OutputGrad::loss(0.1), Tensor(), [](int, int) {}, &deferred); },
      {"on_ready must be empty"}));
  part.gpt.forward(kCpu, ctx, part.alloc, tokens.t(), targets.t());
  part.gpt.backward(kCpu, ctx, part.alloc, Gpt::OutputGrad::loss(0.1), Tensor(), {}, &deferred);
  part.gpt.forward(kCpu, ctx, part.alloc, tokens.t(), targets.t());
  EXPECT_TRUE(testing::throws_with(
      [&] { part.gpt.backward(kCpu, ctx, part.alloc, Gpt::OutputGrad::loss(0.1), Tensor(), {}, &deferred); },
      {"still hold another backward's deferred work"}));
}

}  // namespace
}  // namespace tessera

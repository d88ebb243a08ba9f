// Tests model/lora.h: the adapter's backward against central differences (f64), a new adapter
// (B = 0) leaves the layer's output bitwise unchanged, the merged weight W + (alpha / r) B A gives
// the adapted output, A's Kaiming-uniform init, a frozen base (no gradient buffer), the targets,
// and ten AdamW steps of a tiny GPT-2 and LLaMA against transformers + peft (lora_golden.h5).
#include "model/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include "error_testing.h"
#include "h5_reader.h"
#include "golden_config.h"
#include "kernels/adamw.h"
#include "model/gpt.h"
#include "model/layers.h"
#include "testing.h"

namespace tessera {
using testing::H5Reader;
using testing::HostTensor;
using testing::kCpu;
namespace {

constexpr int64_t kN = 6, kIn = 5, kOut = 4;

LoraConfig lora(int64_t rank, double alpha) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = alpha;
  return c;
}

// Copies host values into a parameter (or its gradient) of the store.
template <typename E>
void set(const Tensor& dst, const HostTensor<E>& src) {
  ASSERT_EQ(dst.numel(), src.numel());
  std::copy(src.vec().begin(), src.vec().end(), dst.ptr<E>());
}
template <typename E>
HostTensor<E> get(const Tensor& t) {
  HostTensor<E> h(t.shape);
  std::copy(t.ptr<E>(), t.ptr<E>() + t.numel(), h.data());
  return h;
}

TEST(Lora, BackwardMatchesFiniteDifferences) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F64);
  Linear lin(ps, "blocks.0.attn.q", kIn, kOut, true, ShardSpec::replicated(), 0.5);
  lin.add_lora(ps, "blocks.0.attn.q", ShardSpec::replicated(), false, lora(3, 5.0));
  ps.finalize();
  ps.initialize(kCpu, 11);
  const LoraAdapter& ad = *lin.lora();
  EXPECT_DOUBLE_EQ(ad.scale(), 5.0 / 3.0);
  // B is zero at init; make it nonzero so that every product of the chain is exercised.
  set(ps.param(ad.b_id()), HostTensor<double>::uniform({kOut, 3}, 7));

  auto x = HostTensor<double>::uniform({kN, kIn}, 3);
  const auto w = HostTensor<double>::uniform({kN, kOut}, 4);
  HostTensor<double> y({kN, kOut});
  auto loss = [&] {
    lin.forward(kCpu, y.t(), x.t());
    return testing::weighted_sum(y, w);
  };
  loss();
  ps.zero_grads(kCpu);
  HostTensor<double> dx({kN, kIn});
  lin.backward(kCpu, dx.t(), w.t(), x.t());
  const auto dA = get<double>(ps.grad(ad.a_id())), dB = get<double>(ps.grad(ad.b_id()));
  const auto dW = get<double>(ps.grad(ps.find("blocks.0.attn.q.weight")));
  testing::expect_gradient_matches(loss, x, dx, "x");
  // Parameters: perturb the store's values through a host copy written back before each loss.
  for (const auto& [id, analytic, what] :
       {std::tuple{ad.a_id(), dA, "lora_A"}, std::tuple{ad.b_id(), dB, "lora_B"},
        std::tuple{ps.find("blocks.0.attn.q.weight"), dW, "weight"}}) {
    auto p = get<double>(ps.param(id));
    auto loss_p = [&, id = id] {
      set(ps.param(id), p);
      return loss();
    };
    testing::expect_gradient_matches(loss_p, p, analytic, what);
    set(ps.param(id), p);
  }
}

// The split backward (the input gradient, then the weights: zero-bubble's B and W) gives the
// whole one's gradients bitwise.
TEST(Lora, SplitBackwardEqualsTheWhole) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F64);
  Linear lin(ps, "blocks.0.mlp.fc", kIn, kOut, true, ShardSpec::replicated(), 0.5);
  lin.add_lora(ps, "blocks.0.mlp.fc", ShardSpec::replicated(), false, lora(2, 4.0));
  ps.finalize();
  ps.initialize(kCpu, 2);
  set(ps.param(lin.lora()->b_id()), HostTensor<double>::uniform({kOut, 2}, 9));
  const auto x = HostTensor<double>::uniform({kN, kIn}, 3), dy = HostTensor<double>::uniform({kN, kOut}, 4);
  HostTensor<double> dx1({kN, kIn}), dx2({kN, kIn});
  ps.zero_grads(kCpu);
  lin.backward(kCpu, dx1.t(), dy.t(), x.t());
  const LoraAdapter& ad = *lin.lora();
  const auto whole_a = get<double>(ps.grad(ad.a_id())), whole_b = get<double>(ps.grad(ad.b_id()));
  ps.zero_grads(kCpu);
  lin.backward(kCpu, dx2.t(), dy.t(), x.t(), false, nullptr);
  ps.zero_grads(kCpu);
  ad.backward(kCpu, Tensor(), dy.t(), x.t(), /*weights=*/false);
  EXPECT_EQ(testing::squared_norm_of(ps.grad(ad.a_id())), 0.0);
  ad.backward_weight(kCpu, dy.t(), x.t());
  EXPECT_EQ(get<double>(ps.grad(ad.a_id())).vec(), whole_a.vec());
  EXPECT_EQ(get<double>(ps.grad(ad.b_id())).vec(), whole_b.vec());
  EXPECT_EQ(dx1.vec(), dx2.vec());
}

// Adapter dropout (model/lora.h LoraDropout): kN = 6 rows are 2 sequences of 3 positions.
LoraDropout dropout_rows() {
  LoraDropout d;
  d.seed = 1337;
  d.step = 4;
  d.sample0 = 2;
  d.positions = {0, 1, 2};
  return d;
}

LoraConfig lora_dropout(int64_t rank, double alpha, double p) {
  LoraConfig c = lora(rank, alpha);
  c.dropout = p;
  return c;
}

// With dropout the adapter reads dropout(x), the mask recomputed in backward: its gradients (x, A,
// B, W) against central differences with the mask fixed (the same coordinates every call).
TEST(Lora, DropoutBackwardMatchesFiniteDifferences) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F64);
  Linear lin(ps, "blocks.1.mlp.proj", kIn, kOut, true, ShardSpec::replicated(), 0.5);
  lin.add_lora(ps, "blocks.1.mlp.proj", ShardSpec::replicated(), false, lora_dropout(3, 5.0, 0.4));
  ps.finalize();
  ps.initialize(kCpu, 11);
  const LoraAdapter& ad = *lin.lora();
  set(ps.param(ad.b_id()), HostTensor<double>::uniform({kOut, 3}, 7));
  const LoraDropout drop = dropout_rows();
  auto x = HostTensor<double>::uniform({kN, kIn}, 3);
  const auto w = HostTensor<double>::uniform({kN, kOut}, 4);
  HostTensor<double> y({kN, kOut});
  auto loss = [&] {
    lin.forward(kCpu, y.t(), x.t(), true, &drop);
    return testing::weighted_sum(y, w);
  };
  loss();
  const std::vector<double> dropped = y.vec();
  lin.forward(kCpu, y.t(), x.t());
  EXPECT_NE(dropped, y.vec());  // the mask changes the output: the check below can fail
  ps.zero_grads(kCpu);
  HostTensor<double> dx({kN, kIn});
  lin.backward(kCpu, dx.t(), w.t(), x.t(), false, nullptr, &drop);
  const auto dA = get<double>(ps.grad(ad.a_id())), dB = get<double>(ps.grad(ad.b_id()));
  const auto dW = get<double>(ps.grad(ps.find("blocks.1.mlp.proj.weight")));
  testing::expect_gradient_matches(loss, x, dx, "x");
  for (const auto& [id, analytic, what] :
       {std::tuple{ad.a_id(), dA, "lora_A"}, std::tuple{ad.b_id(), dB, "lora_B"},
        std::tuple{ps.find("blocks.1.mlp.proj.weight"), dW, "weight"}}) {
    auto p = get<double>(ps.param(id));
    auto loss_p = [&, id = id] {
      set(ps.param(id), p);
      return loss();
    };
    testing::expect_gradient_matches(loss_p, p, analytic, what);
    set(ps.param(id), p);
  }
  // The split backward (B, then W with the mask recomputed again) gives the whole one's bitwise.
  ps.zero_grads(kCpu);
  HostTensor<double> dx2({kN, kIn});
  ad.backward(kCpu, dx2.t(), w.t(), x.t(), /*weights=*/false, &drop);
  ad.backward_weight(kCpu, w.t(), x.t(), &drop);
  EXPECT_EQ(get<double>(ps.grad(ad.a_id())).vec(), dA.vec());
  EXPECT_EQ(get<double>(ps.grad(ad.b_id())).vec(), dB.vec());
}

// lora.dropout = 0 with the coordinates given is the adapter without dropout, bit for bit; and the
// base path is never dropped: a new adapter (B = 0) under dropout leaves the output unchanged.
TEST(Lora, DropoutZeroIsBitwiseTheUndroppedAdapter) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  Linear lin(ps, "blocks.0.attn.v", kIn, kOut, true, ShardSpec::replicated(), 0.3);
  lin.add_lora(ps, "blocks.0.attn.v", ShardSpec::replicated(), false, lora_dropout(2, 4.0, 0.0));
  ParameterStore ps_drop(alloc, DType::F32);
  Linear lin_drop(ps_drop, "blocks.0.attn.v", kIn, kOut, true, ShardSpec::replicated(), 0.3);
  lin_drop.add_lora(ps_drop, "blocks.0.attn.v", ShardSpec::replicated(), false, lora_dropout(2, 4.0, 0.5));
  ps.finalize();
  ps_drop.finalize();
  ps.initialize(kCpu, 5);
  ps_drop.initialize(kCpu, 5);
  const LoraDropout drop = dropout_rows();
  const auto x = HostTensor<float>::uniform({kN, kIn}, 1), dy = HostTensor<float>::uniform({kN, kOut}, 2);
  HostTensor<float> y0({kN, kOut}), y1({kN, kOut});
  lin_drop.forward(kCpu, y1.t(), x.t(), true, &drop);
  lin.forward(kCpu, y0.t(), x.t());
  EXPECT_EQ(y0.vec(), y1.vec());  // B = 0: only the base path, undropped
  set(ps.param(lin.lora()->b_id()), HostTensor<float>::uniform({kOut, 2}, 9));
  lin.forward(kCpu, y0.t(), x.t());
  lin.forward(kCpu, y1.t(), x.t(), true, &drop);
  EXPECT_EQ(y0.vec(), y1.vec());
  HostTensor<float> dx0({kN, kIn}), dx1({kN, kIn});
  ps.zero_grads(kCpu);
  lin.backward(kCpu, dx0.t(), dy.t(), x.t());
  const auto dA = get<float>(ps.grad(lin.lora()->a_id())), dB = get<float>(ps.grad(lin.lora()->b_id()));
  ps.zero_grads(kCpu);
  lin.backward(kCpu, dx1.t(), dy.t(), x.t(), false, nullptr, &drop);
  EXPECT_EQ(dx0.vec(), dx1.vec());
  EXPECT_EQ(get<float>(ps.grad(lin.lora()->a_id())).vec(), dA.vec());
  EXPECT_EQ(get<float>(ps.grad(lin.lora()->b_id())).vec(), dB.vec());
}

TEST(Lora, NewAdapterLeavesTheOutputBitwiseUnchanged) {
  Allocator alloc;
  ParameterStore base(alloc, DType::F32), adapted(alloc, DType::F32);
  Linear plain(base, "blocks.1.attn.v", kIn, kOut, true, ShardSpec::replicated(), 0.3);
  Linear lin(adapted, "blocks.1.attn.v", kIn, kOut, true, ShardSpec::replicated(), 0.3);
  lin.add_lora(adapted, "blocks.1.attn.v", ShardSpec::replicated(), false, lora(4, 8.0));
  base.finalize();
  adapted.finalize();
  base.initialize(kCpu, 5);
  adapted.initialize(kCpu, 5);  // the same W: init is keyed by the parameter's name
  const auto x = HostTensor<float>::uniform({kN, kIn}, 1);
  HostTensor<float> y0({kN, kOut}), y1({kN, kOut});
  plain.forward(kCpu, y0.t(), x.t());
  lin.forward(kCpu, y1.t(), x.t());
  EXPECT_EQ(y0.vec(), y1.vec());
  EXPECT_EQ(testing::squared_norm_of(adapted.param(lin.lora()->b_id())), 0.0);
}

TEST(Lora, MergedWeightGivesTheAdaptedOutput) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F64), merged(alloc, DType::F64);
  Linear lin(ps, "blocks.0.attn.proj", kIn, kOut, true, ShardSpec::replicated(), 0.4);
  lin.add_lora(ps, "blocks.0.attn.proj", ShardSpec::replicated(), false, lora(2, 3.0));
  Linear plain(merged, "blocks.0.attn.proj", kIn, kOut, true, ShardSpec::replicated(), 0.4);
  ps.finalize();
  merged.finalize();
  ps.initialize(kCpu, 8);
  merged.initialize(kCpu, 8);
  const LoraAdapter& ad = *lin.lora();
  set(ps.param(ad.b_id()), HostTensor<double>::uniform({kOut, 2}, 6));
  // W' = W + s B A, by hand.
  const auto A = get<double>(ps.param(ad.a_id())), B = get<double>(ps.param(ad.b_id()));
  auto W = get<double>(ps.param(ps.find("blocks.0.attn.proj.weight")));
  for (int64_t o = 0; o < kOut; ++o)
    for (int64_t i = 0; i < kIn; ++i)
      for (int64_t r = 0; r < 2; ++r) W[o * kIn + i] += ad.scale() * B[o * 2 + r] * A[r * kIn + i];
  set(merged.param(merged.find("blocks.0.attn.proj.weight")), W);
  const auto x = HostTensor<double>::uniform({kN, kIn}, 2);
  HostTensor<double> y({kN, kOut}), ym({kN, kOut});
  lin.forward(kCpu, y.t(), x.t());
  plain.forward(kCpu, ym.t(), x.t());
  EXPECT_LT(testing::max_rel_error(y, ym), 1e-13);
}

// A is Kaiming-uniform with a = sqrt(5) (PEFT, torch.nn.Linear): U(-1/sqrt(in), 1/sqrt(in)).
TEST(Lora, AIsKaimingUniformAndBZero) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F64);
  constexpr int64_t in = 256, r = 16;
  Linear lin(ps, "blocks.0.attn.q", in, 8, false, ShardSpec::replicated(), 0.02);
  lin.add_lora(ps, "blocks.0.attn.q", ShardSpec::replicated(), false, lora(r, 16.0));
  ps.finalize();
  ps.initialize(kCpu, 1);
  const auto A = get<double>(ps.param(lin.lora()->a_id()));
  const double bound = 1.0 / std::sqrt(double(in));
  double lo = 1, hi = -1, sum = 0, sq = 0;
  for (double v : A.vec()) lo = std::min(lo, v), hi = std::max(hi, v), sum += v, sq += v * v;
  const double n = double(A.numel());
  EXPECT_GE(lo, -bound);
  EXPECT_LT(hi, bound);
  EXPECT_GT(hi - lo, 1.9 * bound);                        // it spans the range
  EXPECT_NEAR(sum / n, 0.0, 4 * bound / std::sqrt(3 * n));  // 4 sigma of the mean
  EXPECT_NEAR(sq / n, bound * bound / 3, 0.05 * bound * bound);
  EXPECT_EQ(testing::squared_norm_of(ps.param(lin.lora()->b_id())), 0.0);
}

// The frozen base has no gradient buffer; the adapter's gradients are the trainable base's.
TEST(Lora, FrozenBaseHasNoGradientAndTheSameAdapterGradients) {
  auto run = [](bool freeze, int64_t* grad_elements) {
    Allocator alloc;
    ParameterStore ps(alloc, DType::F64);
    Linear lin(ps, "blocks.0.attn.q", kIn, kOut, true, ShardSpec::replicated(), 0.5);
    lin.add_lora(ps, "blocks.0.attn.q", ShardSpec::replicated(), false, lora(2, 2.0));
    if (freeze) ps.freeze(0), ps.freeze(1);
    ps.finalize();
    ps.initialize(kCpu, 4);
    set(ps.param(lin.lora()->b_id()), HostTensor<double>::uniform({kOut, 2}, 6));
    ps.zero_grads(kCpu);
    const auto x = HostTensor<double>::uniform({kN, kIn}, 2), dy = HostTensor<double>::uniform({kN, kOut}, 3);
    HostTensor<double> dx({kN, kIn});
    lin.backward(kCpu, dx.t(), dy.t(), x.t());
    *grad_elements = ps.padded_flat_grads().numel();
    EXPECT_EQ(ps.grad(0).defined(), !freeze);
    auto out = get<double>(ps.grad(lin.lora()->a_id())).vec();
    const auto dB = get<double>(ps.grad(lin.lora()->b_id()));
    out.insert(out.end(), dB.vec().begin(), dB.vec().end());
    for (double v : dx.vec()) out.push_back(v);
    return out;
  };
  int64_t trained = 0, frozen = 0;
  EXPECT_EQ(run(true, &frozen), run(false, &trained));
  EXPECT_EQ(trained, kIn * kOut + kOut + 2 * kIn + kOut * 2);
  EXPECT_EQ(frozen, kOut + 2 * kIn + kOut * 2);  // the frozen bias keeps its (vector) gradient
}

TEST(Lora, TargetsNameBlockLayers) {
  LoraConfig c = lora(4, 8);
  c.targets = {"attn.q", "mlp.*"};
  EXPECT_TRUE(lora_targets_layer(c, "blocks.3.attn.q"));
  EXPECT_FALSE(lora_targets_layer(c, "blocks.3.attn.k"));
  EXPECT_TRUE(lora_targets_layer(c, "blocks.12.mlp.fc"));
  EXPECT_FALSE(lora_targets_layer(c, "vision.blocks.0.attn.q"));
  EXPECT_FALSE(lora_targets_layer(c, "lm_head"));
  c.rank = 0;
  EXPECT_FALSE(lora_targets_layer(c, "blocks.3.attn.q"));
}

TEST(Lora, BadSettingsNameTheKey) {
  LoraConfig c = lora(4, 8);
  c.targets = {"attn.qkv"};
  EXPECT_TRUE(testing::throws_with([&] { validate_lora(c, "gpt2"); }, {"lora.targets", "attn.qkv", "\"attn.q\""}));
  c.targets = {"mlp.fc"};
  EXPECT_TRUE(testing::throws_with([&] { validate_lora(c, "llama"); }, {"lora.targets", "mlp.gate"}));
  c.targets = {};
  EXPECT_TRUE(testing::throws_with([&] { validate_lora(c, "gpt2"); }, {"lora.targets is empty"}));
  c = lora(4, 0);
  EXPECT_TRUE(testing::throws_with([&] { validate_lora(c, "gpt2"); }, {"lora.alpha"}));
  c = lora(4, 8);
  c.dropout = 0.1;
  EXPECT_NO_THROW(validate_lora(c, "gpt2"));
  for (double bad : {1.0, -0.1}) {
    c.dropout = bad;
    EXPECT_TRUE(testing::throws_with([&] { validate_lora(c, "gpt2"); }, {"lora.dropout", "[0, 1)"}));
  }
  c = lora(-1, 8);
  EXPECT_TRUE(testing::throws_with([&] { validate_lora(c, "gpt2"); }, {"lora.rank"}));
}

TEST(Lora, GptRegistersAdaptersOnItsTargets) {
  ModelConfig cfg;
  cfg.preset = "llama";
  cfg.vocab_size = 16;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  cfg.max_seq_len = 8;
  cfg.lora = lora(2, 4);
  cfg.lora.targets = {"attn.v", "mlp.*"};
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  const Gpt model(cfg, ps);
  int adapters = 0;
  for (const ParamEntry& e : ps.entries())
    if (e.spec.name.find(".lora_") != std::string::npos) ++adapters;
  EXPECT_EQ(adapters, 2 * 2 * 4);  // 2 layers x (v, gate, up, down) x (A, B)
  ASSERT_GE(ps.find("blocks.1.mlp.down.lora_A.weight"), 0);
  EXPECT_EQ(ps.entry(ps.find("blocks.1.mlp.down.lora_A.weight")).spec.global_shape, (Shape{2, resolve(cfg).ffn_hidden}));
  EXPECT_EQ(ps.entry(ps.find("blocks.0.attn.v.lora_B.weight")).spec.global_shape, (Shape{8, 2}));
  EXPECT_EQ(ps.find("blocks.0.attn.q.lora_A.weight"), -1);
}

// ---- Golden: 10 AdamW steps of LoRA against transformers + peft (tests/reference/make_lora_golden.py) ----

const char* kLoraGolden = TESSERA_TEST_DATA_DIR "/lora_golden.h5";

ModelConfig lora_golden_config(const H5Reader& f, const std::string& preset) {
  ModelConfig c = testing::golden_model_config(f, preset);
  c.lora.rank = f.attr_int(preset, "lora_rank");
  c.lora.alpha = f.attr_double(preset, "lora_alpha");
  c.lora.targets.clear();
  std::stringstream targets(f.attr_string(preset, "lora_targets"));
  for (std::string t; std::getline(targets, t, ',');) c.lora.targets.push_back(t);
  return c;
}

HostTensor<int32_t> golden_ids(const H5Reader& f, const std::string& name) {
  auto a = f.read<int32_t>(name);
  HostTensor<int32_t> t({a.shape[0], a.shape[1]});
  t.vec() = a.values;
  return t;
}

// Tolerances: test_gpt.cpp's golden ones (kF64Tol, kF32Tol: ten AdamW steps' losses 1e-10 and
// 2e-6 relative). The final adapters: f64 1e-10 as the losses; f32 1e-4 relative to the tensor's
// largest value (Adam's steps are ~lr whatever the gradient's size, so an f32 gradient's rounding
// moves an element by up to ~lr x its relative error where the gradient is small).
template <typename T>
void check_lora_golden(const std::string& preset, double loss_tol, double weight_tol) {
  H5Reader f(kLoraGolden);
  const ModelConfig cfg = lora_golden_config(f, preset);
  Allocator alloc;
  ParameterStore ps(alloc, dtype_of<T>());
  Gpt gpt(cfg, ps);
  std::vector<int> adapters;
  for (int id = 0; id < ps.size(); ++id) {
    if (ps.entry(id).spec.name.find(".lora_") != std::string::npos)
      adapters.push_back(id);
    else
      ps.freeze(id);  // the base: no gradient, no moments
  }
  ASSERT_FALSE(adapters.empty());
  ps.finalize();
  for (int id = 0; id < ps.size(); ++id) {  // every parameter from the fixture (names are the contract)
    const ParamEntry& e = ps.entry(id);
    auto a = f.read<double>(preset + "/params/" + e.spec.name);
    ASSERT_EQ(static_cast<int64_t>(a.values.size()), e.local_shape.numel()) << e.spec.name;
    T* p = ps.param(id).ptr<T>();
    for (size_t i = 0; i < a.values.size(); ++i) p[i] = static_cast<T>(a.values[i]);
  }
  const auto tokens = golden_ids(f, preset + "/tokens"), targets = golden_ids(f, preset + "/targets");
  AdamWStep s;
  s.lr = f.attr_double(preset, "lr");
  s.beta1 = f.attr_double(preset, "beta1");
  s.beta2 = f.attr_double(preset, "beta2");
  s.eps = f.attr_double(preset, "eps");
  s.weight_decay = f.attr_double(preset, "weight_decay");  // every adapter is a matrix
  std::map<int, std::pair<Buffer, Buffer>> moments;
  for (int id : adapters)
    moments.emplace(id, std::pair{Buffer(alloc, ps.dtype(), ps.entry(id).local_shape, MemCategory::OptimizerState),
                                  Buffer(alloc, ps.dtype(), ps.entry(id).local_shape, MemCategory::OptimizerState)});
  const auto want = f.read<double>(preset + "/adamw_losses").values;
  ASSERT_EQ(static_cast<int64_t>(want.size()), f.attr_int(preset, "steps"));
  for (size_t step = 1; step <= want.size(); ++step) {
    ps.zero_grads(kCpu);
    GptCtx ctx;
    gpt.forward(kCpu, ctx, alloc, tokens.t(), targets.t());
    const LossSums sums = read_loss_sums(kCpu, ctx.loss_sums);
    EXPECT_NEAR(sums.mean(), want[step - 1], loss_tol * want[step - 1]) << preset << " AdamW step " << step;
    gpt.backward(kCpu, ctx, alloc, 1.0 / static_cast<double>(sums.targets));
    s.step = static_cast<int64_t>(step);
    for (int id : adapters) {
      auto& [m, v] = moments.at(id);
      adamw_update(kCpu, ps.param(id), ps.grad(id), m.tensor(), v.tensor(), s);
    }
  }
  for (int id : adapters) {
    const std::string& name = ps.entry(id).spec.name;
    const auto w = f.read<double>(preset + "/final/" + name).values;
    double scale = 0, diff = 0;
    const T* p = ps.param(id).ptr<T>();
    for (size_t i = 0; i < w.size(); ++i)
      scale = std::max(scale, std::abs(w[i])), diff = std::max(diff, std::abs(static_cast<double>(p[i]) - w[i]));
    EXPECT_LT(diff / scale, weight_tol) << preset << " final " << name;
  }
}

TEST(LoraGolden, Gpt2MatchesPeftF64) { check_lora_golden<double>("gpt2", 1e-10, 1e-10); }
TEST(LoraGolden, LlamaMatchesPeftF64) { check_lora_golden<double>("llama", 1e-10, 1e-10); }
TEST(LoraGolden, Gpt2MatchesPeftF32) { check_lora_golden<float>("gpt2", 2e-6, 1e-4); }
TEST(LoraGolden, LlamaMatchesPeftF32) { check_lora_golden<float>("llama", 2e-6, 1e-4); }

}  // namespace
}  // namespace tessera

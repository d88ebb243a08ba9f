// Tests model/vision.h and the vision-language Gpt (model.kind = "vlm"): the whole tiny VLM's
// backward against finite differences (both LM presets, every parameter, text-only and image
// samples mixed), bidirectional attention against an explicit softmax, and the errors.
#include "model/vision.h"

#include <cmath>

#include "error_testing.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "model/gpt.h"
#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;

namespace {

ModelConfig tiny_vlm(const std::string& preset) {
  ModelConfig c;
  c.kind = "vlm";
  c.preset = preset;
  c.vocab_size = 13;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = preset == "llama" ? 1 : 0;
  c.n_embd = 8;
  c.ffn_hidden = 12;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  c.vision.image_size = 4;
  c.vision.patch_size = 2;
  c.vision.channels = 2;
  c.vision.n_layer = 1;
  c.vision.n_head = 2;
  c.vision.n_embd = 8;
  c.vision.ffn_hidden = 12;
  c.vision.placeholder_id = 12;
  return c;
}

// Three samples of 8 positions: sample 0's image at [0, 4), sample 1 text only, sample 2's image
// at [2, 6). Targets of placeholder tokens are ignored, as the data layer makes them.
struct TinyBatch {
  HostTensor<int32_t> tokens{Shape{3, 8}}, targets{Shape{3, 8}};
  HostTensor<double> patches{Shape{2, 4, 8}};
  std::vector<int64_t> sample{0, 2}, start{0, 2};
  explicit TinyBatch(uint64_t seed) {
    tokens = testing::random_ids({3, 8}, 12, seed);
    targets = testing::random_ids({3, 8}, 12, seed + 1);
    for (int64_t t = 0; t < 4; ++t) tokens.vec()[t] = 12;
    for (int64_t t = 2; t < 6; ++t) tokens.vec()[16 + t] = 12;
    for (int64_t t = 0; t < 3; ++t) targets.vec()[t] = kIgnoreIndex;
    for (int64_t t = 1; t < 5; ++t) targets.vec()[16 + t] = kIgnoreIndex;
    std::mt19937_64 rng(seed + 2);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (auto& x : patches.vec()) x = u(rng);
  }
  ImageInput images() { return ImageInput{patches.t(), sample, start}; }
};

double mean_loss(const Gpt& gpt, Allocator& alloc, TinyBatch& b) {
  GptCtx ctx;
  const ImageInput im = b.images();
  gpt.forward(kCpu, ctx, alloc, b.tokens.t(), b.targets.t(), {}, &im);
  return read_loss_sums(kCpu, ctx.loss_sums).mean();
}

}  // namespace

class VlmFiniteDifference : public ::testing::TestWithParam<std::string> {};

// Every parameter's gradient (vision.*, projector.*, and the language model's) against central
// differences of the loss, in double precision.
TEST_P(VlmFiniteDifference, EveryParameterGradient) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F64);
  Gpt gpt(tiny_vlm(GetParam()), ps);
  ps.finalize();
  ps.initialize(kCpu, 7);
  TinyBatch b(11);
  {
    GptCtx ctx;
    const ImageInput im = b.images();
    gpt.forward(kCpu, ctx, alloc, b.tokens.t(), b.targets.t(), {}, &im);
    gpt.backward(kCpu, ctx, alloc, 1.0 / static_cast<double>(read_loss_sums(kCpu, ctx.loss_sums).targets));
  }
  int vision_params = 0;
  for (int id = 0; id < ps.size(); ++id) {
    const ParamEntry& e = ps.entry(id);
    if (e.spec.name.rfind("vision.", 0) == 0 || e.spec.name.rfind("projector.", 0) == 0) ++vision_params;
    const int64_t n = e.local_shape.numel();
    HostTensor<double> x(e.local_shape), g(e.local_shape);
    double* p = ps.param(id).ptr<double>();
    std::copy(p, p + n, x.data());
    std::copy(ps.grad(id).ptr<double>(), ps.grad(id).ptr<double>() + n, g.data());
    auto loss = [&] {
      std::copy(x.data(), x.data() + n, p);
      return mean_loss(gpt, alloc, b);
    };
    testing::expect_gradient_matches(loss, x, g, e.spec.name.c_str(), 1e-6, 1e-5, 8, 1e-4);
    std::copy(x.data(), x.data() + n, p);
  }
  // patch (2), pos, one block (ln1, ln2: 4; q, k, v, proj: 8; fc, proj: 4), ln_f (2), fc1, fc2 (4).
  EXPECT_EQ(vision_params, 25);
}

INSTANTIATE_TEST_SUITE_P(Presets, VlmFiniteDifference, ::testing::Values("gpt2", "llama"));

// Changing sample 0's image moves sample 0's logits only, and the image rows replace the
// placeholder embeddings: the placeholder's token row (untied: llama) gets exactly no gradient.
TEST(Vlm, ImageMovesOnlyItsOwnSample) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F64);
  Gpt gpt(tiny_vlm("llama"), ps);
  ps.finalize();
  ps.initialize(kCpu, 3);
  TinyBatch b(5);
  auto logits = [&] {
    GptCtx ctx;
    const ImageInput im = b.images();
    gpt.forward(kCpu, ctx, alloc, b.tokens.t(), b.targets.t(), {}, &im);
    const double* l = ctx.logits.tensor().ptr<double>();
    return std::vector<double>(l, l + 3 * 8 * 13);
  };
  const std::vector<double> before = logits();
  for (int64_t i = 0; i < 32; ++i) b.patches.vec()[i] += 0.5;  // image 0 = sample 0
  const std::vector<double> after = logits();
  for (int64_t row = 0; row < 24; ++row) {
    double diff = 0;
    for (int64_t v = 0; v < 13; ++v) diff = std::max(diff, std::abs(after[row * 13 + v] - before[row * 13 + v]));
    if (row < 8) EXPECT_GT(diff, 1e-6) << "row " << row;
    else EXPECT_EQ(diff, 0.0) << "row " << row;
  }
  // The placeholder's embedding row never reaches the model: its gradient is zero.
  GptCtx ctx;
  const ImageInput im = b.images();
  gpt.forward(kCpu, ctx, alloc, b.tokens.t(), b.targets.t(), {}, &im);
  gpt.backward(kCpu, ctx, alloc, 1.0);
  const Tensor dwte = ps.grad(ps.find("wte.weight"));
  double placeholder = 0, others = 0;
  for (int64_t c = 0; c < 8; ++c) {
    placeholder = std::max(placeholder, std::abs(dwte.ptr<double>()[12 * 8 + c]));
    others = std::max(others, std::abs(dwte.ptr<double>()[3 * 8 + c]));
  }
  EXPECT_GT(others, 0.0);
  EXPECT_EQ(placeholder, 0.0);
}

// Bidirectional attention (q_offset = S - 1) equals softmax over every key, written out.
TEST(Vlm, BidirectionalAttentionSeesEveryKey) {
  const int64_t B = 2, T = 5, H = 2, D = 3;
  HostTensor<double> q({B, T, H, D}), k({B, T, H, D}), v({B, T, H, D}), out({B, T, H, D}), lse({B, H, T});
  std::mt19937_64 rng(3);
  std::normal_distribution<double> n(0.0, 1.0);
  for (auto* t : {&q, &k, &v})
    for (auto& x : t->vec()) x = n(rng);
  attention_forward(kCpu, out.t(), lse.t(), q.t(), k.t(), v.t(), T - 1, 0);
  double err = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(T);
        double m = -1e300, z = 0;
        for (int64_t j = 0; j < T; ++j) {
          s[j] = 0;
          for (int64_t d = 0; d < D; ++d) s[j] += q[((b * T + i) * H + h) * D + d] * k[((b * T + j) * H + h) * D + d];
          s[j] /= std::sqrt(static_cast<double>(D));
          m = std::max(m, s[j]);
        }
        for (int64_t j = 0; j < T; ++j) z += std::exp(s[j] - m);
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < T; ++j) o += std::exp(s[j] - m) / z * v[((b * T + j) * H + h) * D + d];
          err = std::max(err, std::abs(o - out[((b * T + i) * H + h) * D + d]));
        }
        err = std::max(err, std::abs(m + std::log(z) - lse[(b * H + h) * T + i]));
      }
  EXPECT_LT(err, 1e-12);
}

TEST(Vlm, Errors) {
  Allocator alloc;
  {
    ParameterStore ps(alloc, DType::F64);
    ModelConfig c = tiny_vlm("gpt2");
    c.kind = "gpt";
    Gpt gpt(c, ps);
    ps.finalize();
    TinyBatch b(1);
    GptCtx ctx;
    const ImageInput im = b.images();
    EXPECT_TRUE(testing::throws_with([&] { gpt.forward(kCpu, ctx, alloc, b.tokens.t(), b.targets.t(), {}, &im); },
                                     {"a model without a vision encoder"}));
  }
  {
    ModelConfig c = tiny_vlm("gpt2");
    c.vision.patch_size = 3;
    EXPECT_TRUE(testing::throws_with([&] { resolve(c); }, {"vision.patch_size = 3 must divide vision.image_size = 4"}));
    c = tiny_vlm("gpt2");
    c.vision.placeholder_id = 13;
    EXPECT_TRUE(testing::throws_with([&] { resolve(c); }, {"vision.placeholder_id = 13 is outside the vocabulary"}));
  }
  {
    ParameterStore ps(alloc, DType::F64);
    Gpt gpt(tiny_vlm("gpt2"), ps);
    ps.finalize();
    TinyBatch b(1);
    b.start = {0, 5};  // 5 + 4 > 8
    GptCtx ctx;
    const ImageInput im = b.images();
    EXPECT_TRUE(testing::throws_with([&] { gpt.forward(kCpu, ctx, alloc, b.tokens.t(), b.targets.t(), {}, &im); },
                                     {"placeholder positions from 5 do not fit the sequence of 8"}));
  }
}

}  // namespace tessera

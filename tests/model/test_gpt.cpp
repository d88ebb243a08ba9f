// Tests model/gpt.h: the whole model against PyTorch golden fixtures (both presets, f64 and f32),
// its backward against finite differences, recomputation, and activation memory against the
// analytic count.
#include "model/gpt.h"

#include <cmath>

#include "h5_reader.h"
#include "golden_config.h"
#include "kernels/adamw.h"
#include "kernels/cross_entropy.h"
#include "testing.h"

namespace tessera {
using testing::H5Reader;
using testing::HostTensor;
using testing::kCpu;

namespace {

const char* kGolden = TESSERA_TEST_DATA_DIR "/golden.h5";

ModelConfig golden_config(const H5Reader& f, const std::string& preset) {
  ModelConfig c = testing::golden_model_config(f, preset);
  if (f.exists(preset + "/patches")) {  // a vision-language model (make_golden.py's vlm_*)
    c.kind = "vlm";
    c.vision.image_size = f.attr_int(preset, "vision_image_size");
    c.vision.patch_size = f.attr_int(preset, "vision_patch_size");
    c.vision.channels = f.attr_int(preset, "vision_channels");
    c.vision.n_layer = f.attr_int(preset, "vision_n_layer");
    c.vision.n_head = f.attr_int(preset, "vision_n_head");
    c.vision.n_embd = f.attr_int(preset, "vision_n_embd");
    c.vision.ffn_hidden = f.attr_int(preset, "vision_ffn_hidden");
    c.vision.placeholder_id = f.attr_int(preset, "vision_placeholder_id");
  }
  return c;
}

// A vlm fixture's images: the patches (N, P, K) as T and where each image goes.
template <typename T>
struct GoldenImages {
  HostTensor<T> patches{Shape{0}};
  ImageInput input;
  GoldenImages(const H5Reader& f, const std::string& preset) {
    if (!f.exists(preset + "/patches")) return;
    auto a = f.read<double>(preset + "/patches");
    patches = HostTensor<T>(Shape{a.shape[0], a.shape[1], a.shape[2]});
    for (size_t i = 0; i < a.values.size(); ++i) patches.vec()[i] = static_cast<T>(a.values[i]);
    input.patches = patches.t();
    for (double v : f.read<double>(preset + "/image_sample").values) input.sample.push_back(static_cast<int64_t>(v));
    for (double v : f.read<double>(preset + "/image_start").values) input.start.push_back(static_cast<int64_t>(v));
  }
  const ImageInput* get() const { return input.count() > 0 ? &input : nullptr; }
};

HostTensor<int32_t> read_ids(const H5Reader& f, const std::string& name) {
  auto a = f.read<int32_t>(name);
  HostTensor<int32_t> t({a.shape[0], a.shape[1]});
  t.vec() = a.values;
  return t;
}

template <typename T>
double rel_error(const Tensor& got, const std::vector<double>& want) {
  return testing::max_rel_error(got.ptr<T>(), want.data(), static_cast<int64_t>(want.size()));
}

// A gradient tensor's error relative to max(its own scale, 1e-2 x the largest gradient in the
// model). The floor matters for tensors whose exact gradient is zero: the key bias (softmax is
// invariant to adding q.b to every score of a row) has only rounding noise on both sides.
template <typename T>
double grad_error(const Tensor& got, const std::vector<double>& want, double model_scale) {
  double diff = 0, scale = 0;
  const T* g = got.ptr<T>();
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(g[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / std::max(scale, 1e-2 * model_scale);
}

// Tolerances per precision, each about 10-100x the error seen on these fixtures.
// f64: both sides compute in double from identical weights; only the summation order differs,
// ~1e-16 per op, and 1e-15 was measured on logits: 1e-12 / 1e-10 leave room for other BLAS orders.
// f32: every op rounds at 6e-8 relative; dot products of length <= 128 and the normalizations grow
// that to ~5e-7 on logits (measured), gradients through the longer backward chains to ~1.5e-6
// (measured). Adam's update m/sqrt(v) has magnitude ~lr whatever the gradient's size, so after 10
// steps at lr 1e-2 the loss moved ~2e-7 relative (measured).
struct Tolerances {
  double logits, loss, grads, adamw_losses;
};
constexpr Tolerances kF64Tol{1e-12, 1e-12, 1e-10, 1e-10};
constexpr Tolerances kF32Tol{5e-6, 1e-6, 2e-5, 2e-6};
// bf16 mixed precision (train.dtype = "bf16": f32 model and optimizer, GEMM inputs rounded to bf16,
// fp32 sums), against the same PyTorch fixtures: bf16 keeps 8 significant bits, so each rounded
// input is off by up to u = 2^-8 relative and each product by 2u = 7.8e-3; through the forward's
// chained GEMMs the logits' max error measured 9.2e-3 (gpt2) and 1.1e-2 (llama) relative to the
// largest logit; the backward's longer chains 1.8e-2 and 2.9e-2 on the worst gradient (same
// measure as f32). The loss averages over every token: 1.7e-4 and 8.6e-5. Ten AdamW steps at
// lr 1e-2 on one batch amplify that (Adam's step is ~lr whatever the gradient's size): 3.9e-3 and
// 7.2e-3 at worst. Tolerances are ~3x those measurements (6x for the loss); an f32 result would
// fail the check that the logits moved by more than 1e-4.
constexpr Tolerances kBf16Tol{3e-2, 1e-3, 1e-1, 2.5e-2};

template <typename T>
void check_golden(const std::string& preset, const Tolerances& tol, bool bf16 = false) {
  H5Reader f(kGolden);
  const ModelConfig cfg = golden_config(f, preset);
  Allocator alloc;
  ParameterStore ps(alloc, dtype_of<T>());
  Gpt gpt(cfg, ps);
  ps.finalize();
  if (bf16) ps.enable_compute_copy(DType::BF16);

  // Every tessera parameter has a fixture tensor of the same shape (names are the contract).
  for (int id = 0; id < ps.size(); ++id) {
    const ParamEntry& e = ps.entry(id);
    auto a = f.read<double>(preset + "/params/" + e.spec.name);
    ASSERT_EQ(static_cast<int64_t>(a.values.size()), e.local_shape.numel()) << e.spec.name;
    T* p = ps.param(id).ptr<T>();
    for (size_t i = 0; i < a.values.size(); ++i) p[i] = static_cast<T>(a.values[i]);
  }
  ps.refresh_compute_copy(kCpu);
  auto tokens = read_ids(f, preset + "/tokens");
  auto targets = read_ids(f, preset + "/targets");
  const GoldenImages<T> images(f, preset);

  GptCtx ctx;
  gpt.forward(kCpu, ctx, alloc, tokens.t(), targets.t(), {}, images.get());
  const LossSums sums = read_loss_sums(kCpu, ctx.loss_sums);
  const double loss = sums.mean();
  EXPECT_LT(rel_error<T>(ctx.logits, f.read<double>(preset + "/logits").values), tol.logits) << preset;
  const double want_loss = f.read<double>(preset + "/loss").values[0];
  EXPECT_NEAR(loss, want_loss, tol.loss * want_loss) << preset;
  // The bf16 GEMMs really ran: their rounding moves the logits far beyond f32's 5e-6.
  if (bf16) {
    EXPECT_GT(rel_error<T>(ctx.logits, f.read<double>(preset + "/logits").values), 1e-4) << preset;
  }

  const int64_t n_targets = sums.targets;
  gpt.backward(kCpu, ctx, alloc, 1.0 / static_cast<double>(n_targets));
  double model_scale = 0;
  for (int id = 0; id < ps.size(); ++id)
    for (double g : f.read<double>(preset + "/grads/" + ps.entry(id).spec.name).values)
      model_scale = std::max(model_scale, std::abs(g));
  for (int id = 0; id < ps.size(); ++id) {
    const std::string& name = ps.entry(id).spec.name;
    EXPECT_LT(grad_error<T>(ps.grad(id), f.read<double>(preset + "/grads/" + name).values, model_scale), tol.grads)
        << preset << " gradient of " << name;
  }

  // Ten AdamW steps on the same batch; weight decay on matrices only (as the fixture's groups).
  const int64_t steps = f.attr_int(preset, "steps");
  AdamWStep s;
  s.lr = f.attr_double(preset, "lr");
  s.beta1 = f.attr_double(preset, "beta1");
  s.beta2 = f.attr_double(preset, "beta2");
  s.eps = f.attr_double(preset, "eps");
  const double wd = f.attr_double(preset, "weight_decay");
  Buffer m(alloc, ps.dtype(), {ps.numel()}, MemCategory::OptimizerState);
  Buffer v(alloc, ps.dtype(), {ps.numel()}, MemCategory::OptimizerState);
  const auto want = f.read<double>(preset + "/adamw_losses").values;
  ASSERT_EQ(static_cast<int64_t>(want.size()), steps);
  for (int64_t step = 1; step <= steps; ++step) {
    ps.zero_grads(kCpu);
    gpt.forward(kCpu, ctx, alloc, tokens.t(), targets.t(), {}, images.get());
    const double l = read_loss_sums(kCpu, ctx.loss_sums).mean();
    EXPECT_NEAR(l, want[step - 1], tol.adamw_losses * want[step - 1]) << preset << " AdamW step " << step;
    gpt.backward(kCpu, ctx, alloc, 1.0 / static_cast<double>(n_targets));
    s.step = step;
    for (int id = 0; id < ps.size(); ++id) {
      const ParamEntry& e = ps.entry(id);
      s.weight_decay = e.spec.kind == ParamKind::Matrix ? wd : 0.0;
      const int64_t n = e.local_shape.numel();
      auto slice = [&](const Tensor& flat) { return flat.view({ps.numel()}).slice_rows(e.offset, e.offset + n); };
      adamw_update(kCpu, slice(ps.flat_params()), slice(ps.flat_grads()), slice(m), slice(v), s);
    }
    ps.refresh_compute_copy(kCpu);  // the trainer's order: masters updated, then the bf16 copy
  }
}

}  // namespace

TEST(GptGolden, Gpt2MatchesPyTorchF64) { check_golden<double>("gpt2", kF64Tol); }
TEST(GptGolden, LlamaMatchesPyTorchF64) { check_golden<double>("llama", kF64Tol); }
TEST(GptGolden, Gpt2MatchesPyTorchF32) { check_golden<float>("gpt2", kF32Tol); }
TEST(GptGolden, LlamaMatchesPyTorchF32) { check_golden<float>("llama", kF32Tol); }
// Vision-language models (model.kind = "vlm"): the tiny VLM of make_golden.py (a ViT encoder and
// projector feeding either preset, one text-only sample), same fixtures and tolerances.
TEST(GptGolden, VlmGpt2MatchesPyTorchF64) { check_golden<double>("vlm_gpt2", kF64Tol); }
TEST(GptGolden, VlmLlamaMatchesPyTorchF64) { check_golden<double>("vlm_llama", kF64Tol); }
TEST(GptGolden, VlmGpt2MatchesPyTorchF32) { check_golden<float>("vlm_gpt2", kF32Tol); }
TEST(GptGolden, VlmLlamaMatchesPyTorchF32) { check_golden<float>("vlm_llama", kF32Tol); }
TEST(GptGolden, Gpt2Bf16WithinBf16Tolerance) { check_golden<float>("gpt2", kBf16Tol, true); }
TEST(GptGolden, LlamaBf16WithinBf16Tolerance) { check_golden<float>("llama", kBf16Tol, true); }

namespace {

// "gpt2", "llama", or with the other head: "gpt2_untied", "llama_tied" (model.lm_head).
ModelConfig tiny_config(const std::string& name) {
  ModelConfig c;
  const size_t dash = name.find('_');
  const std::string preset = name.substr(0, dash);
  c.preset = preset;
  if (dash != std::string::npos) c.lm_head = name.substr(dash + 1);
  c.vocab_size = 13;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = preset == "llama" ? 1 : 0;
  c.n_embd = 8;
  c.ffn_hidden = 12;
  c.max_seq_len = 8;
  c.init_std = 0.3;  // large enough that every path carries a visible gradient
  return c;
}

struct TinyModel {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  TinyModel(const ModelConfig& cfg, DType dt, std::vector<Recompute> rc = {}) : ps(alloc, dt), gpt(cfg, ps, rc) {
    ps.finalize();
    ps.initialize(kCpu, 7);
  }
};

}  // namespace

class GptFiniteDifference : public ::testing::TestWithParam<std::string> {};

// Every parameter's gradient against central differences of the loss, in double precision.
TEST_P(GptFiniteDifference, EveryParameterGradient) {
  TinyModel m(tiny_config(GetParam()), DType::F64);
  auto tokens = testing::random_ids({2, 6}, 13, 1);
  auto targets = testing::random_ids({2, 6}, 13, 2);
  targets[1] = kIgnoreIndex;
  GptCtx ctx;
  m.gpt.forward(kCpu, ctx, m.alloc, tokens.t(), targets.t());
  m.gpt.backward(kCpu, ctx, m.alloc, 1.0 / static_cast<double>(read_loss_sums(kCpu, ctx.loss_sums).targets));

  for (int id = 0; id < m.ps.size(); ++id) {
    const ParamEntry& e = m.ps.entry(id);
    const int64_t n = e.local_shape.numel();
    HostTensor<double> x(e.local_shape), g(e.local_shape);
    double* p = m.ps.param(id).ptr<double>();
    std::copy(p, p + n, x.data());
    std::copy(m.ps.grad(id).ptr<double>(), m.ps.grad(id).ptr<double>() + n, g.data());
    auto loss = [&] {
      std::copy(x.data(), x.data() + n, p);
      GptCtx c;
      m.gpt.forward(kCpu, c, m.alloc, tokens.t(), targets.t());
      return read_loss_sums(kCpu, c.loss_sums).mean();
    };
    // Floor 1e-4: this model's gradients are O(1e-2..1); see expect_gradient_matches.
    testing::expect_gradient_matches(loss, x, g, e.spec.name.c_str(), 1e-6, 1e-5, 8, 1e-4);
    std::copy(x.data(), x.data() + n, p);
  }
}

// Recomputation re-runs the same kernels on the same inputs: full (the whole block forward) and
// selective (the norms' and the activation function's outputs) give the gradients of no
// recomputation bit for bit, and so does any mix of policies over the blocks (the
// model.recompute_layers case: the first blocks full, the rest selective).
TEST_P(GptFiniteDifference, RecomputationGivesIdenticalGradients) {
  ModelConfig cfg = tiny_config(GetParam());
  cfg.n_layer = 3;
  TinyModel plain(cfg, DType::F32);
  auto tokens = testing::random_ids({2, 6}, 13, 3);
  auto targets = testing::random_ids({2, 6}, 13, 4);
  const auto run = [&](TinyModel& m) {
    GptCtx ctx;
    m.gpt.forward(kCpu, ctx, m.alloc, tokens.t(), targets.t());
    const double loss = read_loss_sums(kCpu, ctx.loss_sums).mean();
    m.gpt.backward(kCpu, ctx, m.alloc, 1.0 / 12);
    return loss;
  };
  const double loss = run(plain);
  const Recompute N = Recompute::None, S = Recompute::Selective, F = Recompute::Full;
  for (const std::vector<Recompute>& policy :
       {std::vector<Recompute>{F, F, F}, {S, S, S}, {F, S, S}, {N, S, F}}) {
    TinyModel recomputed(cfg, DType::F32, policy);
    EXPECT_EQ(run(recomputed), loss);
    const float* a = plain.ps.flat_grads().ptr<float>();
    const float* b = recomputed.ps.flat_grads().ptr<float>();
    for (int64_t i = 0; i < plain.ps.numel(); ++i)
      ASSERT_EQ(a[i], b[i]) << "gradient element " << i << ", policy " << static_cast<int>(policy[0])
                            << static_cast<int>(policy[1]) << static_cast<int>(policy[2]);
  }
}

// Gpt::recompute (the pipeline's R under model.recompute = "bubble") run between the forward and
// the backward: the backward finds the contexts and recomputes nothing, with the gradients (and
// the loss) of the backward that recomputes inside bit for bit; blocks that kept their context
// are left alone (the mixed policy), and a second recompute changes nothing.
TEST_P(GptFiniteDifference, RecomputeAheadGivesIdenticalGradients) {
  ModelConfig cfg = tiny_config(GetParam());
  cfg.n_layer = 3;
  auto tokens = testing::random_ids({2, 6}, 13, 5);
  auto targets = testing::random_ids({2, 6}, 13, 6);
  const Recompute N = Recompute::None, S = Recompute::Selective, F = Recompute::Full;
  for (const std::vector<Recompute>& policy : {std::vector<Recompute>{F, F, F}, {F, S, N}}) {
    TinyModel inside(cfg, DType::F32, policy), ahead(cfg, DType::F32, policy);
    const auto run = [&](TinyModel& m, bool recompute_first) {
      GptCtx ctx;
      m.gpt.forward(kCpu, ctx, m.alloc, tokens.t(), targets.t());
      const double loss = read_loss_sums(kCpu, ctx.loss_sums).mean();
      if (recompute_first) {
        const size_t before = m.alloc.counter(MemCategory::Activations).current;
        m.gpt.recompute(kCpu, ctx, m.alloc);
        EXPECT_GT(m.alloc.counter(MemCategory::Activations).current, before) << "the recomputed contexts are kept";
        const size_t kept = m.alloc.counter(MemCategory::Activations).current;
        m.gpt.recompute(kCpu, ctx, m.alloc);
        EXPECT_EQ(m.alloc.counter(MemCategory::Activations).current, kept) << "nothing left to recompute";
      }
      m.gpt.backward(kCpu, ctx, m.alloc, 1.0 / 12);
      return loss;
    };
    EXPECT_EQ(run(ahead, true), run(inside, false));
    const float* a = inside.ps.flat_grads().ptr<float>();
    const float* b = ahead.ps.flat_grads().ptr<float>();
    for (int64_t i = 0; i < inside.ps.numel(); ++i) ASSERT_EQ(a[i], b[i]) << "gradient element " << i;
  }
  TinyModel m(cfg, DType::F32, {F, F, F});
  GptCtx empty;
  EXPECT_THROW(m.gpt.recompute(kCpu, empty, m.alloc), Error);
}

INSTANTIATE_TEST_SUITE_P(Presets, GptFiniteDifference, ::testing::Values("gpt2", "llama", "gpt2_untied", "llama_tied"));

// Packed documents (data.document_mask): a window of three documents, each token attending only
// within its document and positions restarting at each document, gives the per-token losses and
// the parameter gradients of the three documents run one by one, each a whole sequence of its own
// (learned positions for gpt2, RoPE for llama).
class GptDocuments : public ::testing::TestWithParam<std::string> {};

TEST_P(GptDocuments, WindowOfDocumentsEqualsDocumentsRunAlone) {
  ModelConfig cfg = tiny_config(GetParam());
  cfg.max_seq_len = 12;
  const int64_t B = 2, T = 12;
  const std::vector<std::vector<int64_t>> lengths = {{3, 5, 4}, {6, 1, 5}};  // per sequence
  auto tokens = testing::random_ids({B, T}, 13, 11);
  auto targets = testing::random_ids({B, T}, 13, 12);
  targets[4] = kIgnoreIndex;
  std::vector<int32_t> doc_start;
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t n : lengths[static_cast<size_t>(b)]) {
      doc_start.insert(doc_start.end(), static_cast<size_t>(n), static_cast<int32_t>(start));
      start += n;
    }
  }
  TinyModel window(cfg, DType::F64);
  GptCtx ctx;
  window.gpt.forward(kCpu, ctx, window.alloc, tokens.t(), targets.t(),
                     SequenceLayout::contiguous(T).with_documents(B, doc_start));
  const std::vector<double> losses(ctx.losses.tensor().ptr<double>(), ctx.losses.tensor().ptr<double>() + B * T);
  window.gpt.backward(kCpu, ctx, window.alloc, 1.0);

  TinyModel alone(cfg, DType::F64);  // the same initial parameters (seed 7)
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t n : lengths[static_cast<size_t>(b)]) {
      HostTensor<int32_t> tok({1, n}), tgt({1, n});
      for (int64_t i = 0; i < n; ++i) {
        tok[i] = tokens[b * T + start + i];
        tgt[i] = targets[b * T + start + i];
      }
      GptCtx one;
      alone.gpt.forward(kCpu, one, alone.alloc, tok.t(), tgt.t());
      const double* l = one.losses.tensor().ptr<double>();
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(losses[static_cast<size_t>(b * T + start + i)], l[i], 1e-12 * std::max(1.0, std::abs(l[i])))
            << GetParam() << " sequence " << b << " position " << start + i;
      alone.gpt.backward(kCpu, one, alone.alloc, 1.0);
      start += n;
    }
  }
  // Relative to max(the tensor's scale, 1e-3 x the model's): the key bias's exact gradient is zero
  // (softmax is invariant to it), so both sides hold only rounding noise there.
  double model_scale = 0;
  for (int64_t i = 0; i < alone.ps.numel(); ++i)
    model_scale = std::max(model_scale, std::abs(alone.ps.flat_grads().ptr<double>()[i]));
  for (int id = 0; id < window.ps.size(); ++id) {
    const Tensor g = window.ps.grad(id);
    std::vector<double> want(alone.ps.grad(id).ptr<double>(), alone.ps.grad(id).ptr<double>() + g.numel());
    EXPECT_LT(grad_error<double>(g, want, 0.1 * model_scale), 1e-11)
        << GetParam() << " gradient of " << window.ps.entry(id).spec.name;
  }
  // Without the mask the window is one long sequence: its losses differ (the test has teeth).
  TinyModel plain(cfg, DType::F64);
  GptCtx pc;
  plain.gpt.forward(kCpu, pc, plain.alloc, tokens.t(), targets.t());
  double diff = 0;
  for (int64_t i = 0; i < B * T; ++i) diff = std::max(diff, std::abs(pc.losses.tensor().ptr<double>()[i] - losses[i]));
  EXPECT_GT(diff, 1e-3) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Presets, GptDocuments, ::testing::Values("gpt2", "llama"));

// Variable-length batches (data/token_batching.h): pieces of long documents continue their
// document's positions (doc_position). Each piece of a packed row gives the per-token losses and the
// parameter gradients of that piece run alone as a sequence of its own, positioned independently of
// the layout code: gpt2 (learned positions) runs it at [0, n) in a model whose position rows
// [0, n) are the original's rows [p, p + n), its position gradient moved back to rows [p, p + n);
// llama (RoPE) runs it at [0, n), the attention scores depending only on relative positions. For
// gpt2 a packed row with every position restarting at 0 differs (the positions have teeth).
TEST_P(GptDocuments, PiecesAtContinuingPositionsEqualPiecesRunAlone) {
  ModelConfig cfg = tiny_config(GetParam());
  cfg.max_seq_len = 12;
  const bool learned = GetParam() == "gpt2";
  const int64_t B = 2, T = 12, C = cfg.n_embd;
  const std::vector<std::vector<int64_t>> lengths = {{3, 5, 4}, {6, 1, 5}};     // per sequence
  const std::vector<std::vector<int64_t>> positions = {{0, 4, 0}, {6, 0, 7}};  // each piece's first position
  auto tokens = testing::random_ids({B, T}, 13, 21);
  auto targets = testing::random_ids({B, T}, 13, 22);
  targets[7] = kIgnoreIndex;
  std::vector<int32_t> doc_start, doc_position;
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (size_t d = 0; d < lengths[static_cast<size_t>(b)].size(); ++d) {
      const int64_t n = lengths[static_cast<size_t>(b)][d];
      doc_start.insert(doc_start.end(), static_cast<size_t>(n), static_cast<int32_t>(start));
      doc_position.insert(doc_position.end(), static_cast<size_t>(n),
                          static_cast<int32_t>(positions[static_cast<size_t>(b)][d]));
      start += n;
    }
  }
  const SequenceLayout packed = SequenceLayout::contiguous(T).with_documents(B, doc_start, doc_position);
  EXPECT_EQ(packed.end_position(), 12);
  TinyModel window(cfg, DType::F64);
  GptCtx ctx;
  window.gpt.forward(kCpu, ctx, window.alloc, tokens.t(), targets.t(), packed);
  const std::vector<double> losses(ctx.losses.tensor().ptr<double>(), ctx.losses.tensor().ptr<double>() + B * T);
  window.gpt.backward(kCpu, ctx, window.alloc, 1.0);

  std::vector<std::vector<double>> want(static_cast<size_t>(window.ps.size()));  // summed over the pieces
  for (int id = 0; id < window.ps.size(); ++id) want[static_cast<size_t>(id)].assign(static_cast<size_t>(window.ps.grad(id).numel()), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (size_t d = 0; d < lengths[static_cast<size_t>(b)].size(); ++d) {
      const int64_t n = lengths[static_cast<size_t>(b)][d], pos = positions[static_cast<size_t>(b)][d];
      TinyModel alone(cfg, DType::F64);  // the same initial parameters (seed 7)
      const int wpe = alone.ps.find("wpe.weight");
      if (learned) {  // rows [0, n) take rows [pos, pos + n)
        double* w = alone.ps.param(wpe).ptr<double>();
        for (int64_t i = 0; i < n * C; ++i) w[i] = w[pos * C + i];
      }
      HostTensor<int32_t> tok({1, n}), tgt({1, n});
      for (int64_t i = 0; i < n; ++i) {
        tok[i] = tokens[b * T + start + i];
        tgt[i] = targets[b * T + start + i];
      }
      GptCtx one;
      alone.gpt.forward(kCpu, one, alone.alloc, tok.t(), tgt.t());
      const double* l = one.losses.tensor().ptr<double>();
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(losses[static_cast<size_t>(b * T + start + i)], l[i], 1e-12 * std::max(1.0, std::abs(l[i])))
            << GetParam() << " sequence " << b << " position " << start + i;
      alone.gpt.backward(kCpu, one, alone.alloc, 1.0);
      for (int id = 0; id < alone.ps.size(); ++id) {
        const double* g = alone.ps.grad(id).ptr<double>();
        std::vector<double>& sum = want[static_cast<size_t>(id)];
        const int64_t shift = learned && id == wpe ? pos * C : 0;  // row i's gradient is row pos + i's
        const int64_t count = learned && id == wpe ? n * C : static_cast<int64_t>(sum.size());
        for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(shift + i)] += g[i];
      }
      start += n;
    }
  }
  double model_scale = 0;
  for (const auto& v : want)
    for (double x : v) model_scale = std::max(model_scale, std::abs(x));
  for (int id = 0; id < window.ps.size(); ++id)
    EXPECT_LT(grad_error<double>(window.ps.grad(id), want[static_cast<size_t>(id)], 0.1 * model_scale), 1e-11)
        << GetParam() << " gradient of " << window.ps.entry(id).spec.name;
  if (!learned) return;
  TinyModel restart(cfg, DType::F64);
  GptCtx rc;
  restart.gpt.forward(kCpu, rc, restart.alloc, tokens.t(), targets.t(),
                      SequenceLayout::contiguous(T).with_documents(B, doc_start));
  double diff = 0;
  for (int64_t i = 0; i < B * T; ++i) diff = std::max(diff, std::abs(rc.losses.tensor().ptr<double>()[i] - losses[i]));
  EXPECT_GT(diff, 1e-3) << GetParam();
}

namespace {

// Bytes a forward keeps for backward, counted from the architecture (independently of the code):
// the residual stream (L+1 of BTC), per block what each op saves, and the head.
int64_t analytic_activation_elements(const ModelConfig& raw, int64_t B, int64_t T, Recompute recompute) {
  const ModelConfig c = resolve(raw);
  const int64_t BT = B * T, C = c.n_embd, F = c.ffn_hidden, H = c.n_head, L = c.n_layer;
  const int64_t kv = c.kv_heads() * c.head_dim();
  const bool layernorm = c.norm == NormKind::LayerNorm;
  const int64_t norm = BT * C + (layernorm ? 2 : 1) * BT;  // output, (mean,) rstd
  const int64_t attention = BT * C + 2 * BT * kv + BT * C + B * H * T;  // q, k, v, out, lse
  const int64_t mlp = (c.mlp == MlpKind::SwiGlu ? 3 : 2) * BT * F;  // (gate, up,) act | fc, act
  const int64_t block = norm + attention + BT * C /* x1 */ + norm + mlp;
  // Selective: without the two norm outputs and the activation function's output (act).
  const int64_t selective = block - 2 * BT * C - BT * F;
  const int64_t head = norm + BT * c.vocab_size /* logits */ + 2 * BT /* losses, lse */;
  const int64_t kept = recompute == Recompute::None ? block : recompute == Recompute::Selective ? selective : 0;
  return (L + 1) * BT * C + L * kept + head;
}

}  // namespace

class GptMemory : public ::testing::TestWithParam<std::string> {};

TEST_P(GptMemory, ActivationsMatchAnalyticCount) {
  ModelConfig cfg = tiny_config(GetParam());
  cfg.n_layer = 3;
  for (Recompute policy : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    std::vector<Recompute> rc(3, policy);
    TinyModel m(cfg, DType::F32, rc);
    auto tokens = testing::random_ids({2, 5}, 13, 5);
    auto targets = testing::random_ids({2, 5}, 13, 6);
    GptCtx ctx;
    m.gpt.forward(kCpu, ctx, m.alloc, tokens.t(), targets.t());
    const size_t expected = 4 * static_cast<size_t>(analytic_activation_elements(cfg, 2, 5, policy));
    EXPECT_EQ(m.alloc.counter(MemCategory::Activations).current, expected) << static_cast<int>(policy);
    m.gpt.backward(kCpu, ctx, m.alloc, 0.1);
    // Backward releases every activation and temporary.
    EXPECT_EQ(m.alloc.counter(MemCategory::Activations).current, 0u);
    EXPECT_EQ(m.alloc.counter(MemCategory::Workspace).current, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GptMemory, ::testing::Values("gpt2", "llama"));

TEST(Gpt, RejectsBadInput) {
  TinyModel m(tiny_config("gpt2"), DType::F32);
  GptCtx ctx;
  auto too_long = testing::random_ids({1, 9}, 13, 1);
  EXPECT_THROW(m.gpt.forward(kCpu, ctx, m.alloc, too_long.t(), Tensor()), Error);
  auto bad_token = testing::random_ids({1, 4}, 13, 1);
  bad_token[2] = 13;
  EXPECT_THROW(m.gpt.forward(kCpu, ctx, m.alloc, bad_token.t(), Tensor()), Error);
}

}  // namespace tessera

namespace tessera {

// Decoding with a KV cache (a prefill of 3 positions, then one position at a time) gives the
// logits of the full forward at every position. f64: only the order of the attention sums
// differs (~1e-15); f32: that reordering costs ~1e-7 relative on these small logits.
class GptKvCache : public ::testing::TestWithParam<std::string> {};

TEST_P(GptKvCache, CachedDecodingEqualsFullForward) {
  for (DType dt : {DType::F64, DType::F32}) {
    TinyModel m(tiny_config(GetParam()), dt);
    auto tokens = testing::random_ids({1, 7}, 13, 9);
    GptCtx full;
    m.gpt.forward(kCpu, full, m.alloc, tokens.t(), Tensor());
    KvCache cache = m.gpt.make_cache(m.alloc, 8);
    const int64_t V = 13;
    int64_t pos = 0;
    for (int64_t n : {3, 1, 1, 1, 1}) {
      GptCtx step;
      const Tensor chunk(tokens.data() + pos, DType::I32, {1, n});
      m.gpt.forward_cached(kCpu, step, m.alloc, chunk, cache);
      EXPECT_EQ(cache.length, pos + n);
      for (int64_t i = 0; i < n * V; ++i) {
        const double got = dt == DType::F64 ? step.logits.ptr<double>()[i] : step.logits.ptr<float>()[i];
        const double want = dt == DType::F64 ? full.logits.ptr<double>()[pos * V + i] : full.logits.ptr<float>()[pos * V + i];
        EXPECT_NEAR(got, want, dt == DType::F64 ? 1e-12 : 1e-5) << "position " << pos + i / V;
      }
      pos += n;
    }
    GptCtx over;
    const Tensor two(tokens.data(), DType::I32, {1, 2});
    EXPECT_THROW(m.gpt.forward_cached(kCpu, over, m.alloc, two, cache), Error);  // 7 + 2 > capacity 8
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GptKvCache, ::testing::Values("gpt2", "llama", "gpt2_untied", "llama_tied"));

}  // namespace tessera

namespace tessera {

// GradsReady reports every parameter exactly once, last layer first, and a reported gradient
// never changes afterwards (what an overlapped data-parallel reduction relies on).
class GptGradsReady : public ::testing::TestWithParam<std::string> {};

TEST_P(GptGradsReady, EachParameterOnceFinalWhenReported) {
  TinyModel m(tiny_config(GetParam()), DType::F32);
  auto tokens = testing::random_ids({2, 6}, 13, 21);
  auto targets = testing::random_ids({2, 6}, 13, 22);
  GptCtx ctx;
  m.gpt.forward(kCpu, ctx, m.alloc, tokens.t(), targets.t());
  std::vector<int> times_reported(static_cast<size_t>(m.ps.size()), 0);
  std::vector<std::vector<float>> at_report(static_cast<size_t>(m.ps.size()));
  std::vector<int> firsts;
  m.gpt.backward(kCpu, ctx, m.alloc, 1.0 / 12, [&](int first, int end) {
    firsts.push_back(first);
    for (int id = first; id < end; ++id) {
      ++times_reported[static_cast<size_t>(id)];
      const Tensor g = m.ps.grad(id);
      at_report[static_cast<size_t>(id)].assign(g.ptr<float>(), g.ptr<float>() + g.numel());
    }
  });
  for (int id = 0; id < m.ps.size(); ++id) {
    EXPECT_EQ(times_reported[static_cast<size_t>(id)], 1) << m.ps.entry(id).spec.name;
    const Tensor g = m.ps.grad(id);
    EXPECT_EQ(at_report[static_cast<size_t>(id)], std::vector<float>(g.ptr<float>(), g.ptr<float>() + g.numel()))
        << m.ps.entry(id).spec.name << " changed after it was reported final";
  }
  for (size_t i = 1; i + 1 < firsts.size(); ++i) EXPECT_LT(firsts[i], firsts[i - 1]) << "blocks last to first";
}

INSTANTIATE_TEST_SUITE_P(Presets, GptGradsReady, ::testing::Values("gpt2", "llama"));

}  // namespace tessera

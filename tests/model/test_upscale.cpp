// Tests model/upscale.h: each method's layer mapping on a 6-layer source, the refusals, the grown
// tensors bit for bit against their sources (or their defined init), LLaMA Pro expansion keeping
// the model's function (logits and loss of a real forward), and optimal-transport fusion
// recovering a hidden permutation of heads (with their GQA groups) and MLP units.
#include "model/upscale.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "error_testing.h"
#include "model/gpt.h"
#include "testing.h"

namespace tessera {
using testing::kCpu;
namespace {

using L = LayerSource;
constexpr LayerInit C = LayerInit::Copy, E = LayerInit::Expand, A = LayerInit::Average, F = LayerInit::Fuse;

std::vector<LayerSource> map6(const std::string& method, UpscaleOptions o = {}) {
  o.method = method;
  return layer_mapping(6, o);
}

std::vector<LayerSource> copies(std::initializer_list<int64_t> layers) {
  std::vector<LayerSource> out;
  for (int64_t l : layers) out.push_back({C, l});
  return out;
}

}  // namespace

TEST(UpscaleMapping, Solar) {
  EXPECT_EQ(map6("solar"), copies({0, 1, 2, 3, 2, 3, 4, 5}));  // default overlap round(6 / 4) = 2
  EXPECT_EQ(map6("solar", {.overlap = 1}), copies({0, 1, 2, 3, 4, 1, 2, 3, 4, 5}));
  EXPECT_EQ(map6("solar", {.layers = 12}), copies({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(map6("solar", {.overlap = 0}), map6("stack"));
  EXPECT_EQ(describe_mapping(map6("solar")), "0 1 2 3 2 3 4 5");
}

// parse_mapping reads describe_mapping back; original_layers (train.freeze = "original") marks the
// first copy of each source layer, per method on 6 layers.
TEST(UpscaleMapping, ParsedBackAndOriginalLayers) {
  for (const auto& [m, o] : std::vector<std::pair<std::string, UpscaleOptions>>{
           {"solar", {}}, {"stack", {}}, {"interleave", {.every = 2}}, {"expand", {.every = 3}}, {"average", {}},
           {"ot", {.layers = 8, .position = "top"}}})
    EXPECT_EQ(parse_mapping(describe_mapping(map6(m, o))), map6(m, o)) << m;
  using V = std::vector<bool>;
  constexpr bool o = true, n = false;
  EXPECT_EQ(original_layers(map6("solar")), (V{o, o, o, o, n, n, o, o}));  // 0 1 2 3 | 2 3 4 5
  EXPECT_EQ(original_layers(map6("stack")), (V{o, o, o, o, o, o, n, n, n, n, n, n}));
  EXPECT_EQ(original_layers(map6("interleave", {.every = 2})), (V{o, o, n, o, o, n, o, o, n}));
  EXPECT_EQ(original_layers(map6("expand", {.every = 3})), (V{o, o, o, n, o, o, o, n}));
  EXPECT_EQ(original_layers(map6("average", {.every = 5})), (V{o, o, o, o, o, n, o}));
  EXPECT_EQ(original_layers(map6("ot", {.layers = 7, .position = "bottom"})), (V{o, n, o, o, o, o, o}));
  EXPECT_TRUE(testing::throws_with([] { parse_mapping("0 1 foo(2)"); }, {"cannot read layer \"foo(2)\""}));
}

TEST(UpscaleMapping, Stack) {
  EXPECT_EQ(map6("stack"), copies({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(map6("stack", {.factor = 3}).size(), 18u);
  EXPECT_EQ(map6("stack", {.layers = 18}), map6("stack", {.factor = 3}));
}

TEST(UpscaleMapping, Interleave) {
  EXPECT_EQ(map6("interleave"), copies({0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}));
  EXPECT_EQ(map6("interleave", {.every = 2}), copies({0, 1, 1, 2, 3, 3, 4, 5, 5}));
  EXPECT_EQ(map6("interleave", {.layers = 8, .position = "top"}), copies({0, 1, 2, 3, 4, 4, 5, 5}));
  EXPECT_EQ(map6("interleave", {.layers = 8, .position = "bottom"}), copies({0, 0, 1, 1, 2, 3, 4, 5}));
  EXPECT_EQ(map6("interleave", {.layers = 9}), map6("interleave", {.every = 2}));  // uniform: slots 1, 3, 5
}

TEST(UpscaleMapping, Expand) {
  EXPECT_EQ(map6("expand", {.every = 3}), (std::vector<L>{{C, 0}, {C, 1}, {C, 2}, {E, 2}, {C, 3}, {C, 4}, {C, 5}, {E, 5}}));
  EXPECT_EQ(describe_mapping(map6("expand", {.every = 3})), "0 1 2 expand(2) 3 4 5 expand(5)");
  EXPECT_EQ(map6("expand", {.layers = 7, .position = "bottom"}),
            (std::vector<L>{{C, 0}, {E, 0}, {C, 1}, {C, 2}, {C, 3}, {C, 4}, {C, 5}}));
}

TEST(UpscaleMapping, AverageAndOt) {
  EXPECT_EQ(map6("average"), (std::vector<L>{{C, 0}, {A, 0, 1}, {C, 1}, {A, 1, 2}, {C, 2}, {A, 2, 3}, {C, 3},
                                             {A, 3, 4}, {C, 4}, {A, 4, 5}, {C, 5}}));
  EXPECT_EQ(map6("ot", {.layers = 8, .position = "top"}),
            (std::vector<L>{{C, 0}, {C, 1}, {C, 2}, {C, 3}, {F, 3, 4}, {C, 4}, {F, 4, 5}, {C, 5}}));
  EXPECT_EQ(map6("average", {.layers = 8, .position = "uniform"}),  // 5 slots, 2 new: slots 1 and 4
            (std::vector<L>{{C, 0}, {C, 1}, {A, 1, 2}, {C, 2}, {C, 3}, {C, 4}, {A, 4, 5}, {C, 5}}));
  EXPECT_EQ(describe_mapping(map6("ot", {.every = 5})), "0 1 2 3 4 ot(4,5) 5");
}

TEST(UpscaleMapping, RefusesBadRequests) {
  using testing::throws_with;
  EXPECT_TRUE(throws_with([] { map6("deepen"); }, {"unknown method \"deepen\"", "solar, stack, interleave"}));
  EXPECT_TRUE(throws_with([] { map6("solar", {.layers = 13}); }, {"even number", "--layers 13"}));
  EXPECT_TRUE(throws_with([] { map6("solar", {.layers = 14}); }, {"overlap must be in [0, 5]"}));
  EXPECT_TRUE(throws_with([] { map6("solar", {.overlap = 3}); }, {"gives 6 layers, not more than the source's 6"}));
  EXPECT_TRUE(throws_with([] { map6("solar", {.factor = 2}); }, {"--factor does not apply to --method solar"}));
  EXPECT_TRUE(throws_with([] { map6("stack", {.layers = 14}); }, {"multiple of the source's 6"}));
  EXPECT_TRUE(throws_with([] { map6("stack", {.overlap = 1}); }, {"--overlap does not apply to --method stack"}));
  EXPECT_TRUE(throws_with([] { map6("interleave", {.layers = 13}); }, {"at most 12 layers from 6", "got --layers 13"}));
  EXPECT_TRUE(throws_with([] { map6("average", {.layers = 12}); }, {"at most 11 layers", "between each pair"}));
  EXPECT_TRUE(throws_with([] { map6("ot", {.layers = 6}); }, {"not more than the source's 6"}));
  EXPECT_TRUE(throws_with([] { map6("expand", {.every = 7}); }, {"--every 7 inserts nothing"}));
  EXPECT_TRUE(throws_with([] { map6("expand", {.every = 2, .position = "top"}); }, {"--position top needs --layers"}));
  EXPECT_TRUE(throws_with([] { map6("expand", {.layers = 8, .every = 2}); }, {"--every or --layers, not both"}));
  EXPECT_TRUE(throws_with([] { map6("expand", {.layers = 8, .position = "middle"}); }, {"top, bottom or uniform"}));
  EXPECT_TRUE(throws_with([] { map6("average", {.sinkhorn_eps = 0.1}); }, {"--sinkhorn-eps does not apply"}));
  EXPECT_TRUE(throws_with([] { map6("stack", {.position = "top"}); }, {"--position does not apply"}));
  EXPECT_TRUE(throws_with([] { layer_mapping(1, {.method = "ot"}); }, {"at least 2 layers"}));
}

// ---- tensors ----

namespace {

ModelConfig tiny(const std::string& preset, int64_t layers) {
  ModelConfig c;
  c.preset = preset;
  c.vocab_size = 13;
  c.n_layer = layers;
  c.n_head = 4;
  c.n_kv_head = preset == "llama" ? 2 : 0;
  c.n_embd = 16;
  c.ffn_hidden = 12;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  return resolve(c);
}

struct Model {
  Allocator alloc;
  ParameterStore ps;
  Gpt gpt;
  explicit Model(const ModelConfig& cfg, uint64_t seed = 7) : ps(alloc, DType::F32), gpt(cfg, ps) {
    ps.finalize();
    ps.initialize(kCpu, seed);
    // Norm gains and biases start as constants: make every tensor distinct, so a misplaced one shows.
    float* p = ps.flat_params().ptr<float>();
    for (int64_t i = 0; i < ps.numel(); ++i) p[i] += 0.01f * static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
  }
  std::vector<float> get(const std::string& name) const {
    const int id = ps.find(name);
    TESSERA_CHECK(id >= 0, "no parameter ", name);
    const Tensor t = ps.param(id);
    return {t.ptr<float>(), t.ptr<float>() + t.numel()};
  }
  void set(const std::string& name, const std::vector<float>& v) {
    const Tensor t = ps.param(ps.find(name));
    ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel()) << name;
    std::copy(v.begin(), v.end(), t.ptr<float>());
  }
  TensorFetch fetch() const {
    return [this](const std::string& n) { return get(n); };
  }
  // Logits (B*T, V) and the mean loss of a fixed batch.
  std::pair<std::vector<float>, double> run() const {
    auto tokens = testing::random_ids({2, 6}, 13, 1);
    auto targets = testing::random_ids({2, 6}, 13, 2);
    GptCtx ctx;
    Allocator alloc;
    gpt.forward(kCpu, ctx, alloc, tokens.t(), targets.t());
    const Tensor l = ctx.logits.tensor();
    return {{l.ptr<float>(), l.ptr<float>() + l.numel()}, read_loss_sums(kCpu, ctx.loss_sums).mean()};
  }
};

// The grown model, every parameter produced by the upscaler.
std::unique_ptr<Model> grow(const Model& src, LayerUpscaler& up) {
  auto out = std::make_unique<Model>(up.target(), 99);
  for (const ParamEntry& e : out->ps.entries()) out->set(e.spec.name, up.parameter(e.spec.name, src.fetch()));
  return out;
}

std::string block(int64_t l, const std::string& suffix) { return "blocks." + std::to_string(l) + "." + suffix; }

std::vector<std::string> block_suffixes(const Model& m) {
  std::vector<std::string> out;
  for (const ParamEntry& e : m.ps.entries()) {
    auto [layer, suffix] = split_block_name(e.spec.name);
    if (layer == 0) out.push_back(suffix);
  }
  return out;
}

}  // namespace

class UpscaleTensors : public ::testing::TestWithParam<std::string> {};

TEST_P(UpscaleTensors, EqualTheirSourcesBitForBit) {
  const Model src(tiny(GetParam(), 6));
  for (const std::string method : {"solar", "stack", "interleave", "expand", "average"}) {
    LayerUpscaler up(src.gpt.config(), map6(method));
    const auto grown = grow(src, up);
    for (const ParamEntry& e : grown->ps.entries()) {
      const auto [layer, suffix] = split_block_name(e.spec.name);
      const std::vector<float> got = grown->get(e.spec.name);
      if (layer < 0) {  // embeddings, final norm, LM head
        EXPECT_EQ(got, src.get(e.spec.name)) << method << " " << e.spec.name;
        continue;
      }
      const LayerSource& l = up.mapping()[static_cast<size_t>(layer)];
      std::vector<float> want = src.get(block(l.a, suffix));
      if (l.init == LayerInit::Expand && zeroed_by_expand(suffix)) std::fill(want.begin(), want.end(), 0.0f);
      if (l.init == LayerInit::Average) {
        const std::vector<float> b = src.get(block(l.b, suffix));
        for (size_t i = 0; i < want.size(); ++i) want[i] = (want[i] + b[i]) * 0.5f;
      }
      EXPECT_EQ(got, want) << method << " " << e.spec.name;
    }
  }
}

TEST_P(UpscaleTensors, ExpandKeepsTheFunction) {
  const Model src(tiny(GetParam(), 3));
  for (const UpscaleOptions& o : {UpscaleOptions{.method = "expand"}, UpscaleOptions{.method = "expand", .every = 2},
                                  UpscaleOptions{.method = "expand", .layers = 4, .position = "bottom"}}) {
    LayerUpscaler up(src.gpt.config(), layer_mapping(3, o));
    const auto grown = grow(src, up);
    const auto [want_logits, want_loss] = src.run();
    const auto [logits, loss] = grown->run();
    ASSERT_EQ(logits.size(), want_logits.size());
    // An identity block adds exactly zero to the residual stream: the same kernels on the same
    // values, so equal to fp32 rounding (in fact bit for bit).
    for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(logits[i], want_logits[i], 1e-6f * (1 + std::abs(want_logits[i])));
    EXPECT_NEAR(loss, want_loss, 1e-6 * want_loss);
    // ...and is not trivially so: the copied blocks are not identities.
    LayerUpscaler interleave(src.gpt.config(), layer_mapping(3, {.method = "interleave"}));
    EXPECT_GT(std::abs(grow(src, interleave)->run().second - want_loss), 1e-4);
  }
}

TEST_P(UpscaleTensors, MomentsFollowTheirParameters) {
  const Model src(tiny(GetParam(), 4)), moments(tiny(GetParam(), 4), 5);
  LayerUpscaler up(src.gpt.config(), layer_mapping(4, {.method = "expand", .every = 2}));
  // layer 2 = expand(1)
  EXPECT_EQ(up.moment(block(2, "ln1.weight"), src.fetch(), moments.fetch()), moments.get(block(1, "ln1.weight")));
  const auto zero = up.moment(block(2, "attn.proj.weight"), src.fetch(), moments.fetch());
  EXPECT_TRUE(std::all_of(zero.begin(), zero.end(), [](float x) { return x == 0.0f; }));
  EXPECT_EQ(up.moment("wte.weight", src.fetch(), moments.fetch()), moments.get("wte.weight"));
}

INSTANTIATE_TEST_SUITE_P(Presets, UpscaleTensors, ::testing::Values("gpt2", "llama"));

// ---- optimal-transport fusion ----

namespace {

// A valid permutation of a block's units: kv groups permuted, query heads permuted inside their
// group (they move with it), MLP units permuted.
BlockAlignment random_permutation(const ModelConfig& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  BlockAlignment p;
  const int64_t H = cfg.n_head, KV = cfg.kv_heads(), r = H / KV;
  p.kv_heads.resize(static_cast<size_t>(KV));
  std::iota(p.kv_heads.begin(), p.kv_heads.end(), 0);
  std::shuffle(p.kv_heads.begin(), p.kv_heads.end(), rng);
  for (int64_t g = 0; g < KV; ++g) {
    std::vector<int64_t> inner(static_cast<size_t>(r));
    std::iota(inner.begin(), inner.end(), 0);
    std::shuffle(inner.begin(), inner.end(), rng);
    for (int64_t j = 0; j < r; ++j) p.heads.push_back(p.kv_heads[static_cast<size_t>(g)] * r + inner[static_cast<size_t>(j)]);
  }
  p.units.resize(static_cast<size_t>(cfg.ffn_hidden));
  std::iota(p.units.begin(), p.units.end(), 0);
  std::shuffle(p.units.begin(), p.units.end(), rng);
  return p;
}

// A 2-layer model whose layer 1 is layer 0 with its units permuted.
std::unique_ptr<Model> permuted_twin(const std::string& preset, BlockAlignment& perm) {
  auto m = std::make_unique<Model>(tiny(preset, 2));
  perm = random_permutation(m->gpt.config(), 17);
  for (const std::string& s : block_suffixes(*m)) m->set(block(1, s), apply_alignment(m->gpt.config(), perm, s, m->get(block(0, s))));
  return m;
}

TensorFetch layer_of(const Model& m, int64_t l) {
  return [&m, l](const std::string& s) { return m.get(block(l, s)); };
}

}  // namespace

class UpscaleFusion : public ::testing::TestWithParam<std::string> {};

TEST_P(UpscaleFusion, PermutingUnitsKeepsTheBlocksFunction) {
  // The oracle for the permutations themselves: a model whose layer 1 is layer 0 computes the same
  // as one whose layer 1 is layer 0 with heads (by kv group) and MLP units permuted.
  BlockAlignment perm;
  const auto twin = permuted_twin(GetParam(), perm);
  Model same(tiny(GetParam(), 2));
  for (const ParamEntry& e : same.ps.entries()) {
    const auto [layer, suffix] = split_block_name(e.spec.name);
    same.set(e.spec.name, twin->get(layer == 1 ? block(0, suffix) : e.spec.name));
  }
  const auto [a, la] = twin->run();
  const auto [b, lb] = same.run();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5f * (1 + std::abs(b[i])));
  EXPECT_NEAR(la, lb, 1e-5 * lb);
  EXPECT_NE(twin->get(block(1, "mlp." + std::string(GetParam() == "gpt2" ? "fc" : "gate") + ".weight")),
            twin->get(block(0, "mlp." + std::string(GetParam() == "gpt2" ? "fc" : "gate") + ".weight")));
}

TEST_P(UpscaleFusion, RecoversAPermutation) {
  BlockAlignment perm;
  const auto twin = permuted_twin(GetParam(), perm);
  const ModelConfig& cfg = twin->gpt.config();
  const BlockAlignment al = align_blocks(cfg, layer_of(*twin, 0), layer_of(*twin, 1), 0.0);
  // b = a permuted by perm, so b's unit perm^-1(u) is a's unit u: al must be that inverse.
  for (int64_t u = 0; u < cfg.ffn_hidden; ++u)
    EXPECT_EQ(perm.units[static_cast<size_t>(al.units[static_cast<size_t>(u)])], u);
  for (int64_t h = 0; h < cfg.n_head; ++h) EXPECT_EQ(perm.heads[static_cast<size_t>(al.heads[static_cast<size_t>(h)])], h);
  for (int64_t g = 0; g < cfg.kv_heads(); ++g)
    EXPECT_EQ(perm.kv_heads[static_cast<size_t>(al.kv_heads[static_cast<size_t>(g)])], g);
  // The fused layer between them is the original, bit for bit; plain averaging is not.
  LayerUpscaler ot(cfg, layer_mapping(2, {.method = "ot"}));
  LayerUpscaler avg(cfg, layer_mapping(2, {.method = "average"}));
  bool average_differs = false;
  for (const std::string& s : block_suffixes(*twin)) {
    EXPECT_EQ(ot.parameter(block(1, s), twin->fetch()), twin->get(block(0, s))) << s;
    average_differs |= avg.parameter(block(1, s), twin->fetch()) != twin->get(block(0, s));
  }
  EXPECT_TRUE(average_differs);
}

// ot --align-data: block 1 (layer 0 permuted) run on block 0's input gives block 0's activations
// permuted, so the activation costs recover the permutation too and the fused layer is the
// original bit for bit.
TEST_P(UpscaleFusion, ActivationCostsRecoverAPermutation) {
  BlockAlignment perm;
  const auto twin = permuted_twin(GetParam(), perm);
  const ModelConfig& cfg = twin->gpt.config();
  const auto mapping = layer_mapping(2, {.method = "ot", .align_data = true});
  std::vector<std::vector<int32_t>> batches;
  for (uint64_t seed : {3, 4}) batches.push_back(testing::random_ids({2, 8}, 13, seed).vec());
  auto features = activation_features(cfg, twin->fetch(), mapping, batches, 2, 8);
  ASSERT_EQ(features.count(1), 1u);
  const auto& [fa, fb] = features.at(1);
  EXPECT_EQ(fa.mlp.size(), static_cast<size_t>(cfg.ffn_hidden * 2 * 2 * 8));  // F units x 32 tokens
  const BlockAlignment al = align_features(cfg, fa, fb, 0.0);
  for (int64_t u = 0; u < cfg.ffn_hidden; ++u)
    EXPECT_EQ(perm.units[static_cast<size_t>(al.units[static_cast<size_t>(u)])], u);
  for (int64_t h = 0; h < cfg.n_head; ++h) EXPECT_EQ(perm.heads[static_cast<size_t>(al.heads[static_cast<size_t>(h)])], h);
  LayerUpscaler ot(cfg, mapping);
  ot.set_features(std::move(features));
  for (const std::string& s : block_suffixes(*twin)) EXPECT_EQ(ot.parameter(block(1, s), twin->fetch()), twin->get(block(0, s))) << s;
  // Only ot takes it.
  EXPECT_TRUE(testing::throws_with([] { layer_mapping(2, {.method = "average", .align_data = true}); },
                                   {"--align-data does not apply to --method average"}));
}

TEST_P(UpscaleFusion, SinkhornWithSmallEpsApproachesTheExactFusion) {
  BlockAlignment perm;
  const auto twin = permuted_twin(GetParam(), perm);
  const ModelConfig& cfg = twin->gpt.config();
  LayerUpscaler soft(cfg, UpscaleOptions{.method = "ot", .sinkhorn_eps = 1e-3});
  LayerUpscaler blurred(cfg, UpscaleOptions{.method = "ot", .sinkhorn_eps = 10.0});
  const std::string s = GetParam() == "gpt2" ? "mlp.fc.weight" : "mlp.up.weight";
  const auto want = twin->get(block(0, s)), got = soft.parameter(block(1, s), twin->fetch());
  double max_err = 0, max_blur = 0;
  const auto far = blurred.parameter(block(1, s), twin->fetch());
  for (size_t i = 0; i < want.size(); ++i) {
    max_err = std::max(max_err, static_cast<double>(std::abs(got[i] - want[i])));
    max_blur = std::max(max_blur, static_cast<double>(std::abs(far[i] - want[i])));
  }
  EXPECT_LT(max_err, 1e-4);
  EXPECT_GT(max_blur, 1e-2);  // a large eps averages units together
}

INSTANTIATE_TEST_SUITE_P(Presets, UpscaleFusion, ::testing::Values("gpt2", "llama"));

}  // namespace tessera

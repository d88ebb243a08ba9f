// Tests model/memory.h: on one rank the analytic counts equal what the allocator measures for tiny
// models, exactly (parameters, activations after a forward, the activation + workspace peak of
// forward + backward, a forward without targets), for both presets, under each recomputation
// policy and mixes of them (model.recompute_layers), for the whole model and for each pipeline stage; and absurd sizes throw instead
// of wrapping. The tensor-parallel layouts are
// checked in test_gpt_tensor_parallel.cpp (under mpiexec).
#include "model/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "kernels/allocator.h"
#include "kernels/elementwise.h"
#include "model/gpt.h"
#include "model/weight_grads.h"
#include "testing.h"

namespace tessera {
namespace {

ModelConfig small_config(const std::string& preset, int64_t n_layer) {
  ModelConfig c;
  c.preset = preset;
  c.vocab_size = 37;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_kv_head = preset == "llama" ? 2 : 0;
  c.n_embd = 16;
  c.ffn_hidden = 24;
  c.max_seq_len = 12;
  return c;
}

struct Case {
  std::string preset;
  Recompute recompute;
};

class ModelMemoryTest : public ::testing::TestWithParam<Case> {};

TEST_P(ModelMemoryTest, EqualsTheAllocatorsCounts) {
  const Case k = GetParam();
  for (int64_t L : {1, 3}) {
    const ModelConfig cfg = small_config(k.preset, L);
    const int64_t B = 3, T = 10;
    const ModelMemory m = model_memory(cfg, {B, T, 1, false, k.recompute});

    Allocator alloc;
    ParameterStore ps(alloc, DType::F32);
    Gpt gpt(cfg, ps, std::vector<Recompute>(static_cast<size_t>(L), k.recompute));
    ps.finalize();
    ps.initialize(testing::kCpu, 3);
    EXPECT_EQ(m.parameters, ps.numel()) << "L=" << L;
    const size_t state = alloc.total_current();  // parameters and gradients
    auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 1);
    auto targets = testing::random_ids({B, T}, cfg.vocab_size, 2);

    GptCtx ctx;
    gpt.forward(testing::kCpu, ctx, alloc, tokens.t(), targets.t());
    EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 4u * static_cast<size_t>(m.activations)) << "L=" << L;
    gpt.backward(testing::kCpu, ctx, alloc, 0.01);
    EXPECT_EQ(alloc.total_peak() - state, 4u * static_cast<size_t>(m.training_peak) + ModelMemory::kLossSumsBytes)
        << "L=" << L;

    alloc.reset_peaks();
    GptCtx infer;
    gpt.forward(testing::kCpu, infer, alloc, tokens.t(), Tensor());
    EXPECT_EQ(alloc.total_peak() - state, 4u * static_cast<size_t>(m.inference_peak)) << "L=" << L;
    EXPECT_EQ(alloc.total_current() - state, 4u * static_cast<size_t>(m.inference_kept)) << "L=" << L;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ModelMemoryTest,
                         ::testing::Values(Case{"gpt2", Recompute::None}, Case{"gpt2", Recompute::Selective},
                                           Case{"gpt2", Recompute::Full}, Case{"llama", Recompute::None},
                                           Case{"llama", Recompute::Selective}, Case{"llama", Recompute::Full}));

// Each pipeline stage's counts equal what the allocator measures for it: its own parameters (the
// last stage's copy of the tied table included), its forward's activations and the peak of its
// forward and backward. A stage without the embedding reads its input and writes its input
// gradient in tensors its caller owns (the pipeline's), here from another allocator.
TEST_P(ModelMemoryTest, EachPipelineStageEqualsTheAllocatorsCounts) {
  const Case k = GetParam();
  const int64_t L = 5, B = 3, T = 10;
  const ModelConfig cfg = resolve(small_config(k.preset, L));
  for (int64_t stages : {2, 3}) {
    int64_t parameters = 0;
    for (int64_t s = 0; s < stages; ++s) {
      const StageSpec spec = StageSpec::split(L, stages, s);
      const std::string what = std::to_string(stages) + " stages, stage " + std::to_string(s);
      const ModelMemory m = model_memory(cfg, {B, T, 1, false, k.recompute, spec});
      Allocator alloc, caller;
      ParameterStore ps(alloc, DType::F32);
      Gpt gpt(cfg, ps, std::vector<Recompute>(static_cast<size_t>(L), k.recompute), {}, spec);
      ps.finalize();
      ps.initialize(testing::kCpu, 3);
      EXPECT_EQ(m.parameters, ps.numel()) << what;
      parameters += m.parameters;
      const size_t state = alloc.total_current();
      auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 1);
      auto targets = testing::random_ids({B, T}, cfg.vocab_size, 2);
      Buffer input(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Activations);
      Buffer dy(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
      Buffer dx(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
      fill_zero(testing::kCpu, input);
      fill_zero(testing::kCpu, dy);

      GptCtx ctx;
      gpt.forward(testing::kCpu, ctx, alloc, spec.embedding ? tokens.t() : input.tensor(),
                  spec.head ? targets.t() : Tensor(), SequenceLayout::contiguous(T));
      EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 4u * static_cast<size_t>(m.activations)) << what;
      // The loss sums (16 bytes, not elements) join the peak only where it is at the loss, not
      // where it is inside the blocks (full recomputation).
      const size_t forward = alloc.total_peak() - state, counted = 4u * static_cast<size_t>(m.forward_peak);
      EXPECT_TRUE(forward == counted || (spec.head && forward == counted + ModelMemory::kLossSumsBytes))
          << what << ": measured " << forward << " bytes, counted " << counted;
      gpt.backward(testing::kCpu, ctx, alloc, spec.head ? Gpt::OutputGrad::loss(0.01) : Gpt::OutputGrad::output(dy),
                   spec.embedding ? Tensor() : dx.tensor());
      EXPECT_EQ(alloc.total_peak() - state,
                4u * static_cast<size_t>(m.training_peak) + (spec.head ? ModelMemory::kLossSumsBytes : 0))
          << what;
      EXPECT_EQ(m.training_peak, std::max(m.forward_peak, m.backward_peak)) << what;

      alloc.reset_peaks();
      GptCtx infer;
      gpt.forward(testing::kCpu, infer, alloc, spec.embedding ? tokens.t() : input.tensor(), Tensor(),
                  SequenceLayout::contiguous(T));
      EXPECT_EQ(alloc.total_peak() - state, 4u * static_cast<size_t>(m.inference_peak)) << what;
      EXPECT_EQ(alloc.total_current() - state, 4u * static_cast<size_t>(m.inference_kept)) << what;
    }
    // The stages hold the model's parameters, and gpt2's last stage a second copy of the table.
    const int64_t table = cfg.tied_embeddings ? cfg.vocab_size * cfg.n_embd : 0;
    EXPECT_EQ(parameters, model_memory(cfg, {B, T, 1, false, k.recompute}).parameters + table) << stages << " stages";
  }
}

// model.recompute_layers: a stage's first full_layers blocks recompute fully, the others follow
// the policy. The counts equal the allocator's for the whole model and each of two stages.
TEST_P(ModelMemoryTest, RecomputeLayersEqualTheAllocatorsCounts) {
  const Case k = GetParam();
  if (k.recompute == Recompute::Full) GTEST_SKIP() << "every block recomputes fully already";
  const int64_t L = 5, B = 2, T = 10;
  const ModelConfig cfg = resolve(small_config(k.preset, L));
  for (int64_t full_layers : {1, 2, 9})
    for (int64_t stages : {1, 2})
      for (int64_t s = 0; s < stages; ++s) {
        const StageSpec spec = StageSpec::split(L, stages, s);
        const std::string what = std::to_string(full_layers) + " full, stage " + std::to_string(s) + " of " +
                                 std::to_string(stages);
        std::vector<Recompute> policy(static_cast<size_t>(L), k.recompute);
        for (int64_t l = spec.first_layer; l < std::min(spec.end_layer, spec.first_layer + full_layers); ++l)
          policy[static_cast<size_t>(l)] = Recompute::Full;
        const ModelMemory m = model_memory(cfg, {B, T, 1, false, k.recompute, spec, full_layers});
        Allocator alloc, caller;
        ParameterStore ps(alloc, DType::F32);
        Gpt gpt(cfg, ps, policy, {}, spec);
        ps.finalize();
        ps.initialize(testing::kCpu, 3);
        const size_t state = alloc.total_current();
        auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 1);
        auto targets = testing::random_ids({B, T}, cfg.vocab_size, 2);
        Buffer input(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Activations);
        Buffer dy(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
        Buffer dx(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
        fill_zero(testing::kCpu, input);
        fill_zero(testing::kCpu, dy);
        GptCtx ctx;
        gpt.forward(testing::kCpu, ctx, alloc, spec.embedding ? tokens.t() : input.tensor(),
                    spec.head ? targets.t() : Tensor(), SequenceLayout::contiguous(T));
        EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 4u * static_cast<size_t>(m.activations)) << what;
        gpt.backward(testing::kCpu, ctx, alloc, spec.head ? Gpt::OutputGrad::loss(0.01) : Gpt::OutputGrad::output(dy),
                     spec.embedding ? Tensor() : dx.tensor());
        const size_t peak = alloc.total_peak() - state, counted = 4u * static_cast<size_t>(m.training_peak);
        EXPECT_TRUE(peak == counted || (spec.head && peak == counted + ModelMemory::kLossSumsBytes))
            << what << ": measured " << peak << " bytes, counted " << counted;
      }
}

// model.activation_compression (kernels/activation_compression.h): a compressing block keeps its
// normed inputs and its MLP's last input compressed, and the counts stay exact: each method, a
// per-layer mix with uncompressed blocks, the whole model and each of two stages, beside
// model.recompute_layers' fully recomputing blocks (which never compress).
TEST_P(ModelMemoryTest, CompressionEqualsTheAllocatorsCounts) {
  const Case k = GetParam();
  if (k.recompute != Recompute::None) GTEST_SKIP() << "compression needs blocks that keep their inputs";
  const int64_t L = 4, B = 2, T = 10;
  const ModelConfig cfg = resolve(small_config(k.preset, L));
  const ActivationCompression none{}, bf16{CompressionMethod::Bf16}, int8{CompressionMethod::Int8},
      lowrank{CompressionMethod::LowRank, 3};
  const std::vector<std::vector<ActivationCompression>> policies = {
      {bf16, bf16, bf16, bf16}, {int8, int8, int8, int8}, {lowrank, lowrank, lowrank, lowrank}, {int8, none, lowrank, bf16}};
  for (size_t p = 0; p < policies.size(); ++p)
    for (int64_t full_layers : {0, 1})
      for (int64_t stages : {1, 2})
        for (int64_t s = 0; s < stages; ++s) {
          const StageSpec spec = StageSpec::split(L, stages, s);
          const std::string what = "policy " + std::to_string(p) + ", " + std::to_string(full_layers) +
                                   " full, stage " + std::to_string(s) + " of " + std::to_string(stages);
          std::vector<Recompute> recompute(static_cast<size_t>(L), Recompute::None);
          std::vector<ActivationCompression> compression = policies[p];
          for (int64_t l = spec.first_layer; l < std::min(spec.end_layer, spec.first_layer + full_layers); ++l) {
            recompute[static_cast<size_t>(l)] = Recompute::Full;
            compression[static_cast<size_t>(l)] = none;
          }
          ModelMemoryLayout layout{B, T, 1, false, Recompute::None, spec, full_layers};
          layout.compression = compression;
          const ModelMemory m = model_memory(cfg, layout);
          Allocator alloc, caller;
          ParameterStore ps(alloc, DType::F32);
          Gpt gpt(cfg, ps, recompute, {}, spec, {}, compression);
          ps.finalize();
          ps.initialize(testing::kCpu, 3);
          const size_t state = alloc.total_current();
          auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 1);
          auto targets = testing::random_ids({B, T}, cfg.vocab_size, 2);
          Buffer input(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Activations);
          Buffer dy(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
          Buffer dx(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
          fill_zero(testing::kCpu, input);
          fill_zero(testing::kCpu, dy);
          GptCtx ctx;
          gpt.forward(testing::kCpu, ctx, alloc, spec.embedding ? tokens.t() : input.tensor(),
                      spec.head ? targets.t() : Tensor(), SequenceLayout::contiguous(T));
          EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 4u * static_cast<size_t>(m.activations)) << what;
          const size_t forward = alloc.total_peak() - state, counted_forward = 4u * static_cast<size_t>(m.forward_peak);
          EXPECT_TRUE(forward == counted_forward || (spec.head && forward == counted_forward + ModelMemory::kLossSumsBytes))
              << what << ": forward measured " << forward << " bytes, counted " << counted_forward;
          gpt.backward(testing::kCpu, ctx, alloc, spec.head ? Gpt::OutputGrad::loss(0.01) : Gpt::OutputGrad::output(dy),
                       spec.embedding ? Tensor() : dx.tensor());
          const size_t peak = alloc.total_peak() - state, counted = 4u * static_cast<size_t>(m.training_peak);
          EXPECT_TRUE(peak == counted || (spec.head && peak == counted + ModelMemory::kLossSumsBytes))
              << what << ": measured " << peak << " bytes, counted " << counted;
          // Compression saves: fewer activations than the same layout without it.
          bool compressing = false;
          for (int64_t l = spec.first_layer; l < spec.end_layer; ++l) compressing |= compression[static_cast<size_t>(l)].active();
          ModelMemoryLayout plain = layout;
          plain.compression.clear();
          if (compressing) EXPECT_LT(m.activations, model_memory(cfg, plain).activations) << what;
        }
}

// kind = "vlm": the vision tower's parameters, its context (kept from the embedding's forward to its
// backward) and its backward's temporaries are counted exactly too: both presets, each
// recomputation policy of the language model's blocks (the encoder keeps everything), with no,
// some and all samples carrying an image, for a narrow encoder (the language model's backward is
// the peak) and a wide one (the encoder's backward is), the whole model and the first of two stages.
TEST_P(ModelMemoryTest, VisionLanguageModelEqualsTheAllocatorsCounts) {
  const Case k = GetParam();
  const int64_t L = 2, B = 3, T = 12;
  for (int64_t width : {8, 48}) {
    ModelConfig base = small_config(k.preset, L);
    base.kind = "vlm";
    base.vision.image_size = 6;
    base.vision.patch_size = 2;  // P = 9 placeholders, K = 12
    base.vision.channels = 3;
    base.vision.n_layer = 2;
    base.vision.n_head = 2;
    base.vision.n_embd = width;
    base.vision.ffn_hidden = 2 * width;
    const ModelConfig cfg = resolve(base);
    const int64_t P = cfg.vision.num_patches(), K = cfg.vision.patch_dim();
    for (int64_t images : {0, 1, 3})
      for (int64_t stages : {1, 2}) {
        const StageSpec spec = StageSpec::split(L, stages, 0);
        const std::string what = "width " + std::to_string(width) + ", " + std::to_string(images) + " images, " +
                                 std::to_string(stages) + " stages";
        ModelMemoryLayout lay{B, T, 1, false, k.recompute, spec};
        lay.images = images;
        const ModelMemory m = model_memory(cfg, lay);
        Allocator alloc, caller;
        ParameterStore ps(alloc, DType::F32);
        Gpt gpt(cfg, ps, std::vector<Recompute>(static_cast<size_t>(L), k.recompute), {}, spec);
        ps.finalize();
        ps.initialize(testing::kCpu, 3);
        EXPECT_EQ(m.parameters, ps.numel()) << what;
        const size_t state = alloc.total_current();
        auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 1);
        auto targets = testing::random_ids({B, T}, cfg.vocab_size, 2);
        Buffer patches(caller, DType::F32, {std::max<int64_t>(images, 1), P, K}, MemCategory::Activations);
        Buffer dy(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
        fill_zero(testing::kCpu, patches);
        fill_zero(testing::kCpu, dy);
        ImageInput im{patches.tensor().slice_rows(0, images), {}, {}};
        for (int64_t i = 0; i < images; ++i) {
          im.sample.push_back(i);
          im.start.push_back(i);  // P + i <= T
        }
        GptCtx ctx;
        gpt.forward(testing::kCpu, ctx, alloc, tokens.t(), spec.head ? targets.t() : Tensor(), {}, &im);
        EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 4u * static_cast<size_t>(m.activations)) << what;
        const size_t loss = spec.head ? ModelMemory::kLossSumsBytes : 0;
        const size_t forward = alloc.total_peak() - state, counted = 4u * static_cast<size_t>(m.forward_peak);
        EXPECT_TRUE(forward == counted || forward == counted + loss)
            << what << ": measured " << forward << " bytes, counted " << counted;
        gpt.backward(testing::kCpu, ctx, alloc, spec.head ? Gpt::OutputGrad::loss(0.01) : Gpt::OutputGrad::output(dy),
                     Tensor());
        const size_t peak = alloc.total_peak() - state, total = 4u * static_cast<size_t>(m.training_peak);
        EXPECT_TRUE(peak == total || peak == total + loss) << what << ": measured " << peak << " bytes, counted " << total;

        alloc.reset_peaks();
        GptCtx infer;
        gpt.forward(testing::kCpu, infer, alloc, tokens.t(), Tensor(), {}, &im);
        EXPECT_EQ(alloc.total_peak() - state, 4u * static_cast<size_t>(m.inference_peak)) << what;
        EXPECT_EQ(alloc.total_current() - state, 4u * static_cast<size_t>(m.inference_kept)) << what;
      }
  }
}

TEST(ModelMemory, CheckedArithmeticThrowsInsteadOfWrapping) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(checked_mul(1 << 20, 1 << 20), int64_t{1} << 40);
  EXPECT_THROW(checked_mul(big / 2, 3), SizeOverflow);
  EXPECT_THROW(checked_add(big, 1), SizeOverflow);
  ModelConfig c = small_config("gpt2", 2);
  c.n_embd = 1 << 20;
  c.n_head = 1 << 10;
  c.vocab_size = int64_t{1} << 31;
  // B T = 2^40 tokens: the logits alone, 2^40 x 2^31 elements, overflow.
  EXPECT_THROW(model_memory(c, {1 << 20, 1 << 20, 1, false}), SizeOverflow);
}

// parallel.tp_overlap_chunks (ModelMemoryLayout::tp_overlap_chunks): counted only where the edges
// are chunked, under sequence parallelism over tp > 1 (elsewhere the key has no effect), as
// min(k, T / tp) chunks as the run uses; k < 1 is refused. The counts themselves are checked
// against the allocator on 2 and 4 ranks (test_gpt_tp_overlap.cpp).
TEST(ModelMemory, TpOverlapChunksCountWhereTheEdgesAreChunked) {
  const ModelConfig cfg = small_config("gpt2", 2);
  const auto peak = [&](int64_t tp, bool sp, int64_t chunks) {
    ModelMemoryLayout l{2, 12, tp, sp};
    l.tp_overlap_chunks = chunks;
    return model_memory(cfg, l).training_peak;
  };
  EXPECT_EQ(peak(2, false, 4), peak(2, false, 1));  // plain tp: nothing chunked
  EXPECT_EQ(peak(1, true, 4), peak(1, true, 1));    // one rank: no edges
  EXPECT_NE(peak(2, true, 2), peak(2, true, 1));
  EXPECT_EQ(peak(2, true, 100), peak(2, true, 6));  // 6 positions per rank: 6 chunks at most
  EXPECT_NE(peak(2, true, 6), peak(2, true, 2));
  ModelMemoryLayout bad{2, 12, 2, true};
  bad.tp_overlap_chunks = 0;
  EXPECT_THROW(model_memory(cfg, bad), Error);
}

// Zero-bubble's split backward (B, then W later): after B the only activations left are the copies
// kept for W, the analytic weight_grads; the peak of forward + B stays at or under the counted
// one (copies are counted from their block's peak on, a few buffers early) and within 5% of it;
// after W nothing is left.
TEST_P(ModelMemoryTest, SplitBackwardKeepsTheCopiesForWAndStaysUnderTheCount) {
  const Case k = GetParam();
  const int64_t L = 3, B = 3, T = 10;
  const ModelConfig cfg = resolve(small_config(k.preset, L));
  ModelMemoryLayout lay{B, T, 1, false, k.recompute};
  lay.split_backward = true;
  const ModelMemory m = model_memory(cfg, lay);
  EXPECT_EQ(model_memory(cfg, {B, T, 1, false, k.recompute}).weight_grads, 0);
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  Gpt gpt(cfg, ps, std::vector<Recompute>(static_cast<size_t>(L), k.recompute));
  ps.finalize();
  ps.initialize(testing::kCpu, 3);
  const size_t state = alloc.total_current();
  auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 1);
  auto targets = testing::random_ids({B, T}, cfg.vocab_size, 2);
  GptCtx ctx;
  WeightGrads deferred(alloc);
  gpt.forward(testing::kCpu, ctx, alloc, tokens.t(), targets.t());
  gpt.backward(testing::kCpu, ctx, alloc, Gpt::OutputGrad::loss(0.01), Tensor(), {}, &deferred);
  EXPECT_GT(m.weight_grads, 0);
  EXPECT_EQ(deferred.bytes(), 4 * m.weight_grads);
  EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 4u * static_cast<size_t>(m.weight_grads));
  const double peak = static_cast<double>(alloc.total_peak() - state - ModelMemory::kLossSumsBytes);
  const double counted = 4.0 * static_cast<double>(m.training_peak);
  EXPECT_LE(peak, counted);
  EXPECT_GE(peak, 0.95 * counted) << "measured " << peak << " bytes, counted " << counted;
  gpt.backward_weight(testing::kCpu, deferred);
  EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 0u);
}

// model.recompute = "bubble" (ModelMemoryLayout::recompute_ahead): the R action (Gpt::recompute)
// at its highest, what it keeps until the backward, and the backward that finds it there, each
// equal to the allocator's, for the whole model and each of two stages, all blocks recomputing
// fully or the first two of a stage (recompute_layers) beside the case's policy.
TEST_P(ModelMemoryTest, RecomputeAheadEqualsTheAllocatorsCounts) {
  const Case k = GetParam();
  const int64_t L = 5, B = 2, T = 10;
  const ModelConfig cfg = resolve(small_config(k.preset, L));
  for (int64_t full_layers : {0, 2})
    for (int64_t stages : {1, 2})
      for (int64_t s = 0; s < stages; ++s) {
        if (full_layers == 0 && k.recompute != Recompute::Full) continue;  // nothing recomputes
        const StageSpec spec = StageSpec::split(L, stages, s);
        const std::string what = std::to_string(full_layers) + " full, stage " + std::to_string(s) + " of " +
                                 std::to_string(stages);
        std::vector<Recompute> policy(static_cast<size_t>(L), k.recompute);
        for (int64_t l = spec.first_layer; l < std::min(spec.end_layer, spec.first_layer + full_layers); ++l)
          policy[static_cast<size_t>(l)] = Recompute::Full;
        ModelMemoryLayout lay{B, T, 1, false, k.recompute, spec, full_layers};
        lay.recompute_ahead = true;
        const ModelMemory m = model_memory(cfg, lay);
        EXPECT_GT(m.recomputed, 0) << what;
        Allocator alloc, caller;
        ParameterStore ps(alloc, DType::F32);
        Gpt gpt(cfg, ps, policy, {}, spec);
        ps.finalize();
        ps.initialize(testing::kCpu, 3);
        const size_t state = alloc.total_current();
        const size_t loss_sums = spec.head ? ModelMemory::kLossSumsBytes : 0;
        auto tokens = testing::random_ids({B, T}, cfg.vocab_size, 1);
        auto targets = testing::random_ids({B, T}, cfg.vocab_size, 2);
        Buffer input(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Activations);
        Buffer dy(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
        Buffer dx(caller, DType::F32, {B, T, cfg.n_embd}, MemCategory::Workspace);
        fill_zero(testing::kCpu, input);
        fill_zero(testing::kCpu, dy);
        GptCtx ctx;
        gpt.forward(testing::kCpu, ctx, alloc, spec.embedding ? tokens.t() : input.tensor(),
                    spec.head ? targets.t() : Tensor(), SequenceLayout::contiguous(T));
        const size_t acts = alloc.counter(MemCategory::Activations).current;
        EXPECT_EQ(acts, 4u * static_cast<size_t>(m.activations)) << what;
        alloc.reset_peaks();
        gpt.recompute(testing::kCpu, ctx, alloc);
        EXPECT_EQ(alloc.total_peak() - state, 4u * static_cast<size_t>(m.recompute_peak) + loss_sums) << what;
        EXPECT_EQ(alloc.counter(MemCategory::Activations).current - acts, 4u * static_cast<size_t>(m.recomputed)) << what;
        alloc.reset_peaks();
        gpt.backward(testing::kCpu, ctx, alloc, spec.head ? Gpt::OutputGrad::loss(0.01) : Gpt::OutputGrad::output(dy),
                     spec.embedding ? Tensor() : dx.tensor());
        EXPECT_EQ(alloc.total_peak() - state, 4u * static_cast<size_t>(m.backward_peak) + loss_sums) << what;
      }
}

}  // namespace
}  // namespace tessera

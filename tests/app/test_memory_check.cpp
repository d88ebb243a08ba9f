// Tests app/memory_check.h: the estimate against the allocator's measured peak of real training
// runs (one rank here; tensor-parallel and ZeRO-1 layouts under `mpiexec -n 2`, MemoryCheckLayouts),
// the refusal message, the issue's absurd configs refused in a second, naming the keys; pipeline
// stages (the schedules' micro-batches in flight) against each rank's peak under mpiexec -n 2;
// train.freeze (no moments for the frozen parameters) on one rank, on each layout, and with an
// in-run growth.
#include "app/memory_check.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "app/checkpoint/hf_export.h"
#include "app/freeze.h"
#include "app/lora.h"
#include "app/trainer.h"
#include "model/memory.h"
#include "model/stage_cut.h"
#include "cli_testing.h"
#include "error_testing.h"
#include "mpi_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace testing;

// Trains a few steps (and the end-of-run evaluation) and returns the allocator's peak.
size_t measured_peak(const Config& cfg, MPI_Comm comm) {
  Trainer t(cfg, "", comm);
  t.run();
  return t.allocator().total_peak();
}

Config tiny(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"train.steps=2", "log.every=100"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return parse_config_string(kTinyConfig, "tiny.toml", all);
}

// How close: on one rank the allocator's part of the estimate is the allocator's peak exactly.
// model/memory.h follows every buffer the model allocates, in order (tests/model/test_memory.cpp
// holds it to the byte), and the trainer adds flat parameters, gradients and AdamW moments whose
// sizes are known; the evaluation forward is an upper bound (all problems at once; they actually
// go by prompt length, which for 1-digit operands is one group). What the allocator does not see
// (token batches, the checkpoint's host copy, the runtime) is estimated, not measured here.
TEST(MemoryCheck, EstimateEqualsTheAllocatorsPeakOnOneRank) {
  const std::vector<std::vector<std::string>> cases = {
      {},                                                                       // gpt2, training dominates
      {"model.preset=\"llama\"", "model.recompute=\"full\"", "train.micro_batch=2"},  // recompute, accumulation
      {"model.recompute=\"selective\""},                                            // gpt2 selective
      {"model.preset=\"llama\"", "model.recompute=\"selective\"", "model.n_layer=3", "model.recompute_layers=1"},
      {"train.micro_batch=1", "train.global_batch=2", "data.val_examples=512"},      // evaluation dominates
  };
  for (const auto& overrides : cases) {
    const Config cfg = tiny(overrides);
    const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false});
    EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured_peak(cfg, MPI_COMM_NULL))
        << ::testing::PrintToString(overrides);
  }
}

// train.dtype = "bf16": the parameters' bf16 copy (exact) and the GEMMs' rounded operands, exact
// at the LM head and an upper bound inside a block (model/memory.h). With the GPT-2 vocabulary the
// head's rounded output gradient (N x V) is the largest of them; on one rank the allocator's part
// of the estimate is at or above the measured peak, and within 5% of it (measured 2026-12-03: equal
// to it in all five cases, the peak being at the head or the evaluation). The 2048-id cases run two
// steps without the end-of-run evaluation, which cannot decode ids beyond the digits' 13.
TEST(MemoryCheck, Bf16EstimateIsWithinFivePercentAboveThePeakOnOneRank) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"model.recompute=\"selective\""},
      {"model.preset=\"llama\"", "model.recompute=\"full\"", "train.micro_batch=2"},
      {"model.preset=\"llama\"", "model.vocab_size=2048"},
      {"model.vocab_size=2048", "model.recompute=\"selective\""},
  };
  for (auto overrides : cases) {
    overrides.push_back("train.dtype=\"bf16\"");
    const Config cfg = tiny(overrides);
    const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false});
    Config fp32 = cfg;
    fp32.train.dtype = "fp32";
    const MemoryEstimate e32 = estimate_training_memory(fp32, 13, MemoryLayout{1, 1, false});
    double peak = 0;
    if (cfg.model.vocab_size == 0) {
      peak = static_cast<double>(measured_peak(cfg, MPI_COMM_NULL));
    } else {
      Trainer t(cfg, "", MPI_COMM_NULL);
      for (int64_t step = 0; step < 2; ++step) ASSERT_FALSE(t.step(step).skipped);
      peak = static_cast<double>(t.allocator().total_peak());
    }
    const double est = static_cast<double>(e.allocator_bytes());
    std::cout << ::testing::PrintToString(overrides) << ": estimate " << est << " (fp32 " << e32.allocator_bytes()
              << "), measured " << peak << ", ratio " << est / peak << "\n";
    EXPECT_GE(est, peak) << ::testing::PrintToString(overrides);
    EXPECT_LE(est, 1.05 * peak) << ::testing::PrintToString(overrides);
  }
}

// A vision-language model (model.kind = "vlm") on the built-in scenes: 8x8 images in 2x2 patches,
// 16 placeholders per sample, a wider encoder than language model so that its share shows.
constexpr const char* kTinyVlm = R"(
[model]
kind = "vlm"
n_layer = 2
n_head = 2
n_embd = 16
[vision]
image_size = 8
patch_size = 2
n_layer = 2
n_head = 2
n_embd = 24
[data]
task = "scenes"
val_examples = 4
[train]
steps = 2
global_batch = 8
micro_batch = 4
seq_len = 26
eval_every = 0
[log]
every = 100
)";

Config tiny_vlm(const std::vector<std::string>& overrides) {
  return parse_config_string(kTinyVlm, "tiny-vlm.toml", overrides);
}

// The vision tower's parameters, gradients and moments, its activations and backward temporaries
// (model/memory.h), the uploaded patches and the caption evaluation: on one rank the allocator's
// part of the estimate is the allocator's peak exactly, under each recomputation policy of the
// language model (the encoder keeps everything), with accumulation, and one image per micro-batch
// (the caption evaluation, as many scenes per forward as training, stays below training's peak).
TEST(MemoryCheck, VisionLanguageEstimateEqualsTheAllocatorsPeakOnOneRank) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"model.recompute=\"selective\""},
      {"model.preset=\"llama\"", "model.recompute=\"full\"", "train.micro_batch=2"},
      {"train.micro_batch=1", "train.global_batch=16", "data.val_examples=64", "train.eval_every=2"},
  };
  for (const auto& overrides : cases) {
    const Config cfg = tiny_vlm(overrides);
    const MemoryEstimate e = estimate_training_memory(cfg, 15, MemoryLayout{1, 1, false});
    const size_t measured = measured_peak(cfg, MPI_COMM_NULL);
    if (static_cast<size_t>(e.allocator_bytes()) != measured)
      for (const MemoryItem& i : e.items) std::cerr << "  " << i.bytes << "  " << i.what << "\n";
    EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured) << ::testing::PrintToString(overrides);
  }
}

// train.freeze resolved for cfg's model (patterns; "original" from an up-scaling record's mapping).
std::set<std::string> frozen_of(const Config& cfg, const std::string& mapping = "") {
  const ModelConfig mc = resolve(to_model_config(cfg, 13));
  std::vector<std::string> names;
  for (const auto& [path, shape] : model_tensor_shapes(mc)) names.push_back(path.substr(std::strlen("/model/")));
  AttrMap record;
  if (!mapping.empty()) record["mapping"] = mapping;
  return frozen_parameters(cfg.train.freeze, names, mc.n_layer, {record, "the test"});
}

// The frozen tensors' global elements, from the checkpoint's tensor list (one rank holds them whole).
int64_t global_elements(const Config& cfg, const std::set<std::string>& names) {
  int64_t n = 0;
  for (const auto& [path, shape] : model_tensor_shapes(resolve(to_model_config(cfg, 13))))
    if (names.count(path.substr(std::strlen("/model/")))) n += shape.numel();
  return n;
}

// Of those, the matrices' and embeddings' elements: a frozen one has no gradient buffer either
// (ParamEntry::has_grad), counted from the model's own registrations.
int64_t no_grad_elements(const Config& cfg, const std::set<std::string>& names) {
  const ModelConfig mc = resolve(to_model_config(cfg, 13));
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  const Gpt model(mc, ps);
  int64_t n = 0;
  for (const ParamEntry& e : ps.entries())
    if (names.count(e.spec.name) && (e.spec.kind == ParamKind::Matrix || e.spec.kind == ParamKind::Embedding))
      n += e.spec.global_shape.numel();
  return n;
}

// train.freeze: the frozen parameters get no AdamW moments, and the frozen matrices and embeddings
// no gradient buffer (norms and biases keep theirs). On one rank the estimate is the allocator's
// peak exactly (as without freezing), and it is the unfrozen estimate less the frozen parameters'
// moments, 2 x 4 bytes per element, and the frozen matrices' gradients, 4 bytes per element
// (checkpoints off here: with them, their host copy too).
TEST(MemoryCheck, FrozenParametersAreEstimatedWithoutTheirMoments) {
  const std::vector<std::vector<std::string>> cases = {
      {"train.freeze=[\"blocks.0.*\", \"wte.weight\"]"},
      {"model.preset=\"llama\"", "model.recompute=\"full\"", "train.micro_batch=2", "train.freeze=[\"blocks.1.mlp.*\"]"},
  };
  for (const auto& overrides : cases) {
    const Config cfg = tiny(overrides);
    MemoryLayout frozen{1, 1, false};
    frozen.frozen = frozen_of(cfg);
    const int64_t elements = global_elements(cfg, frozen.frozen), no_grad = no_grad_elements(cfg, frozen.frozen);
    ASSERT_GT(elements, 0);
    ASSERT_GT(no_grad, 0);
    const MemoryEstimate e = estimate_training_memory(cfg, 13, frozen);
    const MemoryEstimate all = estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false});
    EXPECT_EQ(all.allocator_bytes() - e.allocator_bytes(), 8 * elements + 4 * no_grad)
        << ::testing::PrintToString(overrides);
    EXPECT_EQ(all.total() - e.total(), 8 * elements + 4 * no_grad) << ::testing::PrintToString(overrides);
    EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured_peak(cfg, MPI_COMM_NULL))
        << ::testing::PrintToString(overrides);
    MemoryLayout saving = frozen;  // with checkpoints, their host copy holds no moments of the frozen ones either
    saving.checkpoints = true;
    MemoryLayout saving_all{1, 1, true};
    EXPECT_EQ(estimate_training_memory(cfg, 13, saving_all).total() - estimate_training_memory(cfg, 13, saving).total(),
              16 * elements + 4 * no_grad);
  }
}

// A vision-language model with its tower frozen (stage 1 of docs/multimodal.md's recipe freezes the
// language model; freezing the encoder is the other common choice) and with its language model
// frozen: the tower's and the projector's elements are discounted like the language model's, and the
// estimate is the allocator's peak exactly.
TEST(MemoryCheck, AFrozenVisionTowerIsEstimatedWithoutItsMoments) {
  for (const char* freeze : {"train.freeze=[\"vision.*\", \"projector.*\"]",
                                    "train.freeze=[\"wte.*\", \"wpe.*\", \"blocks.*\", \"ln_f.*\"]"}) {
    const Config cfg = tiny_vlm({freeze});
    const ModelConfig mc = resolve(to_model_config(cfg, 15));
    std::vector<std::string> names;
    for (const auto& [path, shape] : model_tensor_shapes(mc)) names.push_back(path.substr(std::strlen("/model/")));
    MemoryLayout frozen{1, 1, false};
    frozen.frozen = frozen_parameters(cfg.train.freeze, names, mc.n_layer, {AttrMap{}, "the test"});
    int64_t elements = 0;
    for (const auto& [path, shape] : model_tensor_shapes(mc))
      if (frozen.frozen.count(path.substr(std::strlen("/model/")))) elements += shape.numel();
    ASSERT_GT(elements, 0) << freeze;
    int64_t no_grad = 0;  // the frozen matrices and embeddings: no gradient buffer
    {
      Allocator a;
      ParameterStore ps(a, DType::F32);
      const Gpt model(mc, ps);
      for (const ParamEntry& p : ps.entries())
        if (frozen.frozen.count(p.spec.name) && (p.spec.kind == ParamKind::Matrix || p.spec.kind == ParamKind::Embedding))
          no_grad += p.spec.global_shape.numel();
    }
    const MemoryEstimate e = estimate_training_memory(cfg, 15, frozen);
    const MemoryEstimate all = estimate_training_memory(cfg, 15, MemoryLayout{1, 1, false});
    EXPECT_EQ(all.allocator_bytes() - e.allocator_bytes(), 8 * elements + 4 * no_grad) << freeze;
    EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured_peak(cfg, MPI_COMM_NULL)) << freeze;
  }
}

// An in-run growth with train.freeze = ["original"]: before the growth nothing is frozen, after it
// the carried-over layers and the embeddings are. The run's allocator peak is the larger of the two
// models' estimates exactly; the check refuses the unfrozen run and starts the frozen one when the
// memory lies between their grown estimates.
TEST(MemoryCheck, AnInRunGrowthWithFreezeIsCheckedWithoutTheFrozenMoments) {
  const std::vector<std::string> growth = {"train.steps=4", "upscale.method=\"stack\"", "upscale.at_step=2"};
  std::vector<std::string> frozen_growth = growth;
  frozen_growth.push_back("train.freeze=[\"original\"]");
  const Config grows = tiny(growth), grows_frozen = tiny(frozen_growth);
  const Config deep = tiny({"train.steps=4", "model.n_layer=4", "train.freeze=[\"original\"]"});
  const Config plain = tiny({"train.steps=4"});
  MemoryLayout after{1, 1, false};
  after.frozen = frozen_of(deep, "0 1 0 1");  // stack: the first copy is original
  ASSERT_GT(global_elements(deep, after.frozen), 0);
  const MemoryEstimate before = estimate_training_memory(plain, 13, MemoryLayout{1, 1, false});
  const MemoryEstimate grown_frozen = estimate_training_memory(deep, 13, after);
  const MemoryEstimate grown_all = estimate_training_memory(deep, 13, MemoryLayout{1, 1, false});
  EXPECT_EQ(grown_all.total() - grown_frozen.total(),
            8 * global_elements(deep, after.frozen) + 4 * no_grad_elements(deep, after.frozen));
  EXPECT_EQ(measured_peak(grows_frozen, MPI_COMM_NULL),
            static_cast<size_t>(std::max(before.allocator_bytes(), grown_frozen.allocator_bytes())));
  ::setenv("TESSERA_TEST_MEMORY_AVAILABLE",
           std::to_string((std::max(before.total(), grown_frozen.total()) + grown_all.total()) / 2).c_str(), 1);
  EXPECT_TRUE(testing::throws_with([&] { Trainer t(grows, "", MPI_COMM_NULL); },
                                   {"does not fit", "2 -> 4 layers", "not enough memory"}));
  EXPECT_NO_THROW({ Trainer t(grows_frozen, "", MPI_COMM_NULL); });
  ::unsetenv("TESSERA_TEST_MEMORY_AVAILABLE");
}

// [lora]: the adapters are parameters with gradients and moments, the whole base is frozen (no
// moments, no gradient for its matrices and embeddings): counted exactly. An adapted layer's (B T, r)
// temporary is added to the block's peaks, an upper bound: exact when the peak falls in an adapted
// layer (every layer adapted, the first case), else above the allocator's peak by at most B T r
// elements (B T (r + F) with lora.dropout: the dropped input beside it, counted at each adapted layer). A LoRA run needs less than training the whole model.
TEST(MemoryCheck, LoraEstimateEqualsTheAllocatorsPeak) {
  struct Case {
    std::vector<std::string> overrides;
    bool exact;
  };
  const std::vector<Case> cases = {
      {{"lora.rank=2", "lora.targets=[\"attn.*\", \"mlp.*\"]"}, true},
      {{"model.preset=\"llama\"", "lora.rank=4", "lora.targets=[\"attn.q\", \"attn.v\"]"}, false},
      // lora.dropout: the dropped input (B T, in_local) beside A x at each adapted layer (model/lora.h).
      {{"lora.rank=2", "lora.targets=[\"attn.*\", \"mlp.*\"]", "lora.dropout=0.1"}, true},
      {{"model.preset=\"llama\"", "lora.rank=4", "lora.targets=[\"attn.q\", \"attn.v\"]", "lora.dropout=0.1"}, false},
      {{"lora.rank=2", "lora.targets=[\"mlp.proj\"]", "lora.dropout=0.1", "model.recompute=\"full\""}, false},
  };
  for (const Case& k : cases) {
    const Config cfg = tiny(k.overrides);
    const ModelConfig mc = resolve(to_model_config(cfg, 13));
    std::vector<std::string> names;
    for (const auto& [path, shape] : model_tensor_shapes(mc)) names.push_back(path.substr(std::strlen("/model/")));
    MemoryLayout lora{1, 1, false};
    lora.frozen = lora_frozen_base(names);
    ASSERT_LT(lora.frozen.size(), names.size());
    const int64_t estimate = estimate_training_memory(cfg, 13, lora).allocator_bytes();
    const int64_t peak = static_cast<int64_t>(measured_peak(cfg, MPI_COMM_NULL));
    // B <= global_batch on one rank
    // (with dropout, the dropped input beside it: at most the widest input, ffn_hidden)
    const int64_t widest = cfg.lora.dropout > 0 ? mc.ffn_hidden : 0;
    const int64_t tmp_bytes = cfg.train.global_batch * cfg.train.seq_len * (cfg.lora.rank + widest) * 4;
    if (k.exact) EXPECT_EQ(estimate, peak) << ::testing::PrintToString(k.overrides);
    EXPECT_GE(estimate, peak) << ::testing::PrintToString(k.overrides);
    EXPECT_LE(estimate - peak, tmp_bytes) << ::testing::PrintToString(k.overrides);
    Config full = cfg;
    full.lora.rank = 0;
    EXPECT_LT(estimate, estimate_training_memory(full, 13, MemoryLayout{1, 1, false}).allocator_bytes());
  }
}

// Under mpiexec -n 2 (tests/CMakeLists.txt): each rank's estimate against its own allocator peak,
// for tensor parallelism with sequence parallelism, and for data parallelism replicated and ZeRO-1.
// Exact as on one rank except the tp-partial gradient sum (sequence-parallel norm gradients
// packed into one buffer after backward, when the activations are gone): not modelled, and never
// the peak.
TEST(MemoryCheckLayouts, EstimateEqualsEachRanksPeak) {
  const MPI_Comm world = test_world();
  if (comm_size(world) != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (MemoryCheck.two_ranks)";
  struct Layout {
    std::vector<std::string> overrides;
    int64_t tp, dp;
  };
  for (const Layout& l : {Layout{{"parallel.tp=2", "parallel.sequence_parallel=true"}, 2, 1},
                          Layout{{"train.micro_batch=4"}, 1, 2}, Layout{{"train.micro_batch=4", "parallel.zero=1"}, 1, 2},
                          // parallel.tp_comm_compression: the error-feedback residuals, kept from step to step
                          Layout{{"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.tp_comm_compression=\"int8-ef\""}, 2, 1},
                          Layout{{"parallel.tp=2", "parallel.tp_comm_compression_backward=\"int8-ef\""}, 2, 1},
                          // forward "int8-ef" under full recomputation: the replay words a block keeps
                          Layout{{"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.tp_comm_compression=\"int8-ef\"",
                                  "model.recompute=\"full\""}, 2, 1},
                          Layout{{"parallel.tp=2", "parallel.tp_comm_compression_forward=\"int8-ef\"",
                                  "model.recompute_layers=1"}, 2, 1}}) {
    const Config cfg = tiny(l.overrides);
    const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{l.tp, l.dp, false});
    EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured_peak(cfg, world))
        << ::testing::PrintToString(l.overrides) << " on rank " << comm_rank(world);
  }
}

// parallel.tp_overlap_chunks under mpiexec -n 2 (tp 2 with sequence parallelism, 12 positions per
// rank): each rank's estimate against its own allocator peak, exactly, with the chunked edges'
// buffers (model/memory.h ModelMemoryLayout::tp_overlap_chunks) for chunks of 6 + 6, 4 x 3 and
// 3 + 3 + 2 + 2 + 2, under no, selective and full recomputation, and with the per-op recomputation
// of qkv and mlp_in, which re-gathers chunk by chunk; under bf16 within 5% above.
TEST(MemoryCheckLayouts, TpOverlapEstimateEqualsEachRanksPeak) {
  const MPI_Comm world = test_world();
  if (comm_size(world) != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (MemoryCheck.two_ranks)";
  const std::vector<std::string> tp = {"parallel.tp=2", "parallel.sequence_parallel=true"};
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{{"parallel.tp_overlap_chunks=2"},
                                             {"parallel.tp_overlap_chunks=3", "model.recompute=\"selective\""},
                                             {"parallel.tp_overlap_chunks=5", "model.recompute=\"full\""},
                                             {"parallel.tp_overlap_chunks=4", "model.recompute_ops=[\"qkv\", \"mlp_in\"]"},
                                             {"parallel.tp_overlap_chunks=3", "model.preset=\"llama\"",
                                              "model.recompute_ops=[\"all\"]"}}) {
    std::vector<std::string> overrides = tp;
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    const Config cfg = tiny(overrides);
    const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{2, 1, false});
    EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured_peak(cfg, world))
        << ::testing::PrintToString(overrides) << " on rank " << comm_rank(world);
  }
  // train.dtype = "bf16": the GEMMs' rounded operands are counted over whole rows as at k = 1 (a
  // chunk's GEMM rounds only its rows), so the estimate is an upper bound, within 5%.
  std::vector<std::string> bf16 = tp;
  bf16.insert(bf16.end(), {"parallel.tp_overlap_chunks=3", "train.dtype=\"bf16\""});
  const Config cfg = tiny(bf16);
  const double estimate = static_cast<double>(estimate_training_memory(cfg, 13, MemoryLayout{2, 1, false}).allocator_bytes());
  const double peak = static_cast<double>(measured_peak(cfg, world));
  EXPECT_GE(estimate, peak) << "bf16 on rank " << comm_rank(world);
  EXPECT_LE(estimate, 1.05 * peak) << "bf16 on rank " << comm_rank(world);
}

// kind = "vlm" under mpiexec -n 2: tensor parallelism (the encoder's blocks split, the rest of the
// tower replicated), with and without sequence parallelism, each rank's estimate against its peak
// exactly; context parallelism within 5%; two pipeline stages exactly (zb-h1 within 5% above).
TEST(MemoryCheckLayouts, VisionLanguageEstimateEqualsEachRanksPeak) {
  const MPI_Comm world = test_world();
  if (comm_size(world) != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (MemoryCheck.two_ranks)";
  for (const auto& overrides : std::vector<std::vector<std::string>>{
           {"parallel.tp=2"}, {"parallel.tp=2", "parallel.sequence_parallel=true"}}) {
    const Config cfg = tiny_vlm(overrides);
    const MemoryEstimate e = estimate_training_memory(cfg, 15, MemoryLayout{2, 1, false});
    EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured_peak(cfg, world))
        << ::testing::PrintToString(overrides) << " on rank " << comm_rank(world);
  }
  // cp 2: the language model's activations at seq_len / cp, the encoder's whole on every cp rank,
  // and the context attention's temporaries inside each block's attention: exact.
  const Config cfg = tiny_vlm({"parallel.cp=2", "train.seq_len=28"});
  EXPECT_EQ(static_cast<size_t>(estimate_training_memory(cfg, 15, MemoryLayout{1, 1, false}).allocator_bytes()),
            measured_peak(cfg, world))
      << "cp 2 on rank " << comm_rank(world);
  // pp 2 under each schedule the trainer runs: the first stage holds the tower and the patches of
  // its micro-batches in flight; exact. Then the encoder as a stage of its own (pp_layers = [0, 2]:
  // the tower, projector and embedding on the first stage, both blocks on the second), 1f1b and
  // zb-h1.
  struct PpCase {
    std::string schedule, layers;
  };
  for (const PpCase& k : {PpCase{"1f1b", ""}, PpCase{"gpipe", ""}, PpCase{"zb-h1", ""}, PpCase{"1f1b", "[0, 2]"},
                          PpCase{"zb-h1", "[0, 2]"}}) {
    std::vector<std::string> overrides = {"parallel.pp=2", "parallel.pp_schedule=\"" + k.schedule + "\"",
                                          "train.micro_batch=2"};
    if (!k.layers.empty()) overrides.push_back("parallel.pp_layers=" + k.layers);
    const Config pp = tiny_vlm(overrides);
    const int64_t rank = comm_rank(world);
    const std::string what = k.schedule + " " + k.layers + " on rank " + std::to_string(rank);
    const MemoryEstimate e = estimate_training_memory(pp, 15, MemoryLayout{1, 1, false, rank});
    const size_t measured = measured_peak(pp, world);
    if (k.schedule == "zb-h1") {  // the copies for W counted from B's peak on: an upper bound within 5%
      EXPECT_GE(static_cast<double>(e.allocator_bytes()), static_cast<double>(measured)) << what;
      EXPECT_LE(static_cast<double>(e.allocator_bytes()), 1.05 * static_cast<double>(measured)) << what;
    } else {
      EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured) << what;
    }
  }
}

// Under mpiexec -n 2, train.freeze on each layout's own terms: tp 2 (the frozen token table padded
// to 7 rows of 13 per rank; llama's one kv head replicated, k and v whole on both ranks), ZeRO-1 over
// dp 2 (only the trainable part padded and sharded), and two pipeline stages (each its own frozen
// part, the last stage's copy of the tied table included). Each rank's estimate is its peak exactly.
TEST(MemoryCheckLayouts, FrozenEstimateEqualsEachRanksPeak) {
  const MPI_Comm world = test_world();
  if (comm_size(world) != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (MemoryCheck.two_ranks)";
  const int64_t rank = comm_rank(world);
  struct Layout {
    std::vector<std::string> overrides;
    int64_t tp, dp, pp_rank;
  };
  for (const Layout& l :
       {Layout{{"parallel.tp=2", "parallel.sequence_parallel=true", "train.freeze=[\"wte.weight\", \"blocks.1.*\"]"}, 2, 1, -1},
        Layout{{"parallel.tp=2", "model.preset=\"llama\"", "model.n_kv_head=1", "train.freeze=[\"blocks.0.attn.*\"]"},
               2, 1, -1},
        Layout{{"train.micro_batch=4", "parallel.zero=1", "train.freeze=[\"blocks.0.ln*\", \"ln_f.*\"]"}, 1, 2, -1},
        Layout{{"model.n_layer=4", "train.micro_batch=2", "parallel.pp=2", "data.val_examples=1",
                "train.freeze=[\"wte.weight\", \"blocks.3.mlp.*\"]"},
               1, 1, rank}}) {
    const Config cfg = tiny(l.overrides);
    MemoryLayout layout{l.tp, l.dp, false, l.pp_rank};
    layout.frozen = frozen_of(cfg);
    const MemoryEstimate e = estimate_training_memory(cfg, 13, layout);
    const MemoryEstimate all = estimate_training_memory(cfg, 13, MemoryLayout{l.tp, l.dp, false, l.pp_rank});
    EXPECT_LT(e.total(), all.total()) << ::testing::PrintToString(l.overrides) << " on rank " << rank;
    EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured_peak(cfg, world))
        << ::testing::PrintToString(l.overrides) << " on rank " << rank;
  }
}

// An in-run growth onto another layout (dp 2 -> tp 2: [upscale] tp = 2) with train.freeze =
// ["original"]: each rank's allocator peak is the larger of the model before the growth on dp 2
// (nothing frozen yet) and the grown one on tp 2 (its carried-over layers frozen), exactly.
TEST(MemoryCheckLayouts, AGrowthOntoAnotherLayoutIsEstimatedThere) {
  const MPI_Comm world = test_world();
  if (comm_size(world) != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (MemoryCheck.two_ranks)";
  const std::vector<std::string> run = {"train.steps=4", "train.micro_batch=4"};
  std::vector<std::string> grows = run;
  for (const std::string s : {"upscale.method=\"stack\"", "upscale.at_step=2", "upscale.tp=2", "train.freeze=[\"original\"]"})
    grows.push_back(s);
  std::vector<std::string> grown = run;
  for (const std::string s : {"model.n_layer=4", "parallel.tp=2", "train.freeze=[\"original\"]"}) grown.push_back(s);
  MemoryLayout after{2, 1, false};
  after.frozen = frozen_of(tiny(grown), "0 1 0 1");  // stack: the first copy is original
  const int64_t before_bytes = estimate_training_memory(tiny(run), 13, MemoryLayout{1, 2, false}).allocator_bytes();
  const int64_t after_bytes = estimate_training_memory(tiny(grown), 13, after).allocator_bytes();
  EXPECT_EQ(measured_peak(tiny(grows), world), static_cast<size_t>(std::max(before_bytes, after_bytes)))
      << "before " << before_bytes << ", after " << after_bytes << " on rank " << comm_rank(world);
}

// Context parallelism: the activations are those of seq_len / cp positions, and the context
// attention's temporaries (parallel/context_attention.cpp) are counted where they are allocated,
// inside each block's attention forward and backward (model/memory.h ModelMemoryLayout::cp): the
// estimate is each rank's peak to the byte, ring and all-gather, under every recomputation policy
// (selective's peak falls outside the attention: counted as added to the model's peak, as before
// 2026-12-07, the estimate was 6.8% over there), in fp32 and bf16, both models. ZeRO-1 shards
// over dp x cp.
TEST(MemoryCheckLayouts, ContextParallelEstimateEqualsThePeak) {
  const MPI_Comm world = test_world();
  if (comm_size(world) != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (MemoryCheck.two_ranks)";
  std::vector<std::vector<std::string>> cases = {
      {"parallel.cp_comm=\"allgather\"", "parallel.zero=1"},
      {"model.preset=\"llama\"", "model.n_kv_head=2", "train.dtype=\"bf16\""},
  };
  for (const std::string recompute : {"none", "selective", "full"})
    for (const std::string comm : {"ring", "allgather"})
      cases.push_back({"model.recompute=\"" + recompute + "\"", "parallel.cp_comm=\"" + comm + "\""});
  cases.push_back({"model.preset=\"llama\"", "model.n_kv_head=2", "model.recompute=\"selective\"",
                   "train.dtype=\"bf16\"", "train.micro_batch=4"});
  for (std::vector<std::string> overrides : cases) {
    overrides.insert(overrides.begin(), {"parallel.cp=2", "train.seq_len=64"});
    const Config cfg = tiny(overrides);
    const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false});
    EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured_peak(cfg, world))
        << ::testing::PrintToString(overrides) << " on rank " << comm_rank(world);
  }
}

// Under mpiexec -n 2: two pipeline stages, each rank's estimate (its stage, the micro-batches its
// schedule keeps in flight, the tensors it sent) against its own allocator peak, for every schedule
// the trainer runs and every recomputation policy (gpt2; llama under 1f1b), model.recompute_layers
// once; "bubble" holds a micro-batch's recomputed contexts from its R to its backward, with
// model.recompute_ahead 1, 2 and 0 (unbounded: every R as early as the schedule puts it) up to that
// many at once. The issue asks for 5%; the estimate walks the schedule's actions as the trainer
// runs them and is exact.
TEST(MemoryCheckLayouts, PipelineStageEstimateEqualsEachRanksPeak) {
  const MPI_Comm world = test_world();
  if (comm_size(world) != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (MemoryCheck.two_ranks)";
  const int64_t rank = comm_rank(world);
  for (const std::string preset : {"gpt2", "llama"})
    for (const std::string schedule : {"gpipe", "1f1b", "interleaved"})
      for (const std::string recompute : {"none", "selective", "full", "bubble", "bubble K 2", "bubble K 0"}) {
        if (preset == "llama" && schedule != "1f1b") continue;  // the schedules are the model's business once
        std::vector<std::string> o = {"model.preset=\"" + preset + "\"", "model.n_layer=4", "train.micro_batch=2",
                                      "parallel.pp=2", "parallel.pp_schedule=\"" + schedule + "\"",
                                      "model.recompute=\"" + recompute.substr(0, recompute.find(' ')) + "\"",
                                      "data.val_examples=1"};
        // model.recompute_ahead: R's moved into earlier waits, up to 2 (or every one) held at once.
        if (recompute.find(" K ") != std::string::npos) o.push_back("model.recompute_ahead=" + recompute.substr(9));
        if (schedule == "interleaved") o.push_back("parallel.vpp=2");
        if (recompute == "selective" && schedule == "1f1b") o.push_back("model.recompute_layers=1");
        const Config cfg = tiny(o);
        const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false, rank});
        const size_t measured = measured_peak(cfg, world);
        if (static_cast<size_t>(e.allocator_bytes()) != measured)
          for (const MemoryItem& i : e.items) std::cerr << "  " << i.bytes << "  " << i.what << "\n";
        EXPECT_EQ(static_cast<size_t>(e.allocator_bytes()), measured)
            << ::testing::PrintToString(o) << " on rank " << rank << ": " << (double(e.allocator_bytes()) / measured - 1) * 100 << "%";
      }
}

// Zero-bubble (zb-h1) under mpiexec -n 2: each B keeps copies of the GEMM inputs for its W
// (model/weight_grads.h), counted by the walk from B's peak on (model/memory.cpp: a few buffers
// early), so the estimate is an upper bound here; the issue asks for 5%.
TEST(MemoryCheckLayouts, ZeroBubbleEstimateIsWithinFivePercentAboveEachRanksPeak) {
  const MPI_Comm world = test_world();
  if (comm_size(world) != 2) GTEST_SKIP() << "runs under mpiexec -n 2 (MemoryCheck.two_ranks)";
  const int64_t rank = comm_rank(world);
  for (const std::string preset : {"gpt2", "llama"})
    for (const std::string recompute : {"none", "selective", "full", "bubble", "bubble K 2"}) {
      std::vector<std::string> o = {"model.preset=\"" + preset + "\"", "model.n_layer=4", "train.micro_batch=2",
                                    "parallel.pp=2", "parallel.pp_schedule=\"zb-h1\"",
                                    "model.recompute=\"" + recompute.substr(0, recompute.find(' ')) + "\"",
                                    "data.val_examples=1"};
      if (recompute.find(" K ") != std::string::npos) o.push_back("model.recompute_ahead=" + recompute.substr(9));
      const Config cfg = tiny(o);
      const double estimate =
          static_cast<double>(estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false, rank}).allocator_bytes());
      const double peak = static_cast<double>(measured_peak(cfg, world));
      std::cout << "zb-h1 " << preset << " recompute=" << recompute << " rank " << rank << ": estimate / peak = "
                << estimate / peak << "\n";
      EXPECT_GE(estimate, peak) << preset << ", " << recompute << " on rank " << rank;
      EXPECT_LE(estimate, 1.05 * peak) << preset << ", " << recompute << " on rank " << rank;
    }
}

// An in-run growth ([upscale]) is checked at the grown depth before anything is allocated: with
// memory for the 2-layer model but not for the 4 layers it grows into, the run is refused, naming
// the growth; without the growth the same config starts.
TEST(MemoryCheck, AnInRunGrowthIsCheckedAtTheGrownDepth) {
  const std::vector<std::string> growth = {"train.steps=4", "upscale.method=\"stack\"", "upscale.at_step=2"};
  Config grows = tiny(growth);
  Config deep = tiny({"train.steps=4", "model.n_layer=4"});
  Config plain = tiny({"train.steps=4"});
  const MemoryLayout one{1, 1, false};
  const int64_t small = estimate_training_memory(plain, 13, one).total();
  const int64_t large = estimate_training_memory(deep, 13, one).total();
  ASSERT_LT(small, large);
  ::setenv("TESSERA_TEST_MEMORY_AVAILABLE", std::to_string((small + large) / 2).c_str(), 1);
  EXPECT_TRUE(testing::throws_with([&] { Trainer t(grows, "", MPI_COMM_NULL); },
                          {"does not fit", "[upscale] method = \"stack\" at step 2: 2 -> 4 layers",
                           "not enough memory"}));
  EXPECT_NO_THROW({ Trainer t(plain, "", MPI_COMM_NULL); });
  ::unsetenv("TESSERA_TEST_MEMORY_AVAILABLE");
}

// train.micro_batch = 0: the largest divisor of global_batch / dp whose estimate fits what is
// available (TESSERA_TEST_MEMORY_AVAILABLE stands for the node's memory).
TEST(MemoryCheck, AutoMicroBatchIsTheLargestThatFitsTheAvailableMemory) {
  const Config cfg = tiny({"train.micro_batch=0", "train.global_batch=64"});
  const MemoryLayout one{1, 1, false};
  const auto estimate = [&](int64_t micro_batch) {
    Config c = cfg;
    c.train.micro_batch = micro_batch;
    return estimate_training_memory(c, 13, one).total();
  };
  const auto chosen = [&](int64_t available, const MemoryLayout& layout) {
    ::setenv("TESSERA_TEST_MEMORY_AVAILABLE", std::to_string(available).c_str(), 1);
    const int64_t b = with_auto_micro_batch(cfg, 13, layout, MPI_COMM_NULL).train.micro_batch;
    ::unsetenv("TESSERA_TEST_MEMORY_AVAILABLE");
    return b;
  };
  ASSERT_LT(estimate(8), estimate(16));
  EXPECT_EQ(chosen(int64_t{1} << 50, one), 64);
  // At most half of what is available (kAutoMicroBatchMemoryShare).
  EXPECT_EQ(chosen(estimate(8) + estimate(16), one), 8);
  EXPECT_EQ(chosen(2 * estimate(16), one), 16);
  EXPECT_EQ(chosen(2 * estimate(16) - 2, one), 8);
  EXPECT_EQ(chosen(1000, one), 1);  // nothing fits: 1, and the memory check then refuses the run
  EXPECT_EQ(chosen(int64_t{1} << 50, MemoryLayout{1, 4, false}), 16);  // 64 / dp 4
  // A micro_batch of the config's own is kept, even when it does not fit.
  EXPECT_EQ(with_auto_micro_batch(tiny({}), 13, one, MPI_COMM_NULL).train.micro_batch, 8);
  EXPECT_THROW(with_auto_micro_batch(cfg, 13, MemoryLayout{1, 3, false}, MPI_COMM_NULL), Error);  // 64 / 3
  // The trainer resolves it before anything reads it: one micro-batch of 64 per step.
  EXPECT_EQ(Trainer(cfg, "", MPI_COMM_NULL).grad_accum_steps(), 1);
}

// ---- Pipeline stages (issue #13) ----

int64_t item_bytes(const MemoryEstimate& e, const std::string& starts) {
  for (const MemoryItem& i : e.items)
    if (i.what.rfind(starts, 0) == 0) return i.bytes;
  std::string all;
  for (const MemoryItem& i : e.items) all += "\n  " + i.what;
  ADD_FAILURE() << "no item \"" << starts << "...\" among" << all;
  return -1;
}

Config pipeline(int64_t pp, int64_t m, const std::string& schedule, std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"model.n_layer=8", "train.global_batch=" + std::to_string(m), "train.micro_batch=1",
                                "parallel.pp=" + std::to_string(pp), "parallel.pp_schedule=\"" + schedule + "\"",
                                "data.val_examples=1"};
  if (schedule == "interleaved") o.push_back("parallel.vpp=2");
  o.insert(o.end(), more.begin(), more.end());
  return tiny(o);
}

// The micro-batches in flight the estimate names, from the generator's action lists: gpipe all m,
// 1F1B pp - rank on rank `rank` (the first stage the most), interleaved Megatron's
// 2 (pp - rank - 1) + (vpp - 1) pp + 1 chunks (at most all m vpp).
TEST(MemoryCheckPipeline, MicroBatchesInFlightFollowTheSchedules) {
  for (int64_t pp : {2, 4})
    for (int64_t m : {pp, 2 * pp, 3 * pp, 12 * pp})  // 12 pp: extrapolated
      for (int64_t r = 0; r < pp; ++r) {
        const std::string where = "pp " + std::to_string(pp) + ", m " + std::to_string(m) + ", rank " + std::to_string(r);
        const auto in_flight = [&](const std::string& schedule, int64_t n, const char* what) {
          const MemoryEstimate e = estimate_training_memory(pipeline(pp, m, schedule), 13, MemoryLayout{1, 1, false, r});
          item_bytes(e, "activations of " + std::to_string(n) + what + " in flight of " + std::to_string(m));
        };
        SCOPED_TRACE(where);
        in_flight("gpipe", m, " micro-batches");
        in_flight("1f1b", pp - r, " micro-batches");
        in_flight("interleaved", std::min(2 * (pp - r - 1) + pp + 1, 2 * m), " micro-batch chunks");
      }
}

// The estimate of a long step is extrapolated from two short ones (memory_check.cpp
// pipeline_peak): that holds because past a few groups of pp micro-batches the walked peak grows
// by the same bytes for every pp more. Checked on the walked range (m <= 8 pp) and across the
// switch to extrapolation, for each schedule and recomputation policy (bubble with
// model.recompute_ahead 1, 2 and unbounded), on every rank.
TEST(MemoryCheckPipeline, LongStepsFollowTheLineOfTheWalkedOnes) {
  const int64_t pp = 2;
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved", "zb-h1"})
    for (const std::string recompute : {"none", "selective", "full", "bubble", "bubble K 2", "bubble K 0"})
      for (int64_t r = 0; r < pp; ++r) {
        std::vector<int64_t> bytes;
        for (int64_t m = 4 * pp; m <= 14 * pp; m += pp) {
          std::vector<std::string> o = {"model.recompute=\"" + recompute.substr(0, recompute.find(' ')) + "\""};
          if (recompute.find(" K ") != std::string::npos) o.push_back("model.recompute_ahead=" + recompute.substr(9));
          const Config cfg = pipeline(pp, m, schedule, o);
          const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false, r});
          bytes.push_back(item_bytes(e, "activations of "));
        }
        for (size_t i = 2; i < bytes.size(); ++i)
          EXPECT_EQ(bytes[i] - bytes[i - 1], bytes[1] - bytes[0])
              << schedule << ", " << recompute << ", rank " << r << ", m " << 4 * pp + pp * static_cast<int64_t>(i);
      }
}

// model.recompute_ahead under train.max_memory_gib: the largest K up to the one asked for (0: up to
// every R, m vpp) whose estimate of the rank that needs the most fits the cap, found against the
// estimates of each K by hand; 1 when none fits (the run is then refused as before); without a
// cap, the request. On two stages of 1F1B (rank 0 holds R0 and R1 in its wait before B0 with
// K >= 2, so its estimate grows from K = 1 to 2) and interleaved.
TEST(MemoryCheckPipeline, RecomputeAheadIsTheLargestWithinTheCap) {
  for (const std::string schedule : {"1f1b", "interleaved"}) {
    const Config base = pipeline(2, 8, schedule, {"model.recompute=\"bubble\""});
    const MemoryLayout layout{1, 1, false};
    const int64_t all = 8 * base.parallel.vpp;
    std::vector<int64_t> bytes(static_cast<size_t>(all + 1));
    for (int64_t k = 1; k <= all; ++k) {
      Config c = base;
      c.model.recompute_ahead = k;
      bytes[static_cast<size_t>(k)] = estimate_training_memory(c, 13, layout).total();
    }
    ASSERT_LT(bytes[1], bytes[2]) << schedule << ": K = 2 holds more than K = 1";
    const auto chosen = [&](int64_t asked, double cap_bytes) {
      Config c = base;
      c.model.recompute_ahead = asked;
      c.train.max_memory_gib = cap_bytes / (1024.0 * 1024.0 * 1024.0);
      return recompute_ahead_within_cap(c, 13, layout);
    };
    // By hand: the largest k <= asked with bytes[k] <= cap.
    const auto expected = [&](int64_t asked, int64_t cap) {
      int64_t k = asked == 0 ? all : std::min(asked, all);
      while (k > 1 && bytes[static_cast<size_t>(k)] > cap) --k;
      return k;
    };
    for (int64_t asked : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, all + 5})
      for (int64_t k = 1; k <= all; ++k) {
        const int64_t cap = bytes[static_cast<size_t>(k)];  // exactly the estimate of K = k, and 1 byte less
        EXPECT_EQ(chosen(asked, static_cast<double>(cap)), expected(asked, cap))
            << schedule << ", asked " << asked << ", cap at K = " << k;
        EXPECT_EQ(chosen(asked, static_cast<double>(cap - 1)), expected(asked, cap - 1))
            << schedule << ", asked " << asked << ", cap below K = " << k;
      }
    EXPECT_EQ(chosen(2, 0.5 * static_cast<double>(bytes[1])), 1) << schedule << ": nothing fits";
    Config uncapped = base;
    uncapped.model.recompute_ahead = 0;
    EXPECT_EQ(recompute_ahead_within_cap(uncapped, 13, layout), all) << schedule;
    uncapped.model.recompute_ahead = 3;
    EXPECT_EQ(with_recompute_ahead(uncapped, 13, layout).model.recompute_ahead, 3) << schedule;
  }
}

// Two stages of a 4-layer gpt2: each stage's parameters are its own; the last holds a copy of the
// tied table; without a rank the estimate is the larger one's (what every rank on a node is counted
// at). The activations are checked against the allocator under mpiexec (MemoryCheckLayouts).
TEST(MemoryCheckPipeline, EachStageHoldsItsPart) {
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    const Config cfg = tiny({"model.n_layer=4", "train.global_batch=8", "train.micro_batch=2", "parallel.pp=2",
                             "parallel.pp_schedule=\"" + schedule + "\"", "data.val_examples=1"});
    const ModelConfig mc = resolve(to_model_config(cfg, 13));
    const int64_t B = 2, T = 24, C = 32;
    const std::vector<StageSpec> cut = cut_stages(mc, T, 2);
    int64_t parameters = 0, most = 0;
    for (int64_t r = 0; r < 2; ++r) {
      const StageSpec& c = cut[static_cast<size_t>(r)];
      const ModelMemory mm = model_memory(mc, {B, T, 1, false, Recompute::None, c});
      const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false, r});
      const std::string where = schedule + ", stage " + std::to_string(r);
      EXPECT_EQ(item_bytes(e, "parameters ("), 4 * mm.parameters) << where;
      EXPECT_EQ(item_bytes(e, "gradients"), 4 * mm.parameters) << where;
      EXPECT_EQ(item_bytes(e, "AdamW moments"), 8 * mm.parameters) << where;
      parameters += mm.parameters;
      most = std::max(most, e.total());
    }
    EXPECT_EQ(parameters, model_memory(mc, {B, T, 1, false}).parameters + mc.vocab_size * C);
    EXPECT_EQ(estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false}).total(), most) << schedule;
  }
}

// Recomputation lowers a stage's estimate: full < selective < none, and model.recompute_layers
// moves selective towards full.
TEST(MemoryCheckPipeline, RecomputationLowersEachStagesActivations) {
  for (int64_t r = 0; r < 2; ++r) {
    const auto acts = [&](std::vector<std::string> o) {
      return item_bytes(estimate_training_memory(pipeline(2, 8, "1f1b", o), 13, MemoryLayout{1, 1, false, r}),
                        "activations of ");
    };
    const int64_t none = acts({}), selective = acts({"model.recompute=\"selective\""}),
                  full = acts({"model.recompute=\"full\""}),
                  mixed = acts({"model.recompute=\"selective\"", "model.recompute_layers=2"});
    EXPECT_LT(full, mixed) << "rank " << r;
    EXPECT_LT(mixed, selective) << "rank " << r;
    EXPECT_LT(selective, none) << "rank " << r;
  }
}

// An automatic micro-batch under pp is one the schedule runs: 1f1b needs pp micro-batches per step,
// so of global_batch 8 on pp 4 the largest is 2 (4 micro-batches); gpipe runs one micro-batch of 8.
TEST(MemoryCheckPipeline, AutoMicroBatchLeavesTheScheduleEnoughMicroBatches) {
  ::setenv("TESSERA_TEST_MEMORY_AVAILABLE", std::to_string(int64_t{1} << 50).c_str(), 1);
  for (const auto& [schedule, want] : {std::pair<std::string, int64_t>{"1f1b", 2}, {"gpipe", 8}}) {
    const Config cfg = tiny({"model.n_layer=4", "train.micro_batch=0", "train.global_batch=8", "parallel.pp=4",
                             "parallel.pp_schedule=\"" + schedule + "\""});
    EXPECT_EQ(with_auto_micro_batch(cfg, 13, MemoryLayout{1, 1, false}, MPI_COMM_NULL).train.micro_batch, want)
        << schedule;
  }
  ::unsetenv("TESSERA_TEST_MEMORY_AVAILABLE");
}

// What pipeline parallelism is for: the memory per rank falls as stages are added (parameters,
// gradients and moments most).
TEST(MemoryCheckPipeline, MemoryPerRankFallsWithPp) {
  int64_t before = -1;
  for (int64_t pp : {1, 2, 4}) {
    const Config cfg = tiny({"model.n_layer=8", "model.n_embd=64", "train.micro_batch=1", "parallel.pp=" +
                             std::to_string(pp)});
    const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{1, 1, false});
    if (before >= 0) {
      EXPECT_LT(e.total(), before) << "pp " << pp;
    }
    before = e.total();
  }
}

TEST(MemoryCheck, RefusalListsTheItemsLargestFirstWithTheirKeys) {
  const Config cfg = tiny({"train.seq_len=1000000"});
  const MemoryEstimate e = estimate_training_memory(cfg, 13, MemoryLayout{});
  EXPECT_EQ(memory_problem(e, 1, AvailableMemory{e.total(), "test"}), "");
  EXPECT_EQ(memory_problem(e, 1, AvailableMemory{-1, "unknown"}), "");  // unknown: not refused
  const std::string m = memory_problem(e, 2, AvailableMemory{e.total(), "MemAvailable in /proc/meminfo"});
  for (const char* part : {"not enough memory", "per rank x 2 ranks on this node", "is available (MemAvailable in /proc/meminfo)",
                           "activations and temporaries of one micro-batch (8 x 1000000 tokens)",
                           "train.micro_batch, train.seq_len, model.recompute = \"selective\" or \"full\", model.recompute_layers",
                           "train.memory_check = false"})
    EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
  EXPECT_LT(m.find("activations and temporaries"), m.find("parameters")) << "largest first: " << m;
}

TEST(MemoryCheck, AvailableMemoryComesFromTheSystemOrTheTestOverride) {
  const AvailableMemory a = available_host_memory();
  EXPECT_GT(a.bytes, 0) << a.source;
  EXPECT_FALSE(a.source.empty());
  ::setenv("TESSERA_TEST_MEMORY_AVAILABLE", "12345", 1);
  EXPECT_EQ(available_host_memory().bytes, 12345);
  ::unsetenv("TESSERA_TEST_MEMORY_AVAILABLE");
}

// The issue's configs: seq_len = 1e8 was killed by the OOM killer, micro_batch = global_batch = 1e8
// built a 13 GB batch for 5 minutes, a 10000-layer 4096-wide model sat initializing; n_layer =
// 2^63 - 1 died in std::vector. Each is refused in well under a second (about 0.1 s here; the
// bound allows for a loaded machine), naming the keys. prlimit caps the address space at 4 GiB
// so that a build without the check fails fast instead of exhausting the machine.
TEST(MemoryCheck, AbsurdConfigsAreRefusedAtOnceNamingTheKeys) {
  const fs::path dir = temp_dir("memory_absurd");
  std::ofstream(dir / "tiny.toml") << kTinyConfig;
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"train.seq_len=100000000"}, {"not enough memory", "100000000 tokens", "train.seq_len"}},
      {{"train.micro_batch=100000000", "train.global_batch=100000000"},
       {"not enough memory", "100000000 x 24 tokens", "train.micro_batch", "token batches"}},
      {{"model.n_layer=10000", "model.n_embd=4096", "model.n_head=32"},
       {"not enough memory", "parameters (", "model.n_layer, model.n_embd"}},
      {{"model.n_layer=9223372036854775807"}, {"model.n_layer = 9223372036854775807", "must be in [1, 65536]"}},
  };
  for (const auto& [sets, expected] : cases) {
    std::vector<std::string> args = {"--as=4294967296", TESSERA_BINARY, "train", (dir / "tiny.toml").string(),
                                     "--run-dir", (dir / "run").string()};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    const auto t0 = std::chrono::steady_clock::now();
    const RunResult r = run_program("/usr/bin/prlimit", args, dir);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_LT(seconds, 5.0) << r.output;
    for (const auto& part : expected) EXPECT_NE(r.output.find(part), std::string::npos) << part << " not in: " << r.output;
    EXPECT_EQ(r.output.find("| loss"), std::string::npos) << r.output;  // no training step ran
  }
  fs::remove_all(dir);
}

// An expert can start anyway: train.memory_check = false turns the refusal into a warning.
TEST(MemoryCheck, MemoryCheckFalseWarnsAndStarts) {
  const fs::path dir = temp_dir("memory_off");
  std::ofstream(dir / "tiny.toml") << kTinyConfig;
  const std::vector<std::string> env = {"TESSERA_TEST_MEMORY_AVAILABLE=1000"};
  std::vector<std::string> args = {"train", (dir / "tiny.toml").string(), "--run-dir", (dir / "run").string(),
                                   "--set", "train.steps=2"};
  RunResult r = run_tessera(args, dir, {}, SIGINT, env);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("and 1000 B is available (TESSERA_TEST_MEMORY_AVAILABLE)"), std::string::npos) << r.output;
  args.insert(args.end(), {"--set", "train.memory_check=false"});
  r = run_tessera(args, dir, {}, SIGINT, env);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: train.memory_check = false: starting anyway"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 2 steps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("memory estimate: "), std::string::npos) << r.output;  // the header line
  EXPECT_NE(r.output.find(" the progress line's mem) of 1000 B available"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

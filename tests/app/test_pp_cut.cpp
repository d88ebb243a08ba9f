// Tests app/pp_cut.h (parallel.pp_cut = "measured"): the config keys' rules; the timing pass gives a
// positive time for every block, the embedding and the head, and for a vision-language model's
// tower; injected part times give cut_by_time's cut, which differs from the FLOPs cut when the head
// is slower than the formula says; train.max_memory_gib moves the cut to one whose every stage
// fits; with the interleaved schedule (vpp 2) the same, the cut in the pp_layers form; the FLOPs cut
// kept where it is predicted faster (unequal chunks), unless its stages exceed the memory cap; end to end
// (`slow`): `tessera train` on pp 2 (and pp 2 vpp 2) with the measured cut prints it and trains the
// losses of the same cut given as parallel.pp_layers, and the 1-rank run's within 1e-5.
#include "app/pp_cut.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_testing.h"
#include "error_testing.h"
#include "layout_testing.h"
#include "mpi_testing.h"
#include "parallel/mpi.h"
#include "model/stage_cut.h"
#include "vlm_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;
using testing::throws_with;

constexpr int64_t kVocab = 64;

// kTinyConfig with four blocks, micro-batches of 2 (four per step), on two stages.
Config tiny(const std::vector<std::string>& more = {}) {
  std::vector<std::string> sets = {"model.n_layer=4", "train.micro_batch=2", "parallel.pp=2"};
  sets.insert(sets.end(), more.begin(), more.end());
  return parse_config_string(testing::kTinyConfig, "tiny.toml", sets);
}

TEST(PpCutConfig, MeasuredRefusesAHandCutAndADepthVppDoesNotDivide) {
  EXPECT_EQ(tiny().parallel.pp_cut, "flops");
  EXPECT_EQ(tiny({"parallel.pp_cut=\"measured\""}).parallel.pp_cut, "measured");
  EXPECT_TRUE(throws_with([] { tiny({"parallel.pp_cut=\"measured\"", "parallel.pp_layers=[1, 3]"}); },
                          {"parallel.pp_cut", "parallel.pp_layers", "set one of them"}));
  // The interleaved schedule: accepted where vpp divides the depth (each stage's chunks equal).
  EXPECT_EQ(tiny({"parallel.pp_cut=\"measured\"", "parallel.vpp=2", "parallel.pp_schedule=\"interleaved\""}).parallel.vpp, 2);
  EXPECT_TRUE(throws_with([] {
    tiny({"parallel.pp_cut=\"measured\"", "parallel.vpp=2", "parallel.pp_schedule=\"interleaved\"", "model.n_layer=5"});
  }, {"parallel.pp_cut", "parallel.vpp = 2", "model.n_layer = 5", "not a multiple"}));
  EXPECT_TRUE(throws_with([] { tiny({"parallel.pp_cut=\"timed\""}); }, {"parallel.pp_cut", "timed"}));
}

TEST(PpCut, TimesEveryPartOfATinyGpt) {
  const Config cfg = tiny();
  const ModelConfig mc = resolve(to_model_config(cfg, kVocab));
  const PartTimes t = measure_part_times(cfg, mc, Exec::cpu(), 2);
  ASSERT_EQ(t.blocks.size(), 4u);
  for (double b : t.blocks) {
    EXPECT_GT(b, 0);
    EXPECT_TRUE(std::isfinite(b));
  }
  EXPECT_GE(t.embedding, 0);
  EXPECT_GE(t.head, 0);
  EXPECT_EQ(t.vision, 0);
  // A stage built whole from the same parts: positive and finite (its relation to the parts' sum is
  // what the header prints, not asserted: timings on a shared machine are noisy).
  const double s = measure_stage_time(cfg, mc, Exec::cpu(), {3, 1}, 1, 2);
  EXPECT_GT(s, 0);
  EXPECT_TRUE(std::isfinite(s));
}

// A vision tower of 4 blocks of width 64 (and its projector) against a language block of width 32:
// the tower's time is measured, and larger than one language block's.
TEST(PpCut, TimesTheVisionTowerOfAVlm) {
  const Config cfg = parse_config_string(testing::tiny_vlm_toml(1, 0), "vlm.toml",
                                         {"model.n_layer=2", "vision.n_layer=4", "vision.n_embd=64"});
  const ModelConfig mc = resolve(to_model_config(cfg, 15));
  const PartTimes t = measure_part_times(cfg, mc, Exec::cpu(), 3);
  ASSERT_EQ(t.blocks.size(), 2u);
  EXPECT_GT(t.vision, t.blocks[0]);
}

// Every block 1 time unit, the embedding and the head at the FLOPs formula's weights, the head
// head_extra units slower.
PartTimer unit_blocks_timer(const LayerCosts& costs, double head_extra) {
  return [costs, head_extra](const Config&, const ModelConfig& m, const Exec&) {
    PartTimes t;
    t.blocks.assign(static_cast<size_t>(m.n_layer), 1.0);
    t.embedding = costs.weight(costs.embedding);
    t.head = costs.weight(costs.head) + head_extra;
    return t;
  };
}

// Injected times (a head 4 blocks slower than the FLOPs formula's weight): the cut is
// cut_by_time's, not the FLOPs rule's, and its predicted slowest stage is faster.
TEST(PpCut, InjectedTimesGiveTheirCut) {
  const Config cfg = tiny();
  const ModelConfig mc = resolve(to_model_config(cfg, kVocab));
  const PartTimer timer = unit_blocks_timer(layer_costs(mc, cfg.train.seq_len), 4.0);
  const MeasuredCut cut = measured_cut(cfg, mc, kVocab, MemoryLayout{1, 1, false}, Exec::cpu(), MPI_COMM_NULL, timer, false);
  EXPECT_EQ(cut.blocks, cut_by_time(timer(cfg, mc, Exec::cpu()), 2, false));
  EXPECT_NE(cut.blocks, cut.flops_blocks);
  EXPECT_LT(*std::max_element(cut.predicted.begin(), cut.predicted.end()),
            *std::max_element(cut.flops_predicted.begin(), cut.flops_predicted.end()));
  EXPECT_TRUE(cut.measured.empty());
  const std::string header = cut.describe();
  EXPECT_NE(header.find("blocks per stage [" + std::to_string(cut.blocks[0]) + ", " + std::to_string(cut.blocks[1]) + "]"),
            std::string::npos) << header;
  EXPECT_NE(header.find("the FLOPs cut's predicted"), std::string::npos) << header;
}

// The interleaved schedule (8 blocks, 2 stages of 2 chunks), a head 4 blocks slower than the formula:
// the cut is cut_by_time's with vpp 2, in the pp_layers form, not the FLOPs rule's chunks, and its
// predicted slowest stage is faster; the header names the chunks.
TEST(PpCut, InjectedTimesGiveTheirInterleavedCut) {
  const Config cfg = tiny({"model.n_layer=8", "parallel.vpp=2", "parallel.pp_schedule=\"interleaved\"",
                           "parallel.pp_cut=\"measured\""});
  const ModelConfig mc = resolve(to_model_config(cfg, kVocab));
  const PartTimer timer = unit_blocks_timer(layer_costs(mc, cfg.train.seq_len), 4.0);
  const MeasuredCut cut = measured_cut(cfg, mc, kVocab, MemoryLayout{1, 1, false}, Exec::cpu(), MPI_COMM_NULL, timer, false);
  EXPECT_EQ(cut.blocks, cut_by_time(timer(cfg, mc, Exec::cpu()), 2, false, {}, 2));
  ASSERT_EQ(cut.flops_blocks.size(), 4u);  // the FLOPs rule's chunks
  EXPECT_NE(stage_chunks(cut.blocks, 2), cut.flops_blocks);
  EXPECT_LT(*std::max_element(cut.predicted.begin(), cut.predicted.end()),
            *std::max_element(cut.flops_predicted.begin(), cut.flops_predicted.end()));
  // The interleaved step of 4 micro-batches, simulated from the same times: shorter too.
  EXPECT_EQ(cut.micro_batches, 4);
  EXPECT_LT(cut.simulated_step, cut.flops_simulated_step);
  const std::string header = cut.describe();
  EXPECT_NE(header.find("in parallel.vpp = 2 equal chunks each: chunks ["), std::string::npos) << header;
  EXPECT_NE(header.find("step of 4 micro-batches, simulated from the parts (ms): "), std::string::npos) << header;
  EXPECT_NE(header.find("the FLOPs rule's chunks: ["), std::string::npos) << header;
  // Predicted faster: the measured cut runs, written into the config as parallel.pp_layers.
  EXPECT_FALSE(cut.flops_kept);
  EXPECT_NE(header.find("\n  runs the measured cut: its predicted simulated step "), std::string::npos) << header;
  Config run = cfg;
  apply_measured_cut(run, mc, kVocab, MemoryLayout{1, 1, false}, Exec::cpu(), MPI_COMM_NULL, timer);
  EXPECT_EQ(run.parallel.pp_layers, cut.blocks);
  EXPECT_EQ(run.parallel.pp_cut, "flops");
}

// Six blocks of equal time on pp 2 vpp 2 (the end parts at the formula's weights): the equal-chunk
// cuts are [2, 4] and [4, 2] (a stage of 4 blocks), while the FLOPs rule's unequal chunks give each
// stage 3 (docs/parallel.md, "The measured cut and the FLOPs cut"): the FLOPs cut is predicted
// faster and kept: the config keeps the FLOPs rule (no parallel.pp_layers), and the header says so.
TEST(PpCut, FlopsCutIsKeptWhenPredictedFaster) {
  const Config cfg = tiny({"model.n_layer=6", "parallel.vpp=2", "parallel.pp_schedule=\"interleaved\"",
                           "parallel.pp_cut=\"measured\""});
  const ModelConfig mc = resolve(to_model_config(cfg, kVocab));
  const PartTimer timer = unit_blocks_timer(layer_costs(mc, cfg.train.seq_len), 0.0);
  const MeasuredCut cut = measured_cut(cfg, mc, kVocab, MemoryLayout{1, 1, false}, Exec::cpu(), MPI_COMM_NULL, timer, false);
  ASSERT_EQ(cut.flops_blocks.size(), 4u);
  // The premise: the FLOPs chunks hold 3 blocks per stage, the measured cut 4 on one stage.
  EXPECT_EQ(cut.flops_blocks[0] + cut.flops_blocks[2], 3) << "FLOPs chunks";
  EXPECT_EQ(*std::max_element(cut.blocks.begin(), cut.blocks.end()), 4);
  EXPECT_EQ(cut.micro_batches, 4);
  EXPECT_LT(cut.flops_simulated_step, cut.simulated_step);
  EXPECT_EQ(cut.flops_unfit_stage, -1);
  EXPECT_TRUE(cut.flops_kept);
  const std::string header = cut.describe();
  EXPECT_NE(header.find("\n  runs the FLOPs rule's cut: its predicted simulated step "), std::string::npos) << header;
  Config run = cfg;
  const std::string line = apply_measured_cut(run, mc, kVocab, MemoryLayout{1, 1, false}, Exec::cpu(), MPI_COMM_NULL, timer);
  EXPECT_TRUE(run.parallel.pp_layers.empty());
  EXPECT_EQ(run.parallel.pp_cut, "flops");
  EXPECT_NE(line.find("runs the FLOPs rule's cut"), std::string::npos) << line;
}

// A VLM whose injected tower outweighs its two language blocks: the encoder's stage alone, [0, 2]
// (the memory check reads stage 1 holding every block).
TEST(PpCut, HeavyTowerGetsTheEncodersStage) {
  const Config cfg = parse_config_string(testing::tiny_vlm_toml(1, 0), "vlm.toml", {"model.n_layer=2", "parallel.pp=2"});
  const ModelConfig mc = resolve(to_model_config(cfg, 15));
  const PartTimer timer = [](const Config&, const ModelConfig& m, const Exec&) {
    PartTimes t;
    t.blocks.assign(static_cast<size_t>(m.n_layer), 1.0);
    t.vision = 10.0;
    return t;
  };
  EXPECT_EQ(measured_cut(cfg, mc, 15, MemoryLayout{1, 1, false}, Exec::cpu(), MPI_COMM_NULL, timer, false).blocks,
            (std::vector<int64_t>{0, 2}));
}

// The estimate of pipeline stage r holding n of the L blocks (the others on the other stage).
double stage_bytes(const Config& cfg, int64_t r, int64_t n, int64_t L = 4) {
  Config c = cfg;
  c.parallel.pp_layers = r == 0 ? std::vector<int64_t>{n, L - n} : std::vector<int64_t>{L - n, n};
  MemoryLayout l{1, 1, false};
  l.pp_rank = r;
  return static_cast<double>(estimate_training_memory(c, kVocab, l).total());
}

// Injected times want [3, 1] (a head worth 2 blocks); a train.max_memory_gib between what stage 0
// needs with 2 blocks and with 3 (it holds two micro-batches in flight under 1f1b) gives [2, 2].
TEST(PpCut, MemoryCapMovesTheCut) {
  const std::vector<std::string> big = {"model.n_embd=256", "model.n_head=4", "train.seq_len=128",
                                        "model.max_seq_len=128", "train.global_batch=32", "train.micro_batch=8"};
  Config cfg = tiny(big);
  const ModelConfig mc = resolve(to_model_config(cfg, kVocab));
  const PartTimer timer = [](const Config&, const ModelConfig& m, const Exec&) {
    PartTimes t;
    t.blocks.assign(static_cast<size_t>(m.n_layer), 1.0);
    t.head = 2.0;
    return t;
  };
  const MemoryLayout layout{1, 1, false};
  EXPECT_EQ(measured_cut(cfg, mc, kVocab, layout, Exec::cpu(), MPI_COMM_NULL, timer, false).blocks,
            (std::vector<int64_t>{3, 1}));
  const double two = std::max(stage_bytes(cfg, 0, 2), stage_bytes(cfg, 1, 2)), three = stage_bytes(cfg, 0, 3);
  ASSERT_LT(two, three) << "the test's premise: stage 0 with 3 blocks needs the most";
  cfg.train.max_memory_gib = 0.5 * (two + three) / (1024.0 * 1024.0 * 1024.0);
  EXPECT_EQ(measured_cut(cfg, mc, kVocab, layout, Exec::cpu(), MPI_COMM_NULL, timer, false).blocks,
            (std::vector<int64_t>{2, 2}));
  cfg.train.max_memory_gib = 0.5 * stage_bytes(cfg, 1, 1) / (1024.0 * 1024.0 * 1024.0);  // nothing fits
  EXPECT_TRUE(throws_with([&] { measured_cut(cfg, mc, kVocab, layout, Exec::cpu(), MPI_COMM_NULL, timer, false); },
                          {"parallel.pp_cut", "fits in memory"}));
}

// The same with 2 chunks per stage (interleaved, 8 blocks): injected times want [6, 2] (a head worth
// 4 blocks: 2 x 3 against 2 x 1 + 4); a cap between what the stages need with [4, 4] and what stage
// 0 needs with 6 blocks (its two chunks of 3) gives [4, 4].
TEST(PpCut, MemoryCapMovesTheInterleavedCut) {
  const std::vector<std::string> big = {"model.n_embd=256", "model.n_head=4", "train.seq_len=128", "model.max_seq_len=128",
                                        "train.global_batch=32", "train.micro_batch=8", "model.n_layer=8",
                                        "parallel.vpp=2", "parallel.pp_schedule=\"interleaved\""};
  Config cfg = tiny(big);
  const ModelConfig mc = resolve(to_model_config(cfg, kVocab));
  const PartTimer timer = [](const Config&, const ModelConfig& m, const Exec&) {
    PartTimes t;
    t.blocks.assign(static_cast<size_t>(m.n_layer), 1.0);
    t.head = 4.0;
    return t;
  };
  const MemoryLayout layout{1, 1, false};
  EXPECT_EQ(measured_cut(cfg, mc, kVocab, layout, Exec::cpu(), MPI_COMM_NULL, timer, false).blocks,
            (std::vector<int64_t>{6, 2}));
  const double even = std::max(stage_bytes(cfg, 0, 4, 8), stage_bytes(cfg, 1, 4, 8)), six = stage_bytes(cfg, 0, 6, 8);
  ASSERT_LT(even, six) << "the test's premise: stage 0 with 6 blocks needs the most";
  cfg.train.max_memory_gib = 0.5 * (even + six) / (1024.0 * 1024.0 * 1024.0);
  EXPECT_EQ(measured_cut(cfg, mc, kVocab, layout, Exec::cpu(), MPI_COMM_NULL, timer, false).blocks,
            (std::vector<int64_t>{4, 4}));
}

// The case above with wide activations (stage 0 keeps 5 chunk-micro-batches in flight under
// interleaved 1F1B, stage 1 three): a train.max_memory_gib between the largest stage estimate of the
// measured cut and the FLOPs cut's (its stage 0 of chunks of 1 and 2 blocks needs more) leaves the
// FLOPs cut over the limit, so the measured cut runs although the FLOPs cut is predicted faster.
TEST(PpCut, FlopsCutOverTheMemoryLimitIsNotKept) {
  const std::vector<std::string> big = {"model.n_embd=256", "model.n_head=4", "train.seq_len=128", "model.max_seq_len=128",
                                        "train.global_batch=32", "train.micro_batch=8", "model.n_layer=6",
                                        "parallel.vpp=2", "parallel.pp_schedule=\"interleaved\"",
                                        "parallel.pp_cut=\"measured\""};
  Config cfg = tiny(big);
  const ModelConfig mc = resolve(to_model_config(cfg, kVocab));
  const PartTimer timer = [](const Config&, const ModelConfig& m, const Exec&) {
    PartTimes t;
    t.blocks.assign(static_cast<size_t>(m.n_layer), 1.0);
    return t;
  };
  const MemoryLayout layout{1, 1, false};
  const MeasuredCut free_cut = measured_cut(cfg, mc, kVocab, layout, Exec::cpu(), MPI_COMM_NULL, timer, false);
  ASSERT_TRUE(free_cut.flops_kept) << free_cut.describe();
  // Each cut's largest stage estimate (the FLOPs rule's: parallel.pp_layers empty).
  const auto largest = [&](const std::vector<int64_t>& pp_layers) {
    double most = 0;
    for (int64_t r = 0; r < 2; ++r) {
      Config c = cfg;
      c.parallel.pp_layers = pp_layers;
      MemoryLayout l = layout;
      l.pp_rank = r;
      most = std::max(most, static_cast<double>(estimate_training_memory(c, kVocab, l).total()));
    }
    return most;
  };
  const double flops = largest({}), equal = std::min(largest({2, 4}), largest({4, 2}));
  ASSERT_LT(equal, flops) << "the test's premise: an equal-chunk cut needs less than the FLOPs cut";
  cfg.train.max_memory_gib = 0.5 * (equal + flops) / (1024.0 * 1024.0 * 1024.0);
  const MeasuredCut cut = measured_cut(cfg, mc, kVocab, layout, Exec::cpu(), MPI_COMM_NULL, timer, false);
  EXPECT_GE(cut.flops_unfit_stage, 0);
  EXPECT_LT(cut.flops_simulated_step, cut.simulated_step);
  EXPECT_FALSE(cut.flops_kept);
  EXPECT_NE(cut.describe().find("does not fit in memory"), std::string::npos) << cut.describe();
  Config run = cfg;
  apply_measured_cut(run, mc, kVocab, layout, Exec::cpu(), MPI_COMM_NULL, timer);
  EXPECT_EQ(run.parallel.pp_layers, cut.blocks);
}

// Under mpiexec (ctest PpCut.two_ranks): the real timing pass on rank 0, and every rank holds rank 0's
// part times and cut, whatever its own clock would say.
TEST(PpCutLayouts, EveryRankHoldsRankZerosCut) {
  const MPI_Comm world = testing::test_world();
  const Config cfg = tiny();
  const ModelConfig mc = resolve(to_model_config(cfg, kVocab));
  const MeasuredCut cut = measured_cut(cfg, mc, kVocab, MemoryLayout{1, 1, false}, Exec::cpu(), world, {}, true);
  std::vector<double> mine(cut.times.blocks);
  mine.insert(mine.end(), {cut.times.embedding, cut.times.head, static_cast<double>(cut.blocks.at(0)),
                           static_cast<double>(cut.blocks.at(1))});
  std::vector<double> root = mine;
  check_mpi(MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_DOUBLE, 0, world), "MPI_Bcast (test)");
  EXPECT_EQ(mine, root) << "rank " << comm_rank(world);
  EXPECT_EQ(cut.blocks[0] + cut.blocks[1], 4);
  EXPECT_EQ(cut.measured.size(), comm_rank(world) == 0 ? 2u : 0u);  // the stages are timed on rank 0
}

// The text after `key` up to the end of its line.
std::string line_after(const std::string& text, const std::string& key) {
  const auto at = text.find(key);
  return at == std::string::npos ? std::string() : text.substr(at + key.size(), text.find('\n', at) - at - key.size());
}

// The setting that gives by hand the cut a measured run's header says it runs: the measured cut's
// parallel.pp_layers (cut: the text after "blocks per stage "), or, when the header says the FLOPs
// cut is kept (predicted faster: choose_cut), parallel.pp_cut = "flops", the FLOPs rule.
std::string hand_cut(const std::string& output, const std::string& cut) {
  if (output.find("\n  runs the FLOPs rule's cut") != std::string::npos) return "parallel.pp_cut=\"flops\"";
  EXPECT_NE(output.find("\n  runs the measured cut"), std::string::npos) << output;
  return "parallel.pp_layers=" + cut.substr(0, cut.find(']') + 1);  // "[a, b]"
}

// `tessera train` on two stages with parallel.pp_cut = "measured" (four blocks): the header prints the
// cut and the stage times; the losses equal those of the cut it runs given by hand bit for bit (the
// same stages compute the same numbers: the measured cut as parallel.pp_layers, or the FLOPs rule
// when the header says the FLOPs cut is kept), and the 1-rank run's within 1e-5 (fp32, other reduction
// orders: tests/app/test_pipeline_training.cpp). Two processes and three runs: `slow`.
TEST(PpCutSlow, MeasuredCutTrainsAsItsHandCutAndTheOneRankRun) {
  const fs::path dir = testing::temp_dir("pp_cut");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  const std::vector<std::string> base = {"--set", "model.n_layer=4",   "--set", "train.steps=4", "--set",
                                         "train.global_batch=8", "--set", "train.micro_batch=2", "--set", "log.every=1"};
  auto r = testing::train_run(dir, "tiny.toml", "one", 1, base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 4u);
  r = testing::train_run(dir, "tiny.toml", "measured", 2,
                         testing::with(base, {"--set", "parallel.pp=2", "--set", "parallel.pp_cut=\"measured\""}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string cut = line_after(r.output, "blocks per stage ");
  ASSERT_FALSE(cut.empty()) << r.output;
  EXPECT_NE(r.output.find("stage times (ms): predicted ["), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", measured ["), std::string::npos) << r.output;
  const std::string layers = hand_cut(r.output, cut);
  r = testing::train_run(dir, "tiny.toml", "by_hand", 2, testing::with(base, {"--set", "parallel.pp=2", "--set", layers}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> measured = testing::losses(dir / "measured" / "metrics.jsonl");
  EXPECT_EQ(measured, testing::losses(dir / "by_hand" / "metrics.jsonl")) << "cut " << layers;
  testing::expect_losses_near(measured, want, 1e-5, "pp2 measured cut " + layers);
  fs::remove_all(dir);
}

// The same end to end on the interleaved schedule: pp 2 of 2 chunks each over six blocks (the cut is
// [2, 4] or [4, 2]: chunks of 1 and 2 blocks; the FLOPs rule's unequal chunks [1, 2, 2, 1] are
// usually predicted faster and kept), the run against the cut it runs given by hand bit for bit,
// and against the 1-rank run within 1e-5. `slow`.
TEST(PpCutSlow, MeasuredInterleavedCutTrainsAsItsHandCutAndTheOneRankRun) {
  const fs::path dir = testing::temp_dir("pp_cut_vpp");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  const std::vector<std::string> base = {"--set", "model.n_layer=6",   "--set", "train.steps=4", "--set",
                                         "train.global_batch=8", "--set", "train.micro_batch=2", "--set", "log.every=1"};
  const std::vector<std::string> interleaved = {"--set", "parallel.pp=2", "--set", "parallel.vpp=2", "--set",
                                                "parallel.pp_schedule=\"interleaved\""};
  auto r = testing::train_run(dir, "tiny.toml", "one", 1, base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 4u);
  r = testing::train_run(dir, "tiny.toml", "measured", 2,
                         testing::with(testing::with(base, interleaved), {"--set", "parallel.pp_cut=\"measured\""}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string cut = line_after(r.output, "blocks per stage ");
  ASSERT_FALSE(cut.empty()) << r.output;
  EXPECT_NE(cut.find("in parallel.vpp = 2 equal chunks each"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", measured ["), std::string::npos) << r.output;
  const std::string layers = hand_cut(r.output, cut);
  r = testing::train_run(dir, "tiny.toml", "by_hand", 2, testing::with(testing::with(base, interleaved), {"--set", layers}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> measured = testing::losses(dir / "measured" / "metrics.jsonl");
  EXPECT_EQ(measured, testing::losses(dir / "by_hand" / "metrics.jsonl")) << "cut " << layers;
  testing::expect_losses_near(measured, want, 1e-5, "pp2 vpp2 measured cut " + layers);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

// `tessera train` under tensor parallelism end to end: `mpiexec -n 2 tessera train --set
// parallel.tp=2` (with and without sequence parallelism) gives the 1-rank losses and final checkpoint
// within 1e-5 relative (fp32, different reduction orders); checkpoints resume across layouts and
// continue the same trajectory; tp_bytes_per_step is the analytic volume; bad layouts and a rank
// failing alone end the job. Suites named *Slow* have the ctest label `slow` (scripts/test.sh
// --slow). The whole layout matrix (tp 4, dp x tp, ZeRO-1, LLaMA) runs in process:
// tests/app/test_layout_matrix.cpp.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <tuple>

#include "layout_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;
using testing::with;

std::string config(const std::string& preset) { return testing::layout_config(preset); }

std::vector<std::string> settings(int steps, std::vector<std::string> extra = {}) {
  return with({"--set", "train.steps=" + std::to_string(steps), "--set", "train.global_batch=8", "--set",
               "train.micro_batch=2", "--set", "log.every=1", "--set", "checkpoint.every=6"},
              extra);
}

struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> sets;
};

const std::vector<std::string> kZero = {"--set", "parallel.zero=1"};

std::vector<std::string> tp_sets(int tp, bool sp) {
  return {"--set", "parallel.tp=" + std::to_string(tp), "--set", std::string("parallel.sequence_parallel=") + (sp ? "true" : "false")};
}

void expect_layouts_equal_one_rank(const std::string& preset, const std::vector<Layout>& layouts) {
  const fs::path dir = testing::temp_dir("layouts_" + preset + "_" + std::to_string(layouts.front().ranks));
  std::ofstream(dir / "tiny.toml") << config(preset);
  auto r = testing::train_run(dir, "tiny.toml", "one", 1, settings(6));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  for (const Layout& l : layouts) {
    r = testing::train_run(dir, "tiny.toml", l.name, l.ranks, settings(6, l.sets));
    ASSERT_EQ(r.exit_code, 0) << l.name << ": " << r.output;
    EXPECT_EQ(r.output.find("step 1/6"), r.output.rfind("step 1/6")) << "only rank 0 prints: " << r.output;
    testing::expect_losses_near(testing::losses(dir / l.name / "metrics.jsonl"), want, 1e-5, preset + " " + l.name);
    testing::expect_checkpoints_near(dir / l.name / "checkpoints" / "step_00000006.h5",
                                     dir / "one" / "checkpoints" / "step_00000006.h5", 1e-5, preset + " " + l.name);
  }
  fs::remove_all(dir);
}

}  // namespace

// tp and tp + sequence parallelism end to end, through the checkpoint files. The other layouts
// (tp 4, dp 2 x tp 2 with and without ZeRO-1 and recomputation, LLaMA's) are
// tests/app/test_layout_matrix.cpp's, in process.
TEST(TensorParallelTrainingSlow, Gpt2TwoRankLayoutsEqualTheOneRankRun) {
  expect_layouts_equal_one_rank("gpt2", {{"tp2", 2, tp_sets(2, false)}, {"tp2sp", 2, tp_sets(2, true)}});
}

// model.activation_compression under tp2 + sequence parallelism and two pipeline stages: each rank
// compresses its own shards, and the losses and final checkpoint equal the 1-rank run with the
// same compression (bf16 is elementwise, so every layout rounds the same values; int8's row scales
// do not depend on the pipeline cut). int8 under tp is not compared: its per-row scales then cover
// a rank's columns of the MLP activation (docs/training.md, "Compressed saved activations").
// Tolerances: losses 1e-5 for both; the int8 checkpoint 1e-4. pp 2 sums the tied embedding's two
// gradients in another order than 1 rank (a last-bit difference), and a value that then lands on
// the other side of an int8 rounding boundary moves by a step of max|row| / 127 in the saved MLP
// input, which the MLP projection's weight gradient reads: measured 1.9e-5 of the largest
// parameter on an Intel Xeon with AVX-512 (2026-12-06); within 1e-5 in earlier sessions on AMD Zen 4.
TEST(TensorParallelTrainingSlow, ActivationCompressionLayoutsEqualTheOneRankRun) {
  const fs::path dir = testing::temp_dir("layouts_actcomp");
  std::ofstream(dir / "tiny.toml") << config("gpt2");
  const std::vector<std::string> pp2 = {"--set", "parallel.pp=2"};
  for (const std::string method : {"bf16", "int8"}) {
    const std::vector<std::string> compress = {"--set", "model.activation_compression=" + method};
    auto r = testing::train_run(dir, "tiny.toml", "one_" + method, 1, settings(6, compress));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto want = testing::losses(dir / ("one_" + method) / "metrics.jsonl");
    ASSERT_EQ(want.size(), 6u);
    std::vector<Layout> layouts = {{"pp2_" + method, 2, with(pp2, compress)}};
    if (method == "bf16") layouts.push_back({"tp2sp_" + method, 2, with(tp_sets(2, true), compress)});
    for (const Layout& l : layouts) {
      r = testing::train_run(dir, "tiny.toml", l.name, l.ranks, settings(6, l.sets));
      ASSERT_EQ(r.exit_code, 0) << l.name << ": " << r.output;
      testing::expect_losses_near(testing::losses(dir / l.name / "metrics.jsonl"), want, 1e-5, l.name);
      testing::expect_checkpoints_near(dir / l.name / "checkpoints" / "step_00000006.h5",
                                       dir / ("one_" + method) / "checkpoints" / "step_00000006.h5",
                                       method == "int8" ? 1e-4 : 1e-5, l.name);
    }
  }
  fs::remove_all(dir);
}

// parallel.tp_comm_compression = "int8-ef" (both directions) under recomputation: the re-run of a
// fully recomputing block's forward replays what its error-feedback collectives received at the
// first forward (parallel/tp_compression.h TpReceived) instead of communicating again, so the
// residuals move once per micro-batch and every recomputing run's losses and final checkpoint
// (parameters, both moments) are bit-equal to the run without recomputation on the same layout.
void expect_recomputation_bit_equal(const std::string& name, int ranks, const std::vector<std::string>& layout,
                                    const std::vector<std::vector<std::string>>& recomputations) {
  const fs::path dir = testing::temp_dir("tp_ef_recompute_" + name);
  std::ofstream(dir / "tiny.toml") << config("gpt2");
  const std::vector<std::string> ef = with(layout, {"--set", "parallel.tp_comm_compression=\"int8-ef\""});
  auto r = testing::train_run(dir, "tiny.toml", "keep", ranks, settings(6, ef));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "keep" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  for (size_t i = 0; i < recomputations.size(); ++i) {
    const std::string run = "recompute" + std::to_string(i);
    r = testing::train_run(dir, "tiny.toml", run, ranks, settings(6, with(ef, recomputations[i])));
    const std::string what = name + " " + ::testing::PrintToString(recomputations[i]);
    ASSERT_EQ(r.exit_code, 0) << what << ": " << r.output;
    testing::expect_losses_near(testing::losses(dir / run / "metrics.jsonl"), want, 0.0, what);
    testing::expect_checkpoints_equal(dir / run / "checkpoints" / "step_00000006.h5",
                                      dir / "keep" / "checkpoints" / "step_00000006.h5", what);
  }
  fs::remove_all(dir);
}

const std::vector<std::string> kFull = {"--set", "model.recompute=\"full\""};
const std::vector<std::string> kSelective = {"--set", "model.recompute=\"selective\""};

TEST(TensorParallelTraining, TpErrorFeedbackUnderRecomputationEqualsNoRecomputation) {
  expect_recomputation_bit_equal("tp2sp", 2, tp_sets(2, true), {kFull, kSelective});
}

// Four ranks: tp 4 (the all-reduce's replay) with full recomputation, tp 2 + sp x pp 2 recomputing
// in the pipeline's bubbles ("bubble": the schedule's R action re-runs the forward ahead of the
// backward). model.recompute_layers makes its blocks Recompute::Full, the path of the first case
// (each 4-rank run costs about 20 s of CI, so it has no case of its own).
TEST(TensorParallelTrainingSlow, TpErrorFeedbackUnderRecomputationFourRanks) {
  expect_recomputation_bit_equal("tp4", 4, tp_sets(4, false), {kFull});
  expect_recomputation_bit_equal("tp2sp_pp2", 4, with(tp_sets(2, true), {"--set", "parallel.pp=2"}),
                                 {{"--set", "model.recompute=\"bubble\""}});
}

// A checkpoint written under one layout continues under another: the resumed losses equal those
// of the uninterrupted 1-rank run (8 steps), so parameters, both AdamW moments, the step and the
// data position all came through.
TEST(TensorParallelTrainingSlow, CheckpointsResumeAcrossLayouts) {
  const fs::path dir = testing::temp_dir("tp_resume");
  std::ofstream(dir / "tiny.toml") << config("gpt2");
  const std::vector<testing::LayoutHop> hops = {
      {"tp2_to_one", 2, tp_sets(2, false), 1, {}},
      {"one_to_tp2sp", 1, {}, 2, tp_sets(2, true)},
      {"tp4_to_dp2tp2sp_zero", 4, tp_sets(4, false), 4, with(tp_sets(2, true), kZero)},
  };
  testing::expect_resumes_across_layouts(dir, "tiny.toml", settings(8), hops, false);
  fs::remove_all(dir);
}

TEST(TensorParallelTraining, LayoutErrorsNameTheKeys) {
  const fs::path dir = testing::temp_dir("tp_err");
  std::ofstream(dir / "tiny.toml") << config("gpt2");
  auto r = testing::train_run(dir, "tiny.toml", "bad", 2, settings(2, {"--set", "parallel.tp=3"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("parallel.tp"), std::string::npos) << r.output;
  r = testing::train_run(dir, "tiny.toml", "heads", 2, settings(2, {"--set", "parallel.tp=2", "--set", "model.n_head=1"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("model.n_head = 1 is not divisible by parallel.tp = 2"), std::string::npos) << r.output;
  r = testing::train_run(dir, "tiny.toml", "seq", 4,
                         settings(2, {"--set", "parallel.tp=4", "--set", "parallel.sequence_parallel=true", "--set",
                                      "train.seq_len=22"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train.seq_len = 22 is not divisible by parallel.tp = 4"), std::string::npos) << r.output;
  const auto first = r.output.find("tessera: error:");
  EXPECT_EQ(r.output.find("tessera: error:", first + 1), std::string::npos) << "printed once: " << r.output;
  fs::remove_all(dir);
}

// tp_bytes_per_step against the ring volumes (parallel/communicator.h) of every collective the
// model and trainer issue on the tp group, for the tiny GPT-2 (L = 2, C = 32) at B = 2, T = 24,
// 4 micro-batches per step, tp = 2 (all-reduce sends b, all-gather and reduce-scatter b / 2). No
// checkpoint is written (a parallel save costs seconds and is not what this counts).
TEST(TensorParallelTraining, TpBytesPerStepMatchTheAnalyticVolume) {
  const fs::path dir = testing::temp_dir("tp_bytes");
  std::ofstream(dir / "tiny.toml") << config("gpt2");
  const int64_t L = 2, act = 2 * 24 * 32 * 4, bt = 2 * 24 * 4, micro = 4;  // bytes of (B, T, C) and of (B T)
  // The gradient norm's square sum (f64); the stop and data votes go over the world group.
  const int64_t step_extras = 8;
  // Plain tp: forward all-reduces after the embedding and each attention and MLP, backward
  // all-reduces before ln_f and before each attention and MLP input; the loss all-gathers the
  // per-rank log-sum-exps (b = 2 bt) and all-reduces the target logits.
  const int64_t plain = micro * (2 * (1 + 2 * L) * act + bt + bt) + step_extras;
  // Sequence parallel: each edge is an all-gather or reduce-scatter (act / 2): forward 1 + 4 L + 1
  // (embedding, 2 per branch, the LM head's gather), backward 1 + 6 L + 1 (ln_f, per branch: gather
  // dy, re-gather x, reduce-scatter dx; the embedding's gather), plus one all-reduce of the norms'
  // gradients: 2 L + 1 norms of weight and bias (C floats each).
  const int64_t norms = (2 * L + 1) * 2 * 32 * 4;
  const int64_t sp = micro * ((2 + 4 * L + 2 + 6 * L) * act / 2 + bt + bt) + norms + step_extras;
  for (const auto& [name, sets, want] : std::vector<std::tuple<std::string, std::vector<std::string>, int64_t>>{
           {"tp2", tp_sets(2, false), plain}, {"tp2sp", tp_sets(2, true), sp}}) {
    const auto r = testing::train_run(dir, "tiny.toml", name, 2, settings(3, with(sets, {"--set", "checkpoint.at_end=false"})));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(testing::last_metric(dir / name / "metrics.jsonl", "tp_bytes_per_step"), want) << name;
  }
  fs::remove_all(dir);
}

// Minor page faults of every child this test binary has waited for so far (the ranks are reaped
// by mpiexec's proxies, and those by mpiexec: each adds its children's usage to its own).
long child_page_faults() {
  rusage usage{};
  EXPECT_EQ(getrusage(RUSAGE_CHILDREN, &usage), 0);
  return usage.ru_minflt;
}

// A step does not fault its memory in afresh. Under sequence parallelism every all-gather and
// reduce-scatter of MPICH takes a temporary buffer of the message's size from malloc and frees it;
// with glibc's defaults each free gave the top of the heap back to the OS and the next call faulted
// it in again: 25k page faults per step here (0.5 MiB messages, 4 layers, 4 micro-batches), a
// quarter of the step's time. kernels/allocator.h keep_freed_host_memory (called by main) keeps it:
// 8 more steps cost about 1.2k faults in all (measured), held here under 2.5k per step.
TEST(TensorParallelTrainingSlow, SequenceParallelStepsDoNotFaultTheirMemoryInAgain) {
  const fs::path dir = testing::temp_dir("tp_faults");
  std::ofstream(dir / "tiny.toml") << config("llama");
  const auto run = [&](int steps) {
    const long before = child_page_faults();
    const auto r = testing::train_run(
        dir, "tiny.toml", "s" + std::to_string(steps), 2,
        with(tp_sets(2, true), {"--set", "model.n_layer=4", "--set", "model.n_embd=256", "--set", "train.seq_len=64",
                                "--set", "train.global_batch=32", "--set", "train.micro_batch=8", "--set",
                                "train.steps=" + std::to_string(steps), "--set", "checkpoint.at_end=false"}));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return child_page_faults() - before;
  };
  const long short_run = run(4), long_run = run(12);
  EXPECT_LT(long_run - short_run, 8 * 2500) << "page faults: " << short_run << " in 4 steps, " << long_run << " in 12";
  fs::remove_all(dir);
}

// A rank that fails alone in the middle of training (its tp partner then waits in a collective
// that never completes) ends the whole job with a non-zero exit, printing why, instead of hanging.
TEST(TensorParallelTraining, ARankThatFailsAloneEndsTheJob) {
  const fs::path dir = testing::temp_dir("tp_fail");
  std::ofstream(dir / "tiny.toml") << config("gpt2");
  std::vector<std::string> args = {"-n", "2", TESSERA_BINARY, "train", (dir / "tiny.toml").string(), "--run-dir",
                                   (dir / "run").string()};
  for (const auto& a : settings(6, tp_sets(2, false))) args.push_back(a);
  const auto r = testing::run_program(TESSERA_MPIEXEC, args, dir, {}, SIGINT, {"TESSERA_TEST_FAIL_AT_STEP=1:2"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 fails at step 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 failed alone; aborting every rank"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 6/6"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace tessera

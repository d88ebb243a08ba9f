// Data parallel = serial: `mpiexec -n 2` and `-n 4` runs of `tessera train` (2 and 1 micro-batches
// per rank, buckets overlapped with backward, or all after it) give the losses and final
// parameters of the 1-rank run, up to the order of the gradient sums (fp32: ~1e-7 relative per
// step; 1e-5 leaves room for six steps of AdamW). The checkpoint of a 2-rank run resumes on 1 rank.
// The same for ZeRO-1 (parallel.zero = 1) on 2 and 4 ranks, whose checkpoints resume on 1 rank and
// which resumes 1-rank checkpoints. These end-to-end runs have the ctest label `slow` (suite
// DataParallelTrainingSlow, scripts/test.sh --slow); the same layouts run in process in
// tests/app/test_layout_matrix.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "app/checkpoint/checkpoint_io.h"
#include "app/trainer.h"
#include "layout_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;

const std::vector<std::string> kSettings = {"--set", "train.steps=6", "--set", "train.global_batch=8", "--set",
                                            "train.micro_batch=2", "--set", "log.every=1", "--set",
                                            "parallel.bucket_mb=0.01"};

testing::RunResult train(const fs::path& dir, const std::string& run, int ranks, std::vector<std::string> extra = {}) {
  std::vector<std::string> settings = kSettings;
  settings.insert(settings.end(), extra.begin(), extra.end());
  return testing::train_run(dir, "tiny.toml", run, ranks, settings);
}

}  // namespace

TEST(DataParallelTrainingSlow, EqualsTheOneRankRun) {
  const fs::path dir = testing::temp_dir("dp");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  auto r = train(dir, "one", 1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  CheckpointReader base((dir / "one" / "checkpoints" / "step_00000006.h5").string(), testing::test_world());
  for (const auto& [ranks, overlap] : std::vector<std::pair<int, std::string>>{{2, "true"}, {2, "false"}, {4, "true"}}) {
    const std::string run = "dp" + std::to_string(ranks) + overlap;
    r = train(dir, run, ranks, {"--set", "parallel.overlap_grad_reduce=" + overlap});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("step 1/6"), r.output.rfind("step 1/6")) << "only rank 0 prints: " << r.output;
    testing::expect_losses_near(testing::losses(dir / run / "metrics.jsonl"), want, 1e-5, run);
    testing::expect_checkpoints_near(dir / run / "checkpoints" / "step_00000006.h5",
                                     dir / "one" / "checkpoints" / "step_00000006.h5", 1e-5, run);
  }
  // Communication accounting: with 2 ranks each sends, per step, its whole gradient once (ring
  // all-reduce: 2 (p-1)/p = 1 x the bytes) plus two scalar reductions of 8 bytes over the dp group
  // (global targets, global loss); the votes (stop, reading the step's data) go over the world group.
  int64_t params = 0;
  for (const auto& t : base.tensors())
    if (t.path.rfind("/model/", 0) == 0) params += t.shape.numel();
  EXPECT_EQ(testing::last_metric(dir / "dp2true" / "metrics.jsonl", "dp_bytes_per_step"), 4 * params + 8 + 8);
  // The 2-rank checkpoint continues on 1 rank.
  fs::copy(dir / "dp2true", dir / "resumed", fs::copy_options::recursive);
  r = train(dir, "resumed", 1, {"--set", "train.steps=8"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 6"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// ZeRO-1 (parallel.zero = 1) = serial, on a model of 28,281 parameters (C = 33): an odd count, so
// the flat buffer is padded for 2 and 4 ranks. The checkpoint's moments are the gathered shards.
namespace {
using testing::with;
const std::vector<std::string> kOddModel = {"--set", "model.n_embd=33", "--set", "model.n_head=3"};
const std::vector<std::string> kZero = with(kOddModel, {"--set", "parallel.zero=1"});
}  // namespace

TEST(DataParallelTrainingSlow, ZeroOneEqualsTheOneRankRun) {
  const fs::path dir = testing::temp_dir("zero");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  auto r = train(dir, "one", 1, kOddModel);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  CheckpointReader base((dir / "one" / "checkpoints" / "step_00000006.h5").string(), testing::test_world());
  int64_t params = 0;
  for (const auto& t : base.tensors())
    if (t.path.rfind("/model/", 0) == 0) params += t.shape.numel();
  ASSERT_EQ(params, 28281);
  for (int ranks : {2, 4}) {
    const std::string run = "zero" + std::to_string(ranks);
    r = train(dir, run, ranks, kZero);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    testing::expect_losses_near(testing::losses(dir / run / "metrics.jsonl"), want, 1e-5, run);
    // Parameters and (gathered) moments, at the layout of the 1-rank checkpoint.
    testing::expect_checkpoints_near(dir / run / "checkpoints" / "step_00000006.h5",
                                     dir / "one" / "checkpoints" / "step_00000006.h5", 1e-5, run);
    // Communication per step: a reduce-scatter and an all-gather of the padded buffer (P floats),
    // (p - 1) / p x 4P bytes each, plus three scalar all-reduces of 8 bytes (targets, loss, the
    // squared gradient norm), 2 (p - 1) / p x each (the votes go over the world group).
    const int64_t padded = (params + ranks - 1) / ranks * ranks;
    const int64_t scalars = 2 * (ranks - 1) * 8 / ranks * 3;
    EXPECT_EQ(testing::last_metric(dir / run / "metrics.jsonl", "dp_bytes_per_step"), 2 * (ranks - 1) * padded / ranks * 4 + scalars) << run;
  }
  fs::remove_all(dir);
}

TEST(DataParallelTrainingSlow, ZeroOneCheckpointsResumeOnAnyLayout) {
  const fs::path dir = testing::temp_dir("zero_resume");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  auto r = train(dir, "one", 1, kOddModel);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  const std::vector<std::string> stop_at_3 = {"--set", "train.exit_after_steps=3"};
  // ZeRO-1 on 2 ranks for 3 steps, then 1 rank; and 1 rank for 3 steps, then ZeRO-1 on 2 ranks.
  struct Leg { std::string run; int first_ranks, second_ranks; };
  auto settings = [](int ranks) { return ranks > 1 ? kZero : kOddModel; };
  for (const Leg& leg : {Leg{"zero_then_one", 2, 1}, Leg{"one_then_zero", 1, 2}}) {
    r = train(dir, leg.run, leg.first_ranks, with(settings(leg.first_ranks), stop_at_3));
    ASSERT_EQ(r.exit_code, 0) << leg.run << ": " << r.output;
    r = train(dir, leg.run, leg.second_ranks, settings(leg.second_ranks));
    ASSERT_EQ(r.exit_code, 0) << leg.run << ": " << r.output;
    EXPECT_NE(r.output.find("at step 3"), std::string::npos) << r.output;
    const auto got = testing::losses(dir / leg.run / "metrics.jsonl");
    ASSERT_EQ(got.size(), want.size()) << leg.run;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << leg.run << " step " << i + 1;
  }
  fs::remove_all(dir);
}

// The communication volumes of the two slow tests above, without their checkpoints (a parallel
// save costs seconds and is not what this counts): dp 2 sends its whole gradient once per step
// plus four scalar all-reduces; ZeRO-1 on 2 ranks a reduce-scatter and an all-gather of the
// padded buffer, (p - 1) / p of it each, plus five. The parameter counts come from the model itself.
TEST(DataParallelTraining, DpBytesPerStepMatchTheAnalyticVolume) {
  const fs::path dir = testing::temp_dir("dp_bytes");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  auto params_of = [](const std::vector<std::string>& model) {
    std::vector<std::string> sets;
    for (size_t i = 1; i < model.size(); i += 2) sets.push_back(model[i]);  // "--set", "k=v" pairs
    return Trainer(parse_config_string(testing::kTinyConfig, "tiny.toml", sets), "", MPI_COMM_NULL).params().global_numel();
  };
  const std::vector<std::string> quick = {"--set", "train.steps=3", "--set", "checkpoint.at_end=false"};
  auto r = train(dir, "dp2", 2, quick);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::last_metric(dir / "dp2" / "metrics.jsonl", "dp_bytes_per_step"), 4 * params_of({}) + 8 + 8);
  r = train(dir, "zero2", 2, with(kZero, quick));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int64_t params = params_of(kOddModel), ranks = 2, padded = (params + ranks - 1) / ranks * ranks;
  ASSERT_EQ(params, 28281);
  const int64_t scalars = 2 * (ranks - 1) * 8 / ranks * 3;
  EXPECT_EQ(testing::last_metric(dir / "zero2" / "metrics.jsonl", "dp_bytes_per_step"),
            2 * (ranks - 1) * padded / ranks * 4 + scalars);
  fs::remove_all(dir);
}

TEST(DataParallelTraining, AnErrorOnEveryRankIsPrintedOnce) {
  const fs::path dir = testing::temp_dir("dp_err");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  const auto r = train(dir, "bad", 2, {"--set", "train.global_batch=6"});  // 6 is not a multiple of 2 x 2
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto first = r.output.find("tessera: error:");
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("tessera: error:", first + 1), std::string::npos) << "printed twice: " << r.output;
  fs::remove_all(dir);
}

}  // namespace tessera

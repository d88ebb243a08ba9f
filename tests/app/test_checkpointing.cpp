// Tests app/checkpointing.h through `tessera train`: bit-exact resume, a process killed with
// SIGKILL in the middle of a save, preemption by SIGUSR1, keep_last pruning, a damaged newest
// checkpoint, and a checkpoint whose shapes do not fit the config.
#include "app/checkpointing.h"

#include <gtest/gtest.h>

#include "app/checkpoint_io.h"
#include "app/trainer.h"
#include "cli_testing.h"
#include "mpi_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;

struct TrainRun {
  fs::path dir;
  fs::path config;
  fs::path run() const { return dir / "run"; }
  fs::path ckpts() const { return dir / "run" / "checkpoints"; }
  RunResult train(std::vector<std::string> extra, const fs::path& signal_when = {}, int signal = SIGINT,
                  const std::vector<std::string>& env = {}) const {
    std::vector<std::string> args = {"train", config.string(), "--run-dir", run().string(), "--set", "log.every=1"};
    for (auto& e : extra) args.push_back("--set"), args.push_back(e);
    return testing::run_tessera(args, dir, signal_when, signal, env);
  }
};

TrainRun make_run(const std::string& name) {
  TrainRun r{testing::temp_dir(name), {}};
  r.config = r.dir / "tiny.toml";
  std::ofstream(r.config) << testing::kTinyConfig;
  return r;
}

// The "loss" values of metrics.jsonl, as printed (9 significant digits), by step.
std::map<int64_t, std::string> loss_lines(const fs::path& metrics) {
  std::map<int64_t, std::string> out;
  std::istringstream in(testing::read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto l = line.find("\"loss\": ");
    if (l == std::string::npos) continue;
    const int64_t step = std::stoll(line.substr(line.find("\"step\": ") + 8));
    out[step] = line.substr(l, line.find(',', l) - l);
  }
  return out;
}

std::map<std::string, std::vector<float>> tensors_of(const fs::path& file) {
  CheckpointReader r(file.string(), testing::test_world());
  std::map<std::string, std::vector<float>> out;
  for (const auto& t : r.tensors()) out[t.path] = r.read_all(t.path);
  return out;
}

}  // namespace

// Stopped at step 8 by train.exit_after_steps and resumed, a run gives exactly the losses and
// final parameters and optimizer moments of the uninterrupted run (same layout and threads).
TEST(Checkpointing, ResumeIsBitExact) {
  const TrainRun whole = make_run("ckpt_whole"), pieces = make_run("ckpt_pieces");
  RunResult r = whole.train({"train.steps=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = pieces.train({"train.steps=20", "train.exit_after_steps=8"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train.exit_after_steps = 8 reached: saved"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(pieces.ckpts() / "step_00000008.h5"));
  r = pieces.train({"train.steps=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at step 8"), std::string::npos) << r.output;

  const auto a = loss_lines(whole.run() / "metrics.jsonl"), b = loss_lines(pieces.run() / "metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);  // 8 from the first piece, 12 appended by the second
  for (const auto& [step, loss] : a) EXPECT_EQ(b.at(step), loss) << "step " << step;
  const auto ta = tensors_of(whole.ckpts() / "step_00000020.h5"), tb = tensors_of(pieces.ckpts() / "step_00000020.h5");
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [path, values] : ta) EXPECT_EQ(tb.at(path), values) << path;
  fs::remove_all(whole.dir);
  fs::remove_all(pieces.dir);
}

// SIGKILL after the new file is written but before it is renamed into place: the previous
// checkpoint stays intact and named by `latest`, and the next run resumes from it.
TEST(Checkpointing, KillDuringSaveKeepsThePreviousCheckpoint) {
  const TrainRun run = make_run("ckpt_kill");
  RunResult r = run.train({"train.steps=20", "train.exit_after_steps=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path marker = run.dir / "paused";
  r = run.train({"train.steps=20", "train.exit_after_steps=5"}, marker, SIGKILL,
                {"TESSERA_TEST_PAUSE_BEFORE_RENAME=" + marker.string()});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_TRUE(fs::exists(run.ckpts() / "step_00000010.h5.tmp"));
  EXPECT_FALSE(fs::exists(run.ckpts() / "step_00000010.h5"));
  EXPECT_EQ(testing::read_file(run.ckpts() / "latest"), "step_00000005.h5\n");
  r = run.train({"train.steps=12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step_00000005.h5 at step 5"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

// train.exit_after_minutes: saves at the first step boundary past the limit and exits 0; the
// same command continues the schedule to the end.
TEST(Checkpointing, ExitAfterMinutesSavesAndTheSameCommandContinues) {
  const TrainRun run = make_run("ckpt_minutes");
  RunResult r = run.train({"train.steps=20", "train.exit_after_minutes=1e-6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train.exit_after_minutes reached: saved"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(run.ckpts() / "step_00000001.h5"));
  r = run.train({"train.steps=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 20 steps"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

// SIGUSR1 (Slurm's warning before the time limit): checkpoint at the step boundary, exit 75.
TEST(Checkpointing, PreemptionSignalSavesAndExitsForRequeue) {
  const TrainRun run = make_run("ckpt_preempt");
  const RunResult r = run.train({"train.steps=100000"}, run.run() / "metrics.jsonl", SIGUSR1);
  EXPECT_EQ(r.exit_code, kExitPreempted) << r.output;
  EXPECT_NE(r.output.find("preempted by signal"), std::string::npos) << r.output;
  EXPECT_EQ(testing::read_file(run.ckpts() / "latest").rfind("step_", 0), 0u);
  fs::remove_all(run.dir);
}

TEST(Checkpointing, KeepLastPrunesOlderFiles) {
  const TrainRun run = make_run("ckpt_prune");
  const RunResult r = run.train({"train.steps=10", "checkpoint.every=2", "checkpoint.keep_last=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run.ckpts())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000008.h5", "step_00000010.h5"}));
  fs::remove_all(run.dir);
}

// checkpoint.at_end = false (benchmarks): a completed run saves only what checkpoint.every asks
// for, the last step included when every divides it.
TEST(Checkpointing, AtEndFalseSavesOnlyThePeriodicCheckpoints) {
  const TrainRun run = make_run("ckpt_at_end");
  auto saved = [&] {
    std::vector<std::string> names;
    if (fs::exists(run.ckpts()))
      for (const auto& e : fs::directory_iterator(run.ckpts())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  RunResult r = run.train({"train.steps=3", "checkpoint.at_end=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(saved(), std::vector<std::string>{});
  r = run.train({"train.steps=7", "checkpoint.at_end=false", "checkpoint.every=2", "checkpoint.resume=\"none\""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(saved(), (std::vector<std::string>{"latest", "step_00000002.h5", "step_00000004.h5", "step_00000006.h5"}));
  r = run.train({"train.steps=8", "checkpoint.at_end=false", "checkpoint.every=2", "checkpoint.resume=\"none\"",
                 "checkpoint.overwrite=true"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(saved(), (std::vector<std::string>{"latest", "step_00000004.h5", "step_00000006.h5", "step_00000008.h5"}))
      << "keep_last = 3";
  fs::remove_all(run.dir);
}

// A newest checkpoint cut short (a full disk, a crash outside tessera) is skipped with a warning.
TEST(Checkpointing, DamagedNewestCheckpointFallsBackToTheOneBefore) {
  const TrainRun run = make_run("ckpt_damaged");
  RunResult r = run.train({"train.steps=10", "checkpoint.every=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path newest = run.ckpts() / "step_00000010.h5";
  fs::resize_file(newest, fs::file_size(newest) / 2);
  r = run.train({"train.steps=12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: skipping checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step_00000005.h5 at step 5"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

TEST(Checkpointing, ShapeMismatchListsEveryDifference) {
  const TrainRun run = make_run("ckpt_mismatch");
  RunResult r = run.train({"train.steps=3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run.train({"train.steps=6", "model.n_embd=48"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("wte.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("blocks.1.mlp.fc.weight"), std::string::npos) << r.output;
  r = run.train({"train.steps=6", "checkpoint.resume=\"" + (run.dir / "nope.h5").string() + "\""});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("nope.h5"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

}  // namespace tessera

// Tests app/signals.h with real signals sent to real `tessera train` processes: a stop is acted on
// within seconds inside a long evaluation and while a slow first batch loads (also when only one
// of two ranks is signalled), and a second signal exits at once.
#include "app/signals.h"

#include <gtest/gtest.h>

#include "app/trainer.h"
#include "cli_testing.h"
#include "process_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::Spawned;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A tiny addition run in its own directory, configured by --set overrides.
struct SignalRun {
  fs::path dir;
  explicit SignalRun(const std::string& name) : dir(testing::temp_dir(name)) {
    std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  }
  ~SignalRun() { fs::remove_all(dir); }
  fs::path run() const { return dir / "run"; }
  std::vector<std::string> args(const std::vector<std::string>& sets) const {
    std::vector<std::string> a = {"train", (dir / "tiny.toml").string(), "--run-dir", run().string(), "--set",
                                  "log.every=1"};
    for (const auto& s : sets) a.push_back("--set"), a.push_back(s);
    return a;
  }
  std::unique_ptr<Spawned> start(const std::vector<std::string>& sets, const std::vector<std::string>& env = {}) const {
    return std::make_unique<Spawned>(TESSERA_BINARY, args(sets), dir / "output.txt", env);
  }
};

// An evaluation of a million batches (minutes) is abandoned at the next batch: the run saves the
// step it completed and exits 75 within seconds, and the partial evaluation is not recorded.
TEST(StopSignals, SigtermDuringALongEvaluationSavesWithinSeconds) {
  const SignalRun run("sig_eval");
  auto p = run.start({"train.steps=1000", "train.eval_every=1", "train.eval_batches=1000000"});
  // The step-1 record is written just before the first evaluation starts.
  ASSERT_TRUE(p->wait_for_file(run.run() / "metrics.jsonl")) << p->output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  p->signal(SIGTERM);
  const auto code = p->wait_exit(30);
  const double took = seconds_since(t0);
  ASSERT_TRUE(code.has_value()) << "still running 30 s after SIGTERM:\n" << p->output();
  EXPECT_EQ(*code, kExitPreempted) << p->output();
  EXPECT_LT(took, 5.0) << p->output();  // a few tenths of a second here; minutes without the vote
  EXPECT_NE(p->output().find("preempted by signal: saved"), std::string::npos) << p->output();
  EXPECT_TRUE(fs::exists(run.run() / "checkpoints" / "step_00000001.h5")) << p->output();
  EXPECT_EQ(testing::read_file(run.run() / "metrics.jsonl").find("val_loss"), std::string::npos);
}

// The first signal asks for a graceful stop; while that waits (here for a slow evaluation batch:
// 8 samples of 300 ms each), a second one exits at once with 128 + SIGINT and saves nothing.
TEST(StopSignals, SecondSigintExitsAtOnce) {
  const SignalRun run("sig_twice");
  auto p = run.start({"train.steps=1000", "train.eval_every=1", "train.eval_batches=4"},
                     {"TESSERA_TEST_SAMPLE_DELAY_MS=300"});
  ASSERT_TRUE(p->wait_for_file(run.run() / "metrics.jsonl")) << p->output();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  p->signal(SIGINT);
  // Past the window in which a repeat counts as the same signal delivered twice.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = Clock::now();
  p->signal(SIGINT);
  const auto code = p->wait_exit(30);
  const double took = seconds_since(t0);
  ASSERT_TRUE(code.has_value()) << p->output();
  EXPECT_EQ(*code, 128 + SIGINT) << p->output();
  EXPECT_LT(took, 1.5) << p->output();  // the graceful path waits 1.7 s more for the batch, then saves
  EXPECT_NE(p->output().find("second signal (SIGINT): exiting now"), std::string::npos) << p->output();
  EXPECT_FALSE(fs::exists(run.run() / "checkpoints" / "step_00000001.h5")) << p->output();
}

// The same signal twice within a moment (a scheduler signalling every process while a launcher
// forwards it too) is one request: the run still saves and exits 130.
TEST(StopSignals, TwoSignalsAtOnceCountAsOne) {
  const SignalRun run("sig_duplicate");
  auto p = run.start({"train.steps=1000", "train.eval_every=1", "train.eval_batches=4"},
                     {"TESSERA_TEST_SAMPLE_DELAY_MS=100"});
  ASSERT_TRUE(p->wait_for_file(run.run() / "metrics.jsonl")) << p->output();
  p->signal(SIGINT);
  p->signal(SIGINT);
  const auto code = p->wait_exit(30);
  ASSERT_TRUE(code.has_value()) << p->output();
  EXPECT_EQ(*code, kExitInterrupted) << p->output();
  EXPECT_NE(p->output().find("stopped by signal: saved"), std::string::npos) << p->output();
  EXPECT_EQ(p->output().find("second signal"), std::string::npos) << p->output();
}

// A first batch that takes long to read (64 samples of 200 ms: 13 s) is abandoned: SIGTERM acts
// within a sample's read, and with no step completed there is nothing to save.
TEST(StopSignals, SigtermWhileTheFirstBatchLoadsActsPromptly) {
  const SignalRun run("sig_load");
  auto p = run.start({"train.global_batch=64", "train.micro_batch=64"}, {"TESSERA_TEST_SAMPLE_DELAY_MS=200"});
  ASSERT_TRUE(p->wait_for_output("model gpt2")) << p->output();  // run() has started: handlers installed
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  p->signal(SIGTERM);
  const auto code = p->wait_exit(30);
  const double took = seconds_since(t0);
  ASSERT_TRUE(code.has_value()) << p->output();
  EXPECT_EQ(*code, kExitPreempted) << p->output();
  EXPECT_LT(took, 5.0) << p->output();  // the batch alone takes 13 s
  EXPECT_NE(p->output().find("preempted by signal before the first step completed: nothing to save"),
            std::string::npos)
      << p->output();
  EXPECT_EQ(p->output().find("step 1/"), std::string::npos) << p->output();
}

// Under mpiexec, SIGTERM to one rank alone during a long evaluation: the ranks vote between
// evaluation batches, so both abandon it at the same batch, save the same step and exit 75.
TEST(StopSignals, OneOfTwoRanksSignalledDuringEvaluationStopsBoth) {
  const SignalRun run("sig_mpi");
  std::vector<std::string> args = {"-n", "2", TESSERA_BINARY};
  for (const auto& a : run.args({"train.steps=1000", "train.eval_every=1", "train.eval_batches=1000000",
                                 "train.micro_batch=4"}))
    args.push_back(a);
  Spawned p(TESSERA_MPIEXEC, args, run.dir / "output.txt");
  ASSERT_TRUE(p.wait_for_file(run.run() / "metrics.jsonl")) << p.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Rank 1: the rank that prints (0) is not the one signalled.
  pid_t rank1 = 0;
  for (pid_t pid : Spawned::descendants(p.pid())) {
    const std::string env = testing::read_file("/proc/" + std::to_string(pid) + "/environ");
    if (env.find(std::string("PMI_RANK=1\0", 11)) != std::string::npos) rank1 = pid;
  }
  ASSERT_NE(rank1, 0) << p.output();
  const auto t0 = Clock::now();
  kill(rank1, SIGTERM);
  const auto code = p.wait_exit(120);
  const double took = seconds_since(t0);
  ASSERT_TRUE(code.has_value()) << "hung after one rank was signalled:\n" << p.output();
  EXPECT_EQ(*code, kExitPreempted) << p.output();
  // About 2 s here (mostly the collective save); up to 45 s was seen with the two cores shared by
  // 18 busy processes, whose ranks then wait for each other's time slices at every collective.
  EXPECT_LT(took, 60.0) << p.output();
  EXPECT_NE(p.output().find("preempted by signal: saved"), std::string::npos) << p.output();
  EXPECT_TRUE(fs::exists(run.run() / "checkpoints" / "step_00000001.h5")) << p.output();
}

}  // namespace
}  // namespace tessera

// Tests app/trainer.h: gradient accumulation equals one large batch, and the `tessera train`
// command end to end (loss falls, files written, config errors, divergence, Ctrl-C).
#include "app/trainer.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace tessera {
namespace {

namespace fs = std::filesystem;

const char* kTinyConfig = R"(
[model]
preset = "gpt2"
n_layer = 2
n_head = 2
n_embd = 32

[data]
digits = 1
val_examples = 16

[train]
steps = 60
global_batch = 8
micro_batch = 8
seq_len = 24
eval_every = 0
eval_batches = 1

[optim]
lr = 3e-3
warmup_steps = 5

[log]
every = 10
progress = "lines"
peak_gflops = 100.0
)";

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("tessera_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Gradient accumulation over k micro-batches computes the same step as one batch of k times the
// size: the same samples, the same mean. Only the summation order of the weight gradients differs
// (fp32 rounding, ~1e-7 relative), and one AdamW step maps a relative gradient change e into a
// parameter change of at most ~lr * e, so parameters agree to ~1e-6 of their scale.
TEST(Trainer, GradientAccumulationEqualsOneLargeBatch) {
  Config one = parse_config_string(kTinyConfig, "tiny.toml");
  Config four = one;
  four.train.micro_batch = 2;  // 4 micro-batches of 2
  Trainer a(one, "", MPI_COMM_SELF), b(four, "", MPI_COMM_SELF);
  ASSERT_EQ(a.grad_accum_steps(), 1);
  ASSERT_EQ(b.grad_accum_steps(), 4);
  const auto ra = a.step(0), rb = b.step(0);
  EXPECT_NEAR(ra.loss, rb.loss, 1e-6 * ra.loss);
  EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-5 * ra.grad_norm);
  const Tensor pa = a.params().flat_params(), pb = b.params().flat_params();
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < pa.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(pa.ptr<float>()[i] - pb.ptr<float>()[i])));
    scale = std::max(scale, static_cast<double>(std::abs(pa.ptr<float>()[i])));
  }
  EXPECT_LT(diff / scale, 1e-5);
}

struct RunResult {
  int exit_code = -1;
  std::string output;
};

// Runs build/tessera with args, output (stdout + stderr) to a file; optionally sends SIGINT once
// `signal_when_file` exists.
RunResult run_tessera(const std::vector<std::string>& args, const fs::path& dir, const fs::path& signal_when_file = {}) {
  const fs::path log = dir / "output.txt";
  std::vector<std::string> full = {TESSERA_BINARY};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  if (!signal_when_file.empty()) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(signal_when_file) || fs::file_size(signal_when_file) == 0) {
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid, SIGINT);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.output = read_file(log);
  return r;
}

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto k = line.find("\"loss\": ");
    if (k != std::string::npos) out.push_back(std::stod(line.substr(k + 8)));
  }
  return out;
}

TEST(TrainCommand, LossFallsAndRunDirectoryHoldsConfigAndMetrics) {
  const fs::path dir = temp_dir("e2e");
  std::ofstream(dir / "tiny.toml") << kTinyConfig;
  const RunResult r = run_tessera({"train", (dir / "tiny.toml").string(), "--run-dir", (dir / "run").string()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 60/60"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 60 steps"), std::string::npos) << r.output;
  const auto l = losses(dir / "run" / "metrics.jsonl");
  ASSERT_EQ(l.size(), 6u);  // every 10 steps
  EXPECT_LT(l.back(), 0.8 * l.front()) << r.output;
  const std::string metrics = read_file(dir / "run" / "metrics.jsonl");
  for (const char* key : {"\"step\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_s\"", "\"mfu\"", "\"elapsed_s\"",
                          "\"val_loss\"", "\"val_accuracy\""})
    EXPECT_NE(metrics.find(key), std::string::npos) << key;
  // The saved config is the resolved one and loads back.
  EXPECT_EQ(load_config((dir / "run" / "config.toml").string()).train.steps, 60);
  fs::remove_all(dir);
}

TEST(TrainCommand, ConfigErrorsStopBeforeAnythingRuns) {
  const fs::path dir = temp_dir("errors");
  std::ofstream(dir / "tiny.toml") << kTinyConfig;
  const std::string cfg = (dir / "tiny.toml").string();
  RunResult r = run_tessera({"train", cfg, "--set", "train.stpes=5", "--run-dir", (dir / "run").string()}, dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("did you mean train.steps"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run"));
  r = run_tessera({"train", cfg, "--set", "train.micro_batch=3"}, dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("global_batch"), std::string::npos) << r.output;
  r = run_tessera({"train", cfg, "--set", "parallel.tp=2"}, dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("[parallel]"), std::string::npos) << r.output;
  r = run_tessera({"train", (dir / "missing.toml").string()}, dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("missing.toml"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(TrainCommand, NonFiniteStepsAreSkippedThenTheRunStops) {
  const fs::path dir = temp_dir("diverge");
  std::ofstream(dir / "tiny.toml") << kTinyConfig;
  // An absurd learning rate overflows the weights after the first update.
  const RunResult r = run_tessera({"train", (dir / "tiny.toml").string(), "--set", "optim.lr=1e30", "--set",
                                   "optim.warmup_steps=0", "--set", "optim.grad_clip=0", "--set",
                                   "train.max_bad_steps=3", "--run-dir", (dir / "run").string()},
                                  dir);
  EXPECT_EQ(r.exit_code, kExitDiverged) << r.output;
  EXPECT_NE(r.output.find("skipped: loss is"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("3 consecutive non-finite steps"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(TrainCommand, CtrlCStopsAfterTheCurrentStepWithASummary) {
  const fs::path dir = temp_dir("sigint");
  std::ofstream(dir / "tiny.toml") << kTinyConfig;
  const fs::path run = dir / "run";
  const RunResult r = run_tessera({"train", (dir / "tiny.toml").string(), "--set", "train.steps=100000", "--set",
                                   "log.every=1", "--run-dir", run.string()},
                                  dir, run / "metrics.jsonl");
  EXPECT_EQ(r.exit_code, kExitInterrupted) << r.output;
  EXPECT_NE(r.output.find("stopped by signal 2: saved"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: "), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

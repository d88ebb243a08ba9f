// Helpers for tests that run the tessera binary: a tiny training config, temp directories, the one
// process spawner (spawn_logged) every test here uses, running `tessera` with its output captured
// (optionally signalled once a file appears), and a tiny `tessera train` run (TrainRun).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace tessera::testing {

namespace fs = std::filesystem;

inline constexpr const char* kTinyConfig = R"(
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

inline fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("tessera_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct RunResult {
  int exit_code = -1;
  std::string output;
};

// Starts argv[0] (a path; no PATH search) with argv, stdout and stderr into `log` (truncated);
// extra_env entries come before this process's environment (so they win over it); with
// own_process_group the child leads a new process group, so kill(-pid, ...) reaches all it starts.
inline pid_t spawn_logged(std::vector<std::string> argv, const fs::path& log,
                          const std::vector<std::string>& extra_env = {}, bool own_process_group = false) {
  std::vector<char*> argp;
  for (auto& a : argv) argp.push_back(a.data());
  argp.push_back(nullptr);
  std::vector<std::string> env_strings(extra_env);
  for (char** e = environ; *e; ++e) env_strings.push_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (own_process_group) {
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);  // a new group led by the child
  }
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, argp[0], &fa, &attr, argp.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return pid;
}

// Runs build/tessera with args, output (stdout + stderr) to a file; optionally sends SIGINT once
// `signal_when_file` exists.
inline RunResult run_program(const std::string& program, const std::vector<std::string>& args, const fs::path& dir,
                             const fs::path& signal_when_file = {}, int signal = SIGINT,
                             const std::vector<std::string>& env = {}) {
  const fs::path log = dir / "output.txt";
  std::vector<std::string> full = {program};
  full.insert(full.end(), args.begin(), args.end());
  const pid_t pid = spawn_logged(std::move(full), log, env);
  if (!signal_when_file.empty()) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(signal_when_file) || fs::file_size(signal_when_file) == 0) {
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid, signal);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.output = read_file(log);
  return r;
}

inline std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto k = line.find("\"loss\": ");
    if (k != std::string::npos) out.push_back(std::stod(line.substr(k + 8)));
  }
  return out;
}

inline RunResult run_tessera(const std::vector<std::string>& args, const fs::path& dir,
                             const fs::path& signal_when_file = {}, int signal = SIGINT,
                             const std::vector<std::string>& env = {}) {
  return run_program(TESSERA_BINARY, args, dir, signal_when_file, signal, env);
}

// A `tessera train` run of kTinyConfig in its own temp directory (config in dir, run dir dir/run);
// each extra entry becomes a `--set`.
struct TrainRun {
  fs::path dir;
  fs::path config;
  fs::path run() const { return dir / "run"; }
  fs::path ckpts() const { return dir / "run" / "checkpoints"; }
  std::vector<std::string> args(const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {"train", config.string(), "--run-dir", run().string(), "--set", "log.every=1"};
    for (auto& e : extra) a.push_back("--set"), a.push_back(e);
    return a;
  }
  RunResult train(const std::vector<std::string>& extra, const fs::path& signal_when = {}, int signal = SIGINT,
                  const std::vector<std::string>& env = {}) const {
    return run_tessera(args(extra), dir, signal_when, signal, env);
  }
};

inline TrainRun make_run(const std::string& name) {
  TrainRun r{temp_dir(name), {}};
  r.config = r.dir / "tiny.toml";
  std::ofstream(r.config) << kTinyConfig;
  return r;
}

}  // namespace tessera::testing

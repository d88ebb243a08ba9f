// A `tessera` (or mpiexec) process started in the background, for tests that act on it while it
// runs: wait for a line of its output or a file, send it real signals, truncate its data, and
// time how long it takes to exit (killed with SIGKILL past a deadline, so an old hang fails fast).
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_testing.h"

namespace tessera::testing {

class Spawned {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts program with args, stdout and stderr into `log`; env entries are added to this
  // process's environment.
  Spawned(const std::string& program, const std::vector<std::string>& args, std::filesystem::path log,
          const std::vector<std::string>& env = {})
      : log_(std::move(log)) {
    std::vector<std::string> full = {program};
    full.insert(full.end(), args.begin(), args.end());
    pid_ = spawn_logged(std::move(full), log_, env);
  }
  ~Spawned() {
    if (!exit_code_) {
      kill_tree(pid_);
      waitpid(pid_, nullptr, 0);
    }
  }
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;

  pid_t pid() const { return pid_; }
  std::string output() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // True once the output holds `text`; false if the process ended or the timeout passed first.
  bool wait_for_output(const std::string& text, double timeout_s = 60) {
    return poll_until([&] { return output().find(text) != std::string::npos; }, timeout_s);
  }
  bool wait_for_file(const std::filesystem::path& file, double timeout_s = 60) {
    return poll_until([&] { return std::filesystem::exists(file) && std::filesystem::file_size(file) > 0; }, timeout_s);
  }
  void signal(int sig) { kill(pid_, sig); }
  // The exit code (128 + signal if killed by one), or nothing if the process was still running
  // after timeout_s: it is then killed, with everything it started.
  std::optional<int> wait_exit(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_code_;
      }
      if (Clock::now() > deadline) {
        kill_tree(pid_);
        waitpid(pid_, &status, 0);
        exit_code_ = -1;
        return std::nullopt;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // The processes `pid` started, and theirs (under mpiexec: the proxy, then the ranks).
  static std::vector<pid_t> descendants(pid_t pid) {
    std::vector<pid_t> out;
    DIR* d = opendir("/proc");
    if (!d) return out;
    std::vector<std::pair<pid_t, pid_t>> all;  // (pid, parent)
    while (dirent* e = readdir(d)) {
      const pid_t p = static_cast<pid_t>(std::atoi(e->d_name));
      if (p <= 0) continue;
      std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
      std::string line;
      if (!std::getline(stat, line)) continue;
      // pid (comm) state ppid ...; comm may hold spaces, so read after the last ')'.
      std::istringstream rest(line.substr(line.rfind(')') + 2));
      std::string state;
      pid_t parent = 0;
      rest >> state >> parent;
      all.emplace_back(p, parent);
    }
    closedir(d);
    std::vector<pid_t> frontier = {pid};
    while (!frontier.empty()) {
      const pid_t parent = frontier.back();
      frontier.pop_back();
      for (const auto& [p, pp] : all)
        if (pp == parent) out.push_back(p), frontier.push_back(p);
    }
    return out;
  }

 private:
  template <typename F>
  bool poll_until(F&& done, double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (!done()) {
      if (Clock::now() > deadline || exited()) return done();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }
  bool exited() const {
    siginfo_t info{};
    return waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_;
  }
  static void kill_tree(pid_t pid) {
    for (pid_t child : descendants(pid)) kill(child, SIGKILL);
    kill(pid, SIGKILL);
  }

  std::filesystem::path log_;
  pid_t pid_ = 0;
  std::optional<int> exit_code_;
};

}  // namespace tessera::testing

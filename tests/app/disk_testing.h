// Helpers for tests of full disks and hangs: a small tmpfs mounted for one test (unmounted by its
// destructor), with RLIMIT_FSIZE as the fallback where mounting is not allowed, and a runner that
// kills a whole process tree (mpiexec and its ranks) when it outlives a deadline.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cli_testing.h"

namespace tessera::testing {

// The names of the entries in dir, sorted.
inline std::vector<std::string> names_of(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Removes a directory tree when destroyed; declared before a SmallDisk inside it, it runs after
// the unmount.
struct RemoveAtEnd {
  fs::path dir;
  ~RemoveAtEnd() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// A tmpfs of `bytes` mounted on `dir` (created) while alive; mounted() is false when the mount was
// refused (not root): callers then fall back to a file size limit (FileSizeLimit).
class SmallDisk {
 public:
  SmallDisk(fs::path dir, int64_t bytes) : dir_(std::move(dir)) {
    fs::create_directories(dir_);
    mounted_ = ::mount("tmpfs", dir_.c_str(), "tmpfs", 0, ("size=" + std::to_string(bytes)).c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);  // detached even if a test left a file open
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;

  bool mounted() const { return mounted_; }
  const fs::path& path() const { return dir_; }
  // Grows (or shrinks) the file system in place, keeping its files.
  bool resize(int64_t bytes) {
    return mounted_ && ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT,
                               ("size=" + std::to_string(bytes)).c_str()) == 0;
  }

 private:
  fs::path dir_;
  bool mounted_ = false;
};

// While alive, files this process and the processes it starts write are limited to `bytes`
// (RLIMIT_FSIZE; SIGXFSZ ignored, so a write past it fails with EFBIG instead of killing).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(int64_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit r = old_;
    r.rlim_cur = static_cast<rlim_t>(bytes);
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  struct rlimit old_ {};
  sighandler_t old_handler_ = SIG_DFL;
};

struct DeadlineResult {
  RunResult run;
  bool timed_out = false;
};

// Runs program with args (output to dir/output.txt) in a process group of its own; past
// `seconds`, the whole group (mpiexec, its proxies and every rank) is killed and timed_out set.
inline DeadlineResult run_with_deadline(const std::string& program, const std::vector<std::string>& args,
                                        const fs::path& dir, int seconds) {
  const fs::path log = dir / "output.txt";
  std::vector<std::string> full = {program};
  full.insert(full.end(), args.begin(), args.end());
  const pid_t pid = spawn_logged(std::move(full), log, {}, /*own_process_group=*/true);
  DeadlineResult out;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      out.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  out.run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  out.run.output = read_file(log);
  return out;
}

}  // namespace tessera::testing

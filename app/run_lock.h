// One training job per run directory: an exclusive flock(2) on <dir>/.tessera.lock, held for the
// whole run. The kernel drops the lock when the process ends however it ends (kill -9 included),
// so no stale lock is ever left to clean up; the file records the holder's host and PID for the
// message a second job prints.
#pragma once

#include <string>
#include <vector>

namespace tessera {

class RunLock {
 public:
  // The lock file's name inside a locked directory.
  static constexpr const char* kFileName = ".tessera.lock";

  // Takes the lock on dir (which must exist) without waiting. Throws tessera::Error naming the
  // lock file and the holder (host, PID, since when) if another process holds it. On a file
  // system without flock (some Lustre mounts) the run goes on unlocked: warning() says so.
  explicit RunLock(const std::string& dir);
  ~RunLock();  // releases the lock; the file stays (deleting it would race with a new holder)
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&& other) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }
  bool held() const { return fd_ >= 0; }
  const std::string& warning() const { return warning_; }  // "" unless the run goes on unlocked

 private:
  int fd_ = -1;
  std::string path_, warning_;
};

// The locks a training job holds (world rank 0 only): the run directory, and checkpoint_dir too
// when it lies outside it (two runs sharing a checkpoint.dir would prune and resume each other's
// files). Empty directories are skipped; the checkpoint directory is created if needed.
std::vector<RunLock> lock_run_directories(const std::string& run_dir, const std::string& checkpoint_dir);

}  // namespace tessera

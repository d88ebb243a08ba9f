// RunLock: flock(2) on <dir>/.tessera.lock; the holder's host and PID written into the file.
#include "app/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>

#include "kernels/check.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

// "host node17, pid 4242, started 2025-01-31 12:00:00 UTC"
std::string holder_line() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  char when[64] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return std::string("host ") + host + ", pid " + std::to_string(::getpid()) + ", started " + when;
}

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    at += n;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

// Whether path is dir or lies under it (both resolved as far as they exist: symlinks, "..").
bool is_within(const fs::path& path, const fs::path& dir) {
  std::error_code ec1, ec2;
  fs::path p = fs::weakly_canonical(fs::absolute(path), ec1), d = fs::weakly_canonical(fs::absolute(dir), ec2);
  if (ec1 || ec2) p = fs::absolute(path).lexically_normal(), d = fs::absolute(dir).lexically_normal();
  const fs::path rel = p.lexically_relative(d);
  return !rel.empty() && *rel.begin() != "..";
}

}  // namespace

RunLock::RunLock(const std::string& dir) : path_((fs::path(dir) / kFileName).string()) {
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TESSERA_CHECK(fd >= 0, "cannot open the lock file ", path_, ": ", std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      std::string holder = read_all(fd);
      ::close(fd);
      if (holder.empty()) holder = "a process that has not written its host and PID yet";
      TESSERA_CHECK(false, "the directory ", dir, " is in use by another tessera job (", holder,
                    "), which holds the lock file ", path_, ". Two jobs in one directory overwrite each other's "
                    "checkpoints and metrics: wait for that job to end (or stop it), or give this one another run "
                    "directory (--run-dir or train.name) and checkpoint.dir");
    }
    // ENOLCK, EOPNOTSUPP, ENOSYS, EINVAL: the file system offers no flock (Lustre without -o flock).
    ::close(fd);
    warning_ = "warning: cannot lock " + path_ + " (" + std::strerror(err) +
               "): this file system does not support flock, so nothing stops a second job from using " + dir;
    return;
  }
  fd_ = fd;
  const std::string line = holder_line() + "\n";
  // Best effort: the lock is what protects; the text only names the holder.
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size()))
    ::fsync(fd_);
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  // Clearing the text first keeps a later reader from naming a holder that has gone (after kill -9
  // the text stays, but then nobody holds the lock and nobody reads it).
  if (::ftruncate(fd_, 0) != 0) {
    // Nothing to do: the text only informs, and the lock goes with the descriptor below.
  }
  ::close(fd_);  // releases the flock
}

RunLock::RunLock(RunLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), warning_(std::move(other.warning_)) {}

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    RunLock old(std::move(*this));
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    warning_ = std::move(other.warning_);
  }
  return *this;
}

std::vector<RunLock> lock_run_directories(const std::string& run_dir, const std::string& checkpoint_dir) {
  std::vector<RunLock> locks;
  if (!run_dir.empty()) locks.emplace_back(run_dir);
  if (!checkpoint_dir.empty() && (run_dir.empty() || !is_within(checkpoint_dir, run_dir))) {
    std::error_code ec;
    fs::create_directories(checkpoint_dir, ec);
    TESSERA_CHECK(!ec, "cannot create checkpoint.dir ", checkpoint_dir, ": ", ec.message());
    locks.emplace_back(checkpoint_dir);
  }
  return locks;
}

}  // namespace tessera

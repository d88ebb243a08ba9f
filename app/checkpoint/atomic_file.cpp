// Exclusive temporaries and atomic replacement (POSIX open/write/fsync/rename).
#include "app/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "kernels/check.h"

namespace tessera {

namespace fs = std::filesystem;

std::string unique_temp_name(const std::string& path) {
  std::random_device rd;  // the kernel's entropy: names differ across processes and restarts
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%016llx", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(r));
  return path + suffix;
}

int create_exclusive(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    TESSERA_CHECK(err != EEXIST, "cannot create ", path, ": a file or symlink with that name already exists");
    detail::fail("cannot create ", path, ": ", std::strerror(err));
  }
  return fd;
}

bool is_temp_name_of(const std::string& name, const std::string& target_name) {
  const std::string base = target_name + ".tmp";
  if (name == base) return true;
  if (name.rfind(base + ".", 0) != 0) return false;
  // ".<pid>.<hex>": digits, a dot, hex digits.
  const std::string rest = name.substr(base.size() + 1);
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string::npos || dot + 1 == rest.size()) return false;
  for (size_t i = 0; i < rest.size(); ++i) {
    const char c = rest[i];
    const bool ok = i < dot ? (c >= '0' && c <= '9') : i == dot || std::isxdigit(static_cast<unsigned char>(c));
    if (!ok) return false;
  }
  return true;
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(unique_temp_name(path_)) {
  fd_ = create_exclusive(tmp_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());  // not committed: leave nothing behind
}

void AtomicFile::write(const void* data, size_t bytes) {
  TESSERA_CHECK(fd_ >= 0, "AtomicFile::write after commit of ", path_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    TESSERA_CHECK(n > 0, "cannot write ", tmp_, ": ", n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  TESSERA_CHECK(fd_ >= 0, "AtomicFile::commit twice for ", path_);
  const int sync_rc = ::fsync(fd_);
  const int sync_err = errno;
  const int close_rc = ::close(fd_);
  const int close_err = errno;
  fd_ = -1;
  TESSERA_CHECK(sync_rc == 0, "cannot write ", tmp_, " to disk: ", std::strerror(sync_err));
  TESSERA_CHECK(close_rc == 0, "cannot write ", tmp_, ": ", std::strerror(close_err));
  TESSERA_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot rename ", tmp_, " to ", path_, ": ",
                std::strerror(errno));
  tmp_.clear();
  const fs::path parent = fs::path(path_).parent_path();
  sync_directory(parent.empty() ? "." : parent.string());
}

}  // namespace tessera

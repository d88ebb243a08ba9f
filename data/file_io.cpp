// ReadOnlyFile, MappedFile and AtomicFileWriter: POSIX open/fstat/pread/mmap and stdio under
// temporary names.
#include "data/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <tuple>
#include <utility>

#include "kernels/check.h"

namespace tessera {

namespace {
// Closes a file descriptor when it leaves scope.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens path read-only and returns the descriptor and size; errors unless it is a regular file.
std::pair<int, int64_t> open_regular_file(const std::string& path) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  TESSERA_CHECK(fd.fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  TESSERA_CHECK(::fstat(fd.fd, &st) == 0, "cannot stat ", path, ": ", std::strerror(errno));
  TESSERA_CHECK(S_ISREG(st.st_mode), path, " is not a regular file");
  const int out = fd.fd;
  fd.fd = -1;  // ownership passes to the caller
  return {out, static_cast<int64_t>(st.st_size)};
}
}  // namespace

ReadOnlyFile::ReadOnlyFile(const std::string& path) : path_(path) {
  std::tie(fd_, size_) = open_regular_file(path);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read(int64_t offset, int64_t bytes, void* dst) const {
  auto* out = static_cast<char*>(dst);
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd_, out + done, static_cast<size_t>(bytes - done), static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;  // a signal (the stop handlers) interrupted the read
    TESSERA_CHECK(n >= 0, "cannot read ", path_, " (", bytes, " bytes at byte offset ", offset, "): ",
                  std::strerror(errno));
    if (n == 0) fail_short_read(offset, bytes, done);
    done += n;
  }
}

void ReadOnlyFile::fail_short_read(int64_t offset, int64_t bytes, int64_t got) const {
  struct stat st {};
  const std::string now = ::fstat(fd_, &st) == 0 ? std::to_string(st.st_size) : "an unknown number of";
  detail::fail(path_, ": cannot read ", bytes, " bytes at byte offset ", offset,
               got > 0 ? " (only " + std::to_string(got) + " there)" : std::string(), ": the file has ", now,
               " bytes now, ", size_, " when it was opened (truncated or rewritten while in use?)");
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  FdGuard fd{-1};
  std::tie(fd.fd, size_) = open_regular_file(path);
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd.fd, 0);
  TESSERA_CHECK(p != MAP_FAILED, "cannot map ", path, " (", size_, " bytes): ", std::strerror(errno));
  data_ = static_cast<const std::byte*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), static_cast<size_t>(size_));
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp." + std::to_string(::getpid())) {
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  TESSERA_CHECK(file_ != nullptr, "cannot create ", tmp_path_, " (for ", path_, "): ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_) std::fclose(file_);
  if (!renamed_) std::remove(tmp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  TESSERA_CHECK(file_ != nullptr, "internal: write to ", path_, " after close");
  if (bytes == 0) return;
  TESSERA_CHECK(std::fwrite(data, 1, bytes, file_) == bytes, "cannot write ", tmp_path_, ": ", std::strerror(errno));
  written_ += static_cast<int64_t>(bytes);
}

void AtomicFileWriter::close() {
  if (!file_) return;
  const bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  TESSERA_CHECK(ok && closed, "cannot write ", tmp_path_, ": ", std::strerror(err));
}

void AtomicFileWriter::rename() {
  TESSERA_CHECK(file_ == nullptr, "internal: rename of ", path_, " before close");
  TESSERA_CHECK(std::rename(tmp_path_.c_str(), path_.c_str()) == 0, "cannot rename ", tmp_path_, " to ", path_, ": ",
                std::strerror(errno));
  renamed_ = true;
}

}  // namespace tessera

// Shared by the fuzz targets: inputs written to files in a per-process directory under /dev/shm
// (the readers take paths; tmpfs keeps the disk out of each execution), splitting one input into
// several files, and the oracle: a reader may throw tessera::Error, anything else is a finding.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "kernels/check.h"

namespace tessera::fuzz {

// /dev/shm/tessera_fuzz_<target>_<pid>, created on first use and removed at normal exit (a crash
// leaves it; scripts/fuzz.sh removes those). TESSERA_FUZZ_KEEP=1 keeps it, to look at the files
// that the last input became (run the target on that one input).
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& target) {
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm"
                                                                                 : std::filesystem::temp_directory_path();
    path_ = base / ("tessera_fuzz_" + target + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    if (const char* keep = std::getenv("TESSERA_FUZZ_KEEP"); keep && std::string(keep) == "1") return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Writes bytes to path (replacing it). A failure here is the harness's, not the reader's: abort.
inline void write_file(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      std::perror(path.c_str());
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Up to max_parts pieces separated by NUL bytes (the last piece keeps any further NULs). For text
// formats, where a NUL never belongs, it is the natural cut.
inline std::vector<std::string_view> split_at_nul(std::string_view in, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t nul = in.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(in.substr(0, nul));
    in.remove_prefix(nul + 1);
  }
  parts.push_back(in);
  return parts;
}

// Two binary files from one input: a little-endian uint32 length n, then n bytes of the first
// file (fewer if the input ends) and the rest for the second.
struct TwoFiles {
  std::string_view first, second;
};
inline TwoFiles split_length_prefixed(std::string_view in) {
  if (in.size() < 4) return {in, {}};
  uint32_t n = 0;
  std::memcpy(&n, in.data(), 4);
  in.remove_prefix(4);
  const size_t cut = n < in.size() ? n : in.size();
  return {in.substr(0, cut), in.substr(cut)};
}

// Runs f: a tessera::Error is the reader's correct answer to bad input; any other exception is a
// finding (the input deserved a message naming what is wrong), reported and turned into a crash.
template <typename F>
void expect_clean(const char* what, F&& f) {
  try {
    f();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FUZZ FINDING: %s threw %s, not tessera::Error: %s\n", what, typeid(e).name(), e.what());
    std::abort();
  }
}

// An invariant of the reader failed on this input (e.g. a round trip): report and crash.
[[noreturn]] inline void finding(const std::string& message) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", message.c_str());
  std::abort();
}

}  // namespace tessera::fuzz

// Files that appear whole or not at all, written through temporaries that cannot be hijacked:
// each temporary gets a fresh name (<path>.tmp.<pid>.<random>) and is created with O_EXCL |
// O_NOFOLLOW, so a file or symlink planted under a predictable name is refused, never followed;
// the finished file is fsync'ed and renamed over the target (atomic on POSIX file systems).
#pragma once

#include <cstddef>
#include <string>

namespace tessera {

// "<path>.tmp.<pid>.<16 random hex digits>": a name no earlier run and no other process uses.
std::string unique_temp_name(const std::string& path);
// Creates path exclusively (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644) and returns the descriptor;
// an existing file or symlink there is an error naming it.
int create_exclusive(const std::string& path);
// Whether `name` (a file name, no directory) is a temporary of `target_name` that
// unique_temp_name made, or the fixed "<target>.tmp" that older tessera versions used.
bool is_temp_name_of(const std::string& name, const std::string& target_name);
// fsync of a directory, so that a rename in it survives a crash; errors are ignored (some file
// systems refuse to sync directories).
void sync_directory(const std::string& dir);

// Writes `path` atomically: bytes go to a fresh exclusive temporary; commit() syncs it and renames
// it over path. Destroyed without commit (an error, an exception), it removes the temporary.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Throws tessera::Error naming the temporary and the reason (e.g. "No space left on device").
  void write(const void* data, size_t bytes);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // fsync, close, rename over path, fsync the directory.
  void commit();
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

}  // namespace tessera

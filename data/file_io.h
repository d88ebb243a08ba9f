// Files for the on-disk dataset formats: a file read with pread (token data, read while training
// runs), a read-only memory mapping (headers and indices, read while opening) and a writer that
// makes a file appear whole or not at all (written under a temporary name, renamed on commit).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace tessera {

// The formats are little-endian and values are written and read in native order.
static_assert(std::endian::native == std::endian::little, "tessera's file formats assume a little-endian host");

// A regular file opened read-only and read at any offset with pread. For data read while training
// runs: a file truncated meanwhile gives a short read, reported as an error naming the file, the
// offset and the length, where touching a mapped page the file no longer backs would kill the
// process with SIGBUS. (A file replaced by rename keeps being read whole: the descriptor holds it.)
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::string& path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  int64_t size() const { return size_; }  // when opened
  const std::string& path() const { return path_; }
  // Reads bytes [offset, offset + bytes) into dst; safe from several threads at once. An error
  // naming the file, offset and length when the file no longer holds them or the read fails.
  void read(int64_t offset, int64_t bytes, void* dst) const;

 private:
  [[noreturn]] void fail_short_read(int64_t offset, int64_t bytes, int64_t got) const;

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// The whole of a file mapped read-only, for what is read only while a dataset is opened (a file
// truncated under a mapping raises SIGBUS when a vanished page is touched, so data read during
// training goes through ReadOnlyFile instead). Errors name the path. An empty file maps to no memory
// (data() is null, size() 0): mmap refuses a length of 0.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  int64_t size_ = 0;
};

// A little-endian value at any byte offset of a buffer (the .idx arrays start at offset 34, so
// they are not aligned for their type). memcpy compiles to a plain load.
template <typename T>
T load_le(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Writes PATH through PATH.tmp.<pid>; commit() flushes, closes and renames it onto PATH. A writer
// destroyed before commit() (an error on the way) removes its temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  template <typename T>
  void write_value(const T& v) {
    write(&v, sizeof(T));
  }
  int64_t bytes_written() const { return written_; }
  // Closes the temporary file; a later rename() makes it visible. Two steps so that a pair of
  // files (.bin and .idx) is renamed only once both are fully written.
  void close();
  void rename();
  void commit() {
    close();
    rename();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_path_;
  std::FILE* file_ = nullptr;
  int64_t written_ = 0;
  bool renamed_ = false;
};

}  // namespace tessera

// Files for the on-disk dataset formats: a read-only memory mapping (RAII) and a writer that
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

// The whole of a file mapped read-only. Errors name the path. An empty file maps to no memory
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

// Hugging Face's safetensors format, written (the export) and read (the import): an 8-byte
// little-endian header size N, N bytes of JSON giving each tensor's dtype, shape and byte range,
// then the data. Key decision: the reader checks the whole header when it opens a file (dtypes,
// shapes, ranges that tile the data exactly, as the format requires) and reads one tensor at a
// time with pread, so a model is never whole in memory; model folders sharded with
// model.safetensors.index.json open as one set of tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/file_io.h"
#include "kernels/tensor.h"

namespace tessera {

// ---- writing ----

// A tensor to store in a safetensors file; data() produces its float32 values when written, so
// only one tensor at a time is in memory.
struct SafetensorsEntry {
  std::string name;
  Shape shape;
  std::function<std::vector<float>()> data;
};
// Writes the safetensors format, every tensor "F32", back to back in entry order, the JSON padded
// with spaces so the data starts 8-byte aligned. Written to a fresh exclusive temporary
// (app/checkpoint/atomic_file.h) and renamed, so a failed write leaves no partial file and a file
// or symlink planted in the directory is never written through.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata);

// ---- reading ----

// The header's largest allowed size (the format's own limit, 100 MB).
inline constexpr int64_t kSafetensorsMaxHeader = 100'000'000;

// "(768, 2304)": a shape as the messages write it.
std::string safetensors_shape_str(const std::vector<int64_t>& shape);

// One tensor of a file as its header describes it.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as written: "F32", "BF16", "I32", "F8_E4M3", ...
  std::vector<int64_t> shape;   // empty: a scalar
  int64_t offset = 0;           // of its first byte in the file (8 + N + data_offsets[0])
  int64_t bytes = 0;
  int64_t numel() const;
  std::string shape_str() const { return safetensors_shape_str(shape); }
};

// Whether the reader converts tensors of this dtype to float32: F32, F16 and BF16. The others it
// knows (BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F64, F8_E4M3, F8_E5M2) are validated but
// refused when read.
bool safetensors_float_dtype(const std::string& dtype);

// One .safetensors file, its header checked when opened. Errors name the file and, for a
// tensor, its name: a file shorter than its header, a header size over kSafetensorsMaxHeader or
// the file, JSON that is malformed or not an object of tensors, a repeated name, an entry without
// dtype, shape or data_offsets (or with other keys), an unknown dtype, a negative dimension, a byte
// range that does not hold shape x dtype bytes, that lies outside the file, or overlaps another or
// leaves a gap (the format has tensors cover the data exactly), and __metadata__ that is not an
// object of strings.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  // In file order (by offset).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's values as float32 (F16 and BF16 widened exactly). Another dtype, or a file that
  // no longer holds the bytes, is an error naming the tensor and the file.
  std::vector<float> read_f32(const SafetensorsTensor& t) const;

 private:
  ReadOnlyFile file_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a Hugging Face model folder: model.safetensors, or the shards that
// model.safetensors.index.json's "weight_map" names (tensor -> file), each header checked when
// opened. Errors name the file and the tensor: a folder with neither (saying so when it holds
// PyTorch's pytorch_model.bin instead), a shard the index names that is missing, a tensor the
// index puts in a shard that lacks it, a tensor in a shard the index does not list there, a tensor
// in two shards, a shard path that leaves the folder.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& dir);

  // Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  const SafetensorsTensor& tensor(const std::string& name) const;
  // The file that holds it.
  const std::string& file_of(const std::string& name) const;
  std::vector<float> read_f32(const std::string& name) const;
  // The files, in the index's order of first use (or the one model.safetensors).
  std::vector<std::string> files() const;
  bool sharded() const { return sharded_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const SafetensorsTensor*>> where_;
  bool sharded_ = false;
};

}  // namespace tessera

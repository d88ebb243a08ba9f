// safetensors: the writer (float32 tensors produced one at a time), the header check, tensor reads
// with F16/BF16 widening, and the sharded folder's index.
#include "app/checkpoint/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "app/checkpoint/atomic_file.h"
#include "data/json.h"
#include "kernels/check.h"

namespace tessera {

static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian values");

namespace fs = std::filesystem;

// ---- writing ----

namespace {

std::string shape_json(const Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.ndim(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  std::string h = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : metadata) {
    if (!first) h += ',';
    h += Json(k).dump() + ":" + Json(v).dump();
    first = false;
  }
  h += "}";
  int64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    const int64_t bytes = e.shape.numel() * static_cast<int64_t>(sizeof(float));
    h += ',';
    h += Json(e.name).dump();
    h += ":{\"dtype\":\"F32\",\"shape\":" + shape_json(e.shape);
    h += ",\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  h += "}";
  h.resize((h.size() + 7) / 8 * 8, ' ');  // the data then starts at 8 + N, a multiple of 8
  return h;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(entries, metadata);
  // A fresh exclusive temporary (a planted file or symlink is never followed), renamed when whole.
  AtomicFile out(path);
  const uint64_t n = header.size();
  out.write(&n, sizeof n);
  out.write(header);
  for (const SafetensorsEntry& e : entries) {
    const std::vector<float> values = e.data();
    TESSERA_CHECK(static_cast<int64_t>(values.size()) == e.shape.numel(), "safetensors entry ", e.name, " produced ",
                  values.size(), " values for shape ", e.shape.str());
    out.write(values.data(), values.size() * sizeof(float));
  }
  out.commit();
}

// ---- reading ----

namespace {

// Bytes per element of the dtypes the format defines with whole-byte elements.
int64_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// IEEE half to float, exactly (every half is a float).
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (mant << 13);  // inf, or NaN with its payload
  } else if (exp != 0) {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {        // subnormal: mant x 2^-24, normalized
    int e = -1;
    uint32_t m = mant;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400) == 0);
    bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((m & 0x3FF) << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// a * b, or -1 when it passes 2^62 (no real tensor comes near; a hostile header might).
int64_t checked_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > (int64_t{1} << 62) / b ? -1 : a * b;
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

std::string safetensors_shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

bool safetensors_float_dtype(const std::string& dtype) { return dtype == "F32" || dtype == "F16" || dtype == "BF16"; }

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const int64_t size = file_.size();
  TESSERA_CHECK(size >= 8, path, " is not a safetensors file: ", size, " bytes, shorter than the 8-byte header size");
  uint64_t n = 0;
  file_.read(0, 8, &n);
  TESSERA_CHECK(n <= static_cast<uint64_t>(kSafetensorsMaxHeader), path, ": the header size is ", n,
                " bytes, over the format's limit of ", kSafetensorsMaxHeader, " (not a safetensors file?)");
  TESSERA_CHECK(static_cast<int64_t>(n) <= size - 8, path, ": the header size is ", n, " bytes, but the file has only ",
                size - 8, " after it (truncated?)");
  std::string text(static_cast<size_t>(n), '\0');
  file_.read(8, static_cast<int64_t>(n), text.data());
  TESSERA_CHECK(!text.empty() && text[0] == '{', path, ": the header does not start with '{' (not a safetensors file?)");
  const Json header = parse_json(text, path + " (header)");
  TESSERA_CHECK(header.is_object(), path, ": the header is ", json_kind(header), ", expected an object of tensors");

  const int64_t data_start = 8 + static_cast<int64_t>(n), data_bytes = size - data_start;
  for (const auto& [name, entry] : header.items()) {
    const std::string where = path + ": tensor \"" + name + "\"";
    if (name == "__metadata__") {
      TESSERA_CHECK(entry.is_object(), path, ": __metadata__ is ", json_kind(entry), ", expected an object of strings");
      for (const auto& [k, v] : entry.items()) {
        TESSERA_CHECK(v.is_string(), path, ": __metadata__ \"", k, "\" is ", json_kind(v), ", expected a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    TESSERA_CHECK(entry.is_object(), where, " is ", json_kind(entry),
                  ", expected an object with dtype, shape and data_offsets");
    for (const auto& [k, v] : entry.items())
      TESSERA_CHECK(k == "dtype" || k == "shape" || k == "data_offsets", where, " has an unknown field \"", k,
                    "\" (expected dtype, shape and data_offsets)");
    SafetensorsTensor t;
    t.name = name;
    const std::optional<std::string> dtype = json_string(entry, "dtype", where);
    TESSERA_CHECK(dtype.has_value(), where, " has no dtype");
    t.dtype = *dtype;
    const int64_t elem = dtype_bytes(t.dtype);
    TESSERA_CHECK(elem > 0, where, " has dtype \"", t.dtype, "\", which is not one of the format's whole-byte "
                  "dtypes (F32, F16, BF16, F64, I8..I64, U8..U64, BOOL, F8_E4M3, F8_E5M2)");
    const auto shape = entry.find("shape");
    TESSERA_CHECK(shape != entry.end() && shape->is_array(), where, " has no shape (an array of dimensions)");
    int64_t numel = 1;
    for (const Json& d : *shape) {
      TESSERA_CHECK(d.is_number_integer() && !(d.is_number_unsigned() && d.get<uint64_t>() > (uint64_t{1} << 62)) &&
                        d.get<int64_t>() >= 0,
                    where, " has a dimension ", d.dump(), " in its shape; expected integers >= 0");
      t.shape.push_back(d.get<int64_t>());
      numel = checked_mul(numel, t.shape.back());
      TESSERA_CHECK(numel >= 0, where, " has shape ", shape->dump(), ": too many elements");
    }
    const auto offsets = entry.find("data_offsets");
    TESSERA_CHECK(offsets != entry.end() && offsets->is_array() && offsets->size() == 2 &&
                      (*offsets)[0].is_number_unsigned() && (*offsets)[1].is_number_unsigned(),
                  where, " needs data_offsets [begin, end] (two integers >= 0)");
    const uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
    TESSERA_CHECK(begin <= end && end <= static_cast<uint64_t>(data_bytes), where, " has data_offsets [", begin, ", ",
                  end, "], outside the ", data_bytes, " data bytes of the file (truncated?)");
    const int64_t bytes = checked_mul(numel, elem);
    TESSERA_CHECK(bytes >= 0 && static_cast<uint64_t>(bytes) == end - begin, where, " (", t.dtype, ", shape ",
                  t.shape_str(), ") needs ", bytes, " bytes, but data_offsets [", begin, ", ", end, "] hold ",
                  end - begin);
    t.offset = data_start + static_cast<int64_t>(begin);
    t.bytes = bytes;
    tensors_.push_back(std::move(t));
  }
  // The format's rule: the tensors cover the data bytes exactly, with no gap and no overlap.
  std::sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
  });
  int64_t at = data_start;
  for (const SafetensorsTensor& t : tensors_) {
    TESSERA_CHECK(t.offset >= at, path, ": tensor \"", t.name, "\" (bytes ", t.offset - data_start, "..",
                  t.offset - data_start + t.bytes, " of the data) overlaps the tensor before it");
    TESSERA_CHECK(t.offset == at, path, ": the data has a gap of ", t.offset - at, " bytes before tensor \"", t.name,
                  "\" (the format puts tensors back to back)");
    at += t.bytes;
  }
  TESSERA_CHECK(at == size, path, ": ", size - at, " bytes after the last tensor belong to none (the format puts "
                "tensors back to back to the end of the file)");
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> SafetensorsFile::read_f32(const SafetensorsTensor& t) const {
  TESSERA_CHECK(safetensors_float_dtype(t.dtype), path(), ": tensor \"", t.name, "\" is ", t.dtype,
                "; tessera reads F32, F16 and BF16 tensors only",
                t.dtype.rfind("F8", 0) == 0 || t.dtype[0] == 'I' || t.dtype[0] == 'U'
                    ? " (integer and 8-bit float weights are a quantized model's: import its unquantized release)"
                    : "");
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  if (t.dtype == "F32") {
    file_.read(t.offset, t.bytes, out.data());
    return out;
  }
  std::vector<uint16_t> half(n);
  file_.read(t.offset, t.bytes, half.data());
  if (t.dtype == "F16") {
    for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(half[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(half[i]);
  }
  return out;
}

// ---- a model folder ----

SafetensorsSet::SafetensorsSet(const std::string& dir) {
  const fs::path d(dir);
  TESSERA_CHECK(fs::is_directory(d), dir, " is not a directory (expected a Hugging Face model folder)");
  const fs::path single = d / "model.safetensors", index = d / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    TESSERA_CHECK(fs::exists(single), dir, " has neither model.safetensors nor model.safetensors.index.json",
                  fs::exists(d / "pytorch_model.bin") || fs::exists(d / "pytorch_model.bin.index.json")
                      ? " (it has PyTorch's pytorch_model.bin, which tessera does not read: save the model with "
                        "safe_serialization=True, or convert it to safetensors)"
                      : "");
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const SafetensorsTensor& t : files_[0]->tensors()) where_[t.name] = {files_[0].get(), &t};
    return;
  }
  sharded_ = true;
  const std::string idx = index.string();
  const Json j = read_json_file(idx);
  TESSERA_CHECK(j.is_object(), idx, " is ", json_kind(j), ", expected an object with \"weight_map\"");
  const auto map = j.find("weight_map");
  TESSERA_CHECK(map != j.end() && map->is_object(), idx, " has no \"weight_map\" object (tensor name -> shard file)");
  std::map<std::string, const SafetensorsFile*> shard_of_file;
  std::map<const SafetensorsFile*, std::set<std::string>> listed;  // per shard, the names the index puts there
  for (const auto& [name, file] : map->items()) {
    TESSERA_CHECK(file.is_string(), idx, ": weight_map \"", name, "\" is ", json_kind(file), ", expected a file name");
    const std::string f = file.get<std::string>();
    const fs::path rel(f);
    TESSERA_CHECK(!f.empty() && rel.is_relative() && rel.lexically_normal().string().rfind("..", 0) != 0, idx,
                  ": weight_map \"", name, "\" names \"", f, "\", a file outside the folder");
    auto it = shard_of_file.find(f);
    if (it == shard_of_file.end()) {
      const fs::path p = d / rel;
      TESSERA_CHECK(fs::exists(p), idx, " puts \"", name, "\" in ", f, ", which is missing from ", dir,
                    " (an incomplete download?)");
      files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
      it = shard_of_file.emplace(f, files_.back().get()).first;
    }
    const SafetensorsTensor* t = it->second->find(name);
    TESSERA_CHECK(t != nullptr, idx, " puts \"", name, "\" in ", f, ", but ", it->second->path(), " has no such tensor");
    where_[name] = {it->second, t};
    listed[it->second].insert(name);
  }
  TESSERA_CHECK(!files_.empty(), idx, ": weight_map is empty");
  for (const auto& file : files_)
    for (const SafetensorsTensor& t : file->tensors()) {
      if (listed[file.get()].count(t.name)) continue;
      const auto w = where_.find(t.name);
      TESSERA_CHECK(w == where_.end(), "tensor \"", t.name, "\" is in both ", w->second.first->path(), " and ",
                    file->path());
      detail::fail(file->path(), " holds tensor \"", t.name, "\", which ", idx, " does not list there");
    }
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (const auto& [name, w] : where_) out.push_back(name);
  return out;
}

const SafetensorsTensor& SafetensorsSet::tensor(const std::string& name) const {
  const auto it = where_.find(name);
  TESSERA_CHECK(it != where_.end(), "no tensor \"", name, "\" in the safetensors files");
  return *it->second.second;
}

const std::string& SafetensorsSet::file_of(const std::string& name) const {
  tensor(name);
  return where_.at(name).first->path();
}

std::vector<float> SafetensorsSet::read_f32(const std::string& name) const {
  tensor(name);
  const auto& [file, t] = where_.at(name);
  return file->read_f32(*t);
}

std::vector<std::string> SafetensorsSet::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

}  // namespace tessera

// IndexedDataset (validate everything at open, then read in place) and IndexedDatasetBuilder.
#include "data/indexed_dataset.h"

#include <filesystem>
#include <limits>

#include "kernels/check.h"

namespace tessera {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The path of one of the pair, checked to exist first so the message says which file is missing.
std::string existing_file(const std::string& prefix, const char* ext) {
  const std::string path = prefix + ext;
  TESSERA_CHECK(std::filesystem::exists(path), "missing file ", path, ": an indexed dataset is a pair ", prefix,
                ".bin + ", prefix, ".idx");
  return path;
}

// Ids representable in a dtype, for the builder's range check.
std::pair<int64_t, int64_t> dtype_range(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8: return {0, 255};
    case TokenDType::kInt8: return {0, 127};
    case TokenDType::kInt16: return {0, 32767};
    case TokenDType::kUInt16: return {0, 65535};
    default: return {0, std::numeric_limits<int32_t>::max()};
  }
}

template <typename T>
void convert(std::span<const int32_t> ids, std::byte* out) {
  auto* p = reinterpret_cast<T*>(out);
  for (size_t i = 0; i < ids.size(); ++i) p[i] = static_cast<T>(ids[i]);
}

}  // namespace

std::string indexed_dataset_prefix(const std::string& path) {
  if (ends_with(path, ".bin") || ends_with(path, ".idx")) return path.substr(0, path.size() - 4);
  return path;
}

// ---- reader ----

IndexedDataset::IndexedDataset(const std::string& path)
    : prefix_(indexed_dataset_prefix(path)),
      idx_(existing_file(prefix_, ".idx")),
      bin_(existing_file(prefix_, ".bin")) {
  validate_header();
  validate_arrays();
  validate_bin_size();
}

void IndexedDataset::validate_header() {
  const std::string& path = idx_.path();
  const int64_t size = idx_.size();
  const std::byte* p = idx_.data();
  TESSERA_CHECK(size >= 9 && std::memcmp(p, kIndexedMagic, 9) == 0, path,
                " is not a Megatron indexed dataset index: wrong magic (expected the 9 bytes \"MMIDIDX\\0\\0\")");
  TESSERA_CHECK(size >= kIndexedHeaderBytes, path, " is truncated: ", size, " bytes, but the header alone is ",
                kIndexedHeaderBytes);
  const auto version = load_le<uint64_t>(p + 9);
  TESSERA_CHECK(version == kIndexedVersion, path, ": unsupported index version ", version, " (tessera reads version ",
                kIndexedVersion, ")");
  const auto code = load_le<uint8_t>(p + 17);
  const auto dtype = token_dtype_from_code(code);
  TESSERA_CHECK(dtype.has_value(), path, ": unknown dtype code ", int(code),
                " (Megatron's codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)");
  TESSERA_CHECK(token_dtype_is_integer(*dtype), path, ": dtype ", token_dtype_name(*dtype),
                " (code ", int(code), ") cannot hold token ids");
  dtype_ = *dtype;
  const auto S = load_le<uint64_t>(p + 18), D = load_le<uint64_t>(p + 26);
  // Counts beyond 2^40 cannot come from a real file; rejecting them keeps the size sums exact.
  constexpr uint64_t kMaxCount = uint64_t(1) << 40;
  TESSERA_CHECK(S < kMaxCount && D < kMaxCount, path, ": implausible header (", S, " sequences, ", D,
                " document indices)");
  num_sequences_ = static_cast<int64_t>(S);
  num_doc_indices_ = static_cast<int64_t>(D);
  const int64_t need = kIndexedHeaderBytes + 12 * num_sequences_ + 8 * num_doc_indices_;
  TESSERA_CHECK(size >= need, path, " is truncated: ", size, " bytes, but its header (", S, " sequences, ", D,
                " document indices) needs ", need);
  // Megatron's multimodal datasets append one int8 mode per sequence; nothing else may follow.
  TESSERA_CHECK(size == need || size == need + num_sequences_, path, " has ", size - need,
                " unexpected bytes after its arrays (", S, " sequences, ", D, " document indices)");
  TESSERA_CHECK(num_doc_indices_ >= 1, path, ": the document index is empty (Megatron writes at least the leading 0)");
}

void IndexedDataset::validate_arrays() {
  const std::string& path = idx_.path();
  const int64_t item = token_dtype_size(dtype_);
  int64_t end = 0;  // byte where the previous sequence ends
  for (int64_t s = 0; s < num_sequences_; ++s) {
    const int32_t len = sequence_length(s);
    const int64_t ptr = sequence_pointer(s);
    TESSERA_CHECK(len >= 0, path, ": sequence ", s, " has negative length ", len);
    TESSERA_CHECK(ptr >= end, path, ": sequence pointers are not monotonic: sequence ", s, " starts at byte ", ptr,
                  ", before the end of the previous sequence at byte ", end);
    TESSERA_CHECK(ptr == end, path, ": sequence ", s, " starts at byte ", ptr, ", leaving a gap after the previous ",
                  "sequence's end at byte ", end, " (tessera needs sequences back to back, as Megatron writes them)");
    end = ptr + int64_t(len) * item;
  }
  num_tokens_ = end / item;
  int64_t prev = 0;
  for (int64_t d = 0; d < num_doc_indices_; ++d) {
    const auto first = load_le<int64_t>(doc_indices() + 8 * d);
    TESSERA_CHECK(d > 0 || first == 0, path, ": document index 0 is ", first, ", expected 0");
    TESSERA_CHECK(first >= prev && first <= num_sequences_, path, ": document index ", d, " is ", first,
                  " (after ", prev, "; indices must rise from 0 to the ", num_sequences_, " sequences)");
    prev = first;
  }
  TESSERA_CHECK(prev == num_sequences_, path, ": the last document index is ", prev, " but there are ",
                num_sequences_, " sequences");
}

void IndexedDataset::validate_bin_size() const {
  const int64_t need = num_tokens_ * token_dtype_size(dtype_);
  TESSERA_CHECK(bin_.size() >= need, bin_.path(), " is too small: ", bin_.size(), " bytes, but ", idx_.path(),
                " places ", num_tokens_, " ", token_dtype_name(dtype_), " tokens up to byte ", need,
                " (truncated .bin, or .bin and .idx from different datasets)");
  TESSERA_CHECK(bin_.size() == need, bin_.path(), " has ", bin_.size(), " bytes, more than the ", need, " that ",
                idx_.path(), " describes (.bin and .idx from different datasets?)");
}

int32_t IndexedDataset::sequence_length(int64_t s) const { return load_le<int32_t>(lengths() + 4 * s); }

int64_t IndexedDataset::sequence_pointer(int64_t s) const { return load_le<int64_t>(pointers() + 8 * s); }

TokenSpan IndexedDataset::sequence(int64_t s) const {
  return tokens().subspan(sequence_pointer(s) / token_dtype_size(dtype_), sequence_length(s));
}

int64_t IndexedDataset::document_first_sequence(int64_t d) const {
  return load_le<int64_t>(doc_indices() + 8 * d);
}

int64_t IndexedDataset::document_token_offset(int64_t d) const {
  const int64_t s = document_first_sequence(d);
  return s == num_sequences_ ? num_tokens_ : sequence_pointer(s) / token_dtype_size(dtype_);
}

TokenSpan IndexedDataset::document(int64_t d) const {
  const int64_t begin = document_token_offset(d);
  return tokens().subspan(begin, document_token_offset(d + 1) - begin);
}

// ---- writer ----

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, TokenDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype), bin_(prefix_ + ".bin") {
  TESSERA_CHECK(token_dtype_is_integer(dtype), "indexed dataset ", prefix_, ": cannot store token ids as ",
                token_dtype_name(dtype));
}

TokenDType IndexedDatasetBuilder::dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenDType::kUInt16 : TokenDType::kInt32;
}

void IndexedDatasetBuilder::add_document(std::span<const int32_t> ids) {
  TESSERA_CHECK(!finalized_, "indexed dataset ", prefix_, ": add_document after finalize");
  TESSERA_CHECK(ids.size() <= size_t(std::numeric_limits<int32_t>::max()), "indexed dataset ", prefix_,
                ": a document of ", ids.size(), " tokens exceeds the format's int32 sequence length");
  const auto [lo, hi] = dtype_range(dtype_);
  for (size_t i = 0; i < ids.size(); ++i)
    TESSERA_CHECK(ids[i] >= lo && ids[i] <= hi, "indexed dataset ", prefix_, ": token id ", ids[i], " (document ",
                  lengths_.size(), ", position ", i, ") does not fit dtype ", token_dtype_name(dtype_));
  buffer_.resize(ids.size() * token_dtype_size(dtype_));
  switch (dtype_) {
    case TokenDType::kUInt8: convert<uint8_t>(ids, buffer_.data()); break;
    case TokenDType::kInt8: convert<int8_t>(ids, buffer_.data()); break;
    case TokenDType::kInt16: convert<int16_t>(ids, buffer_.data()); break;
    case TokenDType::kUInt16: convert<uint16_t>(ids, buffer_.data()); break;
    case TokenDType::kInt32: convert<int32_t>(ids, buffer_.data()); break;
    case TokenDType::kInt64: convert<int64_t>(ids, buffer_.data()); break;
    default: break;
  }
  bin_.write(buffer_.data(), buffer_.size());
  lengths_.push_back(static_cast<int32_t>(ids.size()));
  num_tokens_ += static_cast<int64_t>(ids.size());
}

void IndexedDatasetBuilder::write_index(AtomicFileWriter& idx) const {
  const uint64_t S = lengths_.size(), D = S + 1;
  idx.write(kIndexedMagic, sizeof(kIndexedMagic));
  idx.write_value<uint64_t>(kIndexedVersion);
  idx.write_value<uint8_t>(static_cast<uint8_t>(dtype_));
  idx.write_value<uint64_t>(S);
  idx.write_value<uint64_t>(D);
  idx.write(lengths_.data(), lengths_.size() * sizeof(int32_t));
  std::vector<int64_t> v(S);
  int64_t ptr = 0;
  for (size_t s = 0; s < S; ++s) {
    v[s] = ptr;
    ptr += int64_t(lengths_[s]) * token_dtype_size(dtype_);
  }
  idx.write(v.data(), v.size() * sizeof(int64_t));
  v.resize(D);
  for (size_t d = 0; d < D; ++d) v[d] = static_cast<int64_t>(d);  // one sequence per document
  idx.write(v.data(), v.size() * sizeof(int64_t));
}

void IndexedDatasetBuilder::finalize() {
  TESSERA_CHECK(!finalized_, "indexed dataset ", prefix_, ": finalize called twice");
  AtomicFileWriter idx(prefix_ + ".idx");
  write_index(idx);
  bin_.close();
  idx.close();
  bin_.rename();
  idx.rename();
  finalized_ = true;
}

}  // namespace tessera

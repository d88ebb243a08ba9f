// Megatron-LM's indexed dataset ("MMIDIDX" version 1): PREFIX.bin holds the token ids of every
// sequence back to back, PREFIX.idx their lengths, byte offsets and document boundaries.
// Byte-compatible with megatron/core/datasets/indexed_dataset.py both ways. The .idx is mapped and
// validated whole at open, so a bad file fails with a message naming it, never later mid-run; the
// .bin is read with pread, so one truncated while training runs is an error, not a SIGBUS.
//
// PREFIX.idx, all little-endian, arrays packed with no padding (S sequences, D = documents + 1):
//   offset 0         9 bytes   magic "MMIDIDX\0\0"
//   offset 9         uint64    version, 1
//   offset 17        uint8     dtype code of the .bin elements (TokenDType)
//   offset 18        uint64    S, the number of sequences
//   offset 26        uint64    D, the number of document indices
//   offset 34        int32[S]  sequence lengths, in tokens
//   offset 34 + 4S   int64[S]  sequence pointers, byte offsets into the .bin
//   offset 34 + 12S  int64[D]  document indices: document d is sequences [idx[d], idx[d + 1]);
//                              idx[0] = 0 and idx[D - 1] = S
// (Megatron's multimodal variant appends int8[S] sequence modes; tessera reads past them.)
// tessera writes one sequence per document.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/file_io.h"
#include "data/token_span.h"

namespace tessera {

inline constexpr char kIndexedMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexedVersion = 1;
inline constexpr int64_t kIndexedHeaderBytes = 34;

// "data/x", "data/x.bin" and "data/x.idx" all name the dataset with prefix "data/x".
std::string indexed_dataset_prefix(const std::string& path);

// A read-only indexed dataset (.idx memory-mapped, .bin read with pread). Opening checks: both files exist, magic, version,
// dtype code, that the .idx holds the arrays its header announces, document indices run from 0
// to S without going back, sequences follow each other in the .bin (pointer k = the end of
// sequence k - 1: what every Megatron writer produces) and the .bin is exactly as long as the
// index says.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& path);  // PREFIX, PREFIX.bin or PREFIX.idx

  const std::string& prefix() const { return prefix_; }
  std::string bin_path() const { return prefix_ + ".bin"; }
  std::string idx_path() const { return prefix_ + ".idx"; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_indices_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

  int32_t sequence_length(int64_t s) const;
  int64_t sequence_pointer(int64_t s) const;  // in bytes
  TokenSpan sequence(int64_t s) const;
  // Document d's first sequence; document_first_sequence(num_documents()) = num_sequences().
  int64_t document_first_sequence(int64_t d) const;
  // The position of document d's first token in tokens(); d = num_documents() gives num_tokens().
  int64_t document_token_offset(int64_t d) const;
  TokenSpan document(int64_t d) const;
  // Every token, in file order: the documents back to back.
  TokenSpan tokens() const { return TokenSpan(&bin_, 0, num_tokens_, dtype_); }

 private:
  void validate_header();
  void validate_arrays();
  void validate_bin_size() const;
  const std::byte* lengths() const { return idx_.data() + kIndexedHeaderBytes; }
  const std::byte* pointers() const { return lengths() + 4 * num_sequences_; }
  const std::byte* doc_indices() const { return pointers() + 8 * num_sequences_; }

  std::string prefix_;
  MappedFile idx_;
  ReadOnlyFile bin_;
  TokenDType dtype_ = TokenDType::kUInt16;
  int64_t num_sequences_ = 0, num_doc_indices_ = 0, num_tokens_ = 0;
};

// Writes PREFIX.bin and PREFIX.idx, one sequence per document, under temporary names renamed
// into place by finalize(): readers never see half a dataset. Not finalizing discards both.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string prefix, TokenDType dtype);
  // uint16 when every id of a vocabulary of vocab_size fits (vocab_size <= 65,536), else int32.
  // (Megatron's own tools switch to int32 a little earlier, at 65,500; both read either.)
  static TokenDType dtype_for_vocab(int64_t vocab_size);

  // Appends a document. Ids must fit the dtype (e.g. 0 <= id < 65,536 for uint16).
  void add_document(std::span<const int32_t> ids);
  void finalize();

  int64_t num_documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  TokenDType dtype() const { return dtype_; }
  std::string bin_path() const { return prefix_ + ".bin"; }
  std::string idx_path() const { return prefix_ + ".idx"; }

 private:
  void write_index(AtomicFileWriter& idx) const;

  std::string prefix_;
  TokenDType dtype_;
  AtomicFileWriter bin_;
  std::vector<int32_t> lengths_;
  std::vector<std::byte> buffer_;  // one document converted to the dtype
  int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace tessera

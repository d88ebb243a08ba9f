// SequenceLayout: which positions of a sequence this rank holds, as chunks of consecutive global
// positions stored one after another along the local T axis. Sequence parallelism inside tp holds
// one chunk per rank ([r T / tp, (r + 1) T / tp)), context parallelism (later) two load-balanced
// chunks, a KV-cache decoding step one chunk starting at the cache's length; positions (learned,
// RoPE) are applied chunk by chunk, so a rank's rows get their true global positions.
// Packed documents (data.document_mask) refine a layout: each row also knows where its document
// starts, positions restart at each document start, and attention masks other documents' keys.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace tessera {

// A run of consecutive global positions [start, start + length), held in consecutive local rows.
struct SequenceChunk {
  int64_t start = 0;
  int64_t length = 0;
  int64_t end() const { return start + length; }
  bool operator==(const SequenceChunk&) const = default;
};

// Where one kernel call applies positions in a (B, T_local, ...) tensor: batch rows
// [b_begin, b_end), local rows [row, row + length) of each, at global positions
// [position, position + length).
struct SequenceRun {
  int64_t b_begin = 0, b_end = 0;
  int64_t row = 0, length = 0;
  int64_t position = 0;
};

class SequenceLayout {
 public:
  SequenceLayout() = default;  // holds no position
  // Chunks in local order, each non-empty and at positions >= 0, no two overlapping; chunks that
  // continue each other are merged (so a split of one chunk is still one chunk). Errors name the
  // offending chunk.
  explicit SequenceLayout(std::vector<SequenceChunk> chunks);
  // Positions [start, start + T) in order: a whole sequence (start 0) or a decoding step's.
  static SequenceLayout contiguous(int64_t T, int64_t start = 0);
  // Context parallelism's load balance under a causal mask (Megatron-LM, Transformer Engine): a
  // sequence of T cut into 2 * parts equal chunks; rank `index` of `parts` holds chunks index and
  // 2 parts - 1 - index (an early and a late one), so every rank has the same attention work.
  // Example, T = 16, parts = 2: rank 0 holds [0, 4) [12, 16), rank 1 [4, 8) [8, 12) (one chunk).
  static SequenceLayout load_balanced(int64_t T, int64_t parts, int64_t index);

  // Sequence parallelism: part `index` of `parts` equal parts of this layout's local rows, with
  // their global positions (a part may cut through chunks). The rows must divide evenly.
  // Example: contiguous(12).split(3, 1) holds [4, 8); load_balanced(16, 2, 0).split(2, 1) [12, 16).
  SequenceLayout split(int64_t parts, int64_t index) const;

  // Packed documents: a copy of this layout whose B sequences' rows belong to documents. doc_start
  // (B, length()) holds for each sequence and local row the global position of the first token of
  // its document: at or before the row's position, and within a chunk either the row before's
  // start or the row's own position (the row starts a document). Positions then restart at each
  // document (runs() are cut at document starts and count a row's position from its document's
  // start), and attention masks the keys before a query's document start. Errors name the row.
  // doc_position (B, length()), when not empty, continues a document cut into pieces (variable-length
  // batches, data/token_batching.h): the position its document start takes instead of 0, the same
  // for every row of a document and >= 0; positions then run from it.
  SequenceLayout with_documents(int64_t B, std::vector<int32_t> doc_start,
                                std::vector<int32_t> doc_position = {}) const;
  bool has_documents() const { return docs_ != nullptr; }
  // The (B, length()) document starts as a host I32 tensor over the layout's storage (valid while
  // the layout lives); undefined without documents.
  Tensor doc_starts() const;
  // The document starts of sequence b's rows [row, row + n), or null without documents.
  const int32_t* doc_starts(int64_t b, int64_t row) const;

  int64_t length() const { return length_; }  // local rows
  bool empty() const { return chunks_.empty(); }
  const std::vector<SequenceChunk>& chunks() const { return chunks_; }
  // One past the largest position held (0 when empty): what must fit the model's positions. With
  // documents, one past the largest position a row's document gives it.
  int64_t end_position() const;
  // The global position of local row `row`.
  int64_t position(int64_t row) const;
  // The runs of a (B, length(), ...) tensor in which to apply positions: one over the whole batch
  // for a one-chunk layout (one kernel call, as without a layout), else one per sequence and chunk;
  // with documents, one per sequence, chunk and document piece, at the position within the document.
  std::vector<SequenceRun> runs(int64_t B) const;
  // Equal chunks, and equal documents (or none on both sides).
  bool operator==(const SequenceLayout& o) const;
  bool same_chunks(const SequenceLayout& o) const { return chunks_ == o.chunks_; }
  std::string str() const;  // "[0, 4) [12, 16)"

 private:
  std::vector<SequenceChunk> chunks_;
  int64_t length_ = 0;
  int64_t doc_batch_ = 0;                               // B of the documents
  std::shared_ptr<const std::vector<int32_t>> docs_;  // (B, length_) document starts; shared by copies
  std::shared_ptr<const std::vector<int32_t>> doc_pos_;  // (B, length_) document positions, or null (all 0)
  int32_t doc_position(int64_t b, int64_t row) const {
    return doc_pos_ ? (*doc_pos_)[static_cast<size_t>(b * length_ + row)] : 0;
  }
};

// The rows of t (B, T_local, ...) that a run covers, as a view (b_end - b_begin, length, ...): a
// run of several batch rows spans all of T_local, so the view is contiguous either way.
Tensor run_view(const Tensor& t, const SequenceRun& run);

}  // namespace tessera

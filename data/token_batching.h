// Variable-length batches (data.batching = "tokens", docs/data.md): whole documents, cut into pieces
// of at most seq_len tokens whose positions continue, packed into micro-batches of rows by a token
// budget and balanced over the data-parallel ranks by their real tokens. Key decision: a step's plan
// is a pure function of a cursor (a document position in the shuffled order and a piece of it), so
// every rank computes the same plan and a run resumes bit-exactly from the cursor alone.
//
// A micro-batch is (R, L): R rows of L = train.seq_len positions, R = train.tokens_per_micro_batch / L.
// Each row holds pieces back to back, then padding (its own document, no targets):
//
//     row 0 | doc 17 (0..5)    | doc 3 piece 1 (pos 64..70) | pad   |
//     row 1 | doc 42 (0..11)                   | doc 8 (0..3)  | pad |
//
// Attention stays within a piece (the document mask), positions count from the piece's position.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <cstdint>
#include <optional>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"
#include "data/token_dataset.h"

namespace tessera {

// One document of a token stream: inputs are the stream's tokens [begin, begin + length), targets
// the tokens one later. Documents end at the end-of-text id, which is the last target of its
// document and the first input of the next (it stands for "a document starts": the next document's
// first token is predicted from it). So the documents tile the inputs [0, N - 1) of N tokens.
struct DocumentSpan {
  int64_t begin = 0, length = 0;
  bool operator==(const DocumentSpan&) const = default;
};

// The documents of tokens[0, n) ending at each eot id (the last may end without one); none empty.
std::vector<DocumentSpan> find_documents(const int32_t* tokens, int64_t n, int32_t eot);
// The same over a whole dataset's stream, read in chunks (one pass; an error when it holds no input).
std::vector<DocumentSpan> find_documents(const TokenWindowDataset& ds, int32_t eot);

// A piece of a document: its inputs [begin, begin + length) of the stream (length <= seq_len), the
// position its first token takes (piece j of a document: (j seq_len) mod position_period).
struct DocumentPiece {
  int64_t document = 0;  // index into the packer's documents
  int64_t begin = 0, length = 0, position = 0;
  bool operator==(const DocumentPiece&) const = default;
};

// Where the next step starts: piece `piece` of the document at position `document` of the shuffled
// document order (document / N is the epoch; the order is the windows' Sampler over documents).
struct PackCursor {
  int64_t document = 0, piece = 0;
  bool operator==(const PackCursor&) const = default;
};

struct PackingShape {
  int64_t seq_len = 0;          // L: the row length and the longest piece
  int64_t rows = 0;             // R: rows per micro-batch (tokens_per_micro_batch / L)
  int64_t micro_batches = 0;    // M: per rank and step (gradient accumulation)
  int64_t dp_size = 1;
  int64_t position_period = 0;  // a multiple of L, <= the model's positions: where piece positions wrap
  int64_t step_capacity() const { return dp_size * micro_batches * rows * seq_len; }
};

// A micro-batch's rows, each a list of pieces back to back (at most L tokens together).
struct MicroBatchPlan {
  std::vector<std::vector<DocumentPiece>> rows;
  int64_t tokens() const;  // real (input) tokens
};

struct StepPlan {
  std::vector<std::vector<MicroBatchPlan>> ranks;  // [dp rank][micro-batch]
  std::vector<int64_t> rank_tokens;                // real tokens per dp rank
  PackCursor next;                                 // where the following step starts
  int64_t tokens() const;
  // Token imbalance over dp: max / mean - 1 of rank_tokens (0 = equal; 0 for an empty step).
  double imbalance() const;
};

// The packing and balancing rule (docs/data.md), in three steps:
// 1. the step takes the pieces that follow the cursor, in order, while their tokens fit its capacity
//    (dp x M x R x L) and they belong to the cursor's epoch (an epoch's last step may be short, and
//    every epoch trains each token exactly once);
// 2. first-fit decreasing packs them into the step's dp x M x R rows (longest first, ties in stream
//    order, each into the first row with room); when one fits no row, the step drops its last piece
//    in stream order and packs again (the first piece always fits);
// 3. the rows, fullest first, go to the dp rank with the fewest tokens that still has a free row
//    (ties: the lower rank), micro-batch by micro-batch.
// Steps 1 and 2 do not depend on dp: every layout trains the same documents in the same steps (the
// 1-rank run's), and only step 3 spreads them (measured: ranks 1.9% apart on the mean step, 4.9% on
// the worst; docs/performance.md).
class TokenPacker {
 public:
  TokenPacker(std::vector<DocumentSpan> documents, uint64_t seed, bool shuffle, PackingShape shape);

  StepPlan plan_step(PackCursor at) const;
  int64_t num_documents() const { return static_cast<int64_t>(documents_.size()); }
  const PackingShape& shape() const { return shape_; }
  // The pieces of the document at position q of the shuffled order (all of them, in order).
  std::vector<DocumentPiece> pieces_at(int64_t q) const;

 private:
  bool pack_rows(std::vector<DocumentPiece> pieces, std::vector<std::vector<DocumentPiece>>& rows) const;
  void balance(const std::vector<std::vector<DocumentPiece>>& rows, StepPlan& plan) const;
  std::vector<DocumentSpan> documents_;
  Sampler order_;
  PackingShape shape_;
};

// Reads micro-batch `plan` from the stream as a (R, L) batch: tokens, targets (kIgnoreTarget where
// the loss mask excludes the target, and in the padding), doc_start (each piece a document, the
// padding one of its own) and doc_position (the pieces' positions). pad: the id the padding holds.
Batch make_packed_batch(const TokenWindowDataset& ds, const MicroBatchPlan& plan, int64_t seq_len, int32_t pad);

// A loader's producer (data/loader.h) of dp rank `dp_rank`'s micro-batches from the step at `from` on.
std::function<std::optional<Batch>(const std::atomic<bool>&)> packed_batches(
    std::shared_ptr<const TokenWindowDataset> ds, std::shared_ptr<const TokenPacker> packer, PackCursor from,
    int64_t dp_rank, int32_t pad);

}  // namespace tessera

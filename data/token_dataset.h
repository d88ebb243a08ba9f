// Training samples from token files: TokenWindowDataset cuts one stream of tokens (an indexed
// dataset, or llm.c shards concatenated in order) into packed windows of T + 1 tokens with
// stride T, ignoring document boundaries (GPT-2/nanoGPT style; end-of-document ids separate them).
// Plus the helpers that find files: globs, format detection, and the held-out validation split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/indexed_dataset.h"
#include "data/llmc_shard.h"
#include "data/loss_mask_file.h"
#include "data/token_span.h"

namespace tessera {

// A contiguous run of tokens of one file, kept open by `owner`.
struct TokenSegment {
  std::shared_ptr<const void> owner;  // the IndexedDataset or LlmcShard that holds the file open
  TokenSpan tokens;
  std::string path;        // the file, for messages
  int64_t first_position;  // the position of tokens[0] among that file's tokens
  // The file's loss mask (PREFIX.mask beside an indexed dataset, `prepare --sft`), flag k for
  // token first_position + k; null: every token is a target.
  std::shared_ptr<const LossMaskFile> mask = nullptr;
};

TokenSegment whole_segment(std::shared_ptr<const IndexedDataset> ds);
TokenSegment whole_segment(std::shared_ptr<const LlmcShard> shard);
// Documents [first, last) of an indexed dataset, with the loss mask beside it when there is one.
TokenSegment document_segment(std::shared_ptr<const IndexedDataset> ds, int64_t first, int64_t last);

// Sample i is tokens [i*T, i*T + T + 1) of the concatenated segments; the last partial window is
// dropped, so there are (N - 1) / T samples for N tokens. The loss mask is the segments' mask
// files where they have one, else all ones.
// Token ids outside [0, vocab_size) are errors naming the file and position: checked for the whole
// stream at construction when it is at most kEagerCheckBytes (a vectorized min/max pass), and
// always for the tokens get() copies out. (eager_check_bytes lets tests take the lazy path.)
class TokenWindowDataset : public Dataset {
 public:
  // The full check runs at memory speed: 256 MB of tokens in the page cache took 0.04-0.09 s
  // here (2 shared cores, read in 256 KiB chunks), so 1 GiB about 0.2-0.35 s. Beyond 1 GiB (data
  // that may not even be cached) opening stays instant and get() finds a bad id when its window
  // is used.
  static constexpr int64_t kEagerCheckBytes = int64_t(1) << 30;

  TokenWindowDataset(std::vector<TokenSegment> segments, int64_t seq_len, int64_t vocab_size,
                     int64_t eager_check_bytes = kEagerCheckBytes);

  int64_t num_samples() const override { return num_samples_; }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return vocab_size_; }
  void get(int64_t index, int32_t* out, uint8_t* loss_mask) const override;
  std::string describe() const override;

  int64_t num_tokens() const { return starts_.back(); }
  // Any run of the stream: tokens [begin, begin + count) into out, their loss-mask flags into
  // loss_mask when not null (what get() reads for a window; variable-length batches read documents).
  void read(int64_t begin, int64_t count, int32_t* out, uint8_t* loss_mask) const;
  const std::vector<TokenSegment>& segments() const { return segments_; }

 private:
  std::string source_name() const;  // "PATH" or "PATH and k more files"
  void check_all_ids() const;
  [[noreturn]] void fail_bad_id(int64_t stream_position, int64_t id) const;
  size_t segment_of(int64_t stream_position) const;
  void copy_loss_mask(int64_t begin, int64_t count, uint8_t* out) const;  // stream positions [begin, begin + count)

  std::vector<TokenSegment> segments_;
  std::vector<int64_t> starts_;  // starts_[k] = stream position of segment k's first token; back() = total
  int64_t seq_len_ = 0, vocab_size_ = 0, num_samples_ = 0;
};

// Paths matching a glob(3) pattern, sorted; an error naming the pattern when none match.
std::vector<std::string> expand_glob(const std::string& pattern);

enum class TokenFileFormat { kIndexed, kLlmcShard };
// PREFIX / PREFIX.idx, or PREFIX.bin with PREFIX.idx beside it: indexed. A .bin (or any file)
// without an .idx whose first 4 bytes are the llm.c magic: an llm.c shard. Otherwise an error.
TokenFileFormat detect_token_format(const std::string& path);

// Every file named by paths (each a path, a prefix or a glob pattern), in order, opened and
// validated; a dataset matched twice (x.bin and x.idx by one glob) is taken once.
std::vector<TokenSegment> open_token_segments(const std::vector<std::string>& paths);

// Opens paths as one stream: open_token_segments then TokenWindowDataset.
std::unique_ptr<TokenWindowDataset> open_token_dataset(const std::vector<std::string>& paths, int64_t seq_len,
                                                       int64_t vocab_size);

// The first held-out document when the last `fraction` of num_documents is kept for validation:
// floor((1 - fraction) * N), at least one document on each side. fraction 0 returns N (nothing
// held out). Errors for a fraction outside [0, 1) or too few documents to split.
int64_t validation_first_document(int64_t num_documents, double fraction, const std::string& what);

// Documents [0, first) for training and [first, N) for validation, first as above.
struct TrainValSegments {
  TokenSegment train, val;
};
TrainValSegments split_documents(std::shared_ptr<const IndexedDataset> ds, double val_fraction);

}  // namespace tessera

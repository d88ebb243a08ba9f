// data.batching = "tokens" wired into a run (variable-length batches; the packing itself is
// data/token_batching.h): the config's checks, the packer over the training stream for this layout,
// the cursor a step starts from, and the cursor's record in the checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "app/checkpoint/checkpoint_io.h"
#include "app/config.h"
#include "app/training_data.h"
#include "data/loader.h"
#include "data/token_batching.h"

namespace tessera {

// The checkpoint group that holds the cursor (attributes document, piece).
inline constexpr const char* kTokenBatchingGroup = "/data_tokens";

// data.batching and train.tokens_per_micro_batch against the rest of the config: an Error naming the
// keys for what variable-length batches do not support (another task, a blend, train.micro_batch
// other than the budget's rows, a budget not a multiple of train.seq_len, an in-run re-layout
// ([upscale] method), a device without the document mask).
void check_token_batching(const Config& c);

// data.batching = "tokens": train.micro_batch set to the budget's rows (tokens_per_micro_batch /
// seq_len); otherwise cfg as it is.
Config with_token_micro_batch(Config cfg);

class TokenBatching {
 public:
  // Null for data.batching = "windows". micro_batches: per rank and step.
  static std::unique_ptr<TokenBatching> open(const Config& cfg, const TrainingData& data, int64_t dp_size,
                                             int64_t micro_batches);

  // dp rank's micro-batches from the step at cursor() on.
  std::unique_ptr<DataLoader> loader(int64_t dp_rank) const;
  // The step at cursor() is done: the cursor moves past it, and its plan's numbers are counted.
  void advance();
  const PackCursor& cursor() const { return cursor_; }
  void set_cursor(PackCursor c) { cursor_ = c; }
  int64_t num_documents() const { return packer_->num_documents(); }

  // The steps advance() passed since the last take_window(): their mean real tokens per step (all
  // ranks) and their dp token imbalance (max over ranks / mean - 1), mean and worst.
  struct Window {
    double tokens_per_step = 0, imbalance_mean = 0, imbalance_max = 0;
  };
  Window take_window();

  AttrMap record() const;
  // The cursor of a checkpoint's record; an Error naming the file when it has none.
  static PackCursor cursor_of(const GroupAttributes& groups, const std::string& path);

 private:
  std::shared_ptr<const TokenWindowDataset> dataset_;
  std::shared_ptr<const TokenPacker> packer_;
  int32_t pad_ = 0;
  PackCursor cursor_;
  int64_t window_steps_ = 0, window_tokens_ = 0;
  double window_imbalance_sum_ = 0, window_imbalance_max_ = 0;
};

}  // namespace tessera

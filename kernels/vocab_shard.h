// VocabShard: which part of the vocabulary a (tensor-parallel) embedding table or logits tensor
// holds. Rank r of tp holds global ids [start, start + valid); its table may have extra rows after
// them (padding, so every rank's table has the same shape): padding rows are never looked up and
// padding logit columns are left out of the softmax. The default is the whole vocabulary.
#pragma once

#include <cstdint>

namespace tessera {

struct VocabShard {
  int64_t start = 0;   // first global id held
  int64_t valid = -1;  // ids held (-1: every row of the table)
  int64_t vocab = -1;  // the full vocabulary, for checking ids (-1: the table's rows)

  // The shard of rank `rank` of `parts` when each holds ceil(vocab / parts) rows.
  static VocabShard of(int64_t vocab, int64_t parts, int64_t rank) {
    const int64_t rows = (vocab + parts - 1) / parts;
    const int64_t start = rows * rank;
    const int64_t end = start + rows < vocab ? start + rows : vocab;
    return {start, end > start ? end - start : 0, vocab};
  }
  static int64_t rows_per_part(int64_t vocab, int64_t parts) { return (vocab + parts - 1) / parts; }
  // With the table's row count filled in for the defaults.
  VocabShard resolved(int64_t rows) const { return {start, valid < 0 ? rows : valid, vocab < 0 ? rows : vocab}; }
  bool whole(int64_t rows) const { return start == 0 && (valid < 0 || valid == rows) && (vocab < 0 || vocab == rows); }
};

}  // namespace tessera

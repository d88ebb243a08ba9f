// Token and (optional, learned) position embedding lookup.
#pragma once

#include <cstdint>

#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "kernels/vocab_shard.h"

namespace tessera {

// out (B, T, C) = wte[tokens[b, t]] (V, C) + wpe[pos_offset + t] (P, C).
// tokens (B, T) I32; wpe may be undefined (RoPE models). A token id outside [0, V) or a position
// at or beyond P is an Error naming the id.
// Vocabulary-parallel: with a shard, wte holds ids [shard.start, shard.start + shard.valid) and ids
// in [0, shard.vocab) are accepted; an id held elsewhere contributes a zero row (the tensor-parallel
// group then sums the ranks' outputs).
void embedding_forward(const Exec& ex, const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, const VocabShard& shard = {});

// dwte (V, C) += rows of dout scattered by token; dwpe (P, C) += dout summed over B at pos_offset + t.
// Both accumulated; dwpe skipped when undefined. Deterministic (no atomics in a racy order).
// With a shard, only the rows of ids held here receive gradient.
void embedding_backward(const Exec& ex, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, int64_t pos_offset, const VocabShard& shard = {});

}  // namespace tessera

// The trainer's side of context parallelism (parallel.cp, parallel.cp_comm): the cp group as the
// model sees it, and each cp rank's share of a batch. The sequence is cut into 2 cp chunks and cp
// rank r holds chunks r and 2 cp - 1 - r (SequenceLayout::load_balanced): its tokens and targets
// are those positions' (the window is read whole, then cut), and the model is told their global
// positions (learned positions, RoPE, the causal mask across ranks).
#pragma once

#include "app/config.h"
#include "data/dataset.h"
#include "parallel/context_attention.h"
#include "parallel/grid_comms.h"

namespace tessera {

// The cp group of comms (null comms, or cp = 1: inactive) with parallel.cp_comm's mode.
ContextParallel context_parallel_of(const ParallelConfig& p, const GridComms* comms);

// The rows of b (B, T) that this cp rank holds, in the layout's order: a (B, L) batch,
// L = T / cp (document starts, when b has them, taken along: global positions). Images (kind =
// "vlm") are all kept, with their global start positions: every cp rank runs the encoder on each
// and writes the rows it holds (model/gpt.h). cp = 1: b as it is.
Batch cp_share(const Batch& b, const ContextParallel& cp);

// The positions the model is told for share, this rank's cp_share of sequences of T: cp.layout(T),
// with share's documents when it has them (SequenceLayout::with_documents).
SequenceLayout share_layout(const Batch& share, const ContextParallel& cp, int64_t T);

}  // namespace tessera

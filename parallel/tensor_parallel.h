// Tensor parallelism as the model sees it, and the mappings between its regions (Megatron-LM's
// f and g operators, and their sequence-parallel forms). The model calls these at the edges of
// each column-parallel -> row-parallel pair (attention, MLP) and around the vocabulary-parallel
// embedding and LM head; everything between runs on this rank's shard with no communication.
//
//   region edge          plain tp: forward / backward        sequence parallel: forward / backward
//   enter (before a      identity / all-reduce dx            all-gather along T / reduce-scatter dx
//   column layer)
//   leave (after a       all-reduce y / identity             reduce-scatter along T / all-gather dy
//   row layer)
//
// Under sequence parallelism the residual stream, norms and dropout between regions hold
// (B, T / tp, C): rank r holds positions [r T / tp, (r + 1) T / tp) of every sequence, which
// shard_sequence states as a SequenceLayout (parallel/sequence_layout.h). Inside a region the
// model sees the tp group's whole sequence, whose length and positions its own layout gives.
#pragma once

#include <cstdint>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "parallel/communicator.h"
#include "parallel/sequence_layout.h"

namespace tessera {

class TpCompression;      // parallel/tp_compression.h
struct TpReceived;

struct TensorParallel {
  Communicator* comm = nullptr;    // the tensor-parallel group; null: tp = 1
  bool sequence_parallel = false;  // ignored when tp = 1
  // parallel.tp_overlap_chunks: > 1 cuts the sequence-parallel edges into this many chunks along
  // the sequence, each chunk's collective beside the next chunk's GEMMs (parallel/tp_overlap.h).
  int64_t overlap_chunks = 1;
  // parallel.tp_comm_compression: the run's compression (owned by the trainer; null: exact) and
  // the layer region these edges belong to (a block's attention 2 l, its MLP 2 l + 1; -1: exact,
  // e.g. the embedding and the LM head). Only the region edges below compress.
  TpCompression* compression = nullptr;
  int site = -1;
  TensorParallel at_site(int s) const {
    TensorParallel t = *this;
    t.site = s;
    return t;
  }

  int64_t size() const { return comm ? comm->size() : 1; }
  int64_t rank() const { return comm ? comm->rank() : 0; }
  bool active() const { return size() > 1; }
  bool sequence_sharded() const { return active() && sequence_parallel; }
  // The part of the group's sequence `seq` this rank holds between regions: all of it, or under
  // sequence parallelism part rank() of size() of its rows (of a whole sequence of T:
  // [r T / tp, (r + 1) T / tp)). Not to be confused with seq itself, which under context
  // parallelism is already this tp group's chunks of the global sequence.
  SequenceLayout shard_sequence(const SequenceLayout& seq) const {
    return sequence_sharded() ? seq.split(size(), rank()) : seq;
  }
};

// In place: t becomes the sum of every tp rank's t (no-op when tp = 1).
void all_reduce_tp(const TensorParallel& tp, const Tensor& t);

// full (B, T, C) = every rank's local (B, T / tp, C), in rank order along T.
void gather_sequence(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& full,
                     const Tensor& local);

// local (B, T / tp, C) = this rank's positions of the sum over ranks of full (B, T, C).
void reduce_scatter_sequence(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& local,
                             const Tensor& full);

// Entering a region (forward): the full (B, T, C) input. Plain tp: x itself (storage untouched);
// sequence parallel: x gathered into `storage`.
Tensor enter_region(const Exec& ex, const TensorParallel& tp, Allocator& alloc, Buffer& storage, const Tensor& x,
                    int64_t T);
// Entering a region (backward): dx_local (B, T / tp or T, C) from the region's partial input
// gradient dx_full (B, T, C): all-reduce (dx_local must then be dx_full) or reduce-scatter.
void enter_region_backward(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& dx_local,
                           const Tensor& dx_full);
// Leaving a region (forward): y_local from the rank's partial output y_full (all-reduce in place,
// y_local = y_full; or reduce-scatter). received: where a forward with error feedback keeps what it
// received for a recomputed forward to replay (parallel/tp_compression.h TpReceived), or null.
void leave_region(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& y_local,
                  const Tensor& y_full, TpReceived* received = nullptr);
// Where a region's full-sequence result goes before leave_region (its output) or
// enter_region_backward (its input gradient): `local` (B, T_local, C) itself without sequence
// parallelism, else a (B, T, C) workspace buffer in `storage`.
Tensor region_full(const TensorParallel& tp, Allocator& alloc, Buffer& storage, const Tensor& local, int64_t T);
// Leaving a region (backward): the full output gradient (B, T, C) from dy (local): dy itself or
// gathered into `storage`.
Tensor leave_region_backward(const Exec& ex, const TensorParallel& tp, Allocator& alloc, Buffer& storage,
                             const Tensor& dy, int64_t T);

}  // namespace tessera

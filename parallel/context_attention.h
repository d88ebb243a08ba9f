// Context parallelism: causal attention over a sequence whose positions are spread over the cp
// group, each rank holding the load-balanced pair of chunks SequenceLayout::load_balanced gives
// (the sequence cut into 2 cp chunks; rank r holds chunks r and 2 cp - 1 - r, so every rank has
// the same causal attention work). Queries stay on their rank; keys and values move:
//
//   ring       (default) each rank's K and V travel once around the cp ring by point-to-point
//              transfers. At step i a rank attends to the K/V of rank (r - i) mod cp while the
//              next block's transfer is already in flight; the partial results merge by their
//              log-sum-exp (attention_merge). Backward: K/V travel the ring again, and the dK/dV
//              of each block travel with them back to their owner, accumulating on the way.
//   allgather  K and V are all-gathered once per layer (cheap under grouped-query attention,
//              which is why Llama 3 trains so), the same blocks run against the gathered copy,
//              and backward gathers them again and reduce-scatters their gradients.
//
// Both modes compute the same blocks in the same order (rank (r - i) mod cp at step i), so their
// results agree to rounding. Every block is one attention_forward / attention_backward call with
// the chunks' global positions as offsets; pairs of chunks that the causal mask hides entirely
// are skipped.
// Packed documents (data.document_mask): the layout carries each local row's document start
// (SequenceLayout::with_documents, global positions), which is all the mask needs on every rank: a
// query sees key position j iff its document start <= j <= its position, wherever the key lives.
// A key chunk wholly before the earliest document start of a query chunk (over the batch) is
// skipped like a causally hidden one; inside a block the kernel skips masked tiles.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "parallel/communicator.h"
#include "parallel/sequence_layout.h"

namespace tessera {

enum class CpComm { Ring, AllGather };
// "ring" / "allgather"; anything else is an Error naming parallel.cp_comm and the value.
CpComm parse_cp_comm(const std::string& s);
const char* cp_comm_name(CpComm c);

struct ContextParallel {
  Communicator* comm = nullptr;  // the cp group; null: cp = 1
  CpComm mode = CpComm::Ring;

  int64_t size() const { return comm ? comm->size() : 1; }
  int64_t rank() const { return comm ? comm->rank() : 0; }
  bool active() const { return size() > 1; }
  // The positions of a sequence of T that cp rank `index` holds: load-balanced chunks under cp,
  // the whole sequence otherwise.
  SequenceLayout layout_of(int64_t T, int64_t index) const {
    return active() ? SequenceLayout::load_balanced(T, size(), index) : SequenceLayout::contiguous(T);
  }
  SequenceLayout layout(int64_t T) const { return layout_of(T, rank()); }
};

// What one rank's calls computed: visible (query, key) pairs summed over batch rows and query
// heads (the causal attention work, 4 D FLOPs each forward), and attention kernel calls.
// ring_wait_s: host seconds blocked waiting for the ring's transfers after the block they overlap
// was computed (the part of the transfer time not hidden behind attention; on CUDA the waits are
// queued on the stream, not blocked on, and this stays 0).
struct ContextAttentionStats {
  int64_t visible_pairs = 0;
  int64_t blocks = 0;
  double ring_wait_s = 0;
};

// Visible (query, key) pairs between a query chunk and a key chunk under the causal mask (key
// position <= query position) of one sequence; with doc_start (q.length, the queries' document
// starts) under the document mask too (key position >= the query's document start).
int64_t causal_pairs(const SequenceChunk& q, const SequenceChunk& k, const int32_t* doc_start = nullptr);

// q (B, L, H, D), k, v (B, L, KV, D): this rank's rows of the sequence, L = seq.length(), where
// seq has the chunks of cp.layout(cp.size() x L) (anything else is an Error naming both layouts),
// with or without documents.
// out (B, L, H, D) and lse (B, H, L) written: the causal attention of this rank's queries over the
// whole sequence's keys, as attention_forward would give on the whole sequence. Collective over
// cp.comm. stats, when given, is added to.
void context_attention_forward(const Exec& ex, const ContextParallel& cp, Allocator& alloc, const Tensor& out,
                               const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                               const SequenceLayout& seq, ContextAttentionStats* stats = nullptr);

// dq (B, L, H, D), dk, dv (B, L, KV, D) accumulated (+=), as attention_backward: the gradients of
// this rank's rows, including what every other rank's queries contribute to its keys and values.
// out, lse from context_attention_forward. Collective over cp.comm.
void context_attention_backward(const Exec& ex, const ContextParallel& cp, Allocator& alloc, const Tensor& dq,
                                const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                                const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                const SequenceLayout& seq, ContextAttentionStats* stats = nullptr);

}  // namespace tessera

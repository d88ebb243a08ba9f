// Causal self-attention with grouped-query attention, flash-style: keys are visited in tiles with
// an online softmax, so memory is O(T) (no T x T score matrix is ever stored).
// Positions: query i sits at q_offset + i and key j at k_offset + j; a key is visible to a query
// iff its position <= the query's. This lets any chunk pair of a longer sequence (context
// parallel, KV cache) get the right causal mask. scale = 1/sqrt(D).
// Document masking (packed sequences, data.document_mask): doc_start (B, T) I32, when given, holds
// for each query row the position of the first token of its document (<= the query's position);
// the query then sees key j only if doc_start <= k_offset + j <= q_offset + i. Documents are runs
// of consecutive positions, so the query's start is all the mask needs. Key tiles that lie wholly
// before a query tile's earliest document start are skipped, not computed and discarded (the CPU
// kernel; CUDA refuses document masking).
// Bidirectional (non-causal) attention over S keys is the same kernel with q_offset = S - 1 and
// k_offset = 0: every query then sits after every key (model/gpt.h Attention, causal = false).
#pragma once

#include <cstdint>

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

// q (B, T, H, D); k, v (B, S, KV, D) with H % KV == 0 (query head h reads kv head h / (H / KV)).
// out (B, T, H, D) = softmax(scale q k^T + mask) v; lse (B, H, T) = log-sum-exp of the scaled,
// masked scores of each query row, saved for backward. A row with no visible key gets out = 0 and
// lse = -inf. All tensors share one dtype (F32 or F64), except on CUDA's BF16 path: q, k, v, out
// (and the backward's dout) BF16 with lse F32, products on the tensor cores with f32 accumulation,
// head dims 64 and 128; the backward's dq, dk, dv are F32 there (kernels/cuda/attention.cu;
// docs/cuda.md, "Attention").
void attention_forward(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, int64_t q_offset, int64_t k_offset, const Tensor& doc_start = Tensor());

// Recomputes the probabilities from lse (P = exp(scale q k^T - lse)), so out and lse may be the
// merged results of several key blocks (ring attention) and this call yields that block's share.
// dq (B, T, H, D), dk, dv (B, S, KV, D): all accumulated (+=), in q's dtype, or F32 for BF16 q:
// f32 accumulators, so that the calls of a ring (one per key block) and any repeated accumulation
// round in f32, not once per call in bf16; a caller that needs bf16 gradients converts once at the
// end. doc_start as the forward's.
void attention_backward(const Exec& ex, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        int64_t q_offset, int64_t k_offset, const Tensor& doc_start = Tensor());

// Merges one key block's result into a running one (ring attention, context parallelism): out,
// lse (B, T, H, D), (B, H, T) hold the attention of the queries over the keys seen so far, and
// block_out, block_lse the same queries' attention over a further, disjoint block of keys.
// Afterwards out, lse are the attention over both: lse' = log(e^lse + e^block_lse),
// out' = out e^(lse - lse') + block_out e^(block_lse - lse'). A row with block_lse = -inf is left as
// it is (so one with lse = -inf in both stays out = 0, lse = -inf); one with lse = -inf alone takes
// the block's. All four F32 or F64 (CUDA: F32), computed in double per row on both backends.
void attention_merge(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse);

}  // namespace tessera

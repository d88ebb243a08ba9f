// finalize_grads: everything between a step's last backward and the optimizer update, in one
// place and in a fixed order: the tp-partial sums, the embedding-group sum, the reduction over
// dp x cp (the optimizer's) and the global gradient norm. Pipeline and context parallelism add
// groups here, not in the trainer. Worked example: docs/parallel.md, "Gradient finalisation".
#pragma once

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "parallel/communicator.h"
#include "parallel/dp_optimizer.h"
#include "parallel/flat_params.h"

namespace tessera {

// The groups a rank's gradients are finalised over, as plain pointers (null = a group of one:
// nothing to sum). Whoever owns the communicators (GridComms) fills it.
struct GradGroups {
  Communicator* tp = nullptr;         // tensor parallel: tp-partial sums; the norm's tp shards
  Communicator* dp_cp = nullptr;      // gradient reduction: must be the optimizer's group
  Communicator* pp = nullptr;         // pipeline stages: each holds its own layers' norm
  Communicator* embedding = nullptr;  // the first and last stage (tied embedding); rank 0 = first
};

// Collective over every group. Call after the last micro-batch's backward (whose hook,
// opt.grads_ready_hook(), may have started the replicated buckets). Leaves in the gradients what
// the optimizer steps on, and in grad_sq_norm (one F64 element on the parameters' device; nothing
// is read back) the squared L2 norm of the whole model's gradient. In order:
//   1. under ZeRO-1, before its reduce-scatter: the tp-partial sums, then the embedding sum;
//   2. opt.reduce_grads(): the sum over dp x cp (the replicated buckets finish; ZeRO-1's
//      reduce-scatter);
//   3. replicated, after the all-reduce: the tp-partial sums, then the embedding sum (the buckets
//      read the gradients until reduce_grads returns; sums commute, races do not);
//   4. the norm: ZeRO-1 shards summed over dp x cp (inside the optimizer), then over tp (tp shards
//      count once, tensors every tp rank holds whole on tp rank 0 only), then over pp (embedding-
//      group tensors counted on the first stage only).
// The tp-partial parameters (FlatParam::tp_partial) go in one packed all-reduce over tp, as do the
// embedding-group ones over the embedding group; with pp = 1 there are none and it does nothing.
void finalize_grads(const Exec& ex, const FlatParams& flat, DataParallelOptimizer& opt, const GradGroups& groups,
                    Allocator& alloc, const Tensor& grad_sq_norm);

// Steps 1 and 3 alone: sums, over `group`, the gradients of the parameters whose `flag` is set
// (&FlatParam::tp_partial, &FlatParam::embedding_group), packed in buffer order into one
// all-reduce. No-op when the group is null or of one rank, or no parameter has the flag.
void sum_flagged_grads(const Exec& ex, const FlatParams& flat, bool FlatParam::*flag, Communicator* group,
                       Allocator& alloc);

}  // namespace tessera

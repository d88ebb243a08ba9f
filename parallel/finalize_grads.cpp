// finalize_grads: the packed group sums, the optimizer's reduction between them, the global norm.
#include "parallel/finalize_grads.h"

#include <vector>

#include "kernels/check.h"
#include "kernels/elementwise.h"

namespace tessera {

namespace {
bool is_alone(const Communicator* c) { return c == nullptr || c->size() == 1; }
int rank_in(const Communicator* c) { return c ? c->rank() : 0; }
}  // namespace

void sum_flagged_grads(const Exec& ex, const FlatParams& flat, bool FlatParam::*flag, Communicator* group,
                       Allocator& alloc) {
  if (is_alone(group)) return;
  std::vector<const FlatParam*> chosen;
  int64_t n = 0;
  for (const FlatParam& e : flat.entries)
    if (e.*flag) chosen.push_back(&e), n += e.numel;
  if (chosen.empty()) return;
  const Buffer packed(alloc, flat.grads.dtype, {n}, MemCategory::Workspace);
  int64_t at = 0;
  for (const FlatParam* e : chosen) {
    copy(ex, packed.tensor().slice_rows(at, at + e->numel), flat.grads.slice_rows(e->offset, e->offset + e->numel));
    at += e->numel;
  }
  group->all_reduce(packed.tensor(), ReduceOp::Sum);
  at = 0;
  for (const FlatParam* e : chosen) {
    copy(ex, flat.grads.slice_rows(e->offset, e->offset + e->numel), packed.tensor().slice_rows(at, at + e->numel));
    at += e->numel;
  }
}

void finalize_grads(const Exec& ex, const FlatParams& flat, DataParallelOptimizer& opt, const GradGroups& groups,
                    Allocator& alloc, const Tensor& grad_sq_norm) {
  TESSERA_CHECK(groups.dp_cp == opt.group() || (is_alone(groups.dp_cp) && is_alone(opt.group())),
                "finalize_grads: the dp x cp group is not the optimizer's (it reduces the gradients over it)");
  // Sums over other groups go where the reduction over dp x cp reads them: before ZeRO-1's
  // reduce-scatter (afterwards each rank holds only its shard, whose range differs between the
  // stages of the embedding group), after the replicated all-reduce (its buckets, started during
  // backward, read the gradients until reduce_grads returns).
  const auto other_sums = [&] {
    sum_flagged_grads(ex, flat, &FlatParam::tp_partial, groups.tp, alloc);
    sum_flagged_grads(ex, flat, &FlatParam::embedding_group, groups.embedding, alloc);
  };
  if (opt.sharded()) other_sums();
  opt.reduce_grads();
  if (!opt.sharded()) other_sums();

  // Every element of the model once: tp shards on their own rank, tensors every tp rank holds
  // whole on tp rank 0, a tied embedding on the first stage.
  const bool tp_lead = rank_in(groups.tp) == 0, first_of_embedding = rank_in(groups.embedding) == 0;
  opt.grad_sq_norm(ex, grad_sq_norm, [&](const FlatParam& e) {
    return (e.tp_sharded || tp_lead) && (!e.embedding_group || first_of_embedding);
  });
  if (!is_alone(groups.tp)) groups.tp->all_reduce(grad_sq_norm, ReduceOp::Sum);
  if (!is_alone(groups.pp)) groups.pp->all_reduce(grad_sq_norm, ReduceOp::Sum);
}

}  // namespace tessera

// The tensor-parallel mappings. Sequence chunks are not contiguous in a (B, T, C) tensor when B > 1,
// so the gather/scatter go through a (tp, B, T / tp, C) staging buffer: each rank's chunk is
// contiguous there, as the collectives need.
#include "parallel/tensor_parallel.h"

#include "kernels/elementwise.h"
#include "parallel/tp_compression.h"

namespace tessera {

namespace {
// Checks full (B, T, C) against local (B, T / tp, C) and returns B.
int64_t check_sequence_pair(const char* op, const TensorParallel& tp, const Tensor& full, const Tensor& local) {
  TESSERA_CHECK(full.ndim() == 3 && local.ndim() == 3, op, ": expected (B, T, C) tensors, got ", full.shape.str(),
                " and ", local.shape.str());
  TESSERA_CHECK(full.dim(1) == local.dim(1) * tp.size() && full.dim(0) == local.dim(0) && full.dim(2) == local.dim(2),
                op, ": full ", full.shape.str(), " is not ", tp.size(), " x local ", local.shape.str(),
                " along the sequence");
  return full.dim(0);
}

// An edge's compression (parallel.tp_comm_compression, parallel/tp_compression.h): its slot, or
// null where the edge runs the exact collective (no compression, an exact site, mode "none").
struct Edge {
  TpSlot slot;
  TpCompression* compression = nullptr;
};
Edge edge_of(const TensorParallel& tp, bool leave, TpDirection d) {
  if (!tp.compression || tp.site < 0 || tp.compression->mode(d) == TpCompressionMode::None) return {};
  return {TpSlot{tp.site, leave, d, 0}, tp.compression};
}

void all_reduce_edge(const TensorParallel& tp, const Tensor& t, const Edge& e, TpReceived* received = nullptr) {
  if (!tp.active()) return;
  if (e.compression)
    compressed_all_reduce(*tp.comm, *e.compression, e.slot, t, received);
  else
    tp.comm->all_reduce(t, ReduceOp::Sum);
}

void gather_edge(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& full, const Tensor& local,
                 const Edge& e);
void reduce_scatter_edge(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& local,
                         const Tensor& full, const Edge& e, TpReceived* received = nullptr);
}  // namespace

void all_reduce_tp(const TensorParallel& tp, const Tensor& t) { all_reduce_edge(tp, t, {}); }

void gather_sequence(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& full,
                     const Tensor& local) {
  gather_edge(ex, tp, alloc, full, local, {});
}

void reduce_scatter_sequence(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& local,
                             const Tensor& full) {
  reduce_scatter_edge(ex, tp, alloc, local, full, {});
}

namespace {
void gather_edge(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& full, const Tensor& local,
                 const Edge& e) {
  const int64_t B = check_sequence_pair("gather_sequence", tp, full, local);
  const int64_t R = tp.size(), chunk = local.dim(1) * local.dim(2);  // one sequence's chunk
  Buffer staging(alloc, full.dtype, {R, B, chunk}, MemCategory::Workspace);
  if (e.compression)
    compressed_all_gather(*tp.comm, *e.compression, e.slot, local, staging);
  else
    tp.comm->all_gather(local, staging);
  // staging[r] (B, chunk) -> columns [r chunk, (r + 1) chunk) of full viewed as (B, T C).
  const Tensor wide = full.view({B, R * chunk});
  for (int64_t r = 0; r < R; ++r)
    paste_columns(ex, wide, staging.tensor().slice_rows(r, r + 1).view({B, chunk}), r * chunk);
}

void reduce_scatter_edge(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& local,
                         const Tensor& full, const Edge& e, TpReceived* received) {
  const int64_t B = check_sequence_pair("reduce_scatter_sequence", tp, full, local);
  const int64_t R = tp.size(), chunk = local.dim(1) * local.dim(2);
  Buffer staging(alloc, full.dtype, {R, B, chunk}, MemCategory::Workspace);
  const Tensor wide = full.view({B, R * chunk});
  for (int64_t r = 0; r < R; ++r)
    copy_columns(ex, staging.tensor().slice_rows(r, r + 1).view({B, chunk}), wide, r * chunk);
  if (e.compression)
    compressed_reduce_scatter(*tp.comm, *e.compression, e.slot, staging, local, received);
  else
    tp.comm->reduce_scatter(staging, local, ReduceOp::Sum);
}

// Entering forward is leaving backward (a gather under sequence parallelism), leaving forward is
// entering backward (a reduce-scatter or all-reduce): each edge's two directions share the code.
Tensor gather_region(const Exec& ex, const TensorParallel& tp, Allocator& alloc, Buffer& storage, const Tensor& x,
                     int64_t T, const Edge& e) {
  if (!tp.sequence_sharded()) return x;
  storage = Buffer(alloc, x.dtype, {x.dim(0), T, x.dim(2)}, MemCategory::Workspace);
  gather_edge(ex, tp, alloc, storage, x, e);
  return storage;
}

void reduce_region(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& y_local,
                   const Tensor& y_full, const Edge& e, TpReceived* received = nullptr) {
  if (tp.sequence_sharded()) {
    reduce_scatter_edge(ex, tp, alloc, y_local, y_full, e, received);
    return;
  }
  TESSERA_CHECK(y_local.data == y_full.data, "leave_region: without sequence parallelism the local and full outputs "
                "are one tensor");
  all_reduce_edge(tp, y_full, e, received);
}
}  // namespace

Tensor enter_region(const Exec& ex, const TensorParallel& tp, Allocator& alloc, Buffer& storage, const Tensor& x,
                    int64_t T) {
  return gather_region(ex, tp, alloc, storage, x, T, edge_of(tp, /*leave=*/false, TpDirection::Forward));
}

void leave_region(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& y_local,
                  const Tensor& y_full, TpReceived* received) {
  reduce_region(ex, tp, alloc, y_local, y_full, edge_of(tp, /*leave=*/true, TpDirection::Forward), received);
}

Tensor region_full(const TensorParallel& tp, Allocator& alloc, Buffer& storage, const Tensor& local, int64_t T) {
  if (!tp.sequence_sharded()) return local;
  storage = Buffer(alloc, local.dtype, {local.dim(0), T, local.dim(2)}, MemCategory::Workspace);
  return storage;
}

// The two edges are each other's adjoint: entering backward is leaving forward and vice versa.
void enter_region_backward(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& dx_local,
                           const Tensor& dx_full) {
  reduce_region(ex, tp, alloc, dx_local, dx_full, edge_of(tp, /*leave=*/false, TpDirection::Backward));
}

Tensor leave_region_backward(const Exec& ex, const TensorParallel& tp, Allocator& alloc, Buffer& storage,
                             const Tensor& dy, int64_t T) {
  return gather_region(ex, tp, alloc, storage, dy, T, edge_of(tp, /*leave=*/true, TpDirection::Backward));
}

}  // namespace tessera

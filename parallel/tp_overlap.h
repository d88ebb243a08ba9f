// Tensor-parallel communication overlapped with the GEMMs beside it (parallel.tp_overlap_chunks = k,
// docs/parallel.md, "Overlapping tensor-parallel communication"). Under sequence parallelism a
// region's edges move whole sequences (parallel/tensor_parallel.h): an all-gather before the column
// GEMMs, a reduce-scatter after the row GEMM, and their adjoints in the backward. Here each is cut
// into k chunks along the sequence, and chunk i + 1's collective is in flight while chunk i's GEMMs
// run:
//
//   gather_then_gemms          start gather 0 | start gather 1, wait 0, GEMMs 0 | start 2, wait 1, GEMMs 1 | ...
//   gemms_then_reduce_scatter  GEMMs 0, start scatter 0 | GEMMs 1, start scatter 1 | ... | wait all
//
// A chunk holds, of every rank's Tl = T / tp local positions, the positions [start, start + n): the
// all-gather of the ranks' (B, n, C) chunks is the rows (rank, batch, position) of the full
// sequence, which the GEMMs take as they are (a GEMM's rows are independent). Nothing here knows a
// layer: the model passes its GEMMs as functions of rows (model/gpt.cpp).
//
// Progress: the handles are the communicator's asynchronous ops. On the CPU (MPI) a collective
// advances inside MPI calls, so every in-flight handle is tested between two GEMMs; on a GPU (NCCL)
// the ops run on the communicator's stream and wait_on orders the GEMMs after them with events,
// without host waits. Time spent waiting is charged to the profiler as communication (exposed); the
// rest of each op's time in flight as hidden communication (Profiler::add_hidden).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "parallel/tensor_parallel.h"

namespace tessera {

// parallel.tp_overlap_chunks against the layout: chunks >= 1; chunks > 1 needs tp > 1 and sequence
// parallelism, and at most one chunk per local position (chunks <= seq_len / (cp x tp)). Throws
// tessera::Error naming the key and what was expected.
void check_tp_overlap(int64_t chunks, int64_t tp, bool sequence_parallel, int64_t seq_len_per_tp_group);

// Whether tp's region edges run chunked (sequence parallel over tp > 1 ranks, chunks > 1).
inline bool overlaps(const TensorParallel& tp) { return tp.sequence_sharded() && tp.overlap_chunks > 1; }

// The full sequence (B, T, ·) of R ranks cut into chunks along each rank's Tl = T / R positions:
// min(chunks, Tl) chunks, the first Tl % count of them one position longer.
class SequenceChunks {
 public:
  SequenceChunks(int64_t ranks, int64_t batch, int64_t T, int64_t chunks);
  int64_t count() const { return count_; }
  int64_t start(int64_t i) const;   // first local position of chunk i
  int64_t length(int64_t i) const;  // positions per rank in chunk i (n)
  int64_t local_length() const { return Tl_; }
  // rows (R B, n, X), rank-major, <- the chunk's positions of full (B, T, X); and back.
  void pack(const Exec& ex, const Tensor& rows, const Tensor& full, int64_t i) const;
  void unpack(const Exec& ex, const Tensor& full, const Tensor& rows, int64_t i) const;
  // part (B, n, X) <- the chunk's positions of this rank's local (B, Tl, X); and back.
  void pack_local(const Exec& ex, const Tensor& part, const Tensor& local, int64_t i) const;
  void unpack_local(const Exec& ex, const Tensor& local, const Tensor& part, int64_t i) const;

 private:
  int64_t R_, B_, T_, Tl_, count_;
};

// One GEMM of a region on a chunk's rows: writes (or adds to, as the caller's GEMM does) y_rows
// (R B, n, F) from x_rows (R B, n, K).
using RowGemm = std::function<void(const Tensor& y_rows, const Tensor& x_rows)>;

// A column GEMM's output over the full sequence, (B, T, F), and the GEMM that writes it.
struct GatheredOutput {
  Tensor full;
  RowGemm gemm;
};

// The forward's enter_region + column GEMMs (and the backward's leave_region_backward + the row
// layer's input-gradient GEMM): every output's full (B, T, F) = its GEMM of the all-gather over tp
// of x_local (B, T / tp, C), chunk by chunk. gathered_full (B, T, C), when defined, receives the
// gathered sequence too (the backward's weight gradients need it whole).
void gather_then_gemms(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& x_local,
                       const std::vector<GatheredOutput>& outputs, const Tensor& gathered_full = Tensor());

// A row-side GEMM's input over the full sequence, (B, T, K), and the GEMM that reads it. The
// first GEMM of a list writes its rows, the others add to them.
struct ScatteredInput {
  Tensor full;
  RowGemm gemm;
};

// The forward's row GEMM + leave_region (and the backward's column input-gradient GEMMs +
// enter_region_backward): y_local (B, T / tp, C) = this rank's positions of the sum over tp of the
// GEMMs of the inputs, chunk by chunk, each chunk's reduce-scatter in flight beside the next
// chunk's GEMMs.
void gemms_then_reduce_scatter(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& y_local,
                               const std::vector<ScatteredInput>& inputs);

}  // namespace tessera

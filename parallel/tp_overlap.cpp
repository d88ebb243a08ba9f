// Chunked tensor-parallel edges: the chunk geometry, the two pipelines (gather ahead of the GEMMs,
// reduce-scatter behind them) and the timing of their handles (exposed wait vs hidden flight).
#include "parallel/tp_overlap.h"

#include <algorithm>
#include <utility>

#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "kernels/profiler.h"

namespace tessera {

void check_tp_overlap(int64_t chunks, int64_t tp, bool sequence_parallel, int64_t seq_len_per_tp_group) {
  TESSERA_CHECK(chunks >= 1, "parallel.tp_overlap_chunks = ", chunks, ": expected at least 1 (1 = no overlap)");
  if (chunks == 1) return;
  TESSERA_CHECK(tp > 1, "parallel.tp_overlap_chunks = ", chunks, " overlaps tensor-parallel communication, but "
                "parallel.tp = ", tp, " has none: set parallel.tp > 1 or tp_overlap_chunks = 1");
  TESSERA_CHECK(sequence_parallel, "parallel.tp_overlap_chunks = ", chunks, " cuts the sequence-parallel all-gather "
                "and reduce-scatter into chunks: it needs parallel.sequence_parallel = true (plain tp's all-reduce "
                "is not chunked); or set tp_overlap_chunks = 1");
  const int64_t local = seq_len_per_tp_group / tp;
  TESSERA_CHECK(chunks <= local, "parallel.tp_overlap_chunks = ", chunks, " exceeds the ", local,
                " positions each tp rank holds (train.seq_len / (parallel.cp x parallel.tp)): expected at most ",
                local);
}

// ---- SequenceChunks ----

SequenceChunks::SequenceChunks(int64_t ranks, int64_t batch, int64_t T, int64_t chunks)
    : R_(ranks), B_(batch), T_(T), Tl_(T / ranks), count_(std::min(chunks, T / ranks)) {
  TESSERA_CHECK(ranks >= 1 && T % ranks == 0 && Tl_ >= 1 && chunks >= 1, "SequenceChunks: a sequence of ", T,
                " positions over ", ranks, " ranks in ", chunks, " chunks");
}

int64_t SequenceChunks::start(int64_t i) const {
  const int64_t base = Tl_ / count_, extra = Tl_ % count_;
  return i * base + std::min(i, extra);
}

int64_t SequenceChunks::length(int64_t i) const {
  return Tl_ / count_ + (i < Tl_ % count_ ? 1 : 0);
}

// Rank r's part of a chunk: row-block r of rows, positions [r Tl + start, + n) of full, as
// (B, n X) and columns of (B, T X).
void SequenceChunks::pack(const Exec& ex, const Tensor& rows, const Tensor& full, int64_t i) const {
  const int64_t X = full.dim(2), n = length(i);
  const Tensor wide = full.view({B_, T_ * X});
  for (int64_t r = 0; r < R_; ++r)
    copy_columns(ex, rows.slice_rows(r * B_, (r + 1) * B_).view({B_, n * X}), wide, (r * Tl_ + start(i)) * X);
}

void SequenceChunks::unpack(const Exec& ex, const Tensor& full, const Tensor& rows, int64_t i) const {
  const int64_t X = full.dim(2), n = length(i);
  const Tensor wide = full.view({B_, T_ * X});
  for (int64_t r = 0; r < R_; ++r)
    paste_columns(ex, wide, rows.slice_rows(r * B_, (r + 1) * B_).view({B_, n * X}), (r * Tl_ + start(i)) * X);
}

void SequenceChunks::pack_local(const Exec& ex, const Tensor& part, const Tensor& local, int64_t i) const {
  const int64_t X = local.dim(2);
  copy_columns(ex, part.view({B_, length(i) * X}), local.view({B_, Tl_ * X}), start(i) * X);
}

void SequenceChunks::unpack_local(const Exec& ex, const Tensor& local, const Tensor& part, int64_t i) const {
  const int64_t X = local.dim(2);
  paste_columns(ex, local.view({B_, Tl_ * X}), part.view({B_, length(i) * X}), start(i) * X);
}

// ---- Handles in flight, timed ----

namespace {

// One chunk's collective: when it started and when the host saw it complete. Waiting for it is
// exposed communication (charged by the wait's scope); of the rest of its flight, the time the host
// spent outside communication scopes (computing) is hidden communication. Time spent waiting for
// another chunk's op while this one flies is neither: it is that op's exposed time.
class TimedOp {
 public:
  TimedOp(Profiler* prof, CommHandle handle)
      : prof_(prof), handle_(std::move(handle)), started_(clock()), comm_at_start_(comm_seconds()) {}
  TimedOp(TimedOp&&) noexcept = default;
  TimedOp& operator=(TimedOp&&) noexcept = default;

  // Lets MPI progress the op (between GEMMs); notes when it completed.
  void poll() {
    if (!handle_.done() && handle_.test()) account();
  }
  // The result is ready for ex's next ops (a host wait on the CPU, a stream wait for NCCL).
  void finish(const Exec& ex) {
    if (handle_.done()) return;
    {
      ProfileScope scope(prof_, OpFamily::Communication);
      handle_.wait_on(ex);
    }
    account();
  }

 private:
  double clock() const { return prof_ ? prof_->now() : 0.0; }
  double comm_seconds() const { return prof_ ? prof_->entry(OpFamily::Communication).seconds : 0.0; }
  void account() {
    if (prof_) prof_->add_hidden(std::max(0.0, (clock() - started_) - (comm_seconds() - comm_at_start_)));
  }
  Profiler* prof_;
  CommHandle handle_;
  double started_ = 0, comm_at_start_ = 0;
};

// Starts an op under a communication scope (the MPI call's own time is exposed).
template <class Start>
TimedOp start_timed(Profiler* prof, Start start) {
  CommHandle handle;
  {
    ProfileScope scope(prof, OpFamily::Communication);
    handle = start();
  }
  return TimedOp(prof, std::move(handle));
}

void check_full(const char* op, const Tensor& full, int64_t B, int64_t T) {
  TESSERA_CHECK(full.ndim() == 3 && full.dim(0) == B && full.dim(1) == T, op, ": expected a (", B, ", ", T,
                ", X) tensor, got ", full.shape.str());
}

}  // namespace

void gather_then_gemms(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& x_local,
                       const std::vector<GatheredOutput>& outputs, const Tensor& gathered_full) {
  TESSERA_CHECK(overlaps(tp), "gather_then_gemms: needs sequence parallelism with parallel.tp_overlap_chunks > 1");
  TESSERA_CHECK(x_local.ndim() == 3, "gather_then_gemms: expected x (B, T / tp, C), got ", x_local.shape.str());
  const int64_t R = tp.size(), B = x_local.dim(0), T = x_local.dim(1) * R, C = x_local.dim(2);
  for (const GatheredOutput& o : outputs) check_full("gather_then_gemms (output)", o.full, B, T);
  if (gathered_full.defined()) check_full("gather_then_gemms (gathered)", gathered_full, B, T);
  const SequenceChunks chunks(R, B, T, tp.overlap_chunks);
  const int64_t k = chunks.count();
  Profiler* prof = tp.comm->profiler();
  // Every chunk's send and receive buffers live to the end: an op in flight writes into them.
  std::vector<Buffer> sent, got;
  std::vector<TimedOp> ops;
  auto start = [&](int64_t i) {
    const int64_t n = chunks.length(i);
    sent.emplace_back(alloc, x_local.dtype, Shape{B, n, C}, MemCategory::Workspace);
    got.emplace_back(alloc, x_local.dtype, Shape{R * B, n, C}, MemCategory::Workspace);
    chunks.pack_local(ex, sent.back(), x_local, i);
    ops.push_back(start_timed(prof, [&] { return tp.comm->all_gather_async(sent.back(), got.back()); }));
  };
  start(0);
  for (int64_t i = 0; i < k; ++i) {
    if (i + 1 < k) start(i + 1);  // in flight during chunk i's GEMMs
    ops[static_cast<size_t>(i)].finish(ex);
    const Tensor x_rows = got[static_cast<size_t>(i)];  // (R B, n, C)
    if (gathered_full.defined()) chunks.unpack(ex, gathered_full, x_rows, i);
    for (const GatheredOutput& o : outputs) {
      Buffer y(alloc, o.full.dtype, {R * B, chunks.length(i), o.full.dim(2)}, MemCategory::Workspace);
      o.gemm(y, x_rows);
      chunks.unpack(ex, o.full, y, i);
      if (i + 1 < k) ops[static_cast<size_t>(i + 1)].poll();
    }
  }
}

void gemms_then_reduce_scatter(const Exec& ex, const TensorParallel& tp, Allocator& alloc, const Tensor& y_local,
                               const std::vector<ScatteredInput>& inputs) {
  TESSERA_CHECK(overlaps(tp), "gemms_then_reduce_scatter: needs sequence parallelism with "
                "parallel.tp_overlap_chunks > 1");
  TESSERA_CHECK(y_local.ndim() == 3 && !inputs.empty(), "gemms_then_reduce_scatter: expected y (B, T / tp, C) and "
                "at least one input, got ", y_local.shape.str());
  const int64_t R = tp.size(), B = y_local.dim(0), T = y_local.dim(1) * R, C = y_local.dim(2);
  for (const ScatteredInput& in : inputs) check_full("gemms_then_reduce_scatter (input)", in.full, B, T);
  const SequenceChunks chunks(R, B, T, tp.overlap_chunks);
  const int64_t k = chunks.count();
  Profiler* prof = tp.comm->profiler();
  std::vector<Buffer> partial, part;  // (R B, n, C) the GEMMs' partial sums; (B, n, C) this rank's sum
  std::vector<TimedOp> ops;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t n = chunks.length(i);
    partial.emplace_back(alloc, y_local.dtype, Shape{R * B, n, C}, MemCategory::Workspace);
    for (const ScatteredInput& in : inputs) {
      Buffer x(alloc, in.full.dtype, {R * B, n, in.full.dim(2)}, MemCategory::Workspace);
      chunks.pack(ex, x, in.full, i);
      in.gemm(partial.back(), x);
      for (TimedOp& op : ops) op.poll();  // the chunks before this one, in flight
    }
    part.emplace_back(alloc, y_local.dtype, Shape{B, n, C}, MemCategory::Workspace);
    // Rank r's block of partial is rows [r B, (r + 1) B): the reduce-scatter's r-th part.
    ops.push_back(start_timed(prof, [&] {
      return tp.comm->reduce_scatter_async(partial.back(), part.back(), ReduceOp::Sum);
    }));
  }
  for (int64_t i = 0; i < k; ++i) {
    ops[static_cast<size_t>(i)].finish(ex);
    chunks.unpack_local(ex, y_local, part[static_cast<size_t>(i)], i);
  }
}

}  // namespace tessera

// Communicator: the collectives and point-to-point transfers the trainer needs, on Tensors, free of
// any backend's header (MPI on host buffers in parallel/mpi_communicator.h, NCCL with the CUDA
// backend). Every op is started asynchronously; the blocking form starts and waits. A watched
// communicator reports every host wait to a Watchdog (parallel/watchdog.h), whatever the backend.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/exec.h"
#include "kernels/profiler.h"
#include "kernels/tensor.h"
#include "parallel/watchdog.h"

namespace tessera {

// Average is the backend's: NCCL has ncclAvg (the division happens inside the reduction kernel);
// MPI has no average op, so the MPI backend sums (MPI_SUM) and divides by size() when the op
// completes, in the same wait/test/wait_on that completes it.
enum class ReduceOp : uint8_t { Sum, Average };

// One operation in flight, implemented by a backend. Each of wait, test and wait_on completes the
// op at most once (the backend's finishing step, e.g. MPI's division for an average, runs once).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;  // blocks the host until done
  virtual bool test() = 0;  // true when done, never blocks
  // Orders the op's completion before every op queued on ex after this call. The default waits on
  // the host, which orders it before anything queued later on any stream: right for a backend on
  // host buffers (MPI, with the CPU's synchronous Exec). A stream backend (NCCL) overrides it to
  // return at once: record a cudaEvent on the communicator's stream after the op, then
  // cudaStreamWaitEvent(ex.stream, event), so the host queues the next kernels without waiting.
  virtual void wait_on(const Exec& ex) {
    (void)ex;
    wait();
  }
};

// RAII handle of an asynchronous op: the destructor waits, so the buffers the op uses must outlive
// the handle. Move-only. A default-constructed handle is already complete.
class CommHandle {
 public:
  CommHandle() = default;
  explicit CommHandle(std::unique_ptr<CommRequest> request) : request_(std::move(request)) {}
  CommHandle(CommHandle&&) noexcept = default;
  CommHandle& operator=(CommHandle&& other) noexcept;
  ~CommHandle() { wait(); }

  void wait();  // reported to the watch slot, if any, while it blocks
  bool test();  // true once the op is complete; the result may then be read
  // The op's result is ready for every op queued on ex after this call (see CommRequest::wait_on);
  // afterwards the handle is done(): nothing is left for the host to wait for. The MPI backend
  // blocks here (reported to the watch slot as wait() is); a NCCL one only queues a stream wait, so
  // its buffers must then live until ex's stream has passed that point (the stream-ordered
  // allocator's rule), not merely until this call returns.
  void wait_on(const Exec& ex);
  bool done() const { return request_ == nullptr; }

  // Blocking in wait() is reported to slot as `what` (a string literal) of `bytes`, with the peer's
  // rank for point-to-point ops (-1: a collective, or a batch with several peers). Null: not watched.
  void watch(WaitSlot* slot, const char* what, int64_t bytes, int peer = -1) {
    watch_ = Watch{slot, what, bytes, peer};
  }

 private:
  struct Watch {
    WaitSlot* slot = nullptr;
    const char* what = "";
    int64_t bytes = 0;
    int peer = -1;
  };
  std::unique_ptr<CommRequest> request_;
  Watch watch_;
};

// One send or receive of a batch (Communicator::batch_send_recv). Two ranks' sends and receives
// match in the order they were posted (MPI's non-overtaking rule, and NCCL's only rule: NCCL has no
// tags, so a NCCL backend ignores tag and relies on the order alone).
struct P2POp {
  enum class Kind : uint8_t { Send, Recv };
  Kind kind = Kind::Send;
  Tensor t;
  int peer = 0;  // the destination of a send, the source of a receive
  int tag = 0;

  static P2POp send(Tensor t, int dst, int tag = 0) { return {Kind::Send, t, dst, tag}; }
  static P2POp recv(Tensor t, int src, int tag = 0) { return {Kind::Recv, t, src, tag}; }
};

// Bytes this rank sends per kind of op, by the ring algorithms' volumes (p ranks, b bytes):
//   all_reduce      2 (p - 1) / p x b   (b = the tensor; rounded down per call)
//   reduce_scatter  (p - 1) / p x b     (b = the full input, p x the output)
//   all_gather      (p - 1) / p x b     (b = the full output, p x the input)
//   broadcast       b on the root, 0 elsewhere (and 0 when p = 1)
//   send            b  (recv counts nothing; a batch counts each of its sends)
// A model of link traffic for planning and logging, not a measurement of what MPI/NCCL sends.
struct CommCounters {
  int64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0, broadcast = 0, send = 0;
  int64_t total() const { return all_reduce + reduce_scatter + all_gather + broadcast + send; }
};

// The ops check their arguments (shapes, dtypes, peers; the backend checks the device), count
// bytes, then hand over to the backend. Collectives must be called by every rank of the
// communicator in the same order. Reductions take F32 and F64; data movement takes any dtype.
// Tensors are contiguous views; an async op's tensors must stay alive (and untouched) until its
// handle completes.
//
// A backend derives from Communicator and implements size(), rank() and the start_* virtuals
// below, each returning a CommHandle over its own CommRequest (docs/parallel.md, "Communicators",
// sketches NCCL's).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;

  // In place: every rank ends with the sum (or mean) of everyone's t.
  void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) {
    ProfileScope scope(profiler_, OpFamily::Communication);
    all_reduce_async(t, op).wait();
  }
  // input holds size() x output.numel() elements; rank r gets the reduction of chunk r.
  void reduce_scatter(Tensor input, Tensor output, ReduceOp op = ReduceOp::Sum) {
    ProfileScope scope(profiler_, OpFamily::Communication);
    reduce_scatter_async(input, output, op).wait();
  }
  // output holds size() x input.numel() elements: chunk r is rank r's input.
  void all_gather(Tensor input, Tensor output) {
    ProfileScope scope(profiler_, OpFamily::Communication);
    all_gather_async(input, output).wait();
  }
  // In place: every rank ends with root's t.
  void broadcast(Tensor t, int root) {
    ProfileScope scope(profiler_, OpFamily::Communication);
    broadcast_async(t, root).wait();
  }
  void send(Tensor t, int dst, int tag = 0) { send_async(t, dst, tag).wait(); }
  void recv(Tensor t, int src, int tag = 0) { recv_async(t, src, tag).wait(); }
  // Starts every send and receive of ops at once and waits for all of them: the pipeline's
  // exchange between neighbouring stages (activations forward, gradients backward), which would
  // deadlock as a sequence of blocking sends and receives once the messages are too large to be
  // buffered.
  void batch_send_recv(const std::vector<P2POp>& ops) {
    ProfileScope scope(profiler_, OpFamily::Communication);
    batch_send_recv_async(ops).wait();
  }

  CommHandle all_reduce_async(Tensor t, ReduceOp op = ReduceOp::Sum);
  CommHandle reduce_scatter_async(Tensor input, Tensor output, ReduceOp op = ReduceOp::Sum);
  CommHandle all_gather_async(Tensor input, Tensor output);
  CommHandle broadcast_async(Tensor t, int root);
  CommHandle send_async(Tensor t, int dst, int tag = 0);
  CommHandle recv_async(Tensor t, int src, int tag = 0);
  // One handle for the whole batch (complete when every op is). Every op is checked before any is
  // started, so a bad one leaves nothing in flight. An empty batch is complete at once.
  CommHandle batch_send_recv_async(const std::vector<P2POp>& ops);

  // Times the blocking ops (start to completion) as OpFamily::Communication; null: off. The
  // asynchronous ops' waits are the caller's to time.
  void set_profiler(Profiler* p) { profiler_ = p; }
  // The profiler set above (null: off); callers timing their own async waits charge it.
  Profiler* profiler() const { return profiler_; }
  // Every wait on an op of this communicator (blocking form, CommHandle::wait and wait_on, the
  // handle's destructor) is reported to slot, which must outlive the ops; null: not watched (the
  // default).
  void set_wait_slot(WaitSlot* slot) { wait_slot_ = slot; }
  WaitSlot* wait_slot() const { return wait_slot_; }

  const CommCounters& counters() const { return counters_; }
  int64_t bytes_sent() const { return counters_.total(); }
  void reset_counters() { counters_ = {}; }

 protected:
  // Backends: arguments already checked (except the device); return the op in flight. A reduction
  // gets op as the caller gave it: the backend computes the average (see ReduceOp).
  virtual CommHandle start_all_reduce(Tensor t, ReduceOp op) = 0;
  virtual CommHandle start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) = 0;
  virtual CommHandle start_all_gather(Tensor input, Tensor output) = 0;
  virtual CommHandle start_broadcast(Tensor t, int root) = 0;
  virtual CommHandle start_send(Tensor t, int dst, int tag) = 0;
  virtual CommHandle start_recv(Tensor t, int src, int tag) = 0;
  // ops is not empty. All of them in flight at once (MPI: MPI_Isend/MPI_Irecv each, MPI_Waitall;
  // NCCL: ncclSend/ncclRecv each between ncclGroupStart and ncclGroupEnd).
  virtual CommHandle start_batch_send_recv(const std::vector<P2POp>& ops) = 0;

 private:
  void check_peer(const char* op, const char* arg, int peer) const;
  CommCounters counters_;
  Profiler* profiler_ = nullptr;
  WaitSlot* wait_slot_ = nullptr;
};

}  // namespace tessera

// Communicator: the collectives the trainer needs, on Tensors, device-agnostic (MPI on host buffers
// now, NCCL later). Every op is started asynchronously; the blocking form starts and waits. A
// watched communicator reports every wait to a Watchdog (parallel/watchdog.h), whatever the backend.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>

#include "kernels/profiler.h"
#include "kernels/tensor.h"
#include "parallel/watchdog.h"

namespace tessera {

enum class ReduceOp : uint8_t { Sum, Average };

// One operation in flight, implemented by a backend.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;  // blocks until done; finishes the op (e.g. the average's division)
  virtual bool test() = 0;  // true when done (and then finished), never blocks
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
  bool done() const { return request_ == nullptr; }

  // Blocking in wait() is reported to slot as `what` (a string literal) of `bytes`, with the peer's
  // rank for point-to-point ops (-1: a collective). Null: not watched.
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

// Bytes this rank sends per kind of op, by the ring algorithms' volumes (p ranks, b bytes):
//   all_reduce      2 (p - 1) / p x b   (b = the tensor; rounded down per call)
//   reduce_scatter  (p - 1) / p x b     (b = the full input, p x the output)
//   all_gather      (p - 1) / p x b     (b = the full output, p x the input)
//   broadcast       b on the root, 0 elsewhere (and 0 when p = 1)
//   send            b  (recv counts nothing)
// A model of link traffic for planning and logging, not a measurement of what MPI/NCCL sends.
struct CommCounters {
  int64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0, broadcast = 0, send = 0;
  int64_t total() const { return all_reduce + reduce_scatter + all_gather + broadcast + send; }
};

// The ops check their arguments (shapes, dtypes; the backend checks the device), count bytes, then
// hand over to the backend. Collectives must be called by every rank of the communicator in the
// same order. Reductions take F32 and F64; data movement takes any dtype. Tensors are contiguous
// views; an async op's tensors must stay alive (and untouched) until its handle completes.
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

  CommHandle all_reduce_async(Tensor t, ReduceOp op = ReduceOp::Sum);
  CommHandle reduce_scatter_async(Tensor input, Tensor output, ReduceOp op = ReduceOp::Sum);
  CommHandle all_gather_async(Tensor input, Tensor output);
  CommHandle broadcast_async(Tensor t, int root);
  CommHandle send_async(Tensor t, int dst, int tag = 0);
  CommHandle recv_async(Tensor t, int src, int tag = 0);

  // Times the blocking ops (start to completion) as OpFamily::Communication; null: off. The
  // asynchronous ops' waits are the caller's to time.
  void set_profiler(Profiler* p) { profiler_ = p; }
  // Every wait on an op of this communicator (blocking form, CommHandle::wait, the handle's
  // destructor) is reported to slot, which must outlive the ops; null: not watched (the default).
  void set_wait_slot(WaitSlot* slot) { wait_slot_ = slot; }

  const CommCounters& counters() const { return counters_; }
  int64_t bytes_sent() const { return counters_.total(); }
  void reset_counters() { counters_ = {}; }

 protected:
  // Backends: arguments already checked (except the device); return the op in flight.
  virtual CommHandle start_all_reduce(Tensor t, ReduceOp op) = 0;
  virtual CommHandle start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) = 0;
  virtual CommHandle start_all_gather(Tensor input, Tensor output) = 0;
  virtual CommHandle start_broadcast(Tensor t, int root) = 0;
  virtual CommHandle start_send(Tensor t, int dst, int tag) = 0;
  virtual CommHandle start_recv(Tensor t, int src, int tag) = 0;

 private:
  void check_peer(const char* op, const char* arg, int peer) const;
  CommCounters counters_;
  Profiler* profiler_ = nullptr;
  WaitSlot* wait_slot_ = nullptr;
};

// Owns an MPI communicator (MPI_Comm_free on destruction, unless MPI is already finalized).
class MpiComm {
 public:
  MpiComm() = default;
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {}  // takes ownership
  MpiComm(MpiComm&& o) noexcept : comm_(o.release()) {}
  MpiComm& operator=(MpiComm&& o) noexcept;
  ~MpiComm() { reset(); }

  MPI_Comm get() const { return comm_; }
  MPI_Comm release();
  void reset();

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// Communicator over an MPI communicator, on host (CPU) tensors. Owns its MPI_Comm, so its traffic
// never mixes with the parent's. Starting an op is not thread-safe: one thread per communicator.
class MpiCommunicator : public Communicator {
 public:
  // Collective over parent: MPI_Comm_dup.
  static MpiCommunicator duplicate(MPI_Comm parent);
  // Collective over parent: MPI_Comm_split; ranks with the same color share a communicator, ordered
  // by key.
  static MpiCommunicator split(MPI_Comm parent, int color, int key);

  int size() const override { return size_; }
  int rank() const override { return rank_; }
  // For MPI helpers such as throw_if_any_failed (parallel/mpi.h).
  MPI_Comm comm() const { return comm_.get(); }

 protected:
  CommHandle start_all_reduce(Tensor t, ReduceOp op) override;
  CommHandle start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) override;
  CommHandle start_all_gather(Tensor input, Tensor output) override;
  CommHandle start_broadcast(Tensor t, int root) override;
  CommHandle start_send(Tensor t, int dst, int tag) override;
  CommHandle start_recv(Tensor t, int src, int tag) override;

 private:
  explicit MpiCommunicator(MpiComm comm);
  MpiComm comm_;
  int size_ = 1, rank_ = 0;
};

}  // namespace tessera

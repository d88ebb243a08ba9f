// Communicator argument checks and byte accounting, shared by every backend (the MPI one is in
// parallel/mpi_communicator.cpp), and the handle's watched waits.
#include "parallel/communicator.h"

#include <string>
#include <utility>

#include "kernels/check.h"

namespace tessera {

// ---- CommHandle ----

CommHandle& CommHandle::operator=(CommHandle&& other) noexcept {
  if (this != &other) {
    wait();
    request_ = std::move(other.request_);
    watch_ = other.watch_;
  }
  return *this;
}

void CommHandle::wait() {
  if (!request_) return;
  WatchedWait watched(watch_.slot, watch_.what, watch_.bytes, watch_.peer);
  request_->wait();
  request_.reset();
}

void CommHandle::wait_on(const Exec& ex) {
  if (!request_) return;
  WatchedWait watched(watch_.slot, watch_.what, watch_.bytes, watch_.peer);
  request_->wait_on(ex);
  request_.reset();
}

bool CommHandle::test() {
  if (!request_) return true;
  if (!request_->test()) return false;
  request_.reset();
  return true;
}

// ---- Communicator: checks and accounting ----

namespace {

void check_reducible(const char* op, const Tensor& t) {
  TESSERA_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, op, ": reduces f32 or f64 tensors, got ",
                dtype_name(t.dtype));
}

void check_defined(const char* op, const char* arg, const Tensor& t) {
  TESSERA_CHECK(t.defined() || t.numel() == 0, op, ": ", arg, " has no data");
}

}  // namespace

void Communicator::check_peer(const char* op, const char* arg, int peer) const {
  TESSERA_CHECK(peer >= 0 && peer < size(), op, ": ", arg, " = ", peer, " is outside a communicator of ", size(),
                " ranks");
}

CommHandle Communicator::all_reduce_async(Tensor t, ReduceOp op) {
  check_defined("all_reduce", "t", t);
  check_reducible("all_reduce", t);
  const int64_t p = size();
  CommHandle h = start_all_reduce(t, op);
  h.watch(wait_slot_, "all_reduce", static_cast<int64_t>(t.nbytes()));
  counters_.all_reduce += 2 * (p - 1) * static_cast<int64_t>(t.nbytes()) / p;
  return h;
}

CommHandle Communicator::reduce_scatter_async(Tensor input, Tensor output, ReduceOp op) {
  check_defined("reduce_scatter", "input", input);
  check_defined("reduce_scatter", "output", output);
  check_reducible("reduce_scatter", input);
  check_same_dtype("reduce_scatter", input, output);
  TESSERA_CHECK(input.numel() == size() * output.numel(), "reduce_scatter: input ", input.str(), " must hold ", size(),
                " x output ", output.str(), " elements");
  CommHandle h = start_reduce_scatter(input, output, op);
  h.watch(wait_slot_, "reduce_scatter", static_cast<int64_t>(input.nbytes()));
  counters_.reduce_scatter += (size() - 1) * static_cast<int64_t>(output.nbytes());
  return h;
}

CommHandle Communicator::all_gather_async(Tensor input, Tensor output) {
  check_defined("all_gather", "input", input);
  check_defined("all_gather", "output", output);
  check_same_dtype("all_gather", input, output);
  TESSERA_CHECK(output.numel() == size() * input.numel(), "all_gather: output ", output.str(), " must hold ", size(),
                " x input ", input.str(), " elements");
  CommHandle h = start_all_gather(input, output);
  h.watch(wait_slot_, "all_gather", static_cast<int64_t>(output.nbytes()));
  counters_.all_gather += (size() - 1) * static_cast<int64_t>(input.nbytes());
  return h;
}

CommHandle Communicator::broadcast_async(Tensor t, int root) {
  check_defined("broadcast", "t", t);
  check_peer("broadcast", "root", root);
  CommHandle h = start_broadcast(t, root);
  h.watch(wait_slot_, "broadcast", static_cast<int64_t>(t.nbytes()));
  if (rank() == root && size() > 1) counters_.broadcast += static_cast<int64_t>(t.nbytes());
  return h;
}

CommHandle Communicator::send_async(Tensor t, int dst, int tag) {
  check_defined("send", "t", t);
  check_peer("send", "dst", dst);
  CommHandle h = start_send(t, dst, tag);
  h.watch(wait_slot_, "send", static_cast<int64_t>(t.nbytes()), dst);
  counters_.send += static_cast<int64_t>(t.nbytes());
  return h;
}

CommHandle Communicator::recv_async(Tensor t, int src, int tag) {
  check_defined("recv", "t", t);
  check_peer("recv", "src", src);
  CommHandle h = start_recv(t, src, tag);
  h.watch(wait_slot_, "recv", static_cast<int64_t>(t.nbytes()), src);
  return h;
}

CommHandle Communicator::batch_send_recv_async(const std::vector<P2POp>& ops) {
  int64_t bytes = 0, sent = 0;
  int peer = ops.empty() ? -1 : ops.front().peer;  // the one peer of every op, else -1
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    const bool is_send = o.kind == P2POp::Kind::Send;
    const std::string arg = "ops[" + std::to_string(i) + "]" + (is_send ? " (send)" : " (recv)");
    TESSERA_CHECK(o.t.defined() || o.t.numel() == 0, "batch_send_recv: ", arg, " has no data");
    TESSERA_CHECK(o.peer >= 0 && o.peer < size(), "batch_send_recv: ", arg, (is_send ? " dst = " : " src = "), o.peer,
                  " is outside a communicator of ", size(), " ranks");
    bytes += static_cast<int64_t>(o.t.nbytes());
    if (is_send) sent += static_cast<int64_t>(o.t.nbytes());
    if (o.peer != peer) peer = -1;
  }
  if (ops.empty()) return {};
  CommHandle h = start_batch_send_recv(ops);
  h.watch(wait_slot_, "batch_send_recv", bytes, peer);
  counters_.send += sent;
  return h;
}

}  // namespace tessera

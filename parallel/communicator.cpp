// Communicator argument checks and byte accounting (shared by backends), and the MPI backend: every
// op is a nonblocking MPI call (MPI_Iallreduce, ...) wrapped in an RAII request.
#include "parallel/communicator.h"

#include <climits>
#include <functional>
#include <utility>

#include "parallel/mpi.h"

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

// ---- MpiComm ----

MpiComm& MpiComm::operator=(MpiComm&& o) noexcept {
  if (this != &o) {
    reset();
    comm_ = o.release();
  }
  return *this;
}

MPI_Comm MpiComm::release() {
  return std::exchange(comm_, MPI_COMM_NULL);
}

void MpiComm::reset() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

// ---- MpiCommunicator ----

namespace {

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::BF16: return MPI_UINT16_T;  // moved as raw 16-bit words; never reduced here
  }
  detail::fail("no MPI type for dtype ", dtype_name(dt));
}

int mpi_count(const char* op, const Tensor& t) {
  check_cpu(op, t);
  TESSERA_CHECK(t.numel() <= INT_MAX, op, ": ", t.str(), " has more elements than one MPI call takes");
  return static_cast<int>(t.numel());
}

MPI_Op mpi_op(ReduceOp) { return MPI_SUM; }  // the average is a sum divided after completion

// Host tensor /= divisor (the average's second half).
void divide(const Tensor& t, int divisor) {
  if (t.dtype == DType::F32) {
    float* p = t.ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= static_cast<float>(divisor);
  } else {
    double* p = t.ptr<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= divisor;
  }
}

// One MPI request and what to do once it completes.
class MpiRequest : public CommRequest {
 public:
  explicit MpiRequest(std::function<void()> finish) : finish_(std::move(finish)) {}
  ~MpiRequest() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  MPI_Request* get() { return &request_; }

  void wait() override {
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
    finish();
  }
  bool test() override {
    int flag = 0;
    check_mpi(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) finish();
    return flag != 0;
  }

 private:
  void finish() {
    if (finish_) std::exchange(finish_, nullptr)();
  }
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::function<void()> finish_;
};

// Runs start(request) and wraps the request; `finish` runs once it completes.
template <class Start>
CommHandle start_request(const char* what, Start start, std::function<void()> finish = nullptr) {
  auto request = std::make_unique<MpiRequest>(std::move(finish));
  check_mpi(start(request->get()), what);
  return CommHandle(std::move(request));
}

std::function<void()> average_if(ReduceOp op, const Tensor& result, int size) {
  if (op != ReduceOp::Average || size == 1) return nullptr;
  return [result, size] { divide(result, size); };
}

}  // namespace

MpiCommunicator::MpiCommunicator(MpiComm comm) : comm_(std::move(comm)) {
  size_ = comm_size(comm_.get());
  rank_ = comm_rank(comm_.get());
}

MpiCommunicator MpiCommunicator::duplicate(MPI_Comm parent) {
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(parent, &comm), "MPI_Comm_dup");
  return MpiCommunicator(MpiComm(comm));
}

MpiCommunicator MpiCommunicator::split(MPI_Comm parent, int color, int key) {
  TESSERA_CHECK(color >= 0, "MpiCommunicator::split: color ", color, " must be non-negative");
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(parent, color, key, &comm), "MPI_Comm_split");
  return MpiCommunicator(MpiComm(comm));
}

CommHandle MpiCommunicator::start_all_reduce(Tensor t, ReduceOp op) {
  const int n = mpi_count("all_reduce", t);
  return start_request("MPI_Iallreduce", [&](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, t.data, n, mpi_type(t.dtype), mpi_op(op), comm(), r);
  }, average_if(op, t, size_));
}

CommHandle MpiCommunicator::start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) {
  mpi_count("reduce_scatter", input);
  const int n = mpi_count("reduce_scatter", output);
  return start_request("MPI_Ireduce_scatter_block", [&](MPI_Request* r) {
    return MPI_Ireduce_scatter_block(input.data, output.data, n, mpi_type(input.dtype), mpi_op(op), comm(), r);
  }, average_if(op, output, size_));
}

CommHandle MpiCommunicator::start_all_gather(Tensor input, Tensor output) {
  const int n = mpi_count("all_gather", input);
  mpi_count("all_gather", output);
  const MPI_Datatype type = mpi_type(input.dtype);
  return start_request("MPI_Iallgather", [&](MPI_Request* r) {
    return MPI_Iallgather(input.data, n, type, output.data, n, type, comm(), r);
  });
}

CommHandle MpiCommunicator::start_broadcast(Tensor t, int root) {
  const int n = mpi_count("broadcast", t);
  return start_request("MPI_Ibcast", [&](MPI_Request* r) {
    return MPI_Ibcast(t.data, n, mpi_type(t.dtype), root, comm(), r);
  });
}

CommHandle MpiCommunicator::start_send(Tensor t, int dst, int tag) {
  const int n = mpi_count("send", t);
  return start_request("MPI_Isend", [&](MPI_Request* r) {
    return MPI_Isend(t.data, n, mpi_type(t.dtype), dst, tag, comm(), r);
  });
}

CommHandle MpiCommunicator::start_recv(Tensor t, int src, int tag) {
  const int n = mpi_count("recv", t);
  return start_request("MPI_Irecv", [&](MPI_Request* r) {
    return MPI_Irecv(t.data, n, mpi_type(t.dtype), src, tag, comm(), r);
  });
}

}  // namespace tessera

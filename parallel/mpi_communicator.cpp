// The MPI backend: every op is nonblocking MPI (MPI_Iallreduce, ..., a batch's MPI_Isend/MPI_Irecv)
// wrapped in an RAII request that completes with MPI_Waitall/MPI_Testall, then runs the op's
// finishing step (the average's division) once.
#include "parallel/mpi_communicator.h"

#include <climits>
#include <functional>
#include <utility>

#include "kernels/check.h"
#include "parallel/mpi.h"

namespace tessera {

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

// MPI has no average: an Average is summed here and divided by average_if's step on completion.
MPI_Op mpi_op(ReduceOp) { return MPI_SUM; }

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

// The MPI requests of one op (one, or a batch's several) and what to do once all complete. The
// destructor waits for any still in flight (a handle dropped by an exception), so MPI never writes
// into freed buffers.
class MpiRequest : public CommRequest {
 public:
  MpiRequest(size_t n, std::function<void()> finish) : requests_(n, MPI_REQUEST_NULL), finish_(std::move(finish)) {}
  ~MpiRequest() override { MPI_Waitall(count(), requests_.data(), MPI_STATUSES_IGNORE); }
  MPI_Request* get(size_t i) { return &requests_[i]; }

  void wait() override {
    check_mpi(MPI_Waitall(count(), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    finish();
  }
  bool test() override {
    int flag = 0;
    check_mpi(MPI_Testall(count(), requests_.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (flag) finish();
    return flag != 0;
  }
  // wait_on: CommRequest's host wait (host buffers: nothing to queue on a stream).

 private:
  int count() const { return static_cast<int>(requests_.size()); }
  void finish() {
    if (finish_) std::exchange(finish_, nullptr)();
  }
  std::vector<MPI_Request> requests_;
  std::function<void()> finish_;
};

// Runs start(request) and wraps the request; `finish` runs once it completes.
template <class Start>
CommHandle start_request(const char* what, Start start, std::function<void()> finish = nullptr) {
  auto request = std::make_unique<MpiRequest>(1, std::move(finish));
  check_mpi(start(request->get(0)), what);
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

// Every op posted before any is waited for: each rank's receives are up while its sends wait for
// their peers' (a rendezvous-size send completes only once the receive is posted).
CommHandle MpiCommunicator::start_batch_send_recv(const std::vector<P2POp>& ops) {
  std::vector<int> counts;
  for (const P2POp& o : ops) counts.push_back(mpi_count("batch_send_recv", o.t));  // device checks first
  auto request = std::make_unique<MpiRequest>(ops.size(), nullptr);
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    if (o.kind == P2POp::Kind::Send)
      check_mpi(MPI_Isend(o.t.data, counts[i], mpi_type(o.t.dtype), o.peer, o.tag, comm(), request->get(i)), "MPI_Isend");
    else
      check_mpi(MPI_Irecv(o.t.data, counts[i], mpi_type(o.t.dtype), o.peer, o.tag, comm(), request->get(i)), "MPI_Irecv");
  }
  return CommHandle(std::move(request));
}

// ---- GridComms over MPI ----

GridComms mpi_grid_comms(const ProcessGrid& grid, MPI_Comm world) {
  TESSERA_CHECK(comm_size(world) == grid.world_size() && comm_rank(world) == grid.rank(), "GridComms: the grid is for rank ",
                grid.rank(), " of ", grid.world_size(), ", but this is rank ", comm_rank(world), " of ", comm_size(world));
  GridComms comms;
  for (const GridGroup& g : grid_groups(grid)) {
    // Groups partition the world, so a group's lowest rank names it uniquely.
    comms.*g.member = std::make_unique<MpiCommunicator>(
        MpiCommunicator::split(world, static_cast<int>(g.world_ranks.front()), static_cast<int>(grid.rank())));
  }
  return comms;
}

}  // namespace tessera

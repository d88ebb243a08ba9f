// The MPI backend: every op is nonblocking MPI (MPI_Iallreduce, ..., a batch's MPI_Isend/MPI_Irecv)
// wrapped in an RAII request that completes with MPI_Waitall/MPI_Testall (or, where ranks share
// cores, MPI_Testall yielding the core between tests: parallel/mpi.h MpiWait), then runs the op's
// finishing step (the average's division) once.
#include "parallel/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "kernels/backend_info.h"
#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "parallel/mpi.h"
#ifdef TESSERA_WITH_NCCL
#include "parallel/nccl_communicator.h"
#endif

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
  MpiRequest(size_t n, MpiWait how, std::function<void()> finish)
      : requests_(n, MPI_REQUEST_NULL), how_(how), finish_(std::move(finish)) {}
  ~MpiRequest() override { MPI_Waitall(count(), requests_.data(), MPI_STATUSES_IGNORE); }
  MPI_Request* get(size_t i) { return &requests_[i]; }

  void wait() override {
    wait_requests(how_, count(), requests_.data());
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
  MpiWait how_;
  std::function<void()> finish_;
};

// Runs start(request) and wraps the request; `finish` runs once it completes.
template <class Start>
CommHandle start_request(const char* what, MpiWait how, Start start, std::function<void()> finish = nullptr) {
  auto request = std::make_unique<MpiRequest>(1, how, std::move(finish));
  check_mpi(start(request->get(0)), what);
  return CommHandle(std::move(request));
}

std::function<void()> average_if(ReduceOp op, const Tensor& result, int size) {
  if (op != ReduceOp::Average || size == 1) return nullptr;
  return [result, size] { divide(result, size); };
}

}  // namespace

// ---- Staging device tensors through host buffers ----

// Host blocks by size, reused by later ops; owned jointly by the communicator and its staged ops in
// flight (a block goes back when its op's Staging is destroyed).
class MpiCommunicator::StagingPool {
 public:
  explicit StagingPool(Device device) : device_(device) {}
  ~StagingPool() {
    for (const auto& [bytes, p] : free_) host_staging_free(device_, p);
  }
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  static std::shared_ptr<void> take(const std::shared_ptr<StagingPool>& pool, size_t bytes) {
    bytes = std::max<size_t>(bytes, 64);
    void* p = nullptr;
    auto it = pool->free_.find(bytes);
    if (it != pool->free_.end()) {
      p = it->second;
      pool->free_.erase(it);
    } else {
      p = host_staging_alloc(pool->device_, bytes);
    }
    return std::shared_ptr<void>(p, [pool, bytes](void* q) { pool->free_.emplace(bytes, q); });
  }

 private:
  Device device_;
  std::multimap<size_t, void*> free_;
};

// One op's host copies: kept until the op's request is destroyed (MPI is done with them by then).
struct MpiCommunicator::Staging {
  Exec compute;
  std::vector<std::shared_ptr<void>> blocks;
  std::vector<std::pair<Tensor, Tensor>> results;  // (a tensor the op writes, its host copy)
  bool reads = false;                              // host copies filled from device tensors were queued
  void copy_back() const {
    for (const auto& [t, host] : results) copy(compute, t, host);
    if (!results.empty()) synchronize(compute);
  }
};

void MpiCommunicator::stage_through_host(const Exec& compute, bool always) {
  compute_ = compute;
  staging_ = true;
  stage_all_ = always;
  pool_ = std::make_shared<StagingPool>(compute.device);
}

Tensor MpiCommunicator::host_side(const char* op, const Tensor& t, bool read, bool write, Staging& s) {
  if (!staging_ || (t.device.is_cpu() && !stage_all_) || !t.defined()) return t;  // MPI checks it's host memory
  TESSERA_CHECK(t.device == compute_.device, op, ": ", t.str(), " is not on ", compute_.device.str(),
                ", the device this MPI communicator stages");
  s.compute = compute_;
  s.blocks.push_back(StagingPool::take(pool_, t.nbytes()));
  const Tensor host(s.blocks.back().get(), t.dtype, t.shape);
  if (read) {
    copy(compute_, host, t);
    s.reads = true;
  }
  if (write) s.results.emplace_back(t, host);
  return host;
}

std::shared_ptr<MpiCommunicator::Staging> MpiCommunicator::started(Staging&& s) const {
  if (s.blocks.empty()) return nullptr;
  if (s.reads) synchronize(s.compute);  // the host copies hold the values before MPI reads them
  return std::make_shared<Staging>(std::move(s));
}

// An op's completion: its host step (an average's division, on the host copy), then the staged
// results copied back to the device. The request holds this, and with it the staging, until it is
// destroyed (after MPI is done with the buffers).
std::function<void()> MpiCommunicator::finishing(std::function<void()> host_step, std::shared_ptr<Staging> s) {
  if (!s) return host_step;
  return [host_step = std::move(host_step), s = std::move(s)] {
    if (host_step) host_step();
    s->copy_back();
  };
}

MpiCommunicator::MpiCommunicator(MpiComm comm, MpiWait how) : comm_(std::move(comm)), wait_(how) {
  size_ = comm_size(comm_.get());
  rank_ = comm_rank(comm_.get());
}

MpiCommunicator MpiCommunicator::duplicate(MPI_Comm parent, MpiWait how) {
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(parent, &comm), "MPI_Comm_dup");
  return MpiCommunicator(MpiComm(comm), how);
}

MpiCommunicator MpiCommunicator::split(MPI_Comm parent, int color, int key, MpiWait how) {
  TESSERA_CHECK(color >= 0, "MpiCommunicator::split: color ", color, " must be non-negative");
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(parent, color, key, &comm), "MPI_Comm_split");
  return MpiCommunicator(MpiComm(comm), how);
}

CommHandle MpiCommunicator::start_all_reduce(Tensor t, ReduceOp op) {
  Staging staging;  // empty (no heap) unless a tensor is staged
  const Tensor h = host_side("all_reduce", t, true, true, staging);
  const int n = mpi_count("all_reduce", h);
  std::shared_ptr<Staging> s = started(std::move(staging));
  return start_request("MPI_Iallreduce", wait_, [&](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, h.data, n, mpi_type(h.dtype), mpi_op(op), comm(), r);
  }, finishing(average_if(op, h, size_), std::move(s)));
}

CommHandle MpiCommunicator::start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) {
  Staging staging;
  const Tensor in = host_side("reduce_scatter", input, true, false, staging);
  const Tensor out = host_side("reduce_scatter", output, false, true, staging);
  mpi_count("reduce_scatter", in);
  const int n = mpi_count("reduce_scatter", out);
  std::shared_ptr<Staging> s = started(std::move(staging));
  return start_request("MPI_Ireduce_scatter_block", wait_, [&](MPI_Request* r) {
    return MPI_Ireduce_scatter_block(in.data, out.data, n, mpi_type(in.dtype), mpi_op(op), comm(), r);
  }, finishing(average_if(op, out, size_), std::move(s)));
}

CommHandle MpiCommunicator::start_all_gather(Tensor input, Tensor output) {
  Staging staging;
  const Tensor in = host_side("all_gather", input, true, false, staging);
  const Tensor out = host_side("all_gather", output, false, true, staging);
  const int n = mpi_count("all_gather", in);
  mpi_count("all_gather", out);
  const MPI_Datatype type = mpi_type(in.dtype);
  std::shared_ptr<Staging> s = started(std::move(staging));
  return start_request("MPI_Iallgather", wait_, [&](MPI_Request* r) {
    return MPI_Iallgather(in.data, n, type, out.data, n, type, comm(), r);
  }, finishing(nullptr, std::move(s)));
}

CommHandle MpiCommunicator::start_broadcast(Tensor t, int root) {
  Staging staging;
  // The root's values go out, every other rank's come back: each rank reads and writes its own.
  const Tensor h = host_side("broadcast", t, rank_ == root, rank_ != root, staging);
  const int n = mpi_count("broadcast", h);
  std::shared_ptr<Staging> s = started(std::move(staging));
  return start_request("MPI_Ibcast", wait_, [&](MPI_Request* r) {
    return MPI_Ibcast(h.data, n, mpi_type(h.dtype), root, comm(), r);
  }, finishing(nullptr, std::move(s)));
}

CommHandle MpiCommunicator::start_send(Tensor t, int dst, int tag) {
  Staging staging;
  const Tensor h = host_side("send", t, true, false, staging);
  const int n = mpi_count("send", h);
  std::shared_ptr<Staging> s = started(std::move(staging));
  return start_request("MPI_Isend", wait_, [&](MPI_Request* r) {
    return MPI_Isend(h.data, n, mpi_type(h.dtype), dst, tag, comm(), r);
  }, finishing(nullptr, std::move(s)));
}

CommHandle MpiCommunicator::start_recv(Tensor t, int src, int tag) {
  Staging staging;
  const Tensor h = host_side("recv", t, false, true, staging);
  const int n = mpi_count("recv", h);
  std::shared_ptr<Staging> s = started(std::move(staging));
  return start_request("MPI_Irecv", wait_, [&](MPI_Request* r) {
    return MPI_Irecv(h.data, n, mpi_type(h.dtype), src, tag, comm(), r);
  }, finishing(nullptr, std::move(s)));
}

// Every op posted before any is waited for: each rank's receives are up while its sends wait for
// their peers' (a rendezvous-size send completes only once the receive is posted).
CommHandle MpiCommunicator::start_batch_send_recv(const std::vector<P2POp>& ops) {
  Staging staging;
  std::vector<Tensor> host;
  std::vector<int> counts;
  for (const P2POp& o : ops) {  // device checks first
    const bool send = o.kind == P2POp::Kind::Send;
    host.push_back(host_side("batch_send_recv", o.t, send, !send, staging));
    counts.push_back(mpi_count("batch_send_recv", host.back()));
  }
  std::shared_ptr<Staging> s = started(std::move(staging));
  auto request = std::make_unique<MpiRequest>(ops.size(), wait_, finishing(nullptr, std::move(s)));
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    const Tensor& h = host[i];
    if (o.kind == P2POp::Kind::Send)
      check_mpi(MPI_Isend(h.data, counts[i], mpi_type(h.dtype), o.peer, o.tag, comm(), request->get(i)), "MPI_Isend");
    else
      check_mpi(MPI_Irecv(h.data, counts[i], mpi_type(h.dtype), o.peer, o.tag, comm(), request->get(i)), "MPI_Irecv");
  }
  return CommHandle(std::move(request));
}

// ---- GridComms over MPI ----

GridComms mpi_grid_comms(const ProcessGrid& grid, MPI_Comm world, const Exec& compute, std::optional<MpiWait> waits) {
  TESSERA_CHECK(comm_size(world) == grid.world_size() && comm_rank(world) == grid.rank(), "GridComms: the grid is for rank ",
                grid.rank(), " of ", grid.world_size(), ", but this is rank ", comm_rank(world), " of ", comm_size(world));
  GridComms comms;
  const MpiWait how = waits ? *waits : mpi_wait_on_this_node(world, cpu_threads());
  for (const GridGroup& g : grid_groups(grid)) {
    // Groups partition the world, so a group's lowest rank names it uniquely.
    comms.*g.member = std::make_unique<MpiCommunicator>(MpiCommunicator::split(
        world, static_cast<int>(g.world_ranks.front()), static_cast<int>(grid.rank()), how));
    if (!compute.device.is_cpu()) static_cast<MpiCommunicator&>(*(comms.*g.member)).stage_through_host(compute);
  }
  return comms;
}

GridComms make_grid_comms(const ProcessGrid& grid, MPI_Comm world, const Exec& compute, const std::string& backend,
                          std::optional<MpiWait> waits) {
  if (backend != "nccl") return mpi_grid_comms(grid, world, compute, waits);
  TESSERA_CHECK(!compute.device.is_cpu(), "parallel.comm = \"nccl\" moves device tensors: it needs train.device = "
                "\"cuda\" (the CPU's ranks use parallel.comm = \"mpi\")");
#ifdef TESSERA_WITH_NCCL
  return nccl_grid_comms(grid, world, compute);
#else
  TESSERA_CHECK(false, "parallel.comm = \"nccl\": this build has no NCCL (TESSERA_CUDA=OFF)");
  return {};
#endif
}

}  // namespace tessera

// NcclCommunicator (parallel/nccl_communicator.h): NCCL collectives and point-to-point on the
// communicator's stream, each op bracketed by events (after the compute stream's queued work;
// completion for wait/test/wait_on). Average is NCCL's ncclAvg (no finishing step on the host).
#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <utility>

#include "kernels/check.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"

namespace tessera {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  TESSERA_CHECK(e == cudaSuccess, what, " failed: ", cudaGetErrorString(e));
}
void check_nccl(ncclResult_t r, const char* what) {
  TESSERA_CHECK(r == ncclSuccess, what, " failed: ", ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
  }
  detail::fail("no NCCL type for dtype ", dtype_name(dt));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Average ? ncclAvg : ncclSum; }

// One op in flight: its completion event on the communicator's stream. The NCCL communicator is
// checked for asynchronous errors (a peer gone, a network failure) whenever the host waits.
class NcclRequest : public CommRequest {
 public:
  NcclRequest(cudaEvent_t done, ncclComm_t comm, int device) : done_(done), comm_(comm), device_(device) {}
  // No wait here: CommHandle has completed the op (wait, test) or handed it to a stream (wait_on,
  // which must not block the host) before it destroys the request. An event still pending is
  // released by CUDA once it completes; a stream already waiting on it keeps that wait.
  ~NcclRequest() override {
    cudaSetDevice(device_);
    cudaEventDestroy(done_);
  }
  void wait() override {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaEventSynchronize(done_), "NCCL op (cudaEventSynchronize)");
    check_async_error();
  }
  bool test() override {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) {
      cudaGetLastError();  // not sticky, but clear it
      check_async_error();
      return false;
    }
    check_cuda(e, "NCCL op (cudaEventQuery)");
    check_async_error();
    return true;
  }
  void wait_on(const Exec& ex) override {
    TESSERA_CHECK(!ex.device.is_cpu(), "CommHandle::wait_on: a NCCL op's result is on cuda:", device_,
                  "; a CPU context must wait() instead");
    check_cuda(cudaSetDevice(ex.device.index), "cudaSetDevice");
    check_cuda(cudaStreamWaitEvent(ex.stream, done_, 0), "cudaStreamWaitEvent");
  }

 private:
  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    check_nccl(async, "NCCL op");
  }
  cudaEvent_t done_;
  ncclComm_t comm_;
  int device_;
};

// The setup step of one rank: "" when it went well, else its message (for throw_if_any_failed).
template <class F>
std::string attempt(F&& f) {
  try {
    f();
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace

NcclCommunicator::NcclCommunicator(const Exec& compute, CUstream_st* stream, int size, int rank)
    : compute_(compute), stream_(stream), size_(size), rank_(rank) {}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(MPI_Comm parent, const Exec& compute) {
  const int size = comm_size(parent), rank = comm_rank(parent);
  cudaStream_t stream = nullptr;
  // Device and stream first, agreed on by every rank: NCCL's init below waits for all ranks.
  throw_if_any_failed(parent, attempt([&] {
    TESSERA_CHECK(!compute.device.is_cpu(), "NcclCommunicator: the compute context is on the CPU (NCCL needs a CUDA device)");
    check_cuda(cudaSetDevice(compute.device.index), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }));
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(compute, stream, size, rank));
  ncclUniqueId id{};
  std::string err;
  if (rank == 0) err = attempt([&] { check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId"); });
  throw_if_any_failed(parent, err);
  check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, parent), "MPI_Bcast (NCCL unique id)");
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  c->comm_ = comm;
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(compute_.device.index);
  if (comm_) {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

template <class Enqueue>
CommHandle NcclCommunicator::start(const char* op, std::initializer_list<const Tensor*> tensors, Enqueue enqueue) {
  for (const Tensor* t : tensors)
    TESSERA_CHECK(t->device == compute_.device || t->numel() == 0, op, ": ", t->str(), " is not on ",
                  compute_.device.str(), ", the device of this NCCL communicator");
  check_cuda(cudaSetDevice(compute_.device.index), "cudaSetDevice");
  // Inputs: after everything queued on the compute stream so far.
  cudaEvent_t ready = nullptr, done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t rec = cudaEventRecord(ready, compute_.stream);
  const cudaError_t wait = rec == cudaSuccess ? cudaStreamWaitEvent(stream_, ready, 0) : rec;
  cudaEventDestroy(ready);  // released once recorded work completes
  check_cuda(wait, "ordering a NCCL op after the compute stream");
  enqueue(comm_, stream_);
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t rec_done = cudaEventRecord(done, stream_);
  if (rec_done != cudaSuccess) cudaEventDestroy(done);
  check_cuda(rec_done, "cudaEventRecord");
  return CommHandle(std::make_unique<NcclRequest>(done, comm_, compute_.device.index));
}

CommHandle NcclCommunicator::start_all_reduce(Tensor t, ReduceOp op) {
  if (t.device.is_cpu() && t.numel() > 0) return host_all_reduce(t, op);
  return start("all_reduce", {&t}, [&](ncclComm_t c, cudaStream_t s) {
    check_nccl(ncclAllReduce(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype), nccl_op(op), c, s), "ncclAllReduce");
  });
}

// A few host numbers (parallel/host_sums.h: the stop votes, a step's loss sums): through device
// scratch on this communicator's stream, in order with its other ops, complete on return. It does
// not wait for the compute stream: host values depend on nothing queued there.
CommHandle NcclCommunicator::host_all_reduce(const Tensor& t, ReduceOp op) {
  check_cuda(cudaSetDevice(compute_.device.index), "cudaSetDevice");
  const size_t bytes = t.nbytes();
  void* d = nullptr;
  check_cuda(cudaMallocAsync(&d, bytes, stream_), "cudaMallocAsync");
  cudaError_t e = cudaMemcpyAsync(d, t.data, bytes, cudaMemcpyHostToDevice, stream_);
  const ncclResult_t r = e == cudaSuccess ? ncclAllReduce(d, d, size_t(t.numel()), nccl_type(t.dtype), nccl_op(op), comm_, stream_)
                                          : ncclSuccess;
  if (e == cudaSuccess && r == ncclSuccess) e = cudaMemcpyAsync(t.data, d, bytes, cudaMemcpyDeviceToHost, stream_);
  cudaFreeAsync(d, stream_);
  const cudaError_t sync = cudaStreamSynchronize(stream_);
  check_cuda(e, "all_reduce of host values (copies)");
  check_nccl(r, "ncclAllReduce");
  check_cuda(sync, "all_reduce of host values (cudaStreamSynchronize)");
  return CommHandle();
}

CommHandle NcclCommunicator::start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) {
  return start("reduce_scatter", {&input, &output}, [&](ncclComm_t c, cudaStream_t s) {
    check_nccl(ncclReduceScatter(input.data, output.data, size_t(output.numel()), nccl_type(input.dtype), nccl_op(op), c, s),
               "ncclReduceScatter");
  });
}

CommHandle NcclCommunicator::start_all_gather(Tensor input, Tensor output) {
  return start("all_gather", {&input, &output}, [&](ncclComm_t c, cudaStream_t s) {
    check_nccl(ncclAllGather(input.data, output.data, size_t(input.numel()), nccl_type(input.dtype), c, s), "ncclAllGather");
  });
}

CommHandle NcclCommunicator::start_broadcast(Tensor t, int root) {
  return start("broadcast", {&t}, [&](ncclComm_t c, cudaStream_t s) {
    check_nccl(ncclBroadcast(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype), root, c, s), "ncclBroadcast");
  });
}

// NCCL has no tags: sends and receives between two ranks match in the order they are posted.
CommHandle NcclCommunicator::start_send(Tensor t, int dst, int) {
  return start("send", {&t}, [&](ncclComm_t c, cudaStream_t s) {
    check_nccl(ncclSend(t.data, size_t(t.numel()), nccl_type(t.dtype), dst, c, s), "ncclSend");
  });
}

CommHandle NcclCommunicator::start_recv(Tensor t, int src, int) {
  return start("recv", {&t}, [&](ncclComm_t c, cudaStream_t s) {
    check_nccl(ncclRecv(t.data, size_t(t.numel()), nccl_type(t.dtype), src, c, s), "ncclRecv");
  });
}

// One NCCL group: every send and receive in flight together (no deadlock between neighbours).
CommHandle NcclCommunicator::start_batch_send_recv(const std::vector<P2POp>& ops) {
  for (const P2POp& o : ops)
    TESSERA_CHECK(o.t.device == compute_.device || o.t.numel() == 0, "batch_send_recv: ", o.t.str(), " is not on ",
                  compute_.device.str(), ", the device of this NCCL communicator");
  return start("batch_send_recv", {}, [&](ncclComm_t c, cudaStream_t s) {
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (const P2POp& o : ops) {
      if (r != ncclSuccess) break;
      r = o.kind == P2POp::Kind::Send ? ncclSend(o.t.data, size_t(o.t.numel()), nccl_type(o.t.dtype), o.peer, c, s)
                                      : ncclRecv(o.t.data, size_t(o.t.numel()), nccl_type(o.t.dtype), o.peer, c, s);
    }
    const ncclResult_t end = ncclGroupEnd();  // always closed, even after a failed call
    check_nccl(r, "ncclSend/ncclRecv");
    check_nccl(end, "ncclGroupEnd");
  });
}

// ---- GridComms over NCCL ----

GridComms nccl_grid_comms(const ProcessGrid& grid, MPI_Comm world, const Exec& compute) {
  TESSERA_CHECK(comm_size(world) == grid.world_size() && comm_rank(world) == grid.rank(), "GridComms: the grid is for rank ",
                grid.rank(), " of ", grid.world_size(), ", but this is rank ", comm_rank(world), " of ", comm_size(world));
  GridComms comms;
  for (const GridGroup& g : grid_groups(grid)) {
    const MpiCommunicator group =
        MpiCommunicator::split(world, static_cast<int>(g.world_ranks.front()), static_cast<int>(grid.rank()));
    comms.*g.member = NcclCommunicator::create(group.comm(), compute);
  }
  return comms;
}

}  // namespace tessera

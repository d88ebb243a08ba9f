// The CPU twin of NCCL (kernels/simt/include/nccl.h) over MPI: a communicator is an MPI
// communicator split from MPI_COMM_WORLD, and every operation is work queued on its stream that
// makes the MPI call on the stream's worker thread (the process runs MPI_THREAD_MULTIPLE), so a
// collective completes in stream order exactly as NCCL's kernel would. bf16 reductions widen to
// f32, reduce, and round once to nearest even.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/simt/host_bf16.h"
#include "kernels/simt/stream.h"
#include "kernels/simt/twin.h"
#include "nccl.h"

namespace tessera::simt {
namespace {

constexpr char kIdMagic[] = "tessera-simt-nccl";

// What an id carries (in ncclUniqueId::internal).
struct IdContents {
  char magic[sizeof kIdMagic];
  int32_t root_world_rank;
  uint64_t serial;
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES);

// A communicator's state, shared by the handle and the work queued with it (an operation still
// queued when ncclCommDestroy is called completes, as NCCL's finalisation lets it).
struct CommState {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 0, device = 0;
  std::atomic<int> async_error{ncclSuccess};
  ~CommState() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

ncclResult_t fail(ncclResult_t r, const std::string& message) {
  report("nccl", r, "NCCL " + message);
  return r;
}

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return "ncclInt8";
    case ncclUint8: return "ncclUint8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    default: break;
  }
  return "an unknown ncclDataType_t";
}

bool supported(ncclDataType_t t) {
  return t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 || t == ncclInt32;
}
size_t type_bytes(ncclDataType_t t) { return t == ncclFloat64 ? 8 : t == ncclBfloat16 ? 2 : 4; }

// The MPI type that carries t: bf16 moves as 16-bit words (and is reduced as f32, widened).
MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    case ncclInt32: return MPI_INT32_T;
    default: return MPI_UINT16_T;
  }
}

// Throws the failure of an MPI call made by queued work: the device's sticky error, and the
// communicator's asynchronous one (what ncclCommGetAsyncError reports).
void check_mpi(int rc, const char* call, CommState& c) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  c.async_error = ncclSystemError;
  throw std::runtime_error(std::string(call) + " failed: " + std::string(text, size_t(len)));
}

void require_mpi_alive(const char* op) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) throw std::runtime_error(std::string(op) + " ran after MPI_Finalize (a stream was not synchronised)");
}


}  // namespace
}  // namespace tessera::simt

// The handle: the communicator's state, shared with its queued work.
struct ncclComm {
  std::shared_ptr<tessera::simt::CommState> state;
};

namespace tessera::simt {
namespace {

// The checks every operation makes on the calling thread; ncclSuccess or the refusal.
ncclResult_t check_op(const char* op, ncclComm_t comm, ncclDataType_t t, size_t count) {
  if (!comm || !comm->state) return fail(ncclInvalidArgument, std::string(op) + ": a null communicator");
  if (!supported(t))
    return fail(ncclInvalidArgument, std::string(op) + ": data type " + type_name(t) +
                                         " (the twin has ncclFloat32, ncclFloat64, ncclBfloat16, ncclInt32)");
  if (count > size_t(INT_MAX) / size_t(comm->state->size))
    return fail(ncclInvalidArgument, std::string(op) + ": " + std::to_string(count) +
                                         " elements exceed what MPI's int counts carry");
  return ncclSuccess;
}

ncclResult_t check_reduction(const char* op, ncclRedOp_t r) {
  if (r == ncclSum || r == ncclAvg) return ncclSuccess;
  return fail(ncclInvalidArgument, std::string(op) + ": reduction " + std::to_string(int(r)) +
                                       " (the twin has ncclSum and ncclAvg)");
}

// A device buffer of `bytes` (none when 0): NCCL moves device memory only.
ncclResult_t check_buffer(const char* op, const char* name, const void* p, size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  if (!p || !is_device_range(p, bytes))
    return fail(ncclInvalidArgument, std::string(op) + ": the " + name + " (" + std::to_string(bytes) +
                                         " bytes) is not within one device allocation");
  return ncclSuccess;
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// ---- the reductions, run by the stream's worker ----

std::vector<float> widen(const void* p, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  return f;
}
void narrow(const std::vector<float>& f, void* p) {
  for (size_t i = 0; i < f.size(); ++i) static_cast<uint16_t*>(p)[i] = f32_to_bf16(f[i]);
}

// ncclAvg's finishing step: divide the sum (n elements of type t at p) by the ranks.
void divide(void* p, size_t n, ncclDataType_t t, int ranks) {
  switch (t) {
    case ncclFloat32:
      for (size_t i = 0; i < n; ++i) static_cast<float*>(p)[i] /= float(ranks);
      break;
    case ncclFloat64:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(p)[i] /= double(ranks);
      break;
    case ncclInt32:
      for (size_t i = 0; i < n; ++i) static_cast<int32_t*>(p)[i] /= ranks;
      break;
    default: break;
  }
}

void all_reduce(CommState& c, const void* send, void* recv, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  require_mpi_alive("ncclAllReduce");
  if (t == ncclBfloat16) {
    std::vector<float> f = widen(send, n);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, f.data(), int(n), MPI_FLOAT, MPI_SUM, c.comm), "MPI_Allreduce", c);
    if (op == ncclAvg) divide(f.data(), n, ncclFloat32, c.size);
    return narrow(f, recv);
  }
  const void* in = send == recv ? MPI_IN_PLACE : send;
  check_mpi(MPI_Allreduce(in, recv, int(n), mpi_type(t), MPI_SUM, c.comm), "MPI_Allreduce", c);
  if (op == ncclAvg) divide(recv, n, t, c.size);
}

// send holds size x n elements; this rank's n reduced ones go to recv (which may lie in send,
// NCCL's in-place form: recv = send + rank n).
void reduce_scatter(CommState& c, const void* send, void* recv, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  require_mpi_alive("ncclReduceScatter");
  const size_t total = n * size_t(c.size);
  if (t == ncclBfloat16) {
    std::vector<float> in = widen(send, total), out(n);
    check_mpi(MPI_Reduce_scatter_block(in.data(), out.data(), int(n), MPI_FLOAT, MPI_SUM, c.comm),
              "MPI_Reduce_scatter_block", c);
    if (op == ncclAvg) divide(out.data(), n, ncclFloat32, c.size);
    return narrow(out, recv);
  }
  const size_t es = type_bytes(t);
  std::vector<unsigned char> copy;
  if (overlap(send, total * es, recv, n * es)) {  // MPI forbids aliased buffers
    copy.assign(static_cast<const unsigned char*>(send), static_cast<const unsigned char*>(send) + total * es);
    send = copy.data();
  }
  check_mpi(MPI_Reduce_scatter_block(send, recv, int(n), mpi_type(t), MPI_SUM, c.comm), "MPI_Reduce_scatter_block", c);
  if (op == ncclAvg) divide(recv, n, t, c.size);
}

// recv gets every rank's n elements in rank order; send may be recv + rank n (in place).
void all_gather(CommState& c, const void* send, void* recv, size_t n, ncclDataType_t t) {
  require_mpi_alive("ncclAllGather");
  const size_t es = type_bytes(t), bytes = n * es;
  const void* in = send;
  std::vector<unsigned char> copy;
  if (send == static_cast<const unsigned char*>(recv) + size_t(c.rank) * bytes) {
    in = MPI_IN_PLACE;
  } else if (overlap(send, bytes, recv, bytes * size_t(c.size))) {
    copy.assign(static_cast<const unsigned char*>(send), static_cast<const unsigned char*>(send) + bytes);
    in = copy.data();
  }
  check_mpi(MPI_Allgather(in, int(n), mpi_type(t), recv, int(n), mpi_type(t), c.comm), "MPI_Allgather", c);
}

void broadcast(CommState& c, const void* send, void* recv, size_t n, ncclDataType_t t, int root) {
  require_mpi_alive("ncclBroadcast");
  if (c.rank == root && send != recv) std::memmove(recv, send, n * type_bytes(t));
  check_mpi(MPI_Bcast(recv, int(n), mpi_type(t), root, c.comm), "MPI_Bcast", c);
}

// ---- point to point and groups ----

struct P2P {
  std::shared_ptr<CommState> state;
  bool send = false;
  void* buf = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  int peer = 0;
};

// Sends and receives of one group on one stream: all posted, then all waited for.
void exchange(const std::vector<P2P>& ops) {
  require_mpi_alive("ncclSend/ncclRecv");
  std::vector<MPI_Request> requests(ops.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2P& o = ops[i];
    const int rc = o.send ? MPI_Isend(o.buf, int(o.count), mpi_type(o.type), o.peer, 0, o.state->comm, &requests[i])
                          : MPI_Irecv(o.buf, int(o.count), mpi_type(o.type), o.peer, 0, o.state->comm, &requests[i]);
    check_mpi(rc, o.send ? "MPI_Isend" : "MPI_Irecv", *o.state);
  }
  if (!ops.empty())
    check_mpi(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall", *ops.front().state);
}

// The calling thread's open group (NCCL's group calls nest, and are per thread).
struct Group {
  int depth = 0;
  std::vector<std::pair<cudaStream_t, P2P>> ops;
};
thread_local Group this_thread_group;

ncclResult_t point_to_point(const char* op, bool send, void* buf, size_t count, ncclDataType_t t, int peer,
                            ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t r = check_op(op, comm, t, count)) return r;
  if (peer < 0 || peer >= comm->state->size)
    return fail(ncclInvalidArgument, std::string(op) + ": peer " + std::to_string(peer) + " of " +
                                         std::to_string(comm->state->size) + " ranks");
  if (const ncclResult_t r = check_buffer(op, send ? "send buffer" : "receive buffer", buf, count * type_bytes(t)))
    return r;
  P2P p{comm->state, send, buf, count, t, peer};
  if (this_thread_group.depth > 0) {
    this_thread_group.ops.emplace_back(stream, std::move(p));
    return ncclSuccess;
  }
  enqueue(stream, op, [p = std::move(p)] { exchange({p}); });
  return ncclSuccess;
}

// Collectives are not grouped by the twin (tessera groups sends and receives only).
ncclResult_t refuse_in_group(const char* op) {
  if (this_thread_group.depth == 0) return ncclSuccess;
  return fail(ncclInvalidUsage, std::string(op) + " inside ncclGroupStart/ncclGroupEnd: the twin groups ncclSend and "
                                                  "ncclRecv only");
}

}  // namespace
}  // namespace tessera::simt

using namespace tessera::simt;

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  if (const char* m = reported("nccl", result)) return m;
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: break;
  }
  return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return fail(ncclSystemError, "ncclGetUniqueId: the NCCL twin runs over MPI, which is not initialized");
  IdContents id{};
  std::memcpy(id.magic, kIdMagic, sizeof kIdMagic);
  MPI_Comm_rank(MPI_COMM_WORLD, &id.root_world_rank);
  id.serial = next_serial();
  std::memset(uniqueId->internal, 0, sizeof uniqueId->internal);
  std::memcpy(uniqueId->internal, &id, sizeof id);
  return ncclSuccess;
}

// The ranks that share an id meet in MPI_Comm_split over MPI_COMM_WORLD, coloured
// by the root's world rank (communicators created in the same round have distinct roots: they
// are disjoint), ordered by their NCCL rank; then they check that they agree on the id.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  const std::string call = "ncclCommInitRank";
  if (!comm) return fail(ncclInvalidArgument, call + ": comm is null");
  *comm = nullptr;
  IdContents id{};
  std::memcpy(&id, commId.internal, sizeof id);
  if (std::memcmp(id.magic, kIdMagic, sizeof kIdMagic) != 0)
    return fail(ncclInvalidArgument, call + ": the unique id is not from this twin's ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, call + ": rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  int initialized = 0, level = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return fail(ncclSystemError, call + ": the NCCL twin runs over MPI, which is not initialized");
  MPI_Query_thread(&level);
  if (level != MPI_THREAD_MULTIPLE)
    return fail(ncclInvalidUsage, call + ": the NCCL twin calls MPI from stream threads: it needs MPI_THREAD_MULTIPLE");

  auto state = std::make_shared<CommState>();
  // The split's result is a communicator of its own (its own context): no traffic on it meets
  // MPI_COMM_WORLD's.
  const int rc = MPI_Comm_split(MPI_COMM_WORLD, id.root_world_rank, rank, &state->comm);
  if (rc != MPI_SUCCESS) return fail(ncclSystemError, call + ": MPI_Comm_split failed");
  MPI_Comm_set_errhandler(state->comm, MPI_ERRORS_RETURN);  // an MPI failure becomes a device fault, not an abort
  MPI_Comm_size(state->comm, &state->size);
  MPI_Comm_rank(state->comm, &state->rank);
  state->device = current_device();
  // Every member saw the same serial (else two rounds of creation got mixed up), each rank once.
  const int64_t mine[2] = {int64_t(id.serial), -int64_t(id.serial)};
  int64_t agreed[2] = {0, 0};
  MPI_Allreduce(mine, agreed, 2, MPI_INT64_T, MPI_MAX, state->comm);
  if (agreed[0] != -agreed[1] || state->size != nranks || state->rank != rank)
    return fail(ncclInvalidUsage, call + ": rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                                      " met " + std::to_string(state->size) + " ranks with ids that " +
                                      (agreed[0] != -agreed[1] ? "differ" : "agree") +
                                      ": every world rank must create its NCCL communicators in the same order, "
                                      "with distinct ranks 0..nranks-1");
  *comm = new ncclComm{std::move(state)};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommDestroy: a null communicator");
  delete comm;  // the MPI communicator is freed once no queued work holds it
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!comm || !asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: a null argument");
  *asyncError = ncclResult_t(comm->state->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return fail(ncclInvalidArgument, "ncclCommCount: a null argument");
  *count = comm->state->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: a null argument");
  *rank = comm->state->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* name = "ncclAllReduce";
  if (const ncclResult_t r = check_op(name, comm, datatype, count)) return r;
  if (const ncclResult_t r = check_reduction(name, op)) return r;
  if (const ncclResult_t r = refuse_in_group(name)) return r;
  const size_t bytes = count * type_bytes(datatype);
  if (const ncclResult_t r = check_buffer(name, "send buffer", sendbuff, bytes)) return r;
  if (const ncclResult_t r = check_buffer(name, "receive buffer", recvbuff, bytes)) return r;
  if (count == 0) return ncclSuccess;
  enqueue(stream, name, [s = comm->state, sendbuff, recvbuff, count, datatype, op] {
    all_reduce(*s, sendbuff, recvbuff, count, datatype, op);
  });
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const char* name = "ncclReduceScatter";
  if (const ncclResult_t r = check_op(name, comm, datatype, recvcount)) return r;
  if (const ncclResult_t r = check_reduction(name, op)) return r;
  if (const ncclResult_t r = refuse_in_group(name)) return r;
  const size_t bytes = recvcount * type_bytes(datatype);
  if (const ncclResult_t r = check_buffer(name, "send buffer", sendbuff, bytes * size_t(comm->state->size))) return r;
  if (const ncclResult_t r = check_buffer(name, "receive buffer", recvbuff, bytes)) return r;
  if (recvcount == 0) return ncclSuccess;
  enqueue(stream, name, [s = comm->state, sendbuff, recvbuff, recvcount, datatype, op] {
    reduce_scatter(*s, sendbuff, recvbuff, recvcount, datatype, op);
  });
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* name = "ncclAllGather";
  if (const ncclResult_t r = check_op(name, comm, datatype, sendcount)) return r;
  if (const ncclResult_t r = refuse_in_group(name)) return r;
  const size_t bytes = sendcount * type_bytes(datatype);
  if (const ncclResult_t r = check_buffer(name, "send buffer", sendbuff, bytes)) return r;
  if (const ncclResult_t r = check_buffer(name, "receive buffer", recvbuff, bytes * size_t(comm->state->size))) return r;
  if (sendcount == 0) return ncclSuccess;
  enqueue(stream, name, [s = comm->state, sendbuff, recvbuff, sendcount, datatype] {
    all_gather(*s, sendbuff, recvbuff, sendcount, datatype);
  });
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* name = "ncclBroadcast";
  if (const ncclResult_t r = check_op(name, comm, datatype, count)) return r;
  if (const ncclResult_t r = refuse_in_group(name)) return r;
  if (root < 0 || root >= comm->state->size)
    return fail(ncclInvalidArgument, std::string(name) + ": root " + std::to_string(root) + " of " +
                                         std::to_string(comm->state->size) + " ranks");
  const size_t bytes = count * type_bytes(datatype);
  if (comm->state->rank == root)
    if (const ncclResult_t r = check_buffer(name, "send buffer", sendbuff, bytes)) return r;
  if (const ncclResult_t r = check_buffer(name, "receive buffer", recvbuff, bytes)) return r;
  if (count == 0) return ncclSuccess;
  enqueue(stream, name, [s = comm->state, sendbuff, recvbuff, count, datatype, root] {
    broadcast(*s, sendbuff, recvbuff, count, datatype, root);
  });
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point("ncclSend", true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++this_thread_group.depth;
  return ncclSuccess;
}

// The outermost ncclGroupEnd queues the group: one exchange per stream, its operations in order.
ncclResult_t ncclGroupEnd() {
  Group& g = this_thread_group;
  if (g.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g.depth > 0) return ncclSuccess;
  std::vector<std::pair<cudaStream_t, std::vector<P2P>>> by_stream;
  for (auto& [stream, op] : g.ops) {
    auto it = std::find_if(by_stream.begin(), by_stream.end(), [s = stream](const auto& e) { return e.first == s; });
    if (it == by_stream.end()) it = by_stream.insert(by_stream.end(), {stream, {}});
    it->second.push_back(std::move(op));
  }
  g.ops.clear();
  for (auto& [stream, ops] : by_stream) enqueue(stream, "ncclGroupEnd (ncclSend/ncclRecv)", [ops = std::move(ops)] { exchange(ops); });
  return ncclSuccess;
}

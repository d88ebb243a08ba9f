// The NCCL backend of Communicator (parallel/communicator.h): device tensors, every op queued on the
// communicator's own CUDA stream and ordered against the compute stream with events, so that
// collectives (data-parallel buckets) run while the compute stream goes on with the backward.
// Compiled only with the CUDA backend (TESSERA_CUDA=ON); includes no CUDA or NCCL header.
//
// Ordering, both ways, without host waits:
//  * inputs: every op first makes the communicator's stream wait for an event recorded on the
//    compute stream (the Exec given at creation) when the op is started, so it reads what every
//    kernel queued before it wrote;
//  * results: CommHandle::wait_on(ex) queues a wait for the op's completion event on ex.stream and
//    returns at once; wait() blocks the host on that event; test() polls it.
// NCCL refuses two ranks on one GPU: with several ranks per GPU use the MPI communicator.
#pragma once

#include <mpi.h>

#include <initializer_list>
#include <memory>
#include <vector>

#include "kernels/exec.h"
#include "parallel/communicator.h"
#include "parallel/grid_comms.h"
#include "parallel/process_grid.h"

struct ncclComm;  // NCCL's ncclComm_t is `ncclComm*`

namespace tessera {

class NcclCommunicator : public Communicator {
 public:
  // Collective over parent: rank 0 of parent makes the NCCL unique id, MPI_Bcast sends it to the
  // others, and each rank joins (ncclCommInitRank) on compute.device. The setup steps that can
  // fail on one rank alone (device, stream) are agreed on over MPI first, so every rank throws
  // together rather than leaving the others waiting inside NCCL's initialization.
  static std::unique_ptr<NcclCommunicator> create(MPI_Comm parent, const Exec& compute);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int size() const override { return size_; }
  int rank() const override { return rank_; }
  // The compute context whose queued work every op waits for; the communicator's own stream.
  const Exec& compute() const { return compute_; }
  CUstream_st* stream() const { return stream_; }

 protected:
  CommHandle start_all_reduce(Tensor t, ReduceOp op) override;
  CommHandle start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) override;
  CommHandle start_all_gather(Tensor input, Tensor output) override;
  CommHandle start_broadcast(Tensor t, int root) override;
  CommHandle start_send(Tensor t, int dst, int tag) override;
  CommHandle start_recv(Tensor t, int src, int tag) override;
  CommHandle start_batch_send_recv(const std::vector<P2POp>& ops) override;

 private:
  // all_reduce of a host tensor (the trainer's host sums): staged through the device, blocking.
  CommHandle host_all_reduce(const Tensor& t, ReduceOp op);
  NcclCommunicator(const Exec& compute, CUstream_st* stream, int size, int rank);
  // Checks the tensors' device, orders the stream after compute's queued work, runs enqueue (the
  // NCCL calls), records the completion event and wraps it in a handle.
  template <class Enqueue>
  CommHandle start(const char* op, std::initializer_list<const Tensor*> tensors, Enqueue enqueue);

  Exec compute_;
  CUstream_st* stream_ = nullptr;
  ncclComm* comm_ = nullptr;
  int size_ = 1, rank_ = 0;
};

// Collective over world (every rank calls it, in the same order as other collectives): one
// NcclCommunicator per group of grid, in grid_groups order, each created over the MPI_Comm_split of
// world that mpi_grid_comms makes for the group (colored by its lowest world rank, keyed by world
// rank), so ranks inside follow the grid's group order (tp->rank() == grid.tp_rank(), ...). The
// MPI sub-communicators serve only to send the NCCL ids and are freed at once.
GridComms nccl_grid_comms(const ProcessGrid& grid, MPI_Comm world, const Exec& compute);

}  // namespace tessera

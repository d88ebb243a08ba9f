// The MPI backend of Communicator (parallel/communicator.h): host (CPU) tensors, every op a
// nonblocking MPI call wrapped in an RAII request; and the factory that splits a world
// communicator into a grid's GridComms. The only parallel/ header besides mpi.h with <mpi.h>.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/grid_comms.h"
#include "parallel/mpi.h"
#include "parallel/process_grid.h"

namespace tessera {

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

// Communicator over an MPI communicator, on host (CPU) tensors, and on device tensors once
// stage_through_host is set. Owns its MPI_Comm, so its traffic never mixes with the parent's.
// Starting an op is not thread-safe: one thread per communicator. Its handles complete on the
// host: CommHandle::wait_on waits there (for any Exec).
class MpiCommunicator : public Communicator {
 public:
  // Collective over parent: MPI_Comm_dup. `how`: how its ops are waited for (parallel/mpi.h).
  static MpiCommunicator duplicate(MPI_Comm parent, MpiWait how = MpiWait::Spin);
  // Collective over parent: MPI_Comm_split; ranks with the same color share a communicator, ordered
  // by key.
  static MpiCommunicator split(MPI_Comm parent, int color, int key, MpiWait how = MpiWait::Spin);

  int size() const override { return size_; }
  int rank() const override { return rank_; }
  // For MPI helpers such as throw_if_any_failed (parallel/mpi.h).
  MPI_Comm comm() const { return comm_.get(); }
  MpiWait waits() const { return wait_; }

  // Device tensors (train.device = "cuda" with parallel.comm = "mpi": several ranks may share one
  // GPU), on compute's device: every op copies its device inputs to host buffers (page-locked,
  // cached by size, kept by the communicator) on compute's stream and waits for that stream (so it
  // reads what the kernels queued before it wrote), runs MPI on the host copies, and when it
  // completes (wait, test, wait_on, the average's division done on the host) copies the results back
  // on compute's stream and waits for the copy. Host tensors still go to MPI directly, unless
  // `always` (tests: the staging path run on CPU tensors, compute being the CPU's).
  void stage_through_host(const Exec& compute, bool always = false);

 protected:
  CommHandle start_all_reduce(Tensor t, ReduceOp op) override;
  CommHandle start_reduce_scatter(Tensor input, Tensor output, ReduceOp op) override;
  CommHandle start_all_gather(Tensor input, Tensor output) override;
  CommHandle start_broadcast(Tensor t, int root) override;
  CommHandle start_send(Tensor t, int dst, int tag) override;
  CommHandle start_recv(Tensor t, int src, int tag) override;
  CommHandle start_batch_send_recv(const std::vector<P2POp>& ops) override;

 private:
  MpiCommunicator(MpiComm comm, MpiWait how);
  struct Staging;
  class StagingPool;
  // What MPI reads or writes for t: t itself, or a host copy taken from staging (read: filled from
  // t now; write: copied back to t when the op completes).
  Tensor host_side(const char* op, const Tensor& t, bool read, bool write, Staging& s);
  // After host_side's reads are queued: waits for them when any was (the op may read its buffers).
  std::shared_ptr<Staging> started(Staging&& s) const;
  static std::function<void()> finishing(std::function<void()> host_step, std::shared_ptr<Staging> s);
  MpiComm comm_;
  MpiWait wait_ = MpiWait::Spin;
  int size_ = 1, rank_ = 0;
  Exec compute_;        // stage_through_host's context; the CPU's until then
  bool staging_ = false, stage_all_ = false;
  std::shared_ptr<StagingPool> pool_;  // shared with the staged ops in flight
};

// Collective over world (every rank calls it, in the same order as other collectives): one
// MpiCommunicator per group of grid (grid_groups order), each an MPI_Comm_split of world colored by
// the group's lowest world rank and keyed by world rank, so that the ranks inside a communicator
// follow the grid's group order: tp->rank() == grid.tp_rank(), dp_cp->rank() == cp_rank + cp x
// dp_rank, world->rank() == grid.rank(). Throws tessera::Error when grid is not world's.
// compute: the context of the trainer's tensors; on a device, every communicator stages them
// through host buffers (MpiCommunicator::stage_through_host). waits: how their ops are waited for;
// unset: as this node's ranks and OpenMP threads say (mpi_wait_on_this_node: yield where they
// outnumber its CPUs, else spin).
GridComms mpi_grid_comms(const ProcessGrid& grid, MPI_Comm world, const Exec& compute = Exec::cpu(),
                         std::optional<MpiWait> waits = std::nullopt);

// The trainer's communicators for parallel.comm = `backend`: "mpi" (mpi_grid_comms, staging device
// tensors through host buffers), or "nccl" (nccl_grid_comms, parallel/nccl_communicator.h: device
// tensors on compute's CUDA device; a build without the CUDA backend, or a CPU compute context, is
// an Error naming the key). Collective over world.
// waits: the MPI communicators' (mpi_grid_comms); NCCL's ignore it.
GridComms make_grid_comms(const ProcessGrid& grid, MPI_Comm world, const Exec& compute, const std::string& backend,
                          std::optional<MpiWait> waits = std::nullopt);

}  // namespace tessera

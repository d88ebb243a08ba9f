// MPI process lifetime and small collective helpers. MpiSession is the one owner of
// MPI_Init/MPI_Finalize (held by main() for the whole run); everything else takes an MPI_Comm.
#pragma once

#include <mpi.h>

#include "kernels/check.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// An error every rank of a communicator throws together, with the same message: the program
// prints it once (rank 0) and all ranks exit.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// RAII: initializes MPI (MPI_THREAD_MULTIPLE: the checkpoint writer thread does collective I/O on its
// own duplicated communicator while the main thread trains; OpenMP threads do
// not) unless it already is, and finalizes it on destruction only if this session initialized it.
// Started without mpirun, MPICH runs as a singleton: one process, rank 0 of size 1.
class MpiSession {
 public:
  MpiSession() : MpiSession(nullptr, nullptr) {}
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  bool owns_mpi() const { return owns_; }  // false when MPI was already initialized
  int thread_level() const { return thread_level_; }

 private:
  bool owns_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
};

// Throws tessera::Error "<what> failed: <MPI error string>" unless rc is MPI_SUCCESS. A failed MPI
// call is a broken environment, not a user error.
void check_mpi(int rc, const char* what);

// Named comm_rank/comm_size, not rank/size, so that `int rank = comm_rank(comm);` compiles.
int comm_rank(MPI_Comm comm);
int comm_size(MPI_Comm comm);
// How many ranks of comm share this node (MPI_COMM_TYPE_SHARED); collective over comm.
int ranks_on_this_node(MPI_Comm comm);

// How a rank waits for its MPI requests to complete.
enum class MpiWait {
  Spin,   // MPI_Waitall: polls without pause (every rank and its threads have a core of their own)
  Yield,  // MPI_Testall, giving the core away (sched_yield) between tests: the node's ranks share
          // cores, and a rank spinning in MPI_Waitall would hold its core until the scheduler's
          // tick (4 ms at HZ = 250) while the rank it waits for needs that core to send
};
const char* to_string(MpiWait how);
// Pure: Yield when ranks_on_node x threads_per_rank exceed the cpus they may run on.
MpiWait mpi_wait_for(int64_t ranks_on_node, int64_t threads_per_rank, int64_t cpus);

// The CPUs of this node's ranks of a communicator.
struct NodeCpus {
  int ranks_on_node = 1;       // ranks of the communicator on this node
  int cpus_allowed = 1;        // CPUs this rank may run on (its affinity mask)
  int cpus_of_node_ranks = 1;  // CPUs in the union of the node's ranks' masks
  bool ranks_bound = false;    // the launcher gave each rank CPUs of its own (disjoint masks)
};
// Collective over comm (MPI_COMM_TYPE_SHARED, sched_getaffinity).
NodeCpus node_cpus(MPI_Comm comm);
// Collective over comm: mpi_wait_for this node's ranks, threads_per_rank and the node's ranks' CPUs.
MpiWait mpi_wait_on_this_node(MPI_Comm comm, int64_t threads_per_rank);
// parallel.mpi_wait: "spin", "yield", or "auto" (mpi_wait_on_this_node: collective over comm).
// Throws tessera::Error for another value.
MpiWait resolve_mpi_wait(const std::string& setting, MPI_Comm comm, int64_t threads_per_rank);
// Completes n requests the way `how` says (MPI_Waitall, or the yielding loop of MPI_Testall).
void wait_requests(MpiWait how, int n, MPI_Request* requests);
// MPI_Barrier, waited for the way `how` says (MPI_Ibarrier).
void barrier(MPI_Comm comm, MpiWait how);

// Collective over comm. Each rank passes "" when its part went well, else its error message.
// If any rank failed, every rank throws tessera::Error carrying the message of the lowest failed
// rank (the same text everywhere), so ranks leave a collective operation together: no hang, and
// the message can be printed once.
void throw_if_any_failed(MPI_Comm comm, const std::string& local_error);

// Collective: every rank's bytes, indexed by rank, on every rank.
std::vector<std::string> allgather_bytes(MPI_Comm comm, const std::string& mine);
// Collective: root's bytes on every rank (the argument is ignored on other ranks).
std::string broadcast_bytes(MPI_Comm comm, const std::string& bytes, int root);

}  // namespace tessera

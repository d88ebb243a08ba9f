// MPI process lifetime and small collective helpers. MpiSession is the one owner of
// MPI_Init/MPI_Finalize (held by main() for the whole run); everything else takes an MPI_Comm.
#pragma once

#include <mpi.h>

#include "kernels/check.h"

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

// SIMT stand-in for NCCL's <nccl.h> (-DTESSERA_SIMT=ON only): exactly what
// parallel/nccl_communicator.cpp uses, with NCCL's names, signatures and values. The twin
// (kernels/simt/nccl.cpp) runs each operation over MPI on host memory, as work queued on the
// operation's stream; the process must have initialised MPI with MPI_THREAD_MULTIPLE.
#pragma once

#include <cstddef>

#include "kernels/simt/runtime_api.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#define NCCL_UNIQUE_ID_BYTES 128
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};

struct ncclComm;
using ncclComm_t = ncclComm*;

enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8,
};

enum ncclRedOp_t : int { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 };

enum ncclDataType_t : int {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 12,
};

ncclResult_t ncclGetVersion(int* version);
const char* ncclGetErrorString(ncclResult_t result);

// The id carries the root's MPI world rank and a number unique in its process.
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
// Collective over MPI_COMM_WORLD (not only over the new communicator's ranks, as NCCL's is):
// every world rank must create its communicators in the same order, each exactly once per round.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

// ncclSum and ncclAvg over ncclFloat32, ncclFloat64, ncclBfloat16 and ncclInt32.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);

// Sends and receives between these are posted together (MPI_Isend/MPI_Irecv) at ncclGroupEnd, as
// one piece of work per stream that waits for all of them: no deadlock between neighbours.
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

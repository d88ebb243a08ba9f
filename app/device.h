// train.device: which device a rank trains on. "cpu", or "cuda": the GPU of the rank's local rank
// on its node (MPI's or Slurm's), refused with a clear message, on every rank at once, where this
// build has no CUDA backend or the node shows no GPU.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

#include "kernels/tensor.h"

namespace tessera {

struct Config;

// The environment, as std::getenv (null: unset); a parameter so that tests can give their own.
using EnvLookup = std::function<const char*(const char*)>;

// This process's rank among the job's ranks on its node, from the launcher's environment:
// MPI_LOCALRANKID (MPICH's Hydra mpiexec), OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun), then
// SLURM_LOCALID (srun). The MPI launchers' come first: mpiexec inside a Slurm batch job inherits
// the batch step's SLURM_LOCALID (0 for every rank). 0 when none is set (one process); a value
// that is not a non-negative integer is an Error naming the variable.
int local_rank(const EnvLookup& env);

// The device of train.device = `device` ("cpu" or "cuda") for a rank with local rank `local`, on a
// node with `visible` CUDA devices, in a build with (`built`) or without the CUDA backend:
// cuda:(local mod visible), so that several ranks may share one GPU. Errors name the key, the
// value and why: no CUDA backend in this build, no device visible on `host`.
Device select_device(const std::string& device, int local, int visible, bool built, const std::string& host);

// select_device for this process (its environment, this build, this node's devices), agreed over
// comm (null: this process alone): when any rank cannot use its device, every rank throws, the
// failing ones with their reason, the others naming the first failing rank. Collective.
Device resolve_train_device(const std::string& device, MPI_Comm comm);

// What a run on a CUDA device cannot do yet, as the refusal the trainer raises at start (every
// rank alike: it depends on the config and the world size only), or "" when cfg trains there. Each
// names the key: what has no CUDA kernel (the vision tower's bidirectional attention, document
// masking) or is wired on the host only (an in-run growth).
std::string unsupported_on_cuda(const Config& cfg);

}  // namespace tessera

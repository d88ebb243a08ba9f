// The seam between the SIMT emulator's launches (kernels/simt/launch.h) and the CPU twin of the
// CUDA runtime (kernels/simt/runtime.cpp): a launch checks its configuration on the calling
// thread, then queues the grid's execution as one piece of work on the stream.
#pragma once

#include <functional>
#include <string>

#include "kernels/simt/types.h"

namespace tessera::simt {

// Queues work on stream s (nullptr: the legacy default stream) of the calling thread's current
// device; it runs on the stream's worker thread after everything queued there before, and the
// host returns at once. `what` names the work in errors ("kernel layernorm_forward_kernel").
// An exception thrown by work is a fault of the device: printed to stderr with `what`, recorded
// as the sticky error cudaErrorLaunchFailure, whose cudaGetErrorString is that message; the
// stream drops the work queued after it, as a GPU does after a fault.
void enqueue(cudaStream_t s, std::string what, std::function<void()> work);

// Records e as the calling thread's last error (what cudaGetLastError returns and clears, or
// cudaPeekAtLastError returns), with `message` as the text cudaGetErrorString(e) gives until the
// next error is recorded: a launch refused for its configuration names the kernel and the limit.
void set_last_error(cudaError_t e, const std::string& message);

// The calling thread's current device (cudaSetDevice; 0 by default).
int current_device();

}  // namespace tessera::simt

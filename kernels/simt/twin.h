// What the CPU twins of CUDA's libraries (kernels/simt/cublaslt.cpp, nccl.cpp) share with the
// runtime twin (kernels/simt/runtime.cpp): the device-memory check and the text of a refused or
// failed call, kept by the runtime's one process-wide object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::simt {

// Whether [p, p + bytes) lies within one device allocation (cudaMalloc, cudaMallocAsync).
bool is_device_range(const void* p, size_t bytes);

// Prints "tessera simt: <message>" to stderr and makes it the text of `library`'s status `code`
// (what cublasGetStatusString / ncclGetErrorString return for it) until the next such message.
void report(const char* library, int code, const std::string& message);

// A number unique in this process (the NCCL twin's unique ids).
uint64_t next_serial();

// The text report() last gave `library`'s status `code`, or null if none.
const char* reported(const char* library, int code);

}  // namespace tessera::simt

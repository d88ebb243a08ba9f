// SIMT stand-in for CUDA's <cuda_runtime.h> (-DTESSERA_SIMT=ON only): the host API of the CPU
// twin of the runtime and the device side of the emulator.
#pragma once

#include "kernels/simt/runtime_api.h"
#include "kernels/simt/device.h"

// SIMT stand-in for <cudnn.h> (-DTESSERA_SIMT=ON only). tessera calls one cuDNN function, the
// version query in kernels/cuda/runtime.cu's library_versions(); nothing else of cuDNN is used.
#pragma once

#include <cstddef>

// The version of the cuDNN headers this stand-in answers for (9.x numbering: major*10000 + minor*100).
inline size_t cudnnGetVersion() { return 0; }

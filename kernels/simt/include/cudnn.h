// SIMT stand-in for cuDNN's <cudnn.h> (-DTESSERA_SIMT=ON only). tessera calls nothing of cuDNN
// but cudnnGetVersion (kernels/cuda/runtime.cu's library_versions: every CUDA build links it to
// prove the toolkit works), so that is all the twin has.
#pragma once

#include <cstddef>

#define CUDNN_MAJOR 9
#define CUDNN_MINOR 19
#define CUDNN_PATCHLEVEL 0
#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)

// The version the stand-in answers to (the toolkit's headers tessera is written against).
inline size_t cudnnGetVersion() { return CUDNN_VERSION; }

// synchronize() dispatched like an op; whether the CUDA backend was compiled in.
#include "kernels/exec.h"

#include "kernels/cuda/cuda_ops.h"
#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif
#include "kernels/front.h"

namespace tessera {

void synchronize(const Exec& ex) {
  if (ex.device.is_cpu()) return;  // CPU ops run to completion before they return
  TESSERA_CUDA_CALL("synchronize", cuda::synchronize(ex));
}

bool cuda_backend_built() {
#ifdef TESSERA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef TESSERA_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace tessera

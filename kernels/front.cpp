// The fronts' dispatch: the one device of a call, and the error for a CUDA tensor without a kernel.
#include "kernels/front.h"

namespace tessera::front {

Device device_of(const char* op, const Exec& ex, std::initializer_list<Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (!a.t.defined()) continue;
    if (!first) {
      first = &a;
      continue;
    }
    TESSERA_CHECK(a.t.device == first->t.device, op, ": ", a.name, " is on ", a.t.device.str(), " but ", first->name,
                  " on ", first->t.device.str(), " (the tensors of one call share a device)");
  }
  if (!first) return ex.device;  // nothing to touch (e.g. fill_zero of an empty tensor)
  TESSERA_CHECK(first->t.device == ex.device, op, ": ", first->name, " is on ", first->t.device.str(),
                " but the execution context is for ", ex.device.str());
  return ex.device;
}

void no_cuda_implementation(const char* op) {
  detail::fail(op, ": no CUDA implementation in this build",
               cuda_backend_built() ? "" : " (built with TESSERA_CUDA=OFF)");
}

}  // namespace tessera::front

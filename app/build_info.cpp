// build_info(): collected from the kernels layer's own report plus the app's version.
#include "app/build_info.h"

#include <sstream>

#include "kernels/backend_info.h"

namespace tessera {

std::string build_info() {
  std::ostringstream os;
  os << "tessera " << TESSERA_VERSION << "\n" << kernels_backend_info();
  return os.str();
}

}  // namespace tessera

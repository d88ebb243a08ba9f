// What this binary was built with (version, backends, BLAS, CPU features): printed by
// `tessera info` and at the top of every training log.
#pragma once

#include <string>

namespace tessera {

std::string build_info();

}  // namespace tessera

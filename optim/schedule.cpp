// LrSchedule::at: warm-up then decay.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "kernels/check.h"

namespace tessera {

LrDecay parse_lr_decay(const std::string& name) {
  if (name == "cosine") return LrDecay::Cosine;
  if (name == "linear") return LrDecay::Linear;
  if (name == "constant") return LrDecay::Constant;
  TESSERA_CHECK(false, "optim.decay = \"", name, "\" is unknown; expected cosine, linear or constant");
}

double LrSchedule::at(int64_t step) const {
  if (restart_at >= 0 && step >= restart_at) {
    LrSchedule fresh{lr, min_lr, restart_warmup, std::max<int64_t>(1, total_steps - restart_at), decay};
    return fresh.at(step - restart_at);
  }
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (decay == LrDecay::Constant) return lr;
  const int64_t span = total_steps - 1 - warmup_steps;
  const double p = span > 0 ? std::clamp(static_cast<double>(step - warmup_steps) / span, 0.0, 1.0) : 1.0;
  if (decay == LrDecay::Linear) return lr - (lr - min_lr) * p;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * p));
}

}  // namespace tessera

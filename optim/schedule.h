// Learning-rate schedule: linear warm-up, then cosine, linear or constant decay to a floor.
// A pure function of the step, so a resumed run needs only the step count.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

enum class LrDecay { Cosine, Linear, Constant };
LrDecay parse_lr_decay(const std::string& name);  // "cosine" | "linear" | "constant"

struct LrSchedule {
  double lr = 3e-4;       // peak, reached at the end of warm-up
  double min_lr = 0.0;    // floor at the last step
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  LrDecay decay = LrDecay::Cosine;

  // Learning rate for 0-based optimizer step s: lr * (s + 1) / warmup during warm-up, then the
  // decay from lr at s = warmup to min_lr at s = total - 1.
  double at(int64_t step) const;
};

}  // namespace tessera

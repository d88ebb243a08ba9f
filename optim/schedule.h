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

  // A restart ([upscale] rewarm_steps): from step restart_at on, the schedule starts over as if
  // step restart_at were step 0 of a run of total - restart_at steps with restart_warmup warm-up
  // steps: lr * (s - restart_at + 1) / restart_warmup, then the decay to min_lr at s = total - 1.
  // restart_at < 0: none.
  int64_t restart_at = -1;
  int64_t restart_warmup = 0;
  void restart(int64_t at_step, int64_t warmup) { restart_at = at_step, restart_warmup = warmup; }

  // Learning rate for 0-based optimizer step s: lr * (s + 1) / warmup during warm-up, then the
  // decay from lr at s = warmup to min_lr at s = total - 1 (with a restart, see above).
  double at(int64_t step) const;
};

}  // namespace tessera

// plan/recompute_choice.h: the least model.recompute_layers that fits, by bisection.
#include "plan/recompute_choice.h"

#include <algorithm>

#include "kernels/check.h"

namespace tessera::plan {

RecomputeChoice least_recompute_layers(int64_t lo, int64_t hi, const std::function<bool(int64_t)>& fits) {
  RecomputeChoice c;
  if (lo > hi) return c;
  // Invariant: every k < lo fails (or is outside), hi + 1 is the least known to fit (or none).
  int64_t found = -1;
  while (lo <= hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    ++c.estimates;
    if (fits(mid)) {
      found = mid;
      hi = mid - 1;
    } else {
      lo = mid + 1;
    }
  }
  c.layers = found;
  return c;
}

int64_t max_chunk_blocks(const std::vector<StageSpec>& cut, int64_t n_layer) {
  if (cut.empty()) return n_layer;
  int64_t most = 0;
  for (const StageSpec& s : cut) {
    const int64_t end = s.end_layer < 0 ? n_layer : s.end_layer;
    most = std::max(most, end - s.first_layer);
  }
  return most;
}

}  // namespace tessera::plan

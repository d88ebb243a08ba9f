// plan/recompute_choice.h: the least model.recompute_layers that fits, by bisection; the frontier of
// per-block recomputation options by a dynamic programme over the blocks.
#include "plan/recompute_choice.h"

#include <algorithm>
#include <utility>

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

std::vector<RecomputeMix> recompute_frontier(const std::vector<BlockOption>& options, int64_t blocks) {
  TESSERA_CHECK(blocks >= 0, "recompute_frontier: blocks = ", blocks, " must be >= 0");
  for (const BlockOption& o : options)
    TESSERA_CHECK(o.seconds >= 0 && o.saved >= 0, "recompute_frontier: an option with seconds ", o.seconds,
                  " and saved ", o.saved, "; both must be >= 0");
  std::vector<RecomputeMix> frontier = {RecomputeMix{std::vector<int64_t>(options.size(), 0), 0, 0}};
  if (options.empty()) return blocks == 0 ? frontier : std::vector<RecomputeMix>{};
  for (int64_t i = 0; i < blocks; ++i) {
    std::vector<RecomputeMix> next;
    next.reserve(frontier.size() * options.size());
    for (const RecomputeMix& m : frontier)
      for (size_t o = 0; o < options.size(); ++o) {
        RecomputeMix x = m;
        ++x.counts[o];
        x.seconds += options[o].seconds;
        x.saved += options[o].saved;
        next.push_back(std::move(x));
      }
    // Least seconds first; at equal seconds the most saved, then the largest counts (a fixed choice
    // among equal mixes, whatever order they were reached in).
    std::sort(next.begin(), next.end(), [](const RecomputeMix& a, const RecomputeMix& b) {
      if (a.seconds != b.seconds) return a.seconds < b.seconds;
      if (a.saved != b.saved) return a.saved > b.saved;
      return a.counts > b.counts;
    });
    frontier.clear();
    for (RecomputeMix& x : next)  // kept when it frees more than every faster one
      if (frontier.empty() || x.saved > frontier.back().saved) frontier.push_back(std::move(x));
  }
  return frontier;
}

}  // namespace tessera::plan

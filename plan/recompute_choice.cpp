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

namespace {

// A frontier point during the programme: its sums and how it was reached (the point of the
// previous step it extends, by index, and the option added).
struct Point {
  double seconds = 0, saved = 0;
  int64_t from = -1;
  int option = -1;
};

}  // namespace

std::vector<RecomputeMix> recompute_frontier(const std::vector<BlockOption>& options, int64_t blocks) {
  TESSERA_CHECK(blocks >= 0, "recompute_frontier: blocks = ", blocks, " must be >= 0");
  for (const BlockOption& o : options)
    TESSERA_CHECK(o.seconds >= 0 && o.saved >= 0, "recompute_frontier: an option with seconds ", o.seconds,
                  " and saved ", o.saved, "; both must be >= 0");
  if (options.empty() && blocks > 0) return {};
  // Least seconds first; at equal seconds the most saved.
  const auto before = [](const Point& a, const Point& b) {
    return a.seconds != b.seconds ? a.seconds < b.seconds : a.saved > b.saved;
  };
  std::vector<std::vector<Point>> steps = {{Point{}}};  // steps[i]: the frontier of i-block mixes
  std::vector<Point> merged, shifted, next;
  for (int64_t i = 0; i < blocks; ++i) {
    const std::vector<Point>& f = steps.back();
    // Each option shifts the (sorted) frontier by its sums; the shifted copies merged stay sorted.
    merged.clear();
    for (size_t o = 0; o < options.size(); ++o) {
      shifted.clear();
      for (size_t j = 0; j < f.size(); ++j)
        shifted.push_back({f[j].seconds + options[o].seconds, f[j].saved + options[o].saved, int64_t(j), int(o)});
      next.resize(merged.size() + shifted.size());
      std::merge(merged.begin(), merged.end(), shifted.begin(), shifted.end(), next.begin(), before);
      std::swap(merged, next);
    }
    std::vector<Point> frontier;
    for (const Point& x : merged)  // kept when it frees more than every faster one
      if (frontier.empty() || x.saved > frontier.back().saved) frontier.push_back(x);
    steps.push_back(std::move(frontier));
  }
  std::vector<RecomputeMix> out;
  for (const Point& end : steps.back()) {
    RecomputeMix m{std::vector<int64_t>(options.size(), 0), end.seconds, end.saved};
    const Point* p = &end;
    for (int64_t i = blocks; i > 0; --i) {  // walk back through the steps
      ++m.counts[size_t(p->option)];
      p = &steps[size_t(i - 1)][size_t(p->from)];
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace tessera::plan

// The measured cut in two exact passes of dynamic programming over stage ends, O(pp L^2) time and
// O(pp L) memory each (L = n_layer): the least possible slowest stage, then among the cuts reaching
// it the evenest (least sum of squared stage times).
#include "model/stage_cut_measured.h"

#include <algorithm>
#include <limits>
#include <string>

#include "kernels/check.h"

namespace tessera {

namespace {

constexpr double kNone = std::numeric_limits<double>::infinity();

// Stage r's seconds holding blocks [b, e) (prefix: running sums of the block times).
double stage_time(const PartTimes& t, const std::vector<double>& prefix, int64_t r, int64_t pp, int64_t b, int64_t e) {
  double s = prefix[static_cast<size_t>(e)] - prefix[static_cast<size_t>(b)];
  if (r == 0) s += t.embedding + t.vision;
  if (r == pp - 1) s += t.head;
  return s;
}

// Among the cuts whose slowest stage is `limit` (the least possible) and that fit, the one with the
// least sum of squared stage times: the other stages filled as evenly as they can be (a second pass
// of the same shape, exact). Ascending first blocks with strict improvement: ties keep the fewest
// blocks on the earlier stages.
template <class Fit>
std::vector<int64_t> evenest_cut(const PartTimes& t, const std::vector<double>& prefix, int64_t pp, int64_t first_min,
                                 double limit, const Fit& fit) {
  const int64_t L = static_cast<int64_t>(t.blocks.size());
  const auto width = static_cast<size_t>(L) + 1;
  std::vector<double> sq(static_cast<size_t>(pp) * width, kNone);
  std::vector<int64_t> from(static_cast<size_t>(pp) * width, -1);
  for (int64_t e = first_min; e <= L; ++e) {
    const double s = stage_time(t, prefix, 0, pp, 0, e);
    if (s <= limit && fit(0, e)) {
      sq[static_cast<size_t>(e)] = s * s;
      from[static_cast<size_t>(e)] = 0;
    }
  }
  for (int64_t r = 1; r < pp; ++r)
    for (int64_t e = r + first_min; e <= L; ++e)
      for (int64_t b = r - 1 + first_min; b < e; ++b) {
        const double before = sq[static_cast<size_t>(r - 1) * width + static_cast<size_t>(b)];
        const double s = stage_time(t, prefix, r, pp, b, e);
        if (before == kNone || s > limit || !fit(r, e - b)) continue;
        double& cell = sq[static_cast<size_t>(r) * width + static_cast<size_t>(e)];
        if (before + s * s < cell) {
          cell = before + s * s;
          from[static_cast<size_t>(r) * width + static_cast<size_t>(e)] = b;
        }
      }
  std::vector<int64_t> blocks(static_cast<size_t>(pp));
  for (int64_t r = pp - 1, e = L; r >= 0; --r) {
    const int64_t b = from[static_cast<size_t>(r) * width + static_cast<size_t>(e)];
    blocks[static_cast<size_t>(r)] = e - b;
    e = b;
  }
  return blocks;
}

}  // namespace

std::vector<double> stage_times(const PartTimes& t, const std::vector<int64_t>& stage_blocks) {
  const int64_t L = static_cast<int64_t>(t.blocks.size()), pp = static_cast<int64_t>(stage_blocks.size());
  std::vector<double> prefix(static_cast<size_t>(L) + 1, 0.0);
  for (int64_t l = 0; l < L; ++l) prefix[static_cast<size_t>(l) + 1] = prefix[static_cast<size_t>(l)] + t.blocks[static_cast<size_t>(l)];
  std::vector<double> out;
  int64_t b = 0;
  for (int64_t r = 0; r < pp; ++r) {
    const int64_t n = stage_blocks[static_cast<size_t>(r)];
    TESSERA_CHECK(n >= 0 && b + n <= L, "stage_times: stage ", r, " holds ", n, " blocks, past the model's ", L);
    out.push_back(stage_time(t, prefix, r, pp, b, b + n));
    b += n;
  }
  TESSERA_CHECK(b == L, "stage_times: the stages hold ", b, " blocks, but the model has ", L);
  return out;
}

std::vector<int64_t> cut_by_time(const PartTimes& t, int64_t pp, bool encoder_stage, const StageFits& fits) {
  const int64_t L = static_cast<int64_t>(t.blocks.size());
  TESSERA_CHECK(pp >= 1 && pp <= L, "parallel.pp_cut = \"measured\": parallel.pp = ", pp,
                " stages need at least one block each, and model.n_layer = ", L);
  std::vector<double> prefix(static_cast<size_t>(L) + 1, 0.0);
  for (int64_t l = 0; l < L; ++l) prefix[static_cast<size_t>(l) + 1] = prefix[static_cast<size_t>(l)] + t.blocks[static_cast<size_t>(l)];
  const auto fit = [&](int64_t r, int64_t n) { return !fits || fits(r, n); };
  const auto width = static_cast<size_t>(L) + 1;
  // best[r * width + e]: the least slowest stage of stages 0..r holding blocks [0, e).
  std::vector<double> best(static_cast<size_t>(pp) * width, kNone);
  const int64_t first_min = encoder_stage ? 0 : 1;
  for (int64_t e = first_min; e <= L; ++e)
    if (fit(0, e)) best[static_cast<size_t>(e)] = stage_time(t, prefix, 0, pp, 0, e);
  for (int64_t r = 1; r < pp; ++r) {
    for (int64_t e = r + first_min; e <= L; ++e) {
      double& cell = best[static_cast<size_t>(r) * width + static_cast<size_t>(e)];
      // Stage r holds [b, e), at least one block; stages 0..r-1 hold [0, b).
      for (int64_t b = r - 1 + first_min; b < e; ++b) {
        const double before = best[static_cast<size_t>(r - 1) * width + static_cast<size_t>(b)];
        if (before == kNone || !fit(r, e - b)) continue;
        const double slowest = std::max(before, stage_time(t, prefix, r, pp, b, e));
        cell = std::min(cell, slowest);
      }
    }
  }
  TESSERA_CHECK(best[static_cast<size_t>(pp - 1) * width + static_cast<size_t>(L)] != kNone,
                "parallel.pp_cut = \"measured\": no cut of model.n_layer = ", L, " blocks into parallel.pp = ", pp,
                " stages fits in memory (each stage's estimate against the memory available and train.max_memory_gib); "
                "raise parallel.pp, shrink train.micro_batch or set parallel.pp_cut = \"flops\" to start with the "
                "FLOPs cut and see the memory check's estimate");
  return evenest_cut(t, prefix, pp, first_min, best[static_cast<size_t>(pp - 1) * width + static_cast<size_t>(L)], fit);
}

}  // namespace tessera

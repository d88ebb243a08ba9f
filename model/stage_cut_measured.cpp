// The measured cut in two exact passes of dynamic programming over stage ends, O(pp M^2) time and
// O(pp M) memory each (M = n_layer / vpp, the blocks of one round of pp chunks): the least possible
// slowest stage, then among the cuts reaching it the evenest (least sum of squared stage times).
#include "model/stage_cut_measured.h"

#include <algorithm>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>

#include "kernels/check.h"

namespace tessera {

namespace {

constexpr double kNone = std::numeric_limits<double>::infinity();

// The part times folded for a cut in the parallel.pp_layers form: stage r's vpp chunks hold the
// same blocks [b, e) of each round of M = L / vpp blocks (chunk v pp + r holds [v M + b, v M + e)).
struct Rounds {
  const PartTimes& t;
  int64_t pp, vpp, M;
  std::vector<double> prefix;  // (L + 1) running sums of the block times

  Rounds(const PartTimes& times, int64_t pp_, int64_t vpp_) : t(times), pp(pp_), vpp(vpp_) {
    const int64_t L = static_cast<int64_t>(t.blocks.size());
    M = L / vpp;
    prefix.assign(static_cast<size_t>(L) + 1, 0.0);
    for (int64_t l = 0; l < L; ++l) prefix[static_cast<size_t>(l) + 1] = prefix[static_cast<size_t>(l)] + t.blocks[static_cast<size_t>(l)];
  }

  // Stage r's seconds holding [b, e) of every round (0 <= b <= e <= M), with the embedding and
  // vision tower (chunk 0, on stage 0) and the head (the last chunk, on stage pp - 1).
  double stage(int64_t r, int64_t b, int64_t e) const {
    double s = 0;
    for (int64_t v = 0; v < vpp; ++v) s += prefix[static_cast<size_t>(v * M + e)] - prefix[static_cast<size_t>(v * M + b)];
    if (r == 0) s += t.embedding + t.vision;
    if (r == pp - 1) s += t.head;
    return s;
  }
};

// Among the cuts whose slowest stage is `limit` (the least possible) and that fit, the one with the
// least sum of squared stage times: the other stages filled as evenly as they can be (a second pass
// of the same shape, exact). Ascending first blocks with strict improvement: ties keep the fewest
// blocks on the earlier stages. Returns each stage's blocks per chunk.
template <class Fit>
std::vector<int64_t> evenest_cut(const Rounds& rd, int64_t first_min, double limit, const Fit& fit) {
  const int64_t pp = rd.pp, M = rd.M;
  const auto width = static_cast<size_t>(M) + 1;
  std::vector<double> sq(static_cast<size_t>(pp) * width, kNone);
  std::vector<int64_t> from(static_cast<size_t>(pp) * width, -1);
  for (int64_t e = first_min; e <= M; ++e) {
    const double s = rd.stage(0, 0, e);
    if (s <= limit && fit(0, e)) {
      sq[static_cast<size_t>(e)] = s * s;
      from[static_cast<size_t>(e)] = 0;
    }
  }
  for (int64_t r = 1; r < pp; ++r)
    for (int64_t e = r + first_min; e <= M; ++e)
      for (int64_t b = r - 1 + first_min; b < e; ++b) {
        const double before = sq[static_cast<size_t>(r - 1) * width + static_cast<size_t>(b)];
        const double s = rd.stage(r, b, e);
        if (before == kNone || s > limit || !fit(r, e - b)) continue;
        double& cell = sq[static_cast<size_t>(r) * width + static_cast<size_t>(e)];
        if (before + s * s < cell) {
          cell = before + s * s;
          from[static_cast<size_t>(r) * width + static_cast<size_t>(e)] = b;
        }
      }
  std::vector<int64_t> per_chunk(static_cast<size_t>(pp));
  for (int64_t r = pp - 1, e = M; r >= 0; --r) {
    const int64_t b = from[static_cast<size_t>(r) * width + static_cast<size_t>(e)];
    per_chunk[static_cast<size_t>(r)] = e - b;
    e = b;
  }
  return per_chunk;
}

}  // namespace

std::vector<double> rank_times(const PartTimes& t, const std::vector<int64_t>& chunk_blocks, int64_t pp) {
  const int64_t L = static_cast<int64_t>(t.blocks.size()), K = static_cast<int64_t>(chunk_blocks.size());
  TESSERA_CHECK(pp >= 1 && K >= pp && K % pp == 0, "rank_times: ", K, " chunks on ", pp, " ranks");
  std::vector<double> out(static_cast<size_t>(pp), 0.0);
  int64_t b = 0;
  for (int64_t c = 0; c < K; ++c) {
    const int64_t n = chunk_blocks[static_cast<size_t>(c)];
    TESSERA_CHECK(n >= 0 && b + n <= L, "rank_times: chunk ", c, " holds ", n, " blocks, past the model's ", L);
    double& s = out[static_cast<size_t>(c % pp)];
    for (int64_t l = b; l < b + n; ++l) s += t.blocks[static_cast<size_t>(l)];
    if (c == 0) s += t.embedding + t.vision;
    if (c == K - 1) s += t.head;
    b += n;
  }
  TESSERA_CHECK(b == L, "rank_times: the chunks hold ", b, " blocks, but the model has ", L);
  return out;
}

std::vector<int64_t> stage_chunks(const std::vector<int64_t>& stage_blocks, int64_t vpp) {
  const int64_t pp = static_cast<int64_t>(stage_blocks.size());
  TESSERA_CHECK(vpp >= 1, "stage_chunks: vpp = ", vpp);
  std::vector<int64_t> chunks(static_cast<size_t>(pp * vpp));
  for (int64_t r = 0; r < pp; ++r) {
    const int64_t n = stage_blocks[static_cast<size_t>(r)];
    TESSERA_CHECK(n % vpp == 0, "stage_chunks: stage ", r, " holds ", n, " blocks, not a multiple of vpp = ", vpp);
    for (int64_t v = 0; v < vpp; ++v) chunks[static_cast<size_t>(v * pp + r)] = n / vpp;
  }
  return chunks;
}

std::vector<double> stage_times(const PartTimes& t, const std::vector<int64_t>& stage_blocks, int64_t vpp) {
  return rank_times(t, stage_chunks(stage_blocks, vpp), static_cast<int64_t>(stage_blocks.size()));
}

std::vector<int64_t> cut_by_time(const PartTimes& t, int64_t pp, bool encoder_stage, const StageFits& fits, int64_t vpp) {
  const int64_t L = static_cast<int64_t>(t.blocks.size());
  TESSERA_CHECK(vpp >= 1 && pp >= 1 && pp * vpp <= L, "parallel.pp_cut = \"measured\": parallel.pp = ", pp,
                " stages of parallel.vpp = ", vpp, " chunks need at least one block per chunk, and model.n_layer = ", L);
  TESSERA_CHECK(L % vpp == 0, "parallel.pp_cut = \"measured\" gives each stage parallel.vpp = ", vpp,
                " equal chunks (as parallel.pp_layers does), but model.n_layer = ", L,
                " is not a multiple of it; use parallel.pp_cut = \"flops\", or a depth or vpp that divides");
  TESSERA_CHECK(!encoder_stage || vpp == 1, "cut_by_time: an encoder stage needs vpp = 1, not ", vpp);
  const Rounds rd(t, pp, vpp);
  const int64_t M = rd.M;
  // fits reads the stage's blocks: vpp chunks of n.
  const auto fit = [&](int64_t r, int64_t n) { return !fits || fits(r, n * vpp); };
  const auto width = static_cast<size_t>(M) + 1;
  // best[r * width + e]: the least slowest stage of stages 0..r holding [0, e) of every round.
  std::vector<double> best(static_cast<size_t>(pp) * width, kNone);
  const int64_t first_min = encoder_stage ? 0 : 1;
  for (int64_t e = first_min; e <= M; ++e)
    if (fit(0, e)) best[static_cast<size_t>(e)] = rd.stage(0, 0, e);
  for (int64_t r = 1; r < pp; ++r) {
    for (int64_t e = r + first_min; e <= M; ++e) {
      double& cell = best[static_cast<size_t>(r) * width + static_cast<size_t>(e)];
      // Stage r holds [b, e) of each round, at least one block; stages 0..r-1 hold [0, b).
      for (int64_t b = r - 1 + first_min; b < e; ++b) {
        const double before = best[static_cast<size_t>(r - 1) * width + static_cast<size_t>(b)];
        if (before == kNone || !fit(r, e - b)) continue;
        cell = std::min(cell, std::max(before, rd.stage(r, b, e)));
      }
    }
  }
  const double least = best[static_cast<size_t>(pp - 1) * width + static_cast<size_t>(M)];
  TESSERA_CHECK(least != kNone, "parallel.pp_cut = \"measured\": no cut of model.n_layer = ", L, " blocks into parallel.pp = ", pp,
                " stages", vpp > 1 ? " of parallel.vpp = " + std::to_string(vpp) + " equal chunks" : std::string(),
                " fits in memory (each stage's estimate against the memory available and train.max_memory_gib); "
                "raise parallel.pp, shrink train.micro_batch or set parallel.pp_cut = \"flops\" to start with the "
                "FLOPs cut and see the memory check's estimate");
  std::vector<int64_t> blocks = evenest_cut(rd, first_min, least, fit);
  for (int64_t& n : blocks) n *= vpp;
  return blocks;
}

CutChoice choose_cut(const std::vector<double>& measured_stages, double measured_step,
                     const std::vector<double>& flops_stages, double flops_step, int64_t flops_unfit_stage) {
  TESSERA_CHECK(!measured_stages.empty() && !flops_stages.empty(), "choose_cut: no stage times");
  const bool by_step = measured_step > 0 && flops_step > 0;
  const double m = by_step ? measured_step : *std::max_element(measured_stages.begin(), measured_stages.end());
  const double f = by_step ? flops_step : *std::max_element(flops_stages.begin(), flops_stages.end());
  const char* what = by_step ? "simulated step" : "slowest stage";
  std::ostringstream os;
  os << std::setprecision(4);
  CutChoice c;
  if (m < f) {
    os << "the measured cut: its predicted " << what << " " << 1e3 * m << " ms < the FLOPs cut's " << 1e3 * f << " ms";
  } else if (flops_unfit_stage >= 0) {
    os << "the measured cut: the FLOPs cut's predicted " << what << " " << 1e3 * f << " ms <= the measured cut's "
       << 1e3 * m << " ms, but its stage " << flops_unfit_stage << " does not fit in memory";
  } else {
    c.flops = true;
    os << "the FLOPs rule's cut: its predicted " << what << " " << 1e3 * f << " ms <= the measured cut's " << 1e3 * m
       << " ms";
  }
  c.why = os.str();
  return c;
}

}  // namespace tessera

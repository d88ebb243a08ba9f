// Dynamic context parallelism's planner (parallel.cp_mode = "dynamic"): for one micro-batch of packed
// rows, which rows run whole on one cp rank and which are split over a subgroup of the cp ranks
// (ring attention over load-balanced chunks), so that the slowest cp rank is fastest. Key decision:
// a pure function of the rows' document lengths, the cp size and a measured cost model, so every
// rank computes the same plan from the same batch; a row is split only when the cost model says the
// attention it spreads outweighs the ring steps it adds (short documents are never worth it).
//
// Subgroups are aligned blocks of s consecutive cp ranks, s dividing cp (cp 4: {0,1}, {2,3},
// {0,1,2,3}), so that at most cp - 1 subgroups exist and their order is global (see cp_passes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// Seconds of one row's forward + backward through the whole model, by what drives them. Measured at
// start (app/dynamic_cp.h), never guessed: each constant is a fit to timed runs on this machine.
struct CpCostModel {
  double token_s = 0;       // per position: every GEMM, norm, embedding and head (linear in tokens)
  double pair_s = 0;        // per visible (query, key) pair: the attention kernels
  // per ring step of a split pass: its fixed cost (latency and the per-layer waits for the
  // subgroup, all layers, fwd + bwd), paid once per micro-batch and subgroup however many rows the
  // pass carries (its rows' K/V travel in the same messages)
  double ring_step_s = 0;
  double ring_token_s = 0;  // per K/V position of a row moved in a ring step (all layers, fwd + bwd)
  std::string str() const;
};

// What DynamicCp::calibrate times on the run's model (each a median of repeats, averaged over the cp
// group): one row of `length` positions forward + backward whole with documents docs_a and with
// docs_b (the same positions, other pairs), and with docs_a split over s ranks for each s of
// split_ranks (split_s: a member's pass, its waits in the ring included, every subgroup of that size
// running at once as in training).
struct CpTimings {
  int64_t length = 0;
  std::vector<int64_t> docs_a, docs_b;
  double whole_a_s = 0, whole_b_s = 0;
  std::vector<int64_t> split_ranks;
  std::vector<double> split_s;
};

// The cost model of timings t: token_s and pair_s from the two whole rows (pair_s the slope in pairs,
// token_s the rest per position; each clamped at 0); then ring_step_s and ring_token_s so that a
// one-row split's predicted slowest member (cp_row_cost + cp_pass_s) matches split_s: least squares
// in seconds over the split sizes of what a split costs beyond its share of the whole row's work,
// y_s = split_s - max_i (token_s L / s + pair_s pairs_i), against (s - 1) (ring_step_s +
// ring_token_s L / s), both >= 0 (the best non-negative pair: unconstrained when it is >= 0, else
// the better of one term alone). Two sizes (cp 4) are matched exactly when the solution is >= 0; one
// size (cp 2) cannot separate the terms and puts the whole overhead on ring_step_s (a one-row pass
// is predicted the same either way; a pass of several rows then pays it once). Throws on timings
// that do not fit together (a time per size, sizes >= 2).
CpCostModel fit_cp_cost(const CpTimings& t);

// Where a row runs: whole on cp rank `first` (ranks = 1), or split over cp ranks
// [first, first + ranks) in load-balanced chunks (ranks >= 2, first a multiple of ranks).
struct CpPlacement {
  int64_t first = 0, ranks = 1;
  bool split() const { return ranks > 1; }
  bool contains(int64_t r) const { return r >= first && r < first + ranks; }
  bool operator==(const CpPlacement&) const = default;
};

struct CpPlan {
  std::vector<CpPlacement> rows;  // per row of the micro-batch
  std::vector<double> rank_s;     // predicted seconds per cp rank
  bool optimal = true;            // the search finished: no plan has a faster slowest rank
  double max_s() const;
  // Predicted imbalance: max / mean - 1 of rank_s (0: equal; 0 when nothing runs).
  double imbalance() const;
  int64_t split_rows() const;
};

// The subgroup sizes a row of `length` positions can be split over under cp ranks: every s in
// [2, cp] dividing cp with length % (2 s) == 0 (SequenceLayout::load_balanced's chunks).
std::vector<int64_t> cp_split_sizes(int64_t cp, int64_t length);

// Visible (query, key) pairs of the causal document mask for the positions that member `index` of a
// split over `ranks` holds (chunks index and 2 ranks - 1 - index of `length`); ranks = 1: the whole
// row's, sum of d (d + 1) / 2. docs: the row's document lengths in order (padding included as its own
// document), summing to length.
int64_t cp_row_pairs(const std::vector<int64_t>& docs, int64_t length, int64_t ranks, int64_t index);

// Each member's seconds (member i is cp rank first + i) for running row `docs` split over `ranks`
// (1: whole): its positions, its pairs and (split) its K/V moved around the ring, (ranks - 1)
// ring_token_s length / ranks; without the pass's fixed cost (cp_pass_s), which the rows of one
// pass share.
std::vector<double> cp_row_cost(const std::vector<int64_t>& docs, int64_t length, int64_t ranks,
                                const CpCostModel& m);

// Each member's fixed seconds of a pass split over `ranks`: (ranks - 1) ring_step_s (0 whole).
double cp_pass_s(int64_t ranks, const CpCostModel& m);

// The plan for rows (each a list of document lengths summing to length) over cp ranks that
// minimises the slowest rank's predicted seconds. First a greedy plan (longest row first, each to
// the placement whose resulting slowest rank is fastest, then single-row moves while one lowers the
// slowest rank or keeps it and lowers the sum of squared rank times); then an exact branch and
// bound from it, which stops after search_nodes nodes (then the best plan found stands and
// CpPlan::optimal is false). Deterministic. Throws on rows not summing to length.
CpPlan plan_dynamic_cp(const std::vector<std::vector<int64_t>>& rows, int64_t length, int64_t cp,
                       const CpCostModel& m, int64_t search_nodes = 200000);

// The predicted seconds per cp rank of placements (rows as for plan_dynamic_cp): each row's
// cp_row_cost on its members, and each split placement used once cp_pass_s on its members (its rows
// run as one pass: cp_passes).
std::vector<double> cp_rank_seconds(const std::vector<std::vector<int64_t>>& rows, int64_t length, int64_t cp,
                                    const std::vector<CpPlacement>& placements, const CpCostModel& m);

// One forward + backward of cp rank `rank`: the rows that share a placement, run together.
struct CpPass {
  CpPlacement group;
  std::vector<int64_t> rows;  // ascending
};

// Rank's passes for plan, in an order every rank agrees on: the split subgroups it belongs to by
// (first, ranks), then its whole rows as one pass. Two ranks of a subgroup meet it at the same point
// of their lists' global order, so the rings never wait on each other in a cycle.
std::vector<CpPass> cp_passes(const CpPlan& plan, int64_t rank);

}  // namespace tessera

// Optimal transport between two equal-sized sets of units (attention heads, MLP hidden units):
// the exact linear assignment (Hungarian method with potentials, the Jonker-Volgenant style
// shortest augmenting path, O(n^3)) and its entropy-regularized relaxation (Sinkhorn, log domain).
// Used by depth up-scaling's optimal-transport fusion (model/upscale.h) to align two layers.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

// The permutation p minimizing sum_i cost[i * n + p[i]] (row i goes to column p[i]). cost is
// (n, n) row-major, finite. Ties are broken deterministically. n = 0 gives an empty result.
std::vector<int64_t> solve_assignment(const std::vector<double>& cost, int64_t n);

// The entropy-regularized transport plan between uniform marginals (1/n each):
// argmin_P <P, cost> - eps H(P), with the costs divided by their largest value first, so eps is
// relative to it (eps > 0; small eps approaches the exact assignment). eps is annealed from 1 down
// (eps scaling, warm-started potentials). (n, n) row-major; each row sums to 1/n up to rounding
// (the last update fits the rows); the columns' total deviation from 1/n stops at tol or after
// max_iter iterations at the target eps, whichever comes first (slow for eps << 0.01).
std::vector<double> sinkhorn_plan(const std::vector<double>& cost, int64_t n, double eps, double tol = 1e-9,
                                  int max_iter = 10000);

}  // namespace tessera

// The Hungarian method with row/column potentials: rows are added one at a time, each by a
// Dijkstra-like search for the shortest augmenting path over reduced costs (Jonker-Volgenant's
// augmentation step), so the whole solve is O(n^3). Sinkhorn runs in the log domain so that small
// eps neither underflows nor overflows.
#include "model/assignment.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/check.h"

namespace tessera {

std::vector<int64_t> solve_assignment(const std::vector<double>& cost, int64_t n) {
  TESSERA_CHECK(n >= 0 && static_cast<int64_t>(cost.size()) == n * n, "solve_assignment: cost has ", cost.size(),
                " entries, expected n * n = ", n * n);
  for (double c : cost) TESSERA_CHECK(std::isfinite(c), "solve_assignment: the cost matrix holds a non-finite value");
  const double inf = std::numeric_limits<double>::infinity();
  // 1-based arrays; column 0 is a virtual column holding the row being added.
  std::vector<double> u(static_cast<size_t>(n + 1), 0.0), v(static_cast<size_t>(n + 1), 0.0);
  std::vector<int64_t> row_of(static_cast<size_t>(n + 1), 0), way(static_cast<size_t>(n + 1), 0);
  auto c = [&](int64_t i, int64_t j) { return cost[static_cast<size_t>((i - 1) * n + (j - 1))]; };
  for (int64_t i = 1; i <= n; ++i) {
    row_of[0] = i;
    int64_t j0 = 0;
    std::vector<double> minv(static_cast<size_t>(n + 1), inf);
    std::vector<char> used(static_cast<size_t>(n + 1), 0);
    do {  // grow the tree of tight edges until it reaches a free column
      used[static_cast<size_t>(j0)] = 1;
      const int64_t i0 = row_of[static_cast<size_t>(j0)];
      double delta = inf;
      int64_t j1 = 0;
      for (int64_t j = 1; j <= n; ++j) {
        if (used[static_cast<size_t>(j)]) continue;
        const double reduced = c(i0, j) - u[static_cast<size_t>(i0)] - v[static_cast<size_t>(j)];
        if (reduced < minv[static_cast<size_t>(j)]) {
          minv[static_cast<size_t>(j)] = reduced;
          way[static_cast<size_t>(j)] = j0;
        }
        if (minv[static_cast<size_t>(j)] < delta) {
          delta = minv[static_cast<size_t>(j)];
          j1 = j;
        }
      }
      for (int64_t j = 0; j <= n; ++j) {
        if (used[static_cast<size_t>(j)]) {
          u[static_cast<size_t>(row_of[static_cast<size_t>(j)])] += delta;
          v[static_cast<size_t>(j)] -= delta;
        } else {
          minv[static_cast<size_t>(j)] -= delta;
        }
      }
      j0 = j1;
    } while (row_of[static_cast<size_t>(j0)] != 0);
    do {  // augment along the path back to the virtual column
      const int64_t j1 = way[static_cast<size_t>(j0)];
      row_of[static_cast<size_t>(j0)] = row_of[static_cast<size_t>(j1)];
      j0 = j1;
    } while (j0 != 0);
  }
  std::vector<int64_t> perm(static_cast<size_t>(n), -1);
  for (int64_t j = 1; j <= n; ++j) perm[static_cast<size_t>(row_of[static_cast<size_t>(j)] - 1)] = j - 1;
  return perm;
}

namespace {

// log(sum_k exp(x_k)) of a strided run, stable for large magnitudes.
template <class F>
double logsumexp(int64_t n, F&& x) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < n; ++k) m = std::max(m, x(k));
  double s = 0.0;
  for (int64_t k = 0; k < n; ++k) s += std::exp(x(k) - m);
  return m + std::log(s);
}

}  // namespace

std::vector<double> sinkhorn_plan(const std::vector<double>& cost, int64_t n, double eps, double tol, int max_iter) {
  TESSERA_CHECK(n >= 1 && static_cast<int64_t>(cost.size()) == n * n, "sinkhorn_plan: cost has ", cost.size(),
                " entries, expected n * n = ", n * n);
  TESSERA_CHECK(std::isfinite(eps) && eps > 0, "sinkhorn_plan: eps must be > 0, got ", eps);
  double scale = 0.0;
  for (double c : cost) {
    TESSERA_CHECK(std::isfinite(c), "sinkhorn_plan: the cost matrix holds a non-finite value");
    scale = std::max(scale, std::abs(c));
  }
  if (scale == 0.0) scale = 1.0;
  const auto N = static_cast<size_t>(n);
  std::vector<double> c(cost.size());
  for (size_t i = 0; i < cost.size(); ++i) c[i] = cost[i] / scale;
  auto at = [&](int64_t i, int64_t j) { return c[static_cast<size_t>(i * n + j)]; };
  const double log_mass = -std::log(static_cast<double>(n)), mass = 1.0 / static_cast<double>(n);
  // The dual potentials f, g (in cost units), warm-started as eps is annealed from 1 down to the
  // target (eps scaling): at a small eps alone, Sinkhorn converges very slowly.
  std::vector<double> f(N, 0.0), g(N, 0.0);
  auto column_error = [&](double e) {
    double err = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      double col = 0.0;
      for (int64_t i = 0; i < n; ++i) col += std::exp((f[static_cast<size_t>(i)] + g[static_cast<size_t>(j)] - at(i, j)) / e);
      err += std::abs(col - mass);
    }
    return err;
  };
  for (double e = std::max(eps, 1.0);; e = std::max(eps, e * 0.5)) {
    const bool last = e == eps;
    for (int it = 0; it < (last ? max_iter : 100); ++it) {
      for (int64_t j = 0; j < n; ++j)  // fit the columns
        g[static_cast<size_t>(j)] =
            e * (log_mass - logsumexp(n, [&](int64_t i) { return (f[static_cast<size_t>(i)] - at(i, j)) / e; }));
      for (int64_t i = 0; i < n; ++i)  // fit the rows (last, so rows are exact)
        f[static_cast<size_t>(i)] =
            e * (log_mass - logsumexp(n, [&](int64_t j) { return (g[static_cast<size_t>(j)] - at(i, j)) / e; }));
      if (column_error(e) < (last ? tol : 1e-6)) break;
    }
    if (last) break;
  }
  std::vector<double> plan(cost.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      plan[static_cast<size_t>(i * n + j)] = std::exp((f[static_cast<size_t>(i)] + g[static_cast<size_t>(j)] - at(i, j)) / eps);
  return plan;
}

}  // namespace tessera

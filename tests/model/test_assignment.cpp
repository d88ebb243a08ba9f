// Tests model/assignment.h: the exact assignment against brute force over every permutation, and
// the Sinkhorn plan's marginals and its limit (the exact assignment) as eps shrinks.
#include "model/assignment.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "error_testing.h"
#include "testing.h"

namespace tessera {
namespace {

std::vector<double> random_cost(int64_t n, uint32_t seed, bool integer) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 10.0);
  std::vector<double> c(static_cast<size_t>(n * n));
  for (double& x : c) x = integer ? std::floor(u(rng)) : u(rng);  // integers: many ties
  return c;
}

double total(const std::vector<double>& c, int64_t n, const std::vector<int64_t>& p) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += c[static_cast<size_t>(i * n + p[static_cast<size_t>(i)])];
  return s;
}

}  // namespace

TEST(Assignment, MatchesBruteForce) {
  for (int64_t n = 1; n <= 7; ++n)
    for (uint32_t seed = 0; seed < 12; ++seed) {
      const auto c = random_cost(n, seed * 31 + static_cast<uint32_t>(n), seed % 2 == 0);
      const auto p = solve_assignment(c, n);
      std::vector<int64_t> sorted = p;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> ident(static_cast<size_t>(n));
      std::iota(ident.begin(), ident.end(), 0);
      ASSERT_EQ(sorted, ident) << "not a permutation, n = " << n;
      double best = std::numeric_limits<double>::infinity();
      do best = std::min(best, total(c, n, ident));
      while (std::next_permutation(ident.begin(), ident.end()));
      EXPECT_NEAR(total(c, n, p), best, 1e-9) << "n = " << n << " seed " << seed;
    }
}

TEST(Assignment, RecoversAHiddenPermutation) {
  // cost = squared distance of a's rows to b's, where b is a's rows permuted: the assignment is
  // exactly the inverse permutation (zero cost), also at 200 units.
  const int64_t n = 200, dim = 5;
  std::mt19937 rng(3);
  std::normal_distribution<double> g;
  std::vector<double> a(static_cast<size_t>(n * dim));
  for (double& x : a) x = g(rng);
  std::vector<int64_t> hidden(static_cast<size_t>(n));
  std::iota(hidden.begin(), hidden.end(), 0);
  std::shuffle(hidden.begin(), hidden.end(), rng);
  std::vector<double> c(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t k = 0; k < dim; ++k) {
        const double d = a[static_cast<size_t>(i * dim + k)] - a[static_cast<size_t>(hidden[static_cast<size_t>(j)] * dim + k)];
        s += d * d;
      }
      c[static_cast<size_t>(i * n + j)] = s;
    }
  const auto p = solve_assignment(c, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hidden[static_cast<size_t>(p[static_cast<size_t>(i)])], i);
}

TEST(Assignment, RefusesBadInput) {
  EXPECT_TRUE(testing::throws_with([] { solve_assignment({1, 2, 3}, 2); }, {"3 entries", "n * n = 4"}));
  EXPECT_TRUE(testing::throws_with([] { solve_assignment({1, NAN, 3, 4}, 2); }, {"non-finite"}));
  EXPECT_TRUE(solve_assignment({}, 0).empty());
}

TEST(Sinkhorn, MarginalsAreUniform) {
  const int64_t n = 9;
  const auto c = random_cost(n, 5, false);
  for (double eps : {1.0, 0.1, 0.01}) {
    const auto p = sinkhorn_plan(c, n, eps);
    for (int64_t i = 0; i < n; ++i) {
      double row = 0, col = 0;
      for (int64_t j = 0; j < n; ++j) {
        row += p[static_cast<size_t>(i * n + j)];
        col += p[static_cast<size_t>(j * n + i)];
        EXPECT_GE(p[static_cast<size_t>(i * n + j)], 0.0);
      }
      EXPECT_NEAR(row, 1.0 / n, 1e-12) << "eps " << eps;
      // Columns converge slowly at small eps (the rate degrades like exp(-1 / eps)); what the
      // fusion needs is a plan close to doubly stochastic, not 1e-9.
      EXPECT_NEAR(col, 1.0 / n, 1e-5) << "eps " << eps;
    }
  }
}

TEST(Sinkhorn, SmallEpsApproachesTheAssignment) {
  const int64_t n = 7;
  const auto c = random_cost(n, 11, false);
  const auto perm = solve_assignment(c, n);
  // Off the assignment the mass decays like exp(-gap / eps), gap the normalized cost margin of the
  // next best plan (here about 0.01): at eps = 1e-4 it is far below the tolerance.
  const auto p = sinkhorn_plan(c, n, 1e-4);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(p[static_cast<size_t>(i * n + perm[static_cast<size_t>(i)])], 1.0 / n, 1e-9) << "row " << i;
  // A large eps spreads the mass: no entry holds a whole row.
  const auto q = sinkhorn_plan(c, n, 10.0);
  for (double x : q) EXPECT_LT(x, 0.5 / n);
}

TEST(Sinkhorn, RefusesBadInput) {
  EXPECT_TRUE(testing::throws_with([] { sinkhorn_plan({1, 2, 3, 4}, 2, 0.0); }, {"eps must be > 0"}));
  EXPECT_TRUE(testing::throws_with([] { sinkhorn_plan({1, 2, 3}, 2, 0.1); }, {"expected n * n = 4"}));
}

}  // namespace tessera

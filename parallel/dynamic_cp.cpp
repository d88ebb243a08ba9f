// Dynamic context parallelism's planner: costs of a row per placement, greedy placement and
// single-row improvement (dynamic_cp.h).
#include "parallel/dynamic_cp.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <tuple>
#include <utility>

#include "kernels/check.h"

namespace tessera {

std::string CpCostModel::str() const {
  std::ostringstream o;
  o << "token " << token_s * 1e9 << " ns, pair " << pair_s * 1e9 << " ns, ring step " << ring_step_s * 1e6
    << " us + " << ring_token_s * 1e9 << " ns per K/V position";
  return o.str();
}

double CpPlan::max_s() const { return rank_s.empty() ? 0.0 : *std::max_element(rank_s.begin(), rank_s.end()); }

double CpPlan::imbalance() const {
  if (rank_s.empty()) return 0.0;
  const double mean = std::accumulate(rank_s.begin(), rank_s.end(), 0.0) / static_cast<double>(rank_s.size());
  return mean > 0 ? max_s() / mean - 1.0 : 0.0;
}

int64_t CpPlan::split_rows() const {
  return std::count_if(rows.begin(), rows.end(), [](const CpPlacement& p) { return p.split(); });
}

std::vector<int64_t> cp_split_sizes(int64_t cp, int64_t length) {
  std::vector<int64_t> sizes;
  for (int64_t s = 2; s <= cp; ++s)
    if (cp % s == 0 && length % (2 * s) == 0) sizes.push_back(s);
  return sizes;
}

namespace {

void check_row(const std::vector<int64_t>& docs, int64_t length) {
  int64_t total = 0;
  for (int64_t d : docs) {
    TESSERA_CHECK(d > 0, "dynamic cp: a document of length ", d, " (documents are at least 1 position)");
    total += d;
  }
  TESSERA_CHECK(total == length, "dynamic cp: a row's documents cover ", total, " positions, not the row's ", length);
}

// Sum over positions p in [a, b) of (p - start(p) + 1): each query's visible keys under the causal
// document mask. starts: each document's first position, ascending.
int64_t pairs_in(const std::vector<int64_t>& docs, int64_t a, int64_t b) {
  int64_t pairs = 0, start = 0;
  for (int64_t d : docs) {
    const int64_t lo = std::max(a, start), hi = std::min(b, start + d);
    if (lo < hi) {  // positions lo..hi-1 of a document starting at `start`: (p - start + 1) summed
      const int64_t first = lo - start + 1, last = hi - start;
      pairs += (first + last) * (last - first + 1) / 2;
    }
    start += d;
  }
  return pairs;
}

}  // namespace

int64_t cp_row_pairs(const std::vector<int64_t>& docs, int64_t length, int64_t ranks, int64_t index) {
  check_row(docs, length);
  if (ranks == 1) return pairs_in(docs, 0, length);
  TESSERA_CHECK(length % (2 * ranks) == 0 && index >= 0 && index < ranks, "dynamic cp: member ", index, " of ",
                ranks, " ranks over a row of ", length, " positions (needs a multiple of ", 2 * ranks, ")");
  const int64_t c = length / (2 * ranks);
  const int64_t mirror = 2 * ranks - 1 - index;
  return pairs_in(docs, index * c, (index + 1) * c) + pairs_in(docs, mirror * c, (mirror + 1) * c);
}

std::vector<double> cp_row_cost(const std::vector<int64_t>& docs, int64_t length, int64_t ranks,
                                const CpCostModel& m) {
  std::vector<double> cost(static_cast<size_t>(ranks));
  const double tokens = static_cast<double>(length) / static_cast<double>(ranks);
  const double ring = ranks > 1 ? static_cast<double>(ranks - 1) * m.ring_token_s * tokens : 0.0;
  for (int64_t i = 0; i < ranks; ++i)
    cost[static_cast<size_t>(i)] =
        m.token_s * tokens + m.pair_s * static_cast<double>(cp_row_pairs(docs, length, ranks, i)) + ring;
  return cost;
}

namespace {

// The least-squares (a, b) >= 0 of y ~ a u + b v (sums over the points), as described at fit_cp_cost.
std::pair<double, double> nonnegative_fit(const std::vector<double>& u, const std::vector<double>& v,
                                          const std::vector<double>& y) {
  double uu = 0, uv = 0, vv = 0, uy = 0, vy = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    uu += u[i] * u[i], uv += u[i] * v[i], vv += v[i] * v[i], uy += u[i] * y[i], vy += v[i] * y[i];
  }
  const auto residual = [&](double a, double b) {
    double r = 0;
    for (size_t i = 0; i < y.size(); ++i) r += (y[i] - a * u[i] - b * v[i]) * (y[i] - a * u[i] - b * v[i]);
    return r;
  };
  const double det = uu * vv - uv * uv;
  if (det > 1e-9 * uu * vv) {  // the terms separate (two sizes or more)
    const double a = (vv * uy - uv * vy) / det, b = (uu * vy - uv * uy) / det;
    if (a >= 0 && b >= 0) return {a, b};
  }
  const std::pair<double, double> step{uu > 0 ? std::max(0.0, uy / uu) : 0.0, 0.0};
  const std::pair<double, double> token{0.0, vv > 0 ? std::max(0.0, vy / vv) : 0.0};
  // (one size: both fit exactly, up to rounding; the step term is kept)
  return residual(token.first, token.second) < residual(step.first, step.second) * (1 - 1e-9) ? token : step;
}

}  // namespace

CpCostModel fit_cp_cost(const CpTimings& t) {
  const int64_t L = t.length;
  TESSERA_CHECK(L >= 1 && t.split_ranks.size() == t.split_s.size(), "fit_cp_cost: ", t.split_ranks.size(),
                " split sizes, ", t.split_s.size(), " split times, length ", L);
  const double pa = static_cast<double>(cp_row_pairs(t.docs_a, L, 1, 0));
  const double pb = static_cast<double>(cp_row_pairs(t.docs_b, L, 1, 0));
  CpCostModel m;
  m.pair_s = pa != pb ? std::max(0.0, (t.whole_a_s - t.whole_b_s) / (pa - pb)) : 0.0;
  m.token_s = std::max(0.0, (t.whole_b_s - m.pair_s * pb) / static_cast<double>(L));
  std::vector<double> u, v, y;
  for (size_t i = 0; i < t.split_ranks.size(); ++i) {
    const int64_t s = t.split_ranks[i];
    TESSERA_CHECK(s >= 2, "fit_cp_cost: a split over ", s, " ranks");
    const std::vector<double> work = cp_row_cost(t.docs_a, L, s, CpCostModel{m.token_s, m.pair_s, 0, 0});
    const double share = static_cast<double>(L) / static_cast<double>(s);
    u.push_back(static_cast<double>(s - 1));
    v.push_back(static_cast<double>(s - 1) * share);
    y.push_back(t.split_s[i] - *std::max_element(work.begin(), work.end()));
  }
  std::tie(m.ring_step_s, m.ring_token_s) = nonnegative_fit(u, v, y);
  return m;
}

double cp_pass_s(int64_t ranks, const CpCostModel& m) {
  return ranks > 1 ? static_cast<double>(ranks - 1) * m.ring_step_s : 0.0;
}

std::vector<double> cp_rank_seconds(const std::vector<std::vector<int64_t>>& rows, int64_t length, int64_t cp,
                                    const std::vector<CpPlacement>& placements, const CpCostModel& m) {
  TESSERA_CHECK(rows.size() == placements.size(), "dynamic cp: ", rows.size(), " rows, ", placements.size(),
                " placements");
  std::vector<double> load(static_cast<size_t>(cp), 0.0);
  std::vector<CpPlacement> passes;  // the split placements used: one pass each
  for (size_t i = 0; i < rows.size(); ++i) {
    const CpPlacement& p = placements[i];
    TESSERA_CHECK(p.first >= 0 && p.first + p.ranks <= cp && p.first % p.ranks == 0, "dynamic cp: placement [",
                  p.first, ", ", p.first + p.ranks, ") outside cp = ", cp, " or not aligned");
    const std::vector<double> c = cp_row_cost(rows[i], length, p.ranks, m);
    for (int64_t j = 0; j < p.ranks; ++j) load[static_cast<size_t>(p.first + j)] += c[static_cast<size_t>(j)];
    if (p.split() && std::find(passes.begin(), passes.end(), p) == passes.end()) passes.push_back(p);
  }
  for (const CpPlacement& p : passes)
    for (int64_t j = 0; j < p.ranks; ++j) load[static_cast<size_t>(p.first + j)] += cp_pass_s(p.ranks, m);
  return load;
}

namespace {

// Every placement a row can take, in preference order (whole before split, fewer ranks, lower rank).
std::vector<CpPlacement> placements_of(int64_t cp, int64_t length) {
  std::vector<CpPlacement> all;
  for (int64_t r = 0; r < cp; ++r) all.push_back({r, 1});
  for (int64_t s : cp_split_sizes(cp, length))
    for (int64_t f = 0; f < cp; f += s) all.push_back({f, s});
  return all;
}

// (slowest rank, sum of squares): the order plans are compared in.
std::pair<double, double> score(const std::vector<double>& load) {
  double sq = 0;
  for (double l : load) sq += l * l;
  return {*std::max_element(load.begin(), load.end()), sq};
}

// Each rank's predicted seconds while rows are placed and taken back: a row's member costs, and a
// split placement's pass cost (cp_pass_s) once while it holds any row.
struct Loads {
  const std::vector<CpPlacement>& options;
  const std::vector<double>& pass_s;  // per option: each member's pass cost (0: whole)
  std::vector<double> load;
  std::vector<int64_t> rows_on;       // per option: rows placed there

  Loads(const std::vector<CpPlacement>& o, const std::vector<double>& pass, int64_t cp)
      : options(o), pass_s(pass), load(static_cast<size_t>(cp), 0.0), rows_on(o.size(), 0) {}

  void add(size_t o, const std::vector<double>& cost, double sign) {
    const CpPlacement& p = options[o];
    const bool pass_changes = sign > 0 ? rows_on[o]++ == 0 : --rows_on[o] == 0;
    const double pass = pass_changes ? pass_s[o] : 0.0;
    for (int64_t j = 0; j < p.ranks; ++j)
      load[static_cast<size_t>(p.first + j)] += sign * (cost[static_cast<size_t>(j)] + pass);
  }
};

}  // namespace

namespace {

// Depth-first branch and bound over the rows (longest first), each over every placement; a branch
// ends when its slowest rank, or the work left spread evenly, cannot beat the best plan found.
// (Loads only grow as rows are placed, so both bounds hold.)
struct Search {
  const std::vector<CpPlacement>& options;
  const std::vector<std::vector<std::vector<double>>>& costs;  // [row][ranks][member]
  const std::vector<size_t>& order;
  std::vector<double> rest;  // rest[k]: the least total work of rows order[k..] (whole: no ring)
  int64_t budget;            // nodes left; exhausted: the best so far stands
  Loads loads;
  std::vector<CpPlacement> now, best;
  double best_max;

  void run(size_t k) {
    if (budget-- <= 0) return;
    const std::vector<double>& load = loads.load;
    if (k == order.size()) {
      const double m = *std::max_element(load.begin(), load.end());
      if (m < best_max * (1 - 1e-12)) best_max = m, best = now;
      return;
    }
    const size_t i = order[k];
    for (size_t o = 0; o < options.size(); ++o) {
      const std::vector<double>& c = costs[i][static_cast<size_t>(options[o].ranks)];
      loads.add(o, c, +1);
      const double m = *std::max_element(load.begin(), load.end());
      const double sum = std::accumulate(load.begin(), load.end(), 0.0);
      const double bound = std::max(m, (sum + rest[k + 1]) / static_cast<double>(load.size()));
      if (bound < best_max * (1 - 1e-12)) {
        now[i] = options[o];
        run(k + 1);
      }
      loads.add(o, c, -1);
    }
  }
};

}  // namespace

CpPlan plan_dynamic_cp(const std::vector<std::vector<int64_t>>& rows, int64_t length, int64_t cp,
                       const CpCostModel& m, int64_t search_nodes) {
  TESSERA_CHECK(cp >= 1, "dynamic cp: cp = ", cp);
  const std::vector<CpPlacement> options = placements_of(cp, length);
  // costs[i][s]: row i's member costs over s ranks (s = 1: whole), for every size an option uses.
  std::vector<std::vector<std::vector<double>>> costs(rows.size(), std::vector<std::vector<double>>(
                                                                        static_cast<size_t>(cp + 1)));
  for (size_t i = 0; i < rows.size(); ++i) {
    costs[i][1] = cp_row_cost(rows[i], length, 1, m);
    for (int64_t s : cp_split_sizes(cp, length)) costs[i][static_cast<size_t>(s)] = cp_row_cost(rows[i], length, s, m);
  }
  const auto cost_of = [&](size_t i, size_t o) -> const std::vector<double>& {
    return costs[i][static_cast<size_t>(options[o].ranks)];
  };
  std::vector<double> pass_s;  // per option: a member's pass cost
  for (const CpPlacement& o : options) pass_s.push_back(cp_pass_s(o.ranks, m));
  // Greedy: longest first (ties: row order).
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return costs[a][1][0] > costs[b][1][0]; });
  std::vector<size_t> at(rows.size(), 0);  // each row's option
  Loads loads(options, pass_s, cp);
  for (size_t i : order) {
    std::pair<double, double> best{0, 0};
    size_t pick = 0;
    for (size_t o = 0; o < options.size(); ++o) {
      loads.add(o, cost_of(i, o), +1);
      const std::pair<double, double> sc = score(loads.load);
      loads.add(o, cost_of(i, o), -1);
      if (o == 0 || sc < best) best = sc, pick = o;
    }
    at[i] = pick;
    loads.add(pick, cost_of(i, pick), +1);
  }
  // Single-row moves while one improves the score (each strictly lowers it: terminates).
  const auto better = [](std::pair<double, double> a, std::pair<double, double> b) {
    const double tol = 1e-12 * std::max(1.0, std::abs(b.first));
    return a.first < b.first - tol || (a.first <= b.first + tol && a.second < b.second * (1 - 1e-12));
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::pair<double, double> now = score(loads.load);
      loads.add(at[i], cost_of(i, at[i]), -1);
      size_t pick = options.size();
      std::pair<double, double> best = now;
      for (size_t o = 0; o < options.size(); ++o) {
        if (o == at[i]) continue;
        loads.add(o, cost_of(i, o), +1);
        const std::pair<double, double> sc = score(loads.load);
        loads.add(o, cost_of(i, o), -1);
        if (better(sc, best)) best = sc, pick = o;
      }
      if (pick < options.size()) at[i] = pick, moved = true;
      loads.add(at[i], cost_of(i, at[i]), +1);
    }
  }
  CpPlan plan;
  for (size_t o : at) plan.rows.push_back(options[o]);
  // Then the exact search from that bound (the greedy plan's slowest rank, recomputed without drift),
  // within its node budget.
  const std::vector<double> start = cp_rank_seconds(rows, length, cp, plan.rows, m);
  Search search{options, costs, order, std::vector<double>(rows.size() + 1, 0.0), search_nodes,
                Loads(options, pass_s, cp), plan.rows, plan.rows, *std::max_element(start.begin(), start.end())};
  for (size_t k = rows.size(); k-- > 0;) search.rest[k] = search.rest[k + 1] + costs[order[k]][1][0];
  search.run(0);
  plan.rows = search.best;
  plan.optimal = search.budget >= 0;
  plan.rank_s = cp_rank_seconds(rows, length, cp, plan.rows, m);  // recomputed: no drift from the moves
  return plan;
}

std::vector<CpPass> cp_passes(const CpPlan& plan, int64_t rank) {
  std::vector<CpPass> passes;
  CpPass whole{{rank, 1}, {}};
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const CpPlacement& p = plan.rows[i];
    if (!p.contains(rank)) continue;
    if (!p.split()) {
      whole.rows.push_back(static_cast<int64_t>(i));
      continue;
    }
    auto it = std::find_if(passes.begin(), passes.end(), [&](const CpPass& q) { return q.group == p; });
    if (it == passes.end()) passes.push_back({p, {}}), it = passes.end() - 1;
    it->rows.push_back(static_cast<int64_t>(i));
  }
  std::sort(passes.begin(), passes.end(), [](const CpPass& a, const CpPass& b) {
    return std::make_pair(a.group.first, a.group.ranks) < std::make_pair(b.group.first, b.group.ranks);
  });
  if (!whole.rows.empty()) passes.push_back(std::move(whole));
  return passes;
}

}  // namespace tessera

// The layout search of plan/search.h: a decision tree over the degrees (the grid's validation and a
// static memory bound prune whole subtrees), the options of each factorization enumerated with the
// schedule generator's rules, then branch and bound on the predicted step time.
#include "plan/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "kernels/check.h"
#include "model/memory.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/process_grid.h"
#include "plan/recompute_choice.h"

namespace tessera::plan {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

GridLimits limits_of(const Workload& w, bool sp) {
  GridLimits g;
  g.n_head = w.model.n_head;
  g.n_kv_head = w.model.kv_heads();
  g.n_layer = w.model.n_layer;
  g.seq_len = w.seq_len;
  g.vocab_size = w.model.vocab_size;
  g.ffn_hidden = w.model.ffn_hidden;
  g.sequence_parallel = sp;
  return g;
}

// The grid's validation (parallel/process_grid.h, the trainer's rules for heads, KV heads, layers,
// MLP, sequence over cp and tp): "" when it passes.
std::string grid_problem(const Workload& w, const GridDegrees& g, int64_t ranks, bool sp) {
  try {
    validate_grid(g, ranks, limits_of(w, sp));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A lower bound of the largest rank's bytes whatever the options: its share of the parameters,
// gradients and (at best fully sharded) moments, fp32. The ranks of one replica (tp x pp) hold
// every parameter at least once, so the largest holds at least the average.
double static_bytes_bound(double parameters, int64_t tp, int64_t pp, int64_t shards) {
  const double per_rank = parameters / double(tp * pp);
  return per_rank * (4 + 4 + 8.0 / double(shards));
}

// The parameters, gradients (ZeRO-1: and the reduced shard), moments and bf16 copy of the rank
// holding the most parameters: the static part of the trainer's estimate, a lower bound of its total.
double static_bytes(const Layout& l, double parameters) {
  const int64_t shards = l.dp * l.cp;
  const bool zero = l.zero == 1 && shards > 1;
  return parameters * (4 + 4 + (l.bf16 ? 2 : 0) + (zero ? 12.0 / double(shards) : 8.0));
}

// Everything of a layout but its micro-batch and recomputation: the key under which a layout found
// over memory rules out those with a larger micro-batch and less recomputation (the trainer's
// automatic micro-batch takes the same monotonicity; recomputation only ever frees activations).
// "bubble" recomputation holds a chunk's recomputed blocks from R to B (more than "full"): a family
// of its own, in which R further ahead (model.recompute_ahead = 2) holds more and so saves less.
using MemoryKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, int, bool, bool, bool>;
MemoryKey memory_key(const Layout& l) {
  return {l.dp, l.tp, l.pp, l.vpp, l.cp, l.sp, l.zero, int(l.schedule), l.cp_ring, l.bf16, l.recompute_bubble};
}
int saving(const Layout& l) {
  const int r = l.recompute == Recompute::Full ? 2 : l.recompute == Recompute::Selective ? 1 : 0;
  return 2 * r + (l.recompute_ahead > 1 ? 0 : 1);
}
// A layout found over memory: it rules out what it covers once its state is 1 (0: not known yet
// whether the search would have recorded it, search_layouts; -1: it would not have).
struct OverPoint {
  int64_t micro_batch;
  int saving;
  int state = 0;
  Layout layout;     // the layout found over memory
  size_t links = 0;  // its factorization's links
  double kth = 0;    // the K-th best step when it was found
};

// A layout's per-block recomputation options (plan/recompute_choice.h): full first, then the op sets
// the layout allows (none that reruns a GEMM with cp > 1), most bytes freed first, then keeping the
// block. The order is the order of blocks within a chunk (as model.recompute_layers recomputes
// the first blocks fully).
struct BlockOptions {
  std::vector<BlockOption> options;
  std::vector<RecomputeOps> ops;  // per option; option 0 (full) and the last (keep) hold none
  // Per option, what it frees as the chunk's last block: the memory peak is that block's backward
  // beside everything the others keep (model/memory.h model_memory), and its backward recomputes
  // one branch's tensors at a time, so of its bytes only the other branch's stay freed there (a
  // full block's none: its backward re-creates its whole context).
  std::vector<double> last_saved;
};
BlockOptions block_options(const Workload& w, const Layout& l, const ClusterSpec& c, const GroupLinks& links,
                           const std::vector<RecomputeOps>& sets) {
  ModelMemoryLayout m;
  m.batch = l.micro_batch;
  m.seq_len = w.seq_len / l.cp;
  m.tp = l.tp;
  m.sequence_parallel = l.sp && l.tp > 1;
  const int64_t kept = activation_parts(w.model, m).block;
  m.recompute = Recompute::Full;
  const double full = 4.0 * double(kept - activation_parts(w.model, m).block);
  m.recompute = Recompute::None;
  std::vector<std::pair<BlockOption, RecomputeOps>> mid;
  for (const RecomputeOps& o : sets) {
    if (!o.any() || (l.cp > 1 && o.reruns_gemms())) continue;
    mid.push_back({{block_recompute_seconds(w, l, c, links, o, false), double(recompute_ops_cost(w.model, m, o).bytes_saved)}, o});
  }
  std::stable_sort(mid.begin(), mid.end(), [](const auto& a, const auto& b) { return a.first.saved > b.first.saved; });
  BlockOptions b;
  b.options.push_back({block_recompute_seconds(w, l, c, links, {}, true), full});
  b.ops.push_back({});
  b.last_saved.push_back(0);
  const auto bytes = [&](const RecomputeOps& o) { return double(recompute_ops_cost(w.model, m, o).bytes_saved); };
  for (const auto& [option, ops] : mid) {
    b.options.push_back(option), b.ops.push_back(ops);
    const double norm = ops.norm ? bytes({true, false, false, false, false}) / 2 : 0.0;  // one norm a branch
    const double mlp = norm + bytes({false, false, false, ops.mlp_in, ops.mlp_act});
    const double attention = norm + bytes({false, ops.qkv, ops.attn, false, false});
    b.last_saved.push_back(std::min(mlp, attention));
  }
  b.options.push_back({0, 0});
  b.ops.push_back({});
  b.last_saved.push_back(0);
  return b;
}

// A chunk's mix: counts of the options for all blocks but the last, which takes option `last`.
struct ChunkMix {
  std::vector<int64_t> counts;
  size_t last = 0;
  double seconds = 0, saved = 0;  // saved: the others' bytes freed and the last's (last_saved)
};

// The frontier of chunk mixes of `blocks` blocks: the frontier of the first blocks - 1
// (recompute_frontier), each with every option but full as the last block, pruned again by
// (seconds, saved). All kept is its first.
std::vector<ChunkMix> chunk_frontier(const BlockOptions& b, int64_t blocks) {
  std::vector<ChunkMix> all;
  if (blocks < 1) return all;
  for (const RecomputeMix& m : recompute_frontier(b.options, blocks - 1))
    for (size_t o = 1; o < b.options.size(); ++o)  // (full blocks come first in a chunk)
      all.push_back({m.counts, o, m.seconds + b.options[o].seconds, m.saved + b.last_saved[o]});
  std::stable_sort(all.begin(), all.end(), [](const ChunkMix& x, const ChunkMix& y) {
    return x.seconds != y.seconds ? x.seconds < y.seconds : x.saved > y.saved;
  });
  std::vector<ChunkMix> frontier;
  for (ChunkMix& x : all)
    if (frontier.empty() || x.saved > frontier.back().saved) frontier.push_back(std::move(x));
  return frontier;
}

// The layout with a mix's blocks: counts[0] in full (recompute_layers), then each op set's blocks,
// then those kept; `last` (an option but full, or -1) then takes the block after them.
Layout with_mix(Layout l, const BlockOptions& b, const std::vector<int64_t>& counts, int64_t last = -1) {
  l.recompute_layers = counts[0];
  l.recompute_ops.assign(size_t(counts[0]), RecomputeOps{});
  for (size_t o = 1; o + 1 < counts.size(); ++o) l.recompute_ops.insert(l.recompute_ops.end(), size_t(counts[o]), b.ops[o]);
  if (last >= 0) {
    l.recompute_ops.insert(l.recompute_ops.end(), size_t(counts.back()), RecomputeOps{});
    l.recompute_ops.push_back(b.ops[size_t(last)]);
  }
  while (l.recompute_ops.size() > size_t(l.recompute_layers) && !l.recompute_ops.back().any()) l.recompute_ops.pop_back();
  if (l.recompute_ops.size() == size_t(l.recompute_layers)) l.recompute_ops.clear();
  return l;
}

// Every mix of `left` blocks over the options from o on (brute force).
void every_mix(std::vector<int64_t>& counts, size_t o, int64_t left,
               const std::function<void(const std::vector<int64_t>&)>& visit) {
  if (o + 1 == counts.size()) {
    counts[o] = left;
    visit(counts);
    return;
  }
  for (int64_t k = 0; k <= left; ++k) {
    counts[o] = k;
    every_mix(counts, o + 1, left - k, visit);
  }
}

// Every field of a layout, for the memory estimate's memo.
std::vector<int64_t> layout_key(const Layout& l) {
  std::vector<int64_t> k = {l.dp, l.tp, l.pp, l.vpp, l.cp, l.sp, l.zero, int64_t(l.schedule), l.cp_ring,
                            l.micro_batch, int64_t(l.recompute), l.recompute_layers, l.recompute_bubble, l.bf16,
                            l.recompute_ahead};
  for (const RecomputeOps& o : l.recompute_ops)
    k.push_back(int64_t(o.norm) | int64_t(o.qkv) << 1 | int64_t(o.attn) << 2 | int64_t(o.mlp_in) << 3 |
                int64_t(o.mlp_act) << 4);
  return k;
}

struct Pending {
  Layout layout;
  double bound = 0;
  size_t links = 0;  // index into the factorizations' links
};

}  // namespace

std::vector<RecomputeOps> default_recompute_op_sets() {
  const RecomputeOps norm{true, false, false, false, false}, act{false, false, false, false, true};
  const RecomputeOps mlp_in{false, false, false, true, false}, attn{false, false, true, false, false};
  return {norm, act, RecomputeOps::selective(), RecomputeOps::selective() | mlp_in, RecomputeOps::selective() | attn,
          RecomputeOps::all()};
}

PlanResult search_layouts(const Workload& w, const ClusterSpec& cluster, int64_t ranks, const SearchSpace& space,
                          const PlanChecks& checks, int64_t top_k) {
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_CHECK(ranks >= 1, "tessera plan: --gpus must be at least 1, not ", ranks);
  TESSERA_CHECK(top_k >= 1, "tessera plan: --top must be at least 1, not ", top_k);
  PlanResult out;
  SearchStats& st = out.stats;
  const ModelConfig& mc = w.model;
  const double usable = cluster.usable_memory();
  const double parameters = double(model_memory(mc, ModelMemoryLayout{}).parameters);

  // ---- the tree: degrees, then the options of each ----
  CostCache cache = space.shortcuts && checks.schedules ? CostCache(checks.schedules) : CostCache();
  cache.memoise = space.shortcuts;
  std::map<std::vector<int64_t>, MemoryUse> estimates;  // by layout_key
  const auto memory_of = [&](const Layout& x) {
    if (!space.shortcuts) return checks.memory(x);
    std::vector<int64_t> key = layout_key(x);
    auto it = estimates.find(key);
    if (it == estimates.end()) it = estimates.emplace(std::move(key), checks.memory(x)).first;
    return it->second;
  };
  std::vector<GroupLinks> links;
  std::vector<Pending> pending;
  for (int64_t tp : divisors(ranks)) {
    if (space.max_tp > 0 && tp > space.max_tp) continue;
    for (int64_t cp : divisors(ranks / tp)) {
      if (space.max_cp > 0 && cp > space.max_cp) continue;
      for (int64_t pp : divisors(ranks / (tp * cp))) {
        if (space.max_pp > 0 && pp > space.max_pp) continue;
        const int64_t dp = ranks / (tp * cp * pp);
        ++st.degree_sets;
        const GridDegrees g{tp, cp, pp, dp};
        if (!grid_problem(w, g, ranks, false).empty() || w.global_batch % dp != 0) {
          ++st.degree_sets_invalid;
          continue;
        }
        if (static_bytes_bound(parameters, tp, pp, dp * cp) > usable) {
          ++st.degree_sets_too_big;
          continue;
        }
        Layout base;
        base.dp = dp, base.tp = tp, base.pp = pp, base.cp = cp;
        links.push_back(group_links(base, cluster));
        const size_t li = links.size() - 1;

        std::vector<bool> sps{false};
        if (tp > 1 && space.sequence_parallel && grid_problem(w, g, ranks, true).empty()) sps.push_back(true);
        std::vector<std::pair<PipelineKind, int64_t>> schedules;  // (kind, vpp)
        if (pp == 1) {
          schedules.push_back({PipelineKind::OneFOneB, 1});
        } else {
          for (PipelineKind k : space.schedules) {
            if (k != PipelineKind::Interleaved) {
              schedules.push_back({k, 1});
              continue;
            }
            for (int64_t v = 2; v <= space.max_vpp && pp * v <= mc.n_layer; ++v) schedules.push_back({k, v});
          }
        }
        std::vector<int64_t> zeros{0};
        if (dp * cp > 1 && space.zero) zeros.push_back(1);
        std::vector<bool> rings{true};
        if (cp > 1 && space.cp_allgather) rings.push_back(false);
        std::vector<int64_t> micro = divisors(w.global_batch / dp);
        if (space.micro_batch > 0) micro = {space.micro_batch};

        for (bool sp : sps)
          for (const auto& [kind, vpp] : schedules)
            for (int64_t zero : zeros)
              for (bool ring : rings)
                for (int64_t mb : micro) {
                  if ((w.global_batch / dp) % mb != 0) continue;
                  if (pp > 1) {
                    try {  // the generator's rules (micro-batches against pp, interleaving's groups)
                      check_pipeline_schedule(pp, vpp, w.global_batch / (dp * mb), kind);
                    } catch (const Error&) {
                      continue;
                    }
                  }
                  for (Recompute rc : space.recompute)
                    for (bool bf16 : space.bf16) {
                      Layout l = base;
                      l.sp = sp, l.schedule = kind, l.vpp = vpp, l.zero = zero, l.cp_ring = ring;
                      l.micro_batch = mb, l.recompute = rc, l.bf16 = bf16;
                      pending.push_back({l, 0, li});
                      if (rc == Recompute::Full && pp > 1 && space.recompute_bubble) {
                        Layout b = l;
                        b.recompute_bubble = true;
                        pending.push_back({b, 0, li});
                        // R further ahead (model.recompute_ahead): 2, when a chunk sees 2 micro-batches.
                        if (space.recompute_ahead && w.global_batch / (dp * mb) >= 2) {
                          b.recompute_ahead = 2;
                          pending.push_back({b, 0, li});
                        }
                      }
                      if (space.recompute_ops_every && rc == Recompute::None && !space.recompute_op_sets.empty()) {
                        const BlockOptions b = block_options(w, l, cluster, links[li], space.recompute_op_sets);
                        const int64_t most = max_chunk_blocks(cache.stages(w, l).cut, mc.n_layer);
                        // Every mix of the chunk's first blocks, then every option but full last.
                        std::vector<int64_t> counts(b.options.size(), 0);
                        every_mix(counts, 0, most - 1, [&](const std::vector<int64_t>& n) {
                          for (size_t last = 1; last < b.options.size(); ++last) {
                            const Layout x = with_mix(l, b, n, int64_t(last));
                            if (x.recompute_layers > 0 || !x.recompute_ops.empty()) pending.push_back({x, 0, li});
                          }
                        });
                        continue;
                      }
                      if (!space.recompute_layers_every || rc == Recompute::Full) continue;
                      const int64_t most = max_chunk_blocks(cache.stages(w, l).cut, mc.n_layer);
                      for (int64_t k = 1; k < most; ++k) {  // brute force: every k a layout
                        l.recompute_layers = k;
                        pending.push_back({l, 0, li});
                      }
                    }
                }
      }
    }
  }
  st.layouts = int64_t(pending.size());

  // ---- bounds, then exact costs and checks in bound order ----
  for (size_t i = 0; i < pending.size(); ++i) {
    Pending& p = pending[i];
    // "bubble" right after its "full" twin: the same work, so the same bound (the pipeline is left out).
    if (p.layout.recompute_bubble && i > 0) {
      Layout twin = p.layout;
      twin.recompute_bubble = false;
      twin.recompute_ahead = 1;
      for (size_t j = i; j-- > 0 && i - j <= 2;)  // "bubble" (and "bubble+2a") follow their "full" twin
        if (pending[j].layout == twin) {
          p.bound = pending[j].bound;
          break;
        }
      if (p.bound > 0) continue;
    }
    p.bound = predict_step(w, p.layout, cluster, links[p.links], false, &cache).step;
  }
  std::stable_sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) { return a.bound < b.bound; });
  std::map<MemoryKey, std::vector<OverPoint>> over;  // (micro-batch, recomputation) found over memory
  std::set<std::vector<int64_t>> bubble_over;         // "bubble" layouts (R right before B) found over memory
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, bool, int64_t>, double> floors;
  std::map<std::tuple<int64_t, int64_t, bool, int64_t, bool, bool, int64_t>,
           std::pair<BlockOptions, std::vector<ChunkMix>>> frontiers;  // per-op recomputation's, by what sets them
  std::vector<Candidate>& top = out.top;
  // Better: a shorter step, or within rounding of it less memory (layouts that differ only in what
  // the model cannot tell apart, e.g. the micro-batch of a compute-bound step, rank by memory).
  constexpr double kTie = 1e-9;
  const auto better = [](const Candidate& a, const Candidate& b) {
    if (a.cost.step < b.cost.step * (1 - kTie)) return true;
    if (a.cost.step > b.cost.step * (1 + kTie)) return false;
    return a.planned_bytes < b.planned_bytes;
  };
  const auto kth = [&] { return int64_t(top.size()) < top_k ? INFINITY : top.back().cost.step * (1 + kTie); };
  // The step of a layout simulated (memoised: the recomputation choice and the inferred over-memory
  // points below ask again).
  const auto simulated = [&](const Layout& x, size_t li) {
    ++st.costed;
    return predict_step(w, x, cluster, links[li], true, &cache);
  };
  // A layout over memory rules out a larger micro-batch with no more recomputation, as the search
  // costing in bound order always found it: only where its simulated step was within the K-th best
  // of that moment (else the search passed over it without estimating its memory). With shortcuts
  // that step is left unsimulated until a layout the point would rule out asks (resolve).
  const auto inferred = [&](std::vector<OverPoint>& points, const Layout& x) {
    for (OverPoint& q : points) {
      if (q.state < 0 || x.micro_batch < q.micro_batch || saving(x) > q.saving) continue;
      if (q.state == 0) q.state = simulated(q.layout, q.links).step > q.kth ? -1 : 1;
      if (q.state > 0) return true;
    }
    return false;
  };
  for (const Pending& p : pending) {
    const double kth_now = kth();
    if (p.bound > kth_now) break;
    Layout l = p.layout;
    std::vector<OverPoint>& known = over[memory_key(l)];
    // Over-memory points are recorded for recompute_layers = 0 (in bisection mode: once no k fits
    // either), so they rule out only what they cover.
    const bool plain = l.recompute_layers == 0 && l.recompute_ops.empty();  // no recomputation per layer
    // R further ahead holds more than R right before B: over memory where its twin is (which comes
    // first: the same bound, enumerated before it). Never in the result either way, so not estimated.
    if (space.shortcuts && l.recompute_bubble && l.recompute_ahead > 1) {
      Layout twin = l;
      twin.recompute_ahead = 1;
      if (bubble_over.count(layout_key(twin))) {
        ++st.over_memory_inferred;
        continue;
      }
    }
    if (plain && inferred(known, l)) {
      ++st.over_memory_inferred;
      if (l.recompute_bubble && l.recompute_ahead == 1) bubble_over.insert(layout_key(l));
      continue;
    }
    // The layout's simulated cost, when first needed. Without shortcuts first, as the search always
    // did: a layout slower than the K-th best is passed over before its memory is estimated. With
    // them the memory comes first (most layouts costed here are over memory, and an estimate costs
    // far less than a simulation); where the simulation would have passed over the layout, the
    // estimates made are dropped unused, so the result is the same.
    std::optional<Candidate> simulated_l;
    const auto cost = [&]() -> const Candidate& {
      if (!simulated_l) simulated_l = Candidate{l, simulated(l, p.links), {}, 0};
      return *simulated_l;
    };
    const auto slower = [&] { return cost().cost.step > kth_now; };
    if (!space.shortcuts && slower()) continue;
    const auto over_memory = [&](int64_t micro_batch, int saving_level, bool record) {
      ++st.over_memory;
      if (l.recompute_bubble && l.recompute_ahead == 1) bubble_over.insert(layout_key(l));
      if (!record) return;
      OverPoint q{micro_batch, saving_level, 0, l, p.links, kth_now};
      if (simulated_l || !space.shortcuts) q.state = slower() ? -1 : 1;
      if (q.state >= 0) known.push_back(std::move(q));
    };
    const double parameters = *std::max_element(cache.stages(w, l).parameters.begin(),
                                                cache.stages(w, l).parameters.end());  // predict_step's
    if (static_bytes(l, parameters) > usable) {  // over before any activation
      over_memory(1, 2, true);  // every micro-batch and recomputation of this layout
      continue;
    }
    Candidate c{l, {}, {}, 0};
    // The exact estimate first (most layouts that fail, fail there), then the trainer's validation.
    std::string why;
    try {
      const auto planned = [&](const MemoryUse& m) { return cluster.host_memory ? m.total : m.device; };
      // The floor is the same for every schedule, exchange and recomputation of the degrees, ZeRO-1,
      // dtype and micro-batch (MemoryUse): once over, their estimates are not asked (a shortcut).
      const auto floor_key = std::make_tuple(l.dp, l.tp, l.pp, l.vpp, l.cp, l.sp, l.zero, l.bf16, l.micro_batch);
      const auto floor = floors.find(floor_key);
      const bool floor_over = space.shortcuts && floor != floors.end() && floor->second > usable;
      if (floor_over) {
        c.planned_bytes = std::numeric_limits<int64_t>::max();
      } else {
        if (checks.memory) c.memory = memory_of(l);
        c.planned_bytes = planned(c.memory);
        floors[floor_key] = double(cluster.host_memory ? c.memory.floor_total : c.memory.floor_device);
      }
      if (double(c.planned_bytes) > usable) {
        // The least recomputation per layer that fits (plan/recompute_choice.h): more blocks of each
        // chunk recomputed in full, never all (that is model.recompute = "full", a layout of its own).
        // None can when the floor every recomputation needs is over (a shortcut: the bisections
        // below would find every estimate over).
        const bool hopeless = space.shortcuts && (floor_over || double(cluster.host_memory ? c.memory.floor_total
                                                                                          : c.memory.floor_device) > usable);
        const bool choose = space.recompute_layers && !space.recompute_layers_every && !space.recompute_ops_every &&
                            checks.memory && l.recompute != Recompute::Full && plain && !hopeless;
        const int64_t most = choose ? max_chunk_blocks(cache.stages(w, l).cut, mc.n_layer) : 0;
        MemoryUse fitting;
        const auto fits = [&](const Layout& lk) {
          const MemoryUse m = memory_of(lk);
          if (double(planned(m)) > usable) return false;
          fitting = m;  // the last that fits is the least (bisection ends on it)
          return true;
        };
        // Per op (recompute "none" only: the trainer takes ops only there): the frontier of mixes,
        // all kept (index 0) and all in full (model.recompute = "full", a layout of its own) left out.
        const bool per_op = choose && l.recompute == Recompute::None && !space.recompute_op_sets.empty();
        Layout chosen = l;
        bool found = false;
        if (per_op) {
          // The options and their frontier depend on what a block's work and bytes do: cached.
          const auto key = std::make_tuple(l.micro_batch, l.tp, l.sp, l.cp, l.cp_ring, l.bf16, most);
          auto it = frontiers.find(key);
          if (it == frontiers.end()) {
            BlockOptions opts = block_options(w, l, cluster, links[p.links], space.recompute_op_sets);
            std::vector<ChunkMix> front = chunk_frontier(opts, most);
            it = frontiers.emplace(key, std::make_pair(std::move(opts), std::move(front))).first;
          }
          const BlockOptions& b = it->second.first;
          const std::vector<ChunkMix>& mixes = it->second.second;
          const auto mixed = [&](size_t i) { return with_mix(l, b, mixes[i].counts, int64_t(mixes[i].last)); };
          const RecomputeChoice k = least_recompute_layers(1, int64_t(mixes.size()) - 1, [&](int64_t i) {
            return fits(mixed(size_t(i)));
          });
          if ((found = k.layers >= 0)) chosen = mixed(size_t(k.layers));
        }
        // Whole blocks only: the least k in full. With op sets too, the faster of the two (the bytes
        // that order the frontier are not the peak, so a mix the frontier dropped may fit where the
        // ones kept do not: op sets then never do worse than whole blocks).
        const MemoryUse per_op_fit = fitting;
        const RecomputeChoice k = least_recompute_layers(1, most - 1, [&](int64_t layers) {
          Layout lk = l;
          lk.recompute_layers = layers;
          return fits(lk);
        });
        if (!found && k.layers < 0) {
          over_memory(l.micro_batch, saving(l), plain);
          continue;
        }
        if (slower()) continue;  // passed over as the layout itself (its estimates unused)
        if (k.layers >= 0) {
          Layout lk = l;
          lk.recompute_layers = k.layers;
          const bool faster = !found || predict_step(w, lk, cluster, links[p.links], true, &cache).step <
                                            predict_step(w, chosen, cluster, links[p.links], true, &cache).step;
          if (faster) chosen = lk, found = true;
          else fitting = per_op_fit;
        } else {
          fitting = per_op_fit;
        }
        ++st.recompute_chosen;
        l = chosen;
        c = Candidate{l, predict_step(w, l, cluster, links[p.links], true, &cache), fitting, 0};
        c.planned_bytes = planned(c.memory);
        if (c.cost.step > kth_now) continue;
      } else {
        if (slower()) continue;
        c.cost = cost().cost;
      }
      why = checks.invalid ? checks.invalid(l) : "";
    } catch (const Error& e) {
      if (slower()) continue;  // the search passed over it before estimating
      why = e.what();
    }
    if (!why.empty()) {
      ++st.refused;
      if (st.first_refusal.empty()) st.first_refusal = describe(l) + ": " + why;
      continue;
    }
    if (space.best_micro_batch_only) {
      const auto same = std::find_if(top.begin(), top.end(), [&](const Candidate& x) {
        Layout a = x.layout, b = l;
        a.micro_batch = b.micro_batch = 0;
        a.recompute_layers = b.recompute_layers = 0;
        a.recompute_ops.clear(), b.recompute_ops.clear();
        return a == b;
      });
      if (same != top.end()) {
        if (!better(c, *same)) continue;
        top.erase(same);
      }
    }
    top.insert(std::upper_bound(top.begin(), top.end(), c, better), c);
    if (int64_t(top.size()) > top_k) top.pop_back();
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tessera::plan

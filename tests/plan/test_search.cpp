// Tests plan/search.h with checks given here (tests/app/test_plan_command.cpp runs it with the
// trainer's own): every layout it returns fits the ranks, the grid's and the schedule generator's
// rules and the memory; the branch and bound returns what the exhaustive search does; refusals and
// memory are honoured and counted; per-op recomputation chosen by the dynamic programme equals
// every mix enumerated, and prices each op set as the memory model and the cost model count it.
#include "plan/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/memory.h"
#include "model/recompute_ops.h"
#include "model/stage_cut.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/process_grid.h"
#include "plan/recompute_choice.h"

namespace tessera::plan {
namespace {

Workload small_llama() {
  ModelConfig m;
  m.preset = "llama";
  m.vocab_size = 4096;
  m.n_layer = 8;
  m.n_head = 8;
  m.n_kv_head = 2;
  m.n_embd = 512;
  m.max_seq_len = 512;
  return {resolve(m), 512, 32};
}

// Memory like the trainer's in shape: the parameters' share (16 bytes each, ZeRO-1 sharding the
// moments) and activations that grow with the micro-batch and shrink with recomputation (per
// block: recompute_layers of each chunk's blocks in full) and cp.
PlanChecks stub_checks(const Workload& w) {
  const double params = double(model_memory(w.model, ModelMemoryLayout{}).parameters);
  const double layers = double(w.model.n_layer);
  PlanChecks c;
  c.invalid = [](const Layout&) { return std::string(); };
  c.memory = [params, layers](const Layout& l) {
    const double shards = double(l.dp * l.cp);
    const double statics = params / double(l.tp * l.pp) * (l.zero ? 8 + 12 / shards : 16);
    const double base = l.recompute == Recompute::Full ? 1 : l.recompute == Recompute::Selective ? 2 : 4;
    const double blocks = layers / double(l.pp * l.vpp);  // a chunk's
    const double full = l.recompute == Recompute::Full ? 0 : std::min(blocks, double(l.recompute_layers));
    const double act = double(l.micro_batch) * (full + (blocks - full) * base) / blocks;
    const double bytes = statics + 20.0 * (1 << 20) * act / double(l.cp * l.tp);
    return MemoryUse{int64_t(bytes), int64_t(bytes) + 1};
  };
  return c;
}

ClusterSpec node(double memory_mib) {
  ClusterSpec c = preset("h100-sxm-80g");
  c.devices_per_node = 4;
  c.device_memory = memory_mib * (1 << 20);
  c.usable_memory_fraction = 1.0;
  return c;
}

void expect_valid(const Workload& w, const ClusterSpec& c, int64_t ranks, const Candidate& x) {
  const Layout& l = x.layout;
  EXPECT_EQ(l.ranks(), ranks) << describe(l);
  GridLimits g{w.model.n_head, w.model.kv_heads(), w.model.n_layer, l.vpp, w.seq_len, w.model.vocab_size,
               w.model.ffn_hidden, l.sp};
  EXPECT_NO_THROW(validate_grid({l.tp, l.cp, l.pp, l.dp}, ranks, g)) << describe(l);
  EXPECT_EQ(w.global_batch % (l.micro_batch * l.dp), 0) << describe(l);
  if (l.pp > 1) {
    EXPECT_NO_THROW(check_pipeline_schedule(l.pp, l.vpp, w.micro_batches(l), l.schedule)) << describe(l);
  }
  EXPECT_TRUE(l.vpp == 1 || l.schedule == PipelineKind::Interleaved) << describe(l);
  EXPECT_LE(double(x.planned_bytes), c.usable_memory()) << describe(l);
  EXPECT_NEAR(x.cost.step, predict_step(w, l, c).step, 1e-12 * x.cost.step) << describe(l);
}

TEST(Search, EveryLayoutReturnedIsValidAndFits) {
  const Workload w = small_llama();
  for (int64_t ranks : {1, 2, 4, 8}) {
    const ClusterSpec c = node(700);
    const PlanResult r = search_layouts(w, c, ranks, {}, stub_checks(w), 20);
    ASSERT_FALSE(r.top.empty()) << ranks;
    for (size_t i = 0; i < r.top.size(); ++i) {
      expect_valid(w, c, ranks, r.top[i]);
      if (i > 0) {
        EXPECT_LE(r.top[i - 1].cost.step, r.top[i].cost.step * (1 + 1e-9));
      }
    }
    EXPECT_GT(r.stats.layouts, int64_t(r.top.size()));
    EXPECT_LE(r.stats.costed, r.stats.layouts);
  }
}

// The branch and bound (costing in the order of a lower bound, stopping when none left can enter
// the top K) returns the exhaustive search's top K: asking for every layout costs them all.
TEST(Search, BranchAndBoundEqualsTheExhaustiveSearch) {
  const Workload w = small_llama();
  const ClusterSpec c = node(300);  // some layouts do not fit
  for (bool one_mb : {true, false}) {
    SearchSpace space;
    space.best_micro_batch_only = one_mb;
    const PlanResult all = search_layouts(w, c, 8, space, stub_checks(w), 1000000);
    const PlanResult top = search_layouts(w, c, 8, space, stub_checks(w), 7);
    ASSERT_EQ(top.top.size(), 7u);
    EXPECT_GT(all.top.size(), 7u);
    // Every layout simulated, or found over memory (with the shortcuts, before any simulation), or
    // inferred over; without the shortcuts every one not inferred is simulated.
    EXPECT_GE(all.stats.costed + all.stats.over_memory + all.stats.over_memory_inferred, all.stats.layouts);
    SearchSpace plain = space;
    plain.shortcuts = false;
    const PlanResult every = search_layouts(w, c, 8, plain, stub_checks(w), 1000000);
    EXPECT_EQ(every.stats.costed + every.stats.over_memory_inferred, every.stats.layouts);
    EXPECT_LT(top.stats.costed, all.stats.costed);
    for (size_t i = 0; i < top.top.size(); ++i) {
      EXPECT_NEAR(top.top[i].cost.step, all.top[i].cost.step, 1e-12 * all.top[i].cost.step) << i;
      EXPECT_EQ(top.top[i].layout, all.top[i].layout) << describe(top.top[i].layout) << " vs "
                                                        << describe(all.top[i].layout);
    }
    if (one_mb) {  // one micro-batch per layout
      for (size_t i = 0; i < all.top.size(); ++i)
        for (size_t j = i + 1; j < all.top.size(); ++j) {
          Layout a = all.top[i].layout, b = all.top[j].layout;
          a.micro_batch = b.micro_batch = 0;
          EXPECT_FALSE(a == b) << describe(all.top[i].layout);
        }
    }
  }
}

// Recomputation per layer: the bisection's least model.recompute_layers (plan/recompute_choice.h)
// gives the same top layouts as enumerating every k as a layout of its own, and under a tight budget
// some of them recompute part of their blocks.
TEST(Search, RecomputeLayersEqualBruteForce) {
  const Workload w = small_llama();
  // One rank's parameters, gradients and moments (16 bytes each), then room for activations: at one
  // sequence a micro-batch 80 MiB without recomputation, 20 MiB in full (stub_checks).
  const double statics = 16.0 * double(model_memory(w.model, ModelMemoryLayout{}).parameters) / (1 << 20);
  const double tight = statics + 30;  // "selective" (40 MiB) over, "full" (20 MiB) fits
  for (double mib : {tight, statics + 130, statics + 2000}) {
    const ClusterSpec c = node(mib);
    for (int64_t ranks : {1, 2, 4}) {
      SearchSpace bisect, every;
      every.recompute_layers_every = true;
      const PlanResult a = search_layouts(w, c, ranks, bisect, stub_checks(w), 40);
      const PlanResult b = search_layouts(w, c, ranks, every, stub_checks(w), 40);
      ASSERT_EQ(a.top.size(), b.top.size()) << mib << " MiB, " << ranks << " ranks";
      for (size_t i = 0; i < a.top.size(); ++i) {
        EXPECT_EQ(a.top[i].layout, b.top[i].layout) << describe(a.top[i].layout) << " vs " << describe(b.top[i].layout);
        EXPECT_NEAR(a.top[i].cost.step, b.top[i].cost.step, 1e-12 * b.top[i].cost.step);
        EXPECT_EQ(a.top[i].planned_bytes, b.top[i].planned_bytes);
      }
      EXPECT_GT(b.stats.layouts, a.stats.layouts);
      if (mib == tight && ranks == 1) {
        // One rank, a budget between "full" and "none": the fastest recomputes only some blocks.
        EXPECT_GT(a.stats.recompute_chosen, 0);
        ASSERT_FALSE(a.top.empty());
        EXPECT_GT(a.top[0].layout.recompute_layers, 0) << describe(a.top[0].layout);
        // Each chosen k is the least that fits: one block fewer does not.
        for (const Candidate& x : a.top)
          if (x.layout.recompute_layers > 0) {
            Layout fewer = x.layout;
            --fewer.recompute_layers;
            EXPECT_GT(double(stub_checks(w).memory(fewer).device), c.usable_memory()) << describe(x.layout);
            EXPECT_GT(x.cost.recompute, 0);
          }
      }
    }
  }
  SearchSpace off;
  off.recompute_layers = false;
  for (const Candidate& x : search_layouts(w, node(tight), 1, off, stub_checks(w), 40).top)
    EXPECT_EQ(x.layout.recompute_layers, 0);
}

// What the checks refuse never comes back, and is counted; memory likewise.
TEST(Search, RefusalsAndMemoryAreHonoured) {
  const Workload w = small_llama();
  PlanChecks checks = stub_checks(w);
  checks.invalid = [](const Layout& l) { return l.dp > 1 ? std::string("no data parallelism today") : ""; };
  const PlanResult r = search_layouts(w, node(700), 4, {}, checks, 10);
  ASSERT_FALSE(r.top.empty());
  for (const Candidate& x : r.top) EXPECT_EQ(x.layout.dp, 1) << describe(x.layout);
  EXPECT_GT(r.stats.refused, 0);
  EXPECT_NE(r.stats.first_refusal.find("no data parallelism today"), std::string::npos);

  // Host memory (CPU ranks): the estimate's total is what must fit.
  ClusterSpec host = node(700);
  host.host_memory = true;
  for (const Candidate& x : search_layouts(w, host, 4, {}, stub_checks(w), 10).top)
    EXPECT_EQ(x.planned_bytes, x.memory.total);

  // A device too small for any layout: nothing, and the factorizations ruled out by their
  // parameters alone are counted.
  const PlanResult none = search_layouts(w, node(1), 4, {}, stub_checks(w), 10);
  EXPECT_TRUE(none.top.empty());
  EXPECT_GT(none.stats.degree_sets_too_big, 0);
}

// Memory from the exact model (model/memory.h model_memory): the parameters' share as stub_checks,
// then the largest chunk's training peak (fp32 activations) with the layout's policy per layer as
// the trainer takes it (model.recompute_layers of each chunk in full, then its op sets).
PlanChecks exact_checks(const Workload& w) {
  const double params = double(model_memory(w.model, ModelMemoryLayout{}).parameters);
  PlanChecks c;
  c.invalid = [](const Layout&) { return std::string(); };
  c.memory = [w, params](const Layout& l) {
    const double shards = double(l.dp * l.cp);
    const double statics = params / double(l.tp * l.pp) * (l.zero ? 8 + 12 / shards : 16);
    const int64_t n = w.model.n_layer;
    const std::vector<StageSpec> cut = l.pp * l.vpp > 1 ? cut_stages(w.model, w.seq_len, l.pp, l.vpp)
                                                        : std::vector<StageSpec>{StageSpec{0, n, true, true}};
    const std::vector<std::string> names = recompute_ops_layers(l, cut, n);
    int64_t peak = 0;
    for (const StageSpec& chunk : cut) {
      ModelMemoryLayout m;
      m.batch = l.micro_batch;
      m.seq_len = w.seq_len / l.cp;
      m.tp = l.tp;
      m.sequence_parallel = l.sp;
      m.recompute = l.recompute;
      m.stage = chunk;
      m.full_layers = l.recompute == Recompute::Full ? 0 : l.recompute_layers;
      m.recompute_ops = names.empty() ? std::vector<RecomputeOps>{} : recompute_ops_policy({}, names, n);
      peak = std::max(peak, model_memory(w.model, m).training_peak);
    }
    const double bytes = statics + 4.0 * double(peak);
    return MemoryUse{int64_t(bytes), int64_t(bytes) + 1};
  };
  return c;
}

// The shortcuts (SearchSpace::shortcuts: simulations and estimates memoised, memory before the
// simulation, over-memory points resolved when first asked) return the plain branch and bound's top
// K, with fewer simulations where layouts are over memory; with every layout asked for, the same.
TEST(Search, ShortcutsLeaveTheResultAsItIs) {
  const Workload w = small_llama();
  int64_t fewer = 0;
  // Also an estimate that is not monotone in the micro-batch (micro-batch 2 over every device): a
  // layout over memory rules out larger micro-batches only where the plain search found it so.
  PlanChecks odd = exact_checks(w);
  odd.memory = [exact = exact_checks(w).memory](const Layout& l) {
    MemoryUse m = exact(l);
    if (l.micro_batch == 2) m.device = m.total = int64_t(1) << 50;
    return m;
  };
  for (const PlanChecks& checks : {exact_checks(w), odd})
  for (double mib : {150.0, 300.0, 700.0})
    for (int64_t ranks : {1, 8})
      for (const auto& [k, one_mb] : std::vector<std::pair<int64_t, bool>>{{3, true}, {3, false}, {1000000, true}}) {
          SearchSpace fast, plain;
          fast.best_micro_batch_only = plain.best_micro_batch_only = one_mb;
          fast.recompute_op_sets = plain.recompute_op_sets = default_recompute_op_sets();
          plain.shortcuts = false;
          const PlanResult a = search_layouts(w, node(mib), ranks, fast, checks, k);
          const PlanResult b = search_layouts(w, node(mib), ranks, plain, checks, k);
          ASSERT_EQ(a.top.size(), b.top.size()) << mib << " MiB, " << ranks << " ranks, top " << k;
          for (size_t i = 0; i < a.top.size(); ++i) {
            EXPECT_EQ(a.top[i].layout, b.top[i].layout) << describe(a.top[i].layout) << " vs " << describe(b.top[i].layout);
            EXPECT_EQ(a.top[i].cost.step, b.top[i].cost.step);
            EXPECT_EQ(a.top[i].planned_bytes, b.top[i].planned_bytes);
          }
          EXPECT_LE(a.stats.costed, b.stats.costed);
          fewer += a.stats.costed < b.stats.costed;
        }
  EXPECT_GT(fewer, 0);
}

// Per-op recomputation: the dynamic programme's choice (the frontier of mixes of keep, each op set
// and full per block, bisected with the memory estimate) gives the top layouts' steps of
// enumerating every mix as a layout of its own, on budgets between "full" and "none" at one
// micro-batch ("selective" with every model.recompute_layers), on 1 and 2 ranks (pp 2 included); on
// some budget the best mixes op sets and is faster than the best "selective" and "full" layouts.
TEST(Search, RecomputeOpsEqualBruteForce) {
  const Workload w = small_llama();
  const PlanChecks checks = exact_checks(w);
  Layout none;
  none.micro_batch = 4;
  Layout full = none;
  full.recompute = Recompute::Full;
  const double lo = double(checks.memory(full).device), hi = double(checks.memory(none).device);
  ASSERT_LT(lo, hi);
  bool mixed = false;
  for (double f : {0.1, 0.35, 0.6, 0.85}) {
    const ClusterSpec c = node((lo + f * (hi - lo)) / (1 << 20));
    for (int64_t ranks : {1, 2}) {
      SearchSpace dp, every;
      dp.micro_batch = every.micro_batch = 4;
      dp.bf16 = every.bf16 = {false};
      dp.max_vpp = every.max_vpp = 2;
      // (4 of the 6 sets: brute force over 8 blocks and 6 options is already 4,752 layouts a layout)
      const std::vector<RecomputeOps> sets = default_recompute_op_sets();
      dp.recompute_op_sets = every.recompute_op_sets = {sets[0], sets[1], sets[2], sets[3]};
      every.recompute_ops_every = true;
      every.recompute_layers_every = true;  // and "selective" with every k
      const PlanResult a = search_layouts(w, c, ranks, dp, checks, 8);
      const PlanResult b = search_layouts(w, c, ranks, every, checks, 8);
      const std::string what = std::to_string(f) + " of the way, " + std::to_string(ranks) + " ranks";
      ASSERT_EQ(a.top.size(), b.top.size()) << what;
      for (size_t i = 0; i < a.top.size(); ++i) {
        EXPECT_NEAR(a.top[i].cost.step, b.top[i].cost.step, 1e-9 * b.top[i].cost.step)
            << what << ": " << describe(a.top[i].layout) << " vs " << describe(b.top[i].layout);
        EXPECT_LE(double(a.top[i].planned_bytes), c.usable_memory());
      }
      EXPECT_GT(b.stats.layouts, a.stats.layouts);
      if (a.top.empty() || a.top[0].layout.recompute_ops.empty()) continue;
      // The best mixes op sets: faster than the best "selective" (with its least k) and "full".
      SearchSpace sel = dp, whole = dp;
      sel.recompute = {Recompute::Selective};
      whole.recompute = {Recompute::Full};
      const PlanResult rs = search_layouts(w, c, ranks, sel, checks, 1);
      const PlanResult rf = search_layouts(w, c, ranks, whole, checks, 1);
      if ((rs.top.empty() || a.top[0].cost.step < rs.top[0].cost.step) &&
          (rf.top.empty() || a.top[0].cost.step < rf.top[0].cost.step))
        mixed = true;
    }
  }
  EXPECT_TRUE(mixed);  // on some budget
}

// What one op set costs: chunk_time's recomputation adds each op's forward time as the forward
// prices it and the FLOPs of model/memory.h recompute_ops_cost; the memory model frees exactly
// recompute_ops_cost's bytes from what a block keeps.
TEST(Search, OpSetsArePricedByRecomputeOpsCost) {
  const Workload w = small_llama();
  const ClusterSpec c = node(1000);
  Layout l;
  l.micro_batch = 2;
  const GroupLinks links = group_links(l, c);
  const StageSpec block{0, 1, false, false};
  const ChunkTime keep = chunk_time(w, l, c, links, block);
  ModelMemoryLayout m;
  m.batch = 2;
  m.seq_len = w.seq_len;
  double previous = 0;
  for (const RecomputeOps& o : default_recompute_op_sets()) {
    Layout x = l;
    x.recompute_ops = {o};
    const ChunkTime t = chunk_time(w, x, c, links, block);
    const RecomputeOpsCost cost = recompute_ops_cost(w.model, m, o);
    EXPECT_NEAR(t.flops - keep.flops, cost.gemm_flops + cost.attention_flops, 1e-9 * keep.flops) << recompute_ops_name(o);
    EXPECT_GT(t.recompute, 0) << recompute_ops_name(o);
    EXPECT_NEAR(t.b() - keep.b(), block_recompute_seconds(w, l, c, links, o, false), 1e-15);
    ModelMemoryLayout mo = m;
    mo.recompute_ops = {o};
    mo.stage = StageSpec{0, 1, true, false};  // (a stage from layer 0 holds the embedding)
    ModelMemoryLayout mk = m;
    mk.stage = mo.stage;
    EXPECT_EQ(model_memory(w.model, mk).activations - model_memory(w.model, mo).activations, cost.elements_saved)
        << recompute_ops_name(o);
    previous = t.recompute;
  }
  // "all" reruns everything but the output projection and the MLP's last GEMM: less than full.
  EXPECT_LT(previous, block_recompute_seconds(w, l, c, links, {}, true));
}

TEST(Search, SpaceRestrictsTheChoices) {
  const Workload w = small_llama();
  SearchSpace space;
  space.bf16 = {true};
  space.recompute = {Recompute::None};
  space.micro_batch = 2;
  space.schedules = {PipelineKind::GPipe};
  space.max_tp = 2;
  for (const Candidate& x : search_layouts(w, node(1000), 8, space, stub_checks(w), 50).top) {
    EXPECT_TRUE(x.layout.bf16);
    EXPECT_EQ(x.layout.recompute, Recompute::None);
    EXPECT_EQ(x.layout.micro_batch, 2);
    EXPECT_LE(x.layout.tp, 2);
    if (x.layout.pp > 1) {
      EXPECT_EQ(x.layout.schedule, PipelineKind::GPipe);
    }
  }
}

// With full recomputation on pp > 1 the search also tries "bubble" and "bubble" with R two
// micro-batches ahead (model.recompute_ahead = 2), each costed by its own schedule; without
// space.recompute_ahead only the first.
TEST(Search, BubbleRecomputationTriesRAhead) {
  const Workload w = small_llama();
  SearchSpace space;
  space.bf16 = {true};
  space.recompute = {Recompute::Full};
  space.micro_batch = 2;
  space.schedules = {PipelineKind::ZeroBubbleH1};
  space.max_tp = 1, space.max_cp = 1;
  const PlanResult with = search_layouts(w, node(100000), 4, space, stub_checks(w), 1000);
  int ahead = 0, bubble = 0;
  for (const Candidate& x : with.top) {
    if (!x.layout.recompute_bubble) continue;
    ++bubble;
    if (x.layout.recompute_ahead == 2) {
      ++ahead;
      Layout one = x.layout;
      one.recompute_ahead = 1;
      EXPECT_NEAR(x.cost.step, predict_step(w, x.layout, node(100000)).step, 1e-9 * x.cost.step);
      EXPECT_NE(predict_step(w, one, node(100000)).step, x.cost.step) << describe(x.layout);
    }
  }
  EXPECT_GT(ahead, 0);
  EXPECT_GT(bubble, ahead);
  space.recompute_ahead = false;
  const PlanResult without = search_layouts(w, node(100000), 4, space, stub_checks(w), 1000);
  EXPECT_EQ(with.stats.layouts - without.stats.layouts, ahead);
  for (const Candidate& x : without.top) EXPECT_EQ(x.layout.recompute_ahead, 1);
}

}  // namespace
}  // namespace tessera::plan

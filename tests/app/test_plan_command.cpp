// Tests app/plan_command.h: the planner with the trainer's own checks. Every layout it proposes
// passes the trainer's validation and fits the device by the trainer's memory estimate, and its
// config reads back unchanged; GPT-2 124M on 8 H100s plans data parallel, a model too large for one
// device plans tensor or pipeline parallel; `tessera plan` end to end: the table, --explain,
// --emit-config (whose file `tessera train` then runs on 2 ranks), and its errors.
#include "app/plan_command.h"

#include <gtest/gtest.h>

#include <cmath>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "app/memory_check.h"
#include "app/trainer.h"
#include "app/training_data.h"
#include "kernels/exec.h"
#include "parallel/tp_compression.h"
#include "plan/calibrate.h"
#include "cli_testing.h"
#include "error_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace testing;

const std::string kConfigs = std::string(TESSERA_TEST_DATA_DIR) + "/../../configs/";

// A small model with room for every axis: 4 heads (2 KV), 4 layers, T = 64.
constexpr const char* kSmall = R"(
[model]
preset = "llama"
n_layer = 4
n_head = 4
n_kv_head = 2
n_embd = 64

[data]
digits = 2
val_examples = 16

[train]
steps = 2
global_batch = 16
seq_len = 64
eval_every = 0
eval_batches = 1

[log]
every = 1
progress = "lines"
)";

// LLaMA-2 13B's shape (Touvron et al. 2023): 40 layers, 5120 wide, 40 heads, SwiGLU 13824.
constexpr const char* k13B = R"(
[model]
preset = "llama"
vocab_size = 32000
n_layer = 40
n_head = 40
n_embd = 5120
ffn_hidden = 13824
max_seq_len = 4096

[train]
global_batch = 512
seq_len = 4096
)";

Config parse(const std::string& text) { return parse_config_string(text, "test.toml"); }

plan::ClusterSpec local(int64_t ranks) {
  plan::LocalMachine m;
  m.ranks = ranks;
  m.memory_available = 4.0 * (int64_t{1} << 30);
  m.peak_flops_fp32 = 100e9;
  return plan::local_cluster(m);
}

plan::PlanResult plan_for(const Config& cfg, int64_t ranks, const plan::ClusterSpec& c, int64_t top = 10,
                          plan::SearchSpace space = {}) {
  return plan::search_layouts(workload_of(cfg), c, ranks, space, trainer_checks(cfg, ranks), top);
}

// What `tessera train` checks before it starts, and the memory estimate against the device.
void expect_trainer_accepts(const Config& base, const plan::ClusterSpec& cluster, int64_t ranks,
                            const plan::Candidate& x) {
  const Config c = apply_layout(base, x.layout);
  const std::string what = plan::describe(x.layout);
  const Config back = parse_config_string(to_toml(c), "emitted.toml");  // to_toml -> the loader, unchanged
  EXPECT_EQ(back, c) << what;
  const ModelConfig mc = resolve(to_model_config(c, data_vocab_size(c)));
  EXPECT_NO_THROW(check_supported(c)) << what;
  EXPECT_NO_THROW(validate_layout(c, mc, ranks)) << what;
  if (c.parallel.pp > 1) {
    EXPECT_NO_THROW(validate_pipeline(c, x.layout.dp)) << what;
  }
  MemoryLayout m;
  m.tp = x.layout.tp;
  m.dp = x.layout.dp;
  const MemoryEstimate e = estimate_training_memory(c, data_vocab_size(c), m);
  const int64_t planned = cluster.host_memory ? e.total() : e.allocator_bytes();
  EXPECT_EQ(planned, x.planned_bytes) << what;
  EXPECT_LE(double(planned), cluster.usable_memory()) << what;
}

TEST(PlanCommand, EveryPlannedLayoutPassesTheTrainersChecksAndFits) {
  const Config small = parse(kSmall);
  for (int64_t ranks : {1, 2, 4, 8}) {
    plan::SearchSpace space;
    space.best_micro_batch_only = false;
    const plan::PlanResult r = plan_for(small, ranks, local(ranks), 40, space);
    ASSERT_FALSE(r.top.empty()) << ranks;
    bool tp = false, pp = false, cp = false;
    for (const plan::Candidate& x : r.top) {
      expect_trainer_accepts(small, local(ranks), ranks, x);
      tp |= x.layout.tp > 1, pp |= x.layout.pp > 1, cp |= x.layout.cp > 1;
    }
    if (ranks == 8) {
      EXPECT_TRUE(tp || pp || cp);  // not only dp among 40
    }
  }
  const Config gpt2 = load_config(kConfigs + "gpt2-124m.toml");
  for (const plan::Candidate& x : plan_for(gpt2, 16, plan::preset("h100-sxm-80g"), 20).top)
    expect_trainer_accepts(gpt2, plan::preset("h100-sxm-80g"), 16, x);
}

// Recomputation per layer with the trainer's own memory estimate: on a budget between "full" and
// "none", the plan recomputes the least number of blocks that fits (one fewer does not), and train
// accepts it.
TEST(PlanCommand, RecomputesTheLeastLayersThatFit) {
  const Config small = parse(kSmall);
  const plan::PlanChecks checks = trainer_checks(small, 1);
  plan::Layout l;
  l.micro_batch = 16;
  const double none = double(checks.memory(l).total);
  l.recompute = Recompute::Full;
  const double full = double(checks.memory(l).total);
  ASSERT_LT(full, none);
  plan::ClusterSpec c = local(1);
  c.usable_memory_fraction = 1;
  c.device_memory = (none + full) / 2;
  plan::SearchSpace space;
  space.micro_batch = 16;
  space.bf16 = {false};
  space.recompute = {Recompute::None, Recompute::Full};
  const plan::PlanResult r = plan_for(small, 1, c, 5, space);
  ASSERT_FALSE(r.top.empty());
  const plan::Candidate& best = r.top.front();
  EXPECT_EQ(best.layout.recompute, Recompute::None) << plan::describe(best.layout);
  ASSERT_GT(best.layout.recompute_layers, 0) << plan::describe(best.layout);
  EXPECT_LT(best.layout.recompute_layers, 4);
  expect_trainer_accepts(small, c, 1, best);
  plan::Layout fewer = best.layout;
  --fewer.recompute_layers;
  EXPECT_GT(double(checks.memory(fewer).total), c.usable_memory());
  EXPECT_EQ(apply_layout(small, best.layout).model.recompute_layers, best.layout.recompute_layers);
  EXPECT_EQ(layout_of(apply_layout(small, best.layout), 1), best.layout);
  EXPECT_NE(plan::describe(best.layout).find("none+" + std::to_string(best.layout.recompute_layers) + "f"),
            std::string::npos);
}

// At cluster scale, in simulation (scripts/bench/plan_megatron.py, docs/planning.md "Against published
// layouts"): the published Megatron-LM layouts of Narayanan et al. 2021, Table 1, on the A100 preset
// pass the trainer's checks, and the predicted throughput, counted as the paper counts it (its
// equation 3, recomputation included), lies within 25% of the published per-GPU TFLOP/s.
// The lossy options are the user's: the planner prices what a config sets and never sets them
// itself. model.activation_compression = "int8": every planned layout keeps it without
// recomputation (the trainer refuses both in one block), its planned memory is the trainer's
// estimate with the compressed activations (expect_trainer_accepts) and below the same layout's
// without. parallel.tp_comm_compression = "int8": a tp 2 + sp layout's predicted tp bytes drop,
// but not to int8's (C + 4) / 4C of them (the embedding's, the head's and the loss's stay exact),
// and its tp time with them. A config without either plans neither.
TEST(PlanCommand, PricesTheConfigsCompressionAndNeverChoosesIt) {
  const Config plain = parse(kSmall);
  Config act = plain;
  act.model.activation_compression = "int8";
  const plan::PlanChecks plain_checks = trainer_checks(plain, 2);
  const plan::PlanResult r = plan_for(act, 2, local(2), 20);
  ASSERT_FALSE(r.top.empty());
  for (const plan::Candidate& x : r.top) {
    expect_trainer_accepts(act, local(2), 2, x);
    EXPECT_EQ(apply_layout(act, x.layout).model.activation_compression, "int8");
    EXPECT_EQ(x.layout.recompute, Recompute::None);
    EXPECT_EQ(x.layout.recompute_layers, 0);
    EXPECT_LT(x.memory.device, plain_checks.memory(x.layout).device) << plan::describe(x.layout);
  }
  for (const plan::Candidate& x : plan_for(plain, 2, local(2), 20).top) {
    const Config c = apply_layout(plain, x.layout);
    EXPECT_EQ(c.model.activation_compression, "none");
    EXPECT_EQ(c.parallel.tp_comm_compression, "none");
    EXPECT_EQ(c.parallel.tp_comm_compression_forward, "");
    EXPECT_EQ(c.parallel.tp_comm_compression_backward, "");
  }
  Config tpc = plain;
  tpc.parallel.tp_comm_compression = "int8";
  plan::Layout l;
  l.tp = 2;
  l.sp = true;
  l.micro_batch = 4;
  const auto tp_traffic = [&](const Config& c) {
    for (const plan::GroupTraffic& g : plan::predict_step(workload_of(c), l, local(2)).groups)
      if (g.group == "tp") return g;
    return plan::GroupTraffic{};
  };
  const plan::GroupTraffic exact = tp_traffic(plain), int8 = tp_traffic(tpc);
  ASSERT_GT(exact.bytes, 0);
  const double factor = tp_bytes_factor(TpCompressionMode::Int8, plain.model.n_embd);
  EXPECT_LT(int8.bytes, exact.bytes);
  EXPECT_GT(int8.bytes, factor * exact.bytes);
  EXPECT_LT(int8.seconds, exact.seconds);
}

TEST(PlanCommand, PublishedMegatronLayoutsArePredictedNearTheirThroughput) {
  struct Row {
    int64_t heads, hidden, layers, tp, pp, gpus, batch;
    double tflops;
  };
  for (const Row& r : {Row{80, 10240, 60, 8, 4, 1024, 1792, 140}, Row{96, 12288, 80, 8, 8, 1536, 2304, 148}}) {
    const std::string text = "[model]\npreset = \"gpt2\"\nvocab_size = 51200\nn_layer = " + std::to_string(r.layers) +
                             "\nn_head = " + std::to_string(r.heads) + "\nn_embd = " + std::to_string(r.hidden) +
                             "\nmax_seq_len = 2048\nrecompute = \"full\"\n\n[train]\nglobal_batch = " +
                             std::to_string(r.batch) + "\nseq_len = 2048\ndtype = \"bf16\"\nmicro_batch = 1\n\n"
                             "[parallel]\ntp = " + std::to_string(r.tp) + "\npp = " + std::to_string(r.pp) + "\n";
    const Config cfg = parse(text);
    const plan::ClusterSpec a100 = plan::preset("a100-80g");
    const plan::Layout l = layout_of(cfg, r.gpus);
    EXPECT_EQ(l.dp, r.gpus / (r.tp * r.pp));
    EXPECT_EQ(trainer_checks(cfg, r.gpus).invalid(l), "");
    const plan::StepCost s = plan::predict_step(workload_of(cfg), l, a100);
    const double b = double(r.batch), L = double(r.layers), h = double(r.hidden);
    const double megatron_flops = 96 * b * 2048 * L * h * h * (1 + 2048 / (6 * h) + 51200 / (16 * L * h));
    const double tflops = megatron_flops / (double(r.gpus) * s.step) / 1e12;
    EXPECT_NEAR(tflops, r.tflops, 0.25 * r.tflops) << r.layers << " layers on " << r.gpus;
  }
}

// Refusals come from the trainer: a config whose micro-batch rules exclude pipelines with too few
// micro-batches is planned without them, and the checks' messages are the trainer's.
TEST(PlanCommand, TrainerChecksRefuseWhatTrainRefuses) {
  const Config small = parse(kSmall);
  const plan::PlanChecks checks = trainer_checks(small, 4);
  plan::Layout l;
  l.dp = 1, l.pp = 4, l.micro_batch = 8;  // 2 micro-batches per step under 1f1b with pp 4
  EXPECT_NE(checks.invalid(l).find("fewer than parallel.pp = 4"), std::string::npos) << checks.invalid(l);
  l = plan::Layout{};
  l.tp = 4;  // 2 KV heads over tp 4: replicated, accepted
  EXPECT_EQ(checks.invalid(l), "");
  l.tp = 3, l.dp = 1;
  const std::string heads = trainer_checks(small, 3).invalid(l);
  EXPECT_NE(heads.find("model.n_head = 4 is not divisible by parallel.tp = 3"), std::string::npos) << heads;
  const plan::MemoryUse m = checks.memory(plan::Layout{});
  EXPECT_GT(m.device, 0);
  EXPECT_GT(m.total, m.device);  // host items: batches, the checkpoint copy, the runtime
}

struct PlanDir {
  fs::path dir = temp_dir("plan");
  fs::path config = dir / "small.toml";
  PlanDir() { std::ofstream(config) << kSmall; }
};

// Per-op recomputation with the trainer's own checks (kSmall on 1 rank, micro-batch 16): on budgets
// between "full" and "none" the search's best step is brute force's over every mix of keep, the op
// sets and full per block (and "selective" with every model.recompute_layers); every layout it
// returns passes train's checks, fits by train's estimate and reads back through layout_of. This
// model is too small for op sets to win (each elementwise op costs the op latency): whole blocks
// and "selective" do (and with "none" the only policy the search chose whole blocks: see
// docs/planning.md). A layout with op sets by hand passes train's checks, reads back, and its
// config trains (1 rank, 2 steps).
TEST(PlanCommand, ChoosesOpSetsPerBlockAsBruteForceDoesAndTrainAcceptsThem) {
  const Config small = parse(kSmall);
  const plan::PlanChecks checks = trainer_checks(small, 1);
  plan::Layout l;
  l.micro_batch = 16;
  const double none = double(checks.memory(l).total);
  l.recompute = Recompute::Full;
  const double full = double(checks.memory(l).total);
  ASSERT_LT(full, none);
  const std::vector<RecomputeOps> sets = recompute_op_sets_for(small);
  ASSERT_EQ(sets.size(), plan::default_recompute_op_sets().size());
  plan::SearchSpace space;
  space.micro_batch = 16;
  space.bf16 = {false};
  space.recompute_op_sets = sets;
  const auto budget = [&](double f) {
    plan::ClusterSpec c = local(1);
    c.usable_memory_fraction = 1;
    c.device_memory = full + f * (none - full);
    return c;
  };
  for (double f : {0.15, 0.4, 0.65, 0.9}) {
    const plan::ClusterSpec c = budget(f);
    plan::SearchSpace every = space;
    every.recompute_ops_every = true;
    every.recompute_layers_every = true;  // and "selective" with every k
    const plan::PlanResult a = plan_for(small, 1, c, 3, space);
    const plan::PlanResult b = plan_for(small, 1, c, 3, every);
    ASSERT_FALSE(a.top.empty()) << f;
    ASSERT_EQ(a.top.size(), b.top.size()) << f;
    EXPECT_NEAR(a.top[0].cost.step, b.top[0].cost.step, 1e-9 * b.top[0].cost.step)
        << f << ": " << plan::describe(a.top[0].layout) << " vs " << plan::describe(b.top[0].layout);
    for (const plan::Candidate& x : a.top) {
      expect_trainer_accepts(small, c, 1, x);
      EXPECT_EQ(layout_of(apply_layout(small, x.layout), 1), x.layout) << plan::describe(x.layout);
    }
  }
  // The search picked none here (see above), so an op-set layout by hand: every op once, the GEMM
  // reruns included, the last block only its norms.
  plan::Layout ops;
  ops.micro_batch = 16;
  const RecomputeOps all = RecomputeOps::all(), nim = sets[3], nam = sets[4];
  ops.recompute_ops = {all, nim, nam, sets[0]};
  const plan::ClusterSpec roomy = budget(1.0);
  plan::Candidate best{ops, plan::predict_step(workload_of(small), ops, roomy), checks.memory(ops), 0};
  best.planned_bytes = best.memory.total;
  EXPECT_EQ(checks.invalid(ops), "");
  expect_trainer_accepts(small, roomy, 1, best);
  EXPECT_EQ(layout_of(apply_layout(small, ops), 1), ops);
  EXPECT_EQ(plan::recompute_text(ops), "none+1nqaim+1nim+1nam+1n");
  const Config planned = apply_layout(small, best.layout);
  EXPECT_EQ(planned.model.recompute_ops_layers.size(), 4u);
  PlanDir d;
  const fs::path out = d.dir / "ops.toml";
  std::ofstream(out) << to_toml(planned);
  const RunResult train = run_tessera({"train", out.string(), "--run-dir", (d.dir / "run").string()}, d.dir);
  EXPECT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("done: 2 steps"), std::string::npos) << train.output;
}

// The search's shortcuts (plan/search.h SearchSpace::shortcuts: memoised simulations and estimates,
// schedules generated once for the estimates, memory before simulation, the floor every
// recomputation needs) leave the top K as the plain branch and bound finds it with the trainer's own
// checks: the same layouts, steps and memory, on 1, 2 and 4 ranks and on budgets from "nothing
// fits" to "everything fits" (op sets offered, "bubble" and pipelines included).
TEST(PlanCommand, ShortcutsLeaveTheResultAsItIs) {
  const Config small = parse(kSmall);
  plan::Layout l;
  l.micro_batch = 16;
  const double none = double(trainer_checks(small, 1).memory(l).device);
  int64_t fewer_simulated = 0, compared = 0;
  for (int64_t ranks : {1, 2, 4})
    for (double f : {0.05, 0.2, 0.35, 0.5, 0.75, 1.2}) {
      plan::ClusterSpec c = local(ranks);
      c.host_memory = false;
      c.usable_memory_fraction = 1;
      c.device_memory = f * none;
      plan::SearchSpace fast, plain;
      fast.recompute_op_sets = plain.recompute_op_sets = recompute_op_sets_for(small);
      plain.shortcuts = false;
      const plan::PlanResult a =
          plan::search_layouts(workload_of(small), c, ranks, fast, trainer_checks(small, ranks), 8);
      const plan::PlanResult b =
          plan::search_layouts(workload_of(small), c, ranks, plain, trainer_checks(small, ranks, false), 8);
      const std::string where = std::to_string(ranks) + " ranks, " + std::to_string(f) + " x none";
      ASSERT_EQ(a.top.size(), b.top.size()) << where;
      for (size_t i = 0; i < a.top.size(); ++i) {
        EXPECT_EQ(a.top[i].layout, b.top[i].layout)
            << where << ": " << plan::describe(a.top[i].layout) << " vs " << plan::describe(b.top[i].layout);
        EXPECT_EQ(a.top[i].cost.step, b.top[i].cost.step) << where;
        EXPECT_EQ(a.top[i].planned_bytes, b.top[i].planned_bytes) << where;
        ++compared;
      }
      EXPECT_EQ(a.stats.layouts, b.stats.layouts);
      EXPECT_LE(a.stats.costed, b.stats.costed) << where;
      fewer_simulated += a.stats.costed < b.stats.costed;
    }
  EXPECT_GT(compared, 60);
  EXPECT_GT(fewer_simulated, 0);
}

// recompute_floor: what the layout needs however it recomputes. It is at most the estimate of every
// recomputation of the layout (none, selective, full, bubble, every model.recompute_layers, op sets)
// and of every schedule, and under ZeRO-1 holds the moments gathered for a checkpoint.
TEST(PlanCommand, RecomputeFloorIsBelowEveryRecomputation) {
  const Config small = parse(kSmall);
  const plan::PlanChecks checks = trainer_checks(small, 4);
  const std::vector<RecomputeOps> sets = recompute_op_sets_for(small);
  int64_t checked = 0;
  for (const auto& [dp, pp] : std::vector<std::pair<int64_t, int64_t>>{{4, 1}, {2, 2}, {1, 4}})
    for (int64_t zero : {0, 1})
      for (int64_t mb : {1, 4}) {
        plan::Layout base;
        base.dp = dp, base.pp = pp, base.zero = dp > 1 ? zero : 0, base.micro_batch = mb;
        if (pp > 1) base.schedule = PipelineKind::OneFOneB;
        const plan::MemoryUse own = checks.memory(base);
        ASSERT_GT(own.floor_device, 0);
        EXPECT_LT(own.floor_device, own.device);
        EXPECT_LT(own.floor_total, own.total);
        std::vector<plan::Layout> variants;
        for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
          plan::Layout x = base;
          x.recompute = r;
          variants.push_back(x);
          if (r == Recompute::Full && pp > 1) {
            x.recompute_bubble = true, variants.push_back(x);
            x.recompute_ahead = 2, variants.push_back(x);  // R two micro-batches ahead: held longer
          }
        }
        for (int64_t k = 1; k < 4 / pp; ++k) {
          plan::Layout x = base;
          x.recompute_layers = k;
          variants.push_back(x);
        }
        for (const RecomputeOps& o : sets) {
          plan::Layout x = base;
          x.recompute_ops = {o};
          variants.push_back(x);
        }
        if (pp > 1)
          for (PipelineKind k : {PipelineKind::GPipe, PipelineKind::ZeroBubbleH1}) {
            plan::Layout x = base;
            x.schedule = k;
            variants.push_back(x);
          }
        for (const plan::Layout& x : variants) {
          const plan::MemoryUse m = checks.memory(x);
          EXPECT_LE(own.floor_device, m.device) << plan::describe(x);
          EXPECT_LE(own.floor_total, m.total) << plan::describe(x);
          // The floor is the largest rank's, which may be another pipeline rank for x: each
          // bounds the other's estimate too.
          EXPECT_LE(m.floor_device, own.device) << plan::describe(x);
          EXPECT_LE(m.floor_total, own.total) << plan::describe(x);
          ++checked;
        }
        if (base.zero == 1) {  // the moments gathered: 8 bytes a parameter of the rank, at least
          plan::Layout unsharded = base;
          unsharded.zero = 0;
          EXPECT_GT(own.floor_device, checks.memory(unsharded).floor_device / 2) << plan::describe(base);
        }
      }
  EXPECT_GT(checked, 100);
}

// layout_of reads back what apply_layout wrote; --predict costs the config's own layout.
TEST(PlanCommand, PredictCostsTheConfigsOwnLayout) {
  const Config small = parse(kSmall);
  for (const plan::Candidate& x : plan_for(small, 4, local(4), 20).top)
    EXPECT_EQ(layout_of(apply_layout(small, x.layout), 4), x.layout) << plan::describe(x.layout);
  EXPECT_TRUE(throws_with([&] { layout_of(small, 4); }, {"set train.micro_batch"}));
  PlanDir d;
  const RunResult r = run_tessera({"plan", d.config.string(), "--gpus", "2", "--cluster", "local", "--predict", "--set",
                                   "parallel.pp=2", "--set", "train.micro_batch=2"},
                                  d.dir, {}, SIGINT, {"TESSERA_TEST_MEMORY_AVAILABLE=4294967296"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("layout 1: dp 1 tp 1 pp 2 vpp 1 cp 1 zero 0 1f1b mb 2 none fp32"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("predicted: step_s="), std::string::npos) << r.output;
  const RunResult bad = run_tessera({"plan", d.config.string(), "--gpus", "2", "--predict", "--set", "parallel.tp=2",
                                     "--set", "train.micro_batch=2", "--set", "model.n_head=3"},
                                    d.dir);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("error"), std::string::npos) << bad.output;
}

// GPT-2 124M fits one H100 many times over: the planner replicates it (dp 8), the gradients'
// all-reduce over NVLink hidden behind backward, rather than split it.
TEST(PlanCommand, Gpt2OnEightH100sIsDataParallel) {
  const Config gpt2 = load_config(kConfigs + "gpt2-124m.toml");
  const plan::PlanResult r = plan_for(gpt2, 8, plan::preset("h100-sxm-80g"));
  ASSERT_FALSE(r.top.empty());
  const plan::Layout& best = r.top.front().layout;
  EXPECT_EQ(best.dp, 8) << plan::describe(best);
  EXPECT_EQ(best.tp * best.pp * best.cp, 1) << plan::describe(best);
  EXPECT_TRUE(best.bf16) << plan::describe(best);
  EXPECT_LT(r.stats.seconds, 10.0);
}

// A 13B model (fp32 weights, gradients and moments: 16 bytes a parameter, 208 GB) fits no H100
// alone, nor 8 of them under ZeRO-1 alone: every layout the planner finds splits the model with
// tp or pp; on one device it finds none and says so.
TEST(PlanCommand, AModelTooLargeForOneDevicePlansTensorOrPipelineParallel) {
  const Config big = parse(k13B);
  const plan::PlanResult r = plan_for(big, 8, plan::preset("h100-sxm-80g"), 5);
  ASSERT_FALSE(r.top.empty());
  for (const plan::Candidate& x : r.top) {
    EXPECT_GT(x.layout.tp * x.layout.pp, 1) << plan::describe(x.layout);
    EXPECT_LE(double(x.planned_bytes), plan::preset("h100-sxm-80g").usable_memory());
  }
  EXPECT_LT(r.stats.seconds, 30.0);
  const plan::PlanResult one = plan_for(big, 1, plan::preset("h100-sxm-80g"), 5);
  EXPECT_TRUE(one.top.empty());
  EXPECT_EQ(one.stats.degree_sets_too_big, 1);
}

TEST(PlanCommand, PrintsTheTableAndExplainsARow) {
  PlanDir d;
  const RunResult r = run_tessera({"plan", d.config.string(), "--gpus", "4", "--cluster", "local", "--top", "5",
                                   "--explain", "2"},
                                  d.dir, {}, SIGINT, {"TESSERA_TEST_MEMORY_AVAILABLE=4294967296"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"tessera plan: ", "on 4 x local", "  #  dp  tp  pp vpp  cp", "\n  1 ", "\n  5 ",
                           "layout 2: ", "compute", "pipeline bubble", "dp reduction (exposed)", "optimizer",
                           "memory of the largest rank"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
}

// --emit-config writes the best layout as a config the trainer's loader reads back as planned, and
// `tessera train` runs it on the planned ranks.
TEST(PlanCommand, EmittedConfigTrainsUnchanged) {
  PlanDir d;
  const fs::path out = d.dir / "planned.toml";
  const RunResult r = run_tessera({"plan", d.config.string(), "--gpus", "2", "--cluster", "local", "--emit-config",
                                   out.string()},
                                  d.dir, {}, SIGINT, {"TESSERA_TEST_MEMORY_AVAILABLE=4294967296"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + out.string()), std::string::npos) << r.output;
  const Config planned = load_config(out.string());
  EXPECT_EQ(planned.parallel.dp * planned.parallel.tp * planned.parallel.pp * planned.parallel.cp, 2);
  EXPECT_GT(planned.train.micro_batch, 0);
  // Only the layout keys differ from the input config.
  Config input = load_config(d.config.string());
  input.train.name = planned.train.name;
  for (const ConfigChange& change : config_changes(input, planned)) {
    const bool layout = change.key.rfind("parallel.", 0) == 0 || change.key == "train.micro_batch" ||
                        change.key == "train.dtype" || change.key == "model.recompute" ||
                        change.key == "model.recompute_layers" || change.key == "model.recompute_ops_layers";
    EXPECT_TRUE(layout) << change.key << " " << change.before << " -> " << change.after;
  }
  const RunResult train = run_program(TESSERA_MPIEXEC, {"-n", "2", TESSERA_BINARY, "train", out.string(), "--run-dir",
                                                        (d.dir / "run").string()},
                                      d.dir);
  EXPECT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("done: 2 steps"), std::string::npos) << train.output;
}

// --calibrate on 2 ranks writes a cluster file that plans read: measured rates, the link fitted.
TEST(PlanCommand, CalibrateWritesAClusterFileThatPlansRead) {
  PlanDir d;
  const fs::path cluster = d.dir / "local.toml";
  const RunResult r = run_program(TESSERA_MPIEXEC, {"-n", "2", TESSERA_BINARY, "plan", "--calibrate", "--out",
                                                    cluster.string()},
                                  d.dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"GEMM 1024^3 per rank", "memory bandwidth per rank", "all-reduce 4096 bytes over 2 ranks",
                           "link over 2 ranks (fitted to the ring)", "wrote "})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  const plan::ClusterSpec c = plan::load_cluster(cluster.string());
  EXPECT_EQ(c.devices_per_node, 2);
  EXPECT_TRUE(c.host_memory);
  EXPECT_FALSE(c.async_progress);
  EXPECT_GT(c.peak_flops_fp32, 1e8);
  EXPECT_GT(c.intra.bandwidth, 1e7);
  EXPECT_NE(c.description.find("calibrated by `mpirun -n 2 tessera plan --calibrate`"), std::string::npos);
  EXPECT_EQ(c.device, "cpu");
  const RunResult p = run_tessera({"plan", d.config.string(), "--gpus", "2", "--cluster", cluster.string()}, d.dir);
  EXPECT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(p.output.find("on 2 x local"), std::string::npos) << p.output;
  const RunResult bad = run_tessera({"plan", "--calibrate"}, d.dir);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("give --out FILE"), std::string::npos) << bad.output;
  if (!cuda_backend_built()) {  // --device cuda is train.device's refusal in a build without CUDA
    const RunResult gpu = run_tessera({"plan", "--calibrate", "--device", "cuda", "--out", "x.toml"}, d.dir);
    EXPECT_EQ(gpu.exit_code, 1);
    EXPECT_NE(gpu.output.find("built without the CUDA backend"), std::string::npos) << gpu.output;
  }
  const RunResult typo = run_tessera({"plan", "--calibrate", "--device", "gpu", "--out", "x.toml"}, d.dir);
  EXPECT_EQ(typo.exit_code, 1);
  EXPECT_NE(typo.output.find("--device gpu: expected cpu or cuda"), std::string::npos) << typo.output;
  EXPECT_TRUE(c.gemm_rates.empty());
  // The other collectives, fitted each on its own.
  for (const char* part : {"all-gather over 2 ranks", "reduce-scatter over 2 ranks", "send/recv over 2 ranks"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  EXPECT_GT(c.intra.all_gather_bandwidth, 1e7);
  EXPECT_GT(c.intra.reduce_scatter_bandwidth, 1e7);
  EXPECT_GT(c.intra.p2p_bandwidth, 1e7);
  // With the config: also its GEMMs, at the shapes of its step, which plans then use.
  const fs::path shaped = d.dir / "shaped.toml";
  const RunResult s = run_program(TESSERA_MPIEXEC, {"-n", "2", TESSERA_BINARY, "plan", "--calibrate", d.config.string(),
                                                    "--out", shaped.string()},
                                  d.dir);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("GEMMs at the model's"), std::string::npos) << s.output;
  const plan::ClusterSpec cs = plan::load_cluster(shaped.string());
  const Config small = load_config(d.config.string());
  EXPECT_EQ(cs.gemm_rates.size(), 2 * plan::model_gemm_shapes(workload_of(small), 2).size());
  // The Linears as the model runs them, and the chain scales from the model itself run forward and
  // backward (a ratio near 1: the same work, in a chain; not pinned, the machine is shared).
  EXPECT_TRUE(plan::has_op_times(cs, plan::OpKind::LinearBackwardWeight));
  EXPECT_NE(s.output.find("the model forward + backward (micro-batch"), std::string::npos) << s.output;
  for (const double scale : {cs.chain_scale_fp32, cs.chain_scale_bf16}) {
    EXPECT_GT(scale, 0.2) << s.output;
    EXPECT_LT(scale, 20.0) << s.output;
    EXPECT_NE(scale, 1.0) << s.output;  // measured, not the default
  }
  // Measured at each micro-batch of 1, 2, 4, 8 and 16 sequences (global_batch = 16) of 64 positions.
  ASSERT_EQ(cs.chain_scales.size(), 5u) << s.output;
  for (size_t i = 0; i < cs.chain_scales.size(); ++i) {
    const plan::ChainScale& c = cs.chain_scales[i];
    EXPECT_EQ(c.tokens, int64_t(64) << i);
    for (const double scale : {c.fp32, c.bf16}) {
      EXPECT_GT(scale, 0.2) << s.output;
      EXPECT_LT(scale, 20.0) << s.output;
    }
  }
  EXPECT_EQ(cs.chain_scales[3].fp32, cs.chain_scale_fp32);  // the scalars: micro-batch 8's
  EXPECT_EQ(cs.chain_scales[3].bf16, cs.chain_scale_bf16);
  // And the model at tp 2 and at cp 2 (the 2 ranks as one group) measured over its prediction, by
  // dtype.
  for (const auto& [group, scales] : {std::pair{"tp", &cs.tp_scales}, std::pair{"cp", &cs.cp_scales}}) {
    EXPECT_NE(s.output.find(std::string("the model forward + backward at ") + group + " 2 (micro-batch 8, fp32"),
              std::string::npos) << s.output;
    ASSERT_EQ(scales->size(), 1u) << group << "\n" << s.output;
    EXPECT_EQ(scales->at(0).degree, 2);
    // No upper bound: with another test beside it on the 2 cores, the 2 ranks (one per core, so
    // they spin) wait scheduler ticks at each collective, and tp scales of 27-36 were seen.
    for (const double scale : {scales->at(0).fp32, scales->at(0).bf16}) {
      EXPECT_GT(scale, 0.2) << group << "\n" << s.output;
      EXPECT_TRUE(std::isfinite(scale)) << s.output;
      EXPECT_NE(scale, 1.0) << s.output;
    }
  }
  const RunResult ps = run_tessera({"plan", d.config.string(), "--gpus", "2", "--cluster", shaped.string()}, d.dir);
  EXPECT_EQ(ps.exit_code, 0) << ps.output;
}

// On 4 ranks the collectives are fitted on groups of 2 (two groups at once) and of 4: the file
// holds both sizes, the node's link is the 4-rank one, and a plan reads them.
TEST(PlanCommand, CalibrateOnFourRanksFitsEachGroupSize) {
  PlanDir d;
  const fs::path cluster = d.dir / "local4.toml";
  const RunResult r = run_program(TESSERA_MPIEXEC, {"-n", "4", TESSERA_BINARY, "plan", "--calibrate", "--out",
                                                    cluster.string(), "--set", "calibrate.min_seconds=0.01",
                                                    "--set", "calibrate.repeats=2", "--set",
                                                    "calibrate.gemm_size=128", "--set",
                                                    "calibrate.max_message_bytes=262144", "--set",
                                                    "calibrate.group_links=on"},
                                  d.dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"all-reduce 4096 bytes over 2 ranks (2 groups at once)",
                           "link over 2 ranks (2 groups at once) (fitted to the ring)",
                           "send/recv over 2 ranks (2 groups at once)", "all-reduce 4096 bytes over 4 ranks:",
                           "all-gather over 4 ranks", "send/recv over 4 ranks"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  const plan::ClusterSpec c = plan::load_cluster(cluster.string());
  ASSERT_EQ(c.group_links.size(), 2u);
  EXPECT_EQ(c.group_links[0].ranks, 2);
  EXPECT_EQ(c.group_links[1].ranks, 4);
  EXPECT_EQ(c.group_links[1].link, c.intra);
  for (const plan::SizedLink& l : c.group_links) {
    EXPECT_GT(l.link.bandwidth, 1e6);
    EXPECT_GT(l.link.all_gather_bandwidth, 1e6);
    EXPECT_GT(l.link.reduce_scatter_bandwidth, 1e6);
    EXPECT_GT(l.link.p2p_bandwidth, 1e6);
  }
  const RunResult p = run_tessera({"plan", d.config.string(), "--gpus", "4", "--cluster", cluster.string()}, d.dir);
  EXPECT_EQ(p.exit_code, 0) << p.output;
  // Left to itself (auto), with more ranks than cores it fits over all ranks only, saying why.
  if (std::thread::hardware_concurrency() < 4) {
    const fs::path fewer = d.dir / "auto4.toml";
    const RunResult a = run_program(TESSERA_MPIEXEC, {"-n", "4", TESSERA_BINARY, "plan", "--calibrate", "--out",
                                                      fewer.string(), "--set", "calibrate.min_seconds=0.01", "--set",
                                                      "calibrate.repeats=2", "--set", "calibrate.gemm_size=128",
                                                      "--set", "calibrate.max_message_bytes=262144"},
                                    d.dir);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_NE(a.output.find("groups of fewer ranks: not fitted (4 ranks share"), std::string::npos) << a.output;
    EXPECT_EQ(a.output.find("(2 groups at once)"), std::string::npos) << a.output;
    EXPECT_TRUE(plan::load_cluster(fewer.string()).group_links.empty());
  }
}

// A calibrated file names its device: a plan for a config on the other device is refused, naming
// the file, the key and both devices; a file that does not say (presets, older files) plans any.
TEST(PlanCommand, ACalibrationPlansOnlyForItsDevice) {
  Config cpu = parse(kSmall), cuda = cpu;
  cuda.train.device = "cuda";
  plan::ClusterSpec c = plan::preset("h100-sxm-80g");
  for (const Config* cfg : {&cpu, &cuda}) EXPECT_NO_THROW(check_cluster_device(*cfg, c, "h100-sxm-80g"));
  c.device = "cuda", c.device_name = "NVIDIA H100 (sm_90, 79.1 GiB)";
  EXPECT_NO_THROW(check_cluster_device(cuda, c, "gpu.toml"));
  EXPECT_TRUE(throws_with([&] { check_cluster_device(cpu, c, "gpu.toml"); },
                          {"--cluster gpu.toml was calibrated on cluster.device = \"cuda\" (NVIDIA H100",
                           "train.device = \"cpu\"", "--device cpu"}));
  c.device = "cpu";
  EXPECT_NO_THROW(check_cluster_device(cpu, c, "cpu.toml"));
  EXPECT_TRUE(throws_with([&] { check_cluster_device(cuda, c, "cpu.toml"); },
                          {"--cluster cpu.toml was calibrated on cluster.device = \"cpu\"", "train.device = \"cuda\""}));
}

// --set calibrate.KEY=VALUE: the calibration's sizes and times; other keys skipped; unknown keys
// and values out of range refused, naming them.
TEST(PlanCommand, CalibrationOptionsFromSet) {
  const plan::CalibrationOptions o =
      calibration_options({"train.steps=3", "calibrate.min_seconds=0.01", "calibrate.repeats = 2",
                           "calibrate.gemm_size=128", "calibrate.stream_elements=4096",
                           "calibrate.max_message_bytes=65536"},
                          2);
  EXPECT_DOUBLE_EQ(o.min_seconds, 0.01);
  EXPECT_EQ(o.repeats, 2);
  EXPECT_EQ(o.gemm_size, 128);
  EXPECT_EQ(o.stream_elements, 4096);
  EXPECT_EQ(o.max_message, 65536);
  EXPECT_EQ(calibration_options({}, 2).gemm_size, plan::CalibrationOptions{}.gemm_size);
  EXPECT_TRUE(throws_with([] { calibration_options({"calibrate.gemm=64"}, 2); },
                          {"--set calibrate.gemm=64: unknown key calibrate.gemm"}));
  EXPECT_TRUE(throws_with([] { calibration_options({"calibrate.repeats=1.5"}, 2); },
                          {"calibrate.repeats must be an integer from 1 to 1000"}));
  EXPECT_TRUE(throws_with([] { calibration_options({"calibrate.min_seconds=fast"}, 2); },
                          {"calibrate.min_seconds must be a number"}));
  EXPECT_TRUE(throws_with([] { calibration_options({"calibrate.max_message_bytes=32768"}, 4); },
                          {"calibrate.max_message_bytes must be an integer from 65536"}));
  using GL = plan::CalibrationOptions::GroupLinks;
  EXPECT_EQ(calibration_options({}, 4).group_links, GL::Auto);
  EXPECT_EQ(calibration_options({"calibrate.group_links=on"}, 4).group_links, GL::On);
  EXPECT_EQ(calibration_options({"calibrate.group_links=\"off\""}, 4).group_links, GL::Off);
  EXPECT_TRUE(throws_with([] { calibration_options({"calibrate.group_links=yes"}, 4); },
                          {"calibrate.group_links must be auto, on or off"}));
}

TEST(PlanCommand, ErrorsNameWhatIsWrong) {
  PlanDir d;
  RunResult r = run_tessera({"plan", d.config.string()}, d.dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--gpus N is required"), std::string::npos) << r.output;
  r = run_tessera({"plan", d.config.string(), "--gpus", "2", "--cluster", "b200"}, d.dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--cluster b200: no such file, and no preset of that name"), std::string::npos) << r.output;
  r = run_tessera({"plan", d.config.string(), "--gpus", "2", "--set", "cluster.inter_node_bw=3"}, d.dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("unknown key cluster.inter_node_bw"), std::string::npos) << r.output;
  r = run_tessera({"plan", d.config.string(), "--gpus", "2", "--set", "model.n_layers=3"}, d.dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("model.n_layers"), std::string::npos) << r.output;
  r = run_tessera({"plan", d.config.string(), "--gpus", "2", "--top", "3", "--explain", "9"}, d.dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--explain 9: the table has 3 rows"), std::string::npos) << r.output;
  r = run_tessera({"plan", d.config.string(), "--gpus", "2", "--gpu-memory", "lots"}, d.dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--gpu-memory lots"), std::string::npos) << r.output;
  // A cluster too small: the report says no layout fits.
  r = run_tessera({"plan", d.config.string(), "--gpus", "2", "--gpu-memory", "1MiB"}, d.dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no layout fits"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tessera

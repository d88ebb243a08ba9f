// Tests app/auto_layout.h: parallel.layout = "auto". The config rules (the planned keys refused when
// set, naming key and place), the choice sent from rank 0 read back exactly, the choice equal to the
// planner's best and accepted by the trainer's checks, every rank holding rank 0's choice (also run
// under mpiexec -n 2: AutoLayout.two_ranks), and end to end (slow): an auto run on 2 ranks resumed
// auto on 1 gives the losses of explicit runs of the same two layouts.
#include "app/auto_layout.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "app/plan_command.h"
#include "app/trainer.h"
#include "app/training_data.h"
#include "cli_testing.h"
#include "error_testing.h"
#include "mpi_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace testing;

// A small LLaMA with room for dp, tp (4 heads, 2 KV), pp (4 layers) and cp (T = 64).
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
steps = 4
global_batch = 16
seq_len = 64
eval_every = 0
eval_batches = 1

[parallel]
layout = "auto"

[log]
every = 1
progress = "lines"
)";

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config_string(text, "test.toml", overrides);
}

plan::ClusterSpec local(int64_t ranks) {
  plan::LocalMachine m;
  m.ranks = ranks;
  m.memory_available = 4.0 * (int64_t{1} << 30);
  m.peak_flops_fp32 = 100e9;
  return plan::local_cluster(m);
}

TEST(AutoLayout, PlannedKeysSetWithAutoAreRefusedNamingKeyAndPlace) {
  EXPECT_NO_THROW(parse(kSmall));
  // In the file: the key, its value and its line.
  std::string with_tp = kSmall;
  with_tp.replace(with_tp.find("layout = \"auto\"\n"), 16, "layout = \"auto\"\ntp = 2\n");
  EXPECT_TRUE(throws_with([&] { parse(with_tp); },
                          {"parallel.tp = 2 (test.toml:", "parallel.layout = \"auto\"", "remove parallel.tp"}));
  // By --set, every planned key.
  const std::vector<std::pair<std::string, std::string>> set = {
      {"parallel.dp", "2"},        {"parallel.tp", "2"},
      {"parallel.pp", "2"},        {"parallel.pp_layers", "[2,2]"},
      {"parallel.vpp", "2"},       {"parallel.pp_schedule", "\"gpipe\""},
      {"parallel.cp", "2"},        {"parallel.cp_comm", "\"allgather\""},
      {"parallel.sequence_parallel", "true"}, {"parallel.zero", "1"},
      {"model.recompute", "\"full\""}, {"model.recompute_layers", "1"}};
  ASSERT_EQ(set.size(), auto_layout_keys().size());
  for (const auto& [key, value] : set)
    EXPECT_TRUE(throws_with([&] { parse(kSmall, {key + "=" + value}); }, {key + " = ", "(--set", "parallel.layout"}))
        << key;
  // A key at its default asks for nothing (a config written in full, to_toml's, reads back);
  // the same keys with an explicit layout, and keys that are not the layout's, are fine.
  EXPECT_NO_THROW(parse(kSmall, {"parallel.tp=1", "parallel.zero=0", "model.recompute=\"none\""}));
  const Config full = parse(kSmall);
  EXPECT_EQ(parse_config_string(to_toml(full), "written.toml"), full);
  EXPECT_NO_THROW(parse(kSmall, {"parallel.layout=\"explicit\"", "parallel.tp=2"}));
  EXPECT_NO_THROW(parse(kSmall, {"parallel.bucket_mb=4", "train.micro_batch=2", "train.dtype=\"bf16\""}));
  EXPECT_TRUE(throws_with([] { parse(kSmall, {"parallel.layout=\"planned\""}); }, {"parallel.layout", "auto"}));
  EXPECT_EQ(Config{}.parallel.layout, "explicit");
  EXPECT_EQ(Config{}.parallel.cluster, "local");
}

TEST(AutoLayout, ChoiceReadsBackExactly) {
  AutoLayoutChoice c;
  c.layout.dp = 2, c.layout.tp = 2, c.layout.pp = 2, c.layout.vpp = 2, c.layout.cp = 1;
  c.layout.sp = true, c.layout.zero = 1, c.layout.schedule = PipelineKind::Interleaved;
  c.layout.micro_batch = 3, c.layout.recompute = Recompute::Selective, c.layout.bf16 = true;
  c.ranks = 8;
  c.cluster = "h100-sxm-80g (preset)";
  c.step_seconds = 0.1 + 1e-17;  // exact, not rounded to a few digits
  c.tokens_per_s = 1.0 / 3.0;
  c.memory_bytes = 123456789.0;
  c.usable_bytes = 72.0 * (int64_t{1} << 30);
  EXPECT_EQ(decode_choice(encode_choice(c)), c);
  c.layout.cp = 2, c.layout.cp_ring = false, c.layout.schedule = PipelineKind::ZeroBubbleH1;
  EXPECT_EQ(decode_choice(encode_choice(c)), c);
  // "bubble" recomputation, and with R two micro-batches ahead ("bubble2"); a choice written before
  // recompute_ahead existed reads as 1.
  c.layout.recompute = Recompute::Full, c.layout.recompute_bubble = true;
  EXPECT_EQ(decode_choice(encode_choice(c)), c);
  c.layout.recompute_ahead = 2;
  EXPECT_EQ(decode_choice(encode_choice(c)), c);
  EXPECT_NE(encode_choice(c).find(" bubble2 "), std::string::npos) << encode_choice(c);
  EXPECT_EQ(decode_choice("2 1 2 1 1 0 0 1f1b 1 1 bubble 0 - 0 4 0x1p+0 0x1p+0 0x1p+0 0x1p+0 local").layout.recompute_ahead,
            1);
  EXPECT_TRUE(throws_with([] { decode_choice("2 1 2 1 1 0 0 1f1b 1 1 bubbleX 0 - 0 4 0x1p+0 0x1p+0 0x1p+0 0x1p+0 local"); },
                          {"malformed choice"}));
  c.layout.recompute_bubble = false, c.layout.recompute_ahead = 1;
  // Op sets per block of a chunk (model.recompute_ops_layers), a block kept among them.
  c.layout.recompute = Recompute::None, c.layout.recompute_layers = 1;
  c.layout.recompute_ops = {RecomputeOps{}, RecomputeOps::all(), RecomputeOps{}, RecomputeOps::selective()};
  EXPECT_EQ(decode_choice(encode_choice(c)), c);
  EXPECT_NE(encode_choice(c).find(" none,norm+qkv+attn+mlp_in+mlp_act,none,norm+mlp_act "), std::string::npos)
      << encode_choice(c);
  EXPECT_TRUE(throws_with([] { decode_choice("1 1 1 1 1 0 0 1f1b 1 1 none 0 norm+bogus 0 1 0x1p+0 0x1p+0 0x1p+0 0x1p+0 local"); },
                          {"malformed choice"}));
  EXPECT_TRUE(throws_with([] { decode_choice("2 1 1"); }, {"malformed choice"}));
  EXPECT_TRUE(throws_with([] { decode_choice("1 1 1 1 1 0 0 1f1b 1 1 none 0 1 x 1 1 1 local"); }, {"malformed choice"}));
}

// The choice is the planner's best for the ranks, and train accepts its config as it is.
TEST(AutoLayout, ChoosesThePlannersBestAndTrainAcceptsIt) {
  const Config cfg = parse(kSmall);
  for (int64_t ranks : {1, 2, 4}) {
    const plan::ClusterSpec cluster = local(ranks);
    plan::SearchSpace space;
    space.bf16 = {false};
    const plan::PlanResult best =
        plan::search_layouts(workload_of(cfg), cluster, ranks, space, trainer_checks(cfg, ranks), 1);
    ASSERT_EQ(best.top.size(), 1u);
    const AutoLayoutChoice c = plan_auto_layout(cfg, ranks, cluster);
    EXPECT_EQ(c.layout, best.top[0].layout) << ranks;
    EXPECT_EQ(c.ranks, ranks);
    EXPECT_DOUBLE_EQ(c.step_seconds, best.top[0].cost.step);
    EXPECT_EQ(c.memory_bytes, double(best.top[0].planned_bytes));
    EXPECT_LE(c.memory_bytes, c.usable_bytes);
    const Config run = apply_auto_layout(cfg, c);
    EXPECT_EQ(run.parallel.layout, "explicit");
    EXPECT_EQ(run.parallel.dp * run.parallel.tp * run.parallel.pp * run.parallel.cp, ranks);
    EXPECT_EQ(parse_config_string(to_toml(run), "config.toml"), run);  // the run directory's config.toml
    const ModelConfig mc = resolve(to_model_config(run, data_vocab_size(run)));
    EXPECT_NO_THROW(check_supported(run));
    EXPECT_NO_THROW(validate_layout(run, mc, ranks));
    const std::string line = describe_choice(c);
    EXPECT_NE(line.find("auto layout (parallel.layout = \"auto\"): " + plan::describe(c.layout) + " on " +
                        std::to_string(ranks) + " x local"),
              std::string::npos)
        << line;
    EXPECT_NE(line.find("ms/step"), std::string::npos) << line;
  }
  // train.dtype and a given train.micro_batch bound the search; the rest is chosen.
  const AutoLayoutChoice bf16 = plan_auto_layout(parse(kSmall, {"train.dtype=\"bf16\""}), 2, local(2));
  EXPECT_TRUE(bf16.layout.bf16);
  const AutoLayoutChoice mb = plan_auto_layout(parse(kSmall, {"train.micro_batch=2"}), 2, local(2));
  EXPECT_EQ(mb.layout.micro_batch, 2);
  EXPECT_FALSE(plan_auto_layout(cfg, 2, local(2)).layout.bf16);
}

// The auto layout searches the op sets `tessera plan` offers (plan/search.h recompute_op_sets): on
// devices from "full" to beyond "none" it is the planner's best with them. A choice with op sets per
// block reads back exactly and its config (model.recompute_ops_layers) is one train accepts.
TEST(AutoLayout, SearchesOpSetsAsThePlannerDoesAndTrainAcceptsThem) {
  const fs::path dir = temp_dir("auto_layout_ops");
  int with_op_sets = 0;  // blocks with an op set over the budgets' choices
  for (double mib : {5.0, 8.0, 12.0, 16.0, 20.0, 24.0}) {
    const fs::path file = dir / "small_device.toml";
    std::ofstream(file) << "[cluster]\nbase = \"h100-sxm-80g\"\nname = \"small-device\"\n"
                        << "usable_memory_fraction = 1.0\ndevice_memory_gib = " << mib / 1024 << "\n";
    const Config cfg = parse(kSmall, {"parallel.cluster=\"" + file.string() + "\"", "train.micro_batch=16"});
    const plan::ClusterSpec cluster = auto_layout_cluster(cfg, 1);
    plan::SearchSpace space;
    space.bf16 = {false};
    space.micro_batch = 16;
    space.recompute_op_sets = recompute_op_sets_for(cfg);
    ASSERT_FALSE(space.recompute_op_sets.empty());
    const plan::PlanResult best = plan::search_layouts(workload_of(cfg), cluster, 1, space, trainer_checks(cfg, 1), 1);
    if (best.top.empty()) {
      EXPECT_THROW(plan_auto_layout(cfg, 1, cluster), Error) << mib;
      continue;
    }
    const AutoLayoutChoice c = plan_auto_layout(cfg, 1, cluster);
    EXPECT_EQ(c.layout, best.top[0].layout) << mib << " MiB: " << plan::describe(c.layout);
    EXPECT_DOUBLE_EQ(c.step_seconds, best.top[0].cost.step) << mib;
    for (const RecomputeOps& o : c.layout.recompute_ops) with_op_sets += o.any() ? 1 : 0;
  }
  // Some budget between "full" and "none" is met best by op sets (the estimate prices them).
  EXPECT_GT(with_op_sets, 0);
  // A choice with op sets per block (every op once, the GEMM reruns included; one block kept).
  const Config cfg = parse(kSmall);
  AutoLayoutChoice c = plan_auto_layout(cfg, 1, local(1));
  c.layout.recompute = Recompute::None, c.layout.recompute_layers = 0, c.layout.micro_batch = 16;
  const std::vector<RecomputeOps> sets = recompute_op_sets_for(cfg);
  c.layout.recompute_ops = {RecomputeOps::all(), sets[3], RecomputeOps{}, sets[0]};
  const AutoLayoutChoice back = decode_choice(encode_choice(c));
  EXPECT_EQ(back, c);
  const Config run = apply_auto_layout(cfg, back);
  EXPECT_EQ(run.model.recompute, "none");
  EXPECT_EQ(run.model.recompute_ops_layers,
            (std::vector<std::string>{"norm+qkv+attn+mlp_in+mlp_act", "norm+mlp_in+mlp_act", "none", "norm"}));
  EXPECT_EQ(parse_config_string(to_toml(run), "config.toml"), run);
  EXPECT_NO_THROW(check_supported(run));
  EXPECT_NO_THROW(recompute_ops_policy(run));
  EXPECT_EQ(layout_of(run, 1), c.layout);
}

TEST(AutoLayout, NothingFitsAndUnknownClustersAreErrors) {
  const Config cfg = parse(kSmall);
  plan::ClusterSpec tiny = local(2);
  tiny.device_memory = double(int64_t{1} << 20);
  EXPECT_TRUE(throws_with([&] { plan_auto_layout(cfg, 2, tiny); }, {"parallel.layout = \"auto\": no layout of 2 ranks fits",
                                                                   "parallel.cluster = \"local\""}));
  EXPECT_TRUE(throws_with([] { auto_layout_cluster(parse(kSmall, {"parallel.cluster=\"b200\""}), 2); },
                          {"parallel.cluster = \"b200\"", "h100-sxm-80g"}));
  EXPECT_EQ(auto_layout_cluster(parse(kSmall, {"parallel.cluster=\"a100-80g\""}), 8).name, "a100-80g");
  const fs::path dir = temp_dir("auto_layout_cluster");
  std::ofstream(dir / "c.toml") << "[cluster]\nbase = \"h200-141g\"\nname = \"mine\"\ndevices_per_node = 4\n";
  const plan::ClusterSpec file = auto_layout_cluster(parse(kSmall, {"parallel.cluster=\"" + (dir / "c.toml").string() + "\""}), 8);
  EXPECT_EQ(file.name, "mine");
  EXPECT_EQ(file.devices_per_node, 4);
  EXPECT_EQ(auto_layout_cluster(cfg, 3).devices_per_node, 3);  // local: one node of the ranks
}

// Every rank holds rank 0's choice (under mpiexec -n 2 as AutoLayout.two_ranks; one rank here), and
// rank 0's error reaches every rank.
TEST(AutoLayout, EveryRankAppliesRankZerosChoice) {
  MPI_Comm world = test_world();
  const int ranks = comm_size(world);
  const Config cfg = parse(kSmall, {"parallel.cluster=\"h100-sxm-80g\""});
  const AutoLayoutChoice c = choose_auto_layout(cfg, world);
  EXPECT_EQ(c, plan_auto_layout(cfg, ranks, auto_layout_cluster(cfg, ranks)));
  const std::vector<std::string> all = allgather_bytes(world, encode_choice(c));
  for (const std::string& s : all) EXPECT_EQ(s, all[0]);
  try {
    choose_auto_layout(parse(kSmall, {"parallel.cluster=\"b200\""}), world);
    ADD_FAILURE() << "no error";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cluster = \"b200\""), std::string::npos) << e.what();
  }
}

// End to end: `tessera train` with parallel.layout = "auto" on 2 ranks for 2 steps, resumed on 1
// rank for 2 more (planned again). Each part's layout is in the header and in the run directory's
// config.toml; explicit runs of those two configs give the same losses, step for step.
TEST(AutoLayoutSlow, ResumedOnAnotherRankCountPlansAgainAndContinuesAsExplicitRuns) {
  const fs::path dir = temp_dir("auto_layout_resume");
  const fs::path config = dir / "auto.toml";
  std::ofstream(config) << kSmall;
  const std::vector<std::string> env = {"TESSERA_TEST_MEMORY_AVAILABLE=4294967296"};
  const auto train = [&](int ranks, const fs::path& cfg, const fs::path& run, std::vector<std::string> extra) {
    std::vector<std::string> args = {"train", cfg.string(), "--run-dir", run.string()};
    for (const std::string& e : extra) args.push_back("--set"), args.push_back(e);
    if (ranks == 1) return run_tessera(args, dir, {}, SIGINT, env);
    args.insert(args.begin(), {"-n", std::to_string(ranks), TESSERA_BINARY});
    return run_program(TESSERA_MPIEXEC, args, dir, {}, SIGINT, env);
  };
  const fs::path a = dir / "auto_run", b = dir / "explicit_run";
  const RunResult a1 = train(2, config, a, {"train.steps=2", "checkpoint.every=2"});
  ASSERT_EQ(a1.exit_code, 0) << a1.output;
  EXPECT_NE(a1.output.find("auto layout (parallel.layout = \"auto\"): "), std::string::npos) << a1.output;
  EXPECT_NE(a1.output.find(" on 2 x local"), std::string::npos) << a1.output;
  fs::copy_file(a / "config.toml", dir / "part1.toml");
  const Config part1 = load_config((dir / "part1.toml").string());
  EXPECT_EQ(part1.parallel.layout, "explicit");
  EXPECT_EQ(part1.parallel.dp * part1.parallel.tp * part1.parallel.pp * part1.parallel.cp, 2);
  EXPECT_NE(a1.output.find(plan::describe(layout_of(part1, 2))), std::string::npos) << a1.output;

  const RunResult a2 = train(1, config, a, {"checkpoint.every=2"});
  ASSERT_EQ(a2.exit_code, 0) << a2.output;
  EXPECT_NE(a2.output.find(" on 1 x local"), std::string::npos) << a2.output;
  EXPECT_NE(a2.output.find("resumed from"), std::string::npos) << a2.output;
  fs::copy_file(a / "config.toml", dir / "part2.toml");
  const Config part2 = load_config((dir / "part2.toml").string());
  EXPECT_EQ(part2.parallel.dp * part2.parallel.tp * part2.parallel.pp * part2.parallel.cp, 1);

  const RunResult b1 = train(2, dir / "part1.toml", b, {});
  ASSERT_EQ(b1.exit_code, 0) << b1.output;
  EXPECT_EQ(b1.output.find("auto layout"), std::string::npos) << b1.output;
  const RunResult b2 = train(1, dir / "part2.toml", b, {});
  ASSERT_EQ(b2.exit_code, 0) << b2.output;
  EXPECT_NE(b2.output.find("resumed from"), std::string::npos) << b2.output;

  const std::vector<double> got = losses(a / "metrics.jsonl"), want = losses(b / "metrics.jsonl");
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got, want);
}

// End to end with op sets: on a device small enough that the planner's best recomputes ops per
// block (the first budget of a scan whose auto choice has an op set), `tessera train` with
// parallel.layout = "auto" trains that choice, and its losses equal, step for step, the explicit
// run of the config it wrote (model.recompute_ops_layers included).
TEST(AutoLayoutSlow, ChoosesOpSetsAndTrainsAsItsExplicitConfig) {
  const fs::path dir = temp_dir("auto_layout_ops_run");
  const fs::path cluster = dir / "small_device.toml", config = dir / "auto.toml";
  std::ofstream(config) << kSmall;
  bool found = false;
  for (double mib : {12.0, 16.0, 20.0}) {
    std::ofstream(cluster) << "[cluster]\nbase = \"h100-sxm-80g\"\nname = \"small-device\"\n"
                           << "usable_memory_fraction = 1.0\ndevice_memory_gib = " << mib / 1024 << "\n";
    const Config cfg = parse(kSmall, {"parallel.cluster=\"" + cluster.string() + "\"", "train.micro_batch=16"});
    const AutoLayoutChoice c = plan_auto_layout(cfg, 1, auto_layout_cluster(cfg, 1));
    for (const RecomputeOps& o : c.layout.recompute_ops) found = found || o.any();
    if (found) break;
  }
  ASSERT_TRUE(found) << "no budget of the scan chose op sets";
  const std::vector<std::string> env = {"TESSERA_TEST_MEMORY_AVAILABLE=4294967296"};
  const auto train = [&](const fs::path& cfg, const fs::path& run, std::vector<std::string> extra) {
    std::vector<std::string> args = {"train", cfg.string(), "--run-dir", run.string(), "--set", "train.steps=2"};
    for (const std::string& e : extra) args.push_back("--set"), args.push_back(e);
    return run_tessera(args, dir, {}, SIGINT, env);
  };
  const fs::path a = dir / "auto_run", b = dir / "explicit_run";
  const RunResult a1 = train(config, a, {"parallel.cluster=\"" + cluster.string() + "\"", "train.micro_batch=16"});
  ASSERT_EQ(a1.exit_code, 0) << a1.output;
  EXPECT_NE(a1.output.find("auto layout (parallel.layout = \"auto\"): "), std::string::npos) << a1.output;
  fs::copy_file(a / "config.toml", dir / "chosen.toml");
  const Config chosen = load_config((dir / "chosen.toml").string());
  EXPECT_EQ(chosen.parallel.layout, "explicit");
  bool ops = false;
  for (const std::string& l : chosen.model.recompute_ops_layers) ops = ops || l != "none";
  EXPECT_TRUE(ops) << a1.output;
  const RunResult b1 = train(dir / "chosen.toml", b, {});
  ASSERT_EQ(b1.exit_code, 0) << b1.output;
  EXPECT_EQ(b1.output.find("auto layout"), std::string::npos) << b1.output;
  const std::vector<double> got = losses(a / "metrics.jsonl"), want = losses(b / "metrics.jsonl");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace tessera

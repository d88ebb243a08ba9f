// Pipeline parallelism in the trainer: two stages under "1f1b", "gpipe", "interleaved" (two chunks
// per rank) and "zb-h1" (also with full recomputation), four stages (1f1b, zb-h1), and two stages
// with dp or tp on four ranks (zb-h1 too), train the 1-rank run's
// losses and final parameters and AdamW moments within 1e-5 (fp32, other reduction orders), for the
// tied GPT-2 preset (the last stage's copy of wte.weight is compared with the 1-rank table too) and
// LLaMA; dp 2 x tp 2 x pp 2 on eight ranks. Runs under `mpiexec -n 2`, `-n 4` and `-n 8` (ctest
// PipelineLayouts.two_ranks / four_ranks / eight_ranks, the last `slow`; the suite means nothing on
// one rank). As the layout matrix (test_layout_matrix.cpp): each layout
// trains the real Trainer on its own communicator and compares its stage's tensors with the 1-rank
// run it computed itself. PipelineTraining.* runs `tessera train` end to end under mpiexec: stop and
// resume, checkpoints crossing layouts, the validation loss and the task's accuracy, metrics.jsonl's
// pp_bytes_per_step and measured bubble (pp_bubble_fraction, per-rank busy and idle times).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "app/trainer.h"
#include "error_testing.h"
#include "layout_testing.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"
#include "trainer_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;
using testing::expect_state_near;
using testing::Trained;
using testing::train;

struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> sets;
  std::vector<std::string> model = {};  // settings of the 1-rank reference too (a deeper model)
};

// The number `key` of the last metrics.jsonl record that has it; -1 when none does.
double last_value(const fs::path& metrics, const std::string& key) {
  const std::string text = testing::read_file(metrics), field = "\"" + key + "\": ";
  const auto at = text.rfind(field);
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + field.size()));
}

// The array of numbers `key` of the last record that has it; empty when none does.
std::vector<double> last_array(const fs::path& metrics, const std::string& key) {
  const std::string text = testing::read_file(metrics), field = "\"" + key + "\": [";
  const auto at = text.rfind(field);
  std::vector<double> v;
  if (at == std::string::npos) return v;
  std::istringstream in(text.substr(at + field.size(), text.find(']', at) - at - field.size()));
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stod(item));
  return v;
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// 5 steps of 4 micro-batches of 2 (at least pp of them per step for 1f1b, also under dp 2).
const std::vector<std::string> kBase = {"train.steps=5", "train.global_batch=8", "train.micro_batch=2"};
std::vector<std::string> pp(const std::string& schedule) {
  return {"parallel.pp=2", "parallel.pp_schedule=\"" + schedule + "\""};
}

std::vector<Layout> layouts() {
  return {{"pp2_1f1b", 2, pp("1f1b")},
          {"pp2_gpipe", 2, pp("gpipe")},
          {"dp2pp2_1f1b", 4, pp("1f1b")},
          {"dp2pp2_gpipe_zero", 4, pp("gpipe") + std::vector<std::string>{"parallel.zero=1"}},
          {"tp2pp2sp_1f1b", 4, pp("1f1b") + std::vector<std::string>{"parallel.tp=2", "parallel.sequence_parallel=true"}},
          // Interleaved: 4 blocks in pp x vpp = 4 chunks, rank 0 holding the first and third.
          {"pp2vpp2_interleaved", 2, pp("interleaved") + std::vector<std::string>{"parallel.vpp=2"}, {"model.n_layer=4"}},
          {"pp4_1f1b", 4, {"parallel.pp=4", "parallel.pp_schedule=\"1f1b\""}, {"model.n_layer=4"}},
          // zb-h1: each backward split into B (input gradient) and W (the linear layers' weight
          // gradients, deferred); with full recomputation (re-run in B); the data-parallel buckets
          // started by the last W; four stages, where ranks 1-3 hold Ws back.
          {"pp2_zbh1", 2, pp("zb-h1")},
          {"pp2_zbh1_recompute", 2, pp("zb-h1") + std::vector<std::string>{"model.recompute=\"full\""}},
          {"dp2pp2_zbh1_zero", 4, pp("zb-h1") + std::vector<std::string>{"parallel.zero=1"}},
          {"tp2pp2_zbh1", 4, pp("zb-h1") + std::vector<std::string>{"parallel.tp=2"}},
          {"pp4_zbh1", 4, {"parallel.pp=4", "parallel.pp_schedule=\"zb-h1\""}, {"model.n_layer=4"}},
          {"dp2pp2vpp2_interleaved", 4, pp("interleaved") + std::vector<std::string>{"parallel.vpp=2"},
           {"model.n_layer=4", "train.global_batch=16"}},
          // Every axis at once on eight ranks (ctest PipelineLayouts.eight_ranks, `slow`).
          {"dp2tp2pp2_1f1b", 8, pp("1f1b") + std::vector<std::string>{"parallel.tp=2"}}};
}

void expect_pipelines_equal_one_rank(const std::string& preset) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  const std::string config = testing::layout_config(preset);
  int ran = 0;
  for (const Layout& l : layouts()) {
    if (l.ranks != world.size()) continue;
    ++ran;
    const Trained one = train(parse_config_string(config, preset + ".toml", kBase + l.model), MPI_COMM_NULL);
    ASSERT_EQ(one.losses.size(), 5u);
    const std::string what = preset + " " + l.name + " (rank " + std::to_string(world.rank()) + ")";
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    Trained got = train(parse_config_string(config, preset + ".toml", kBase + l.model + l.sets), comm.comm());
    testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
    EXPECT_LT(got.trainer->params().size(), one.trainer->params().size()) << what << ": a stage holds part of the model";
    expect_state_near(*got.trainer, *one.trainer, 1e-5, what);
  }
  EXPECT_GT(ran, 0) << "no pipeline layout of " << world.size() << " ranks";
}

// model.recompute and model.recompute_layers on two stages (1f1b): the same kernels on the same
// values, so the losses and the final parameters and moments equal the run without recomputation
// bit for bit.
void expect_recomputation_changes_nothing(const std::string& preset) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  if (world.size() != 2) return;
  const std::string config = testing::layout_config(preset);
  const std::vector<std::string> base = kBase + pp("1f1b") + std::vector<std::string>{"model.n_layer=4"};
  const auto run = [&](const std::vector<std::string>& more) {
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    return train(parse_config_string(config, preset + ".toml", base + more), comm.comm());
  };
  const Trained none = run({});
  for (const std::vector<std::string>& policy : {std::vector<std::string>{"model.recompute=\"selective\""},
                                                 {"model.recompute=\"full\""},
                                                 {"model.recompute=\"selective\"", "model.recompute_layers=1"}}) {
    const Trained got = run(policy);
    const std::string what = preset + " " + ::testing::PrintToString(policy) + " (rank " + std::to_string(world.rank()) + ")";
    EXPECT_EQ(got.losses, none.losses) << what;
    const FullOptimizerState gs = got.trainer->optimizer().gather_state(), ns = none.trainer->optimizer().gather_state();
    const Tensor g[3] = {got.trainer->params().flat_params(), gs.state.exp_avg, gs.state.exp_avg_sq};
    const Tensor n[3] = {none.trainer->params().flat_params(), ns.state.exp_avg, ns.state.exp_avg_sq};
    for (int f = 0; f < 3; ++f) {
      ASSERT_EQ(g[f].numel(), n[f].numel()) << what;
      for (int64_t i = 0; i < g[f].numel(); ++i)
        ASSERT_EQ(g[f].ptr<float>()[i], n[f].ptr<float>()[i]) << what << ", state " << f << " element " << i;
    }
  }
}

// model.recompute = "bubble" (the schedule's R action recomputes ahead of each backward) against
// "full" (recomputed inside the backward) on every schedule with R: the same operations on the same
// values, so the losses, the final parameters and the AdamW moments are equal bit for bit. Two
// ranks: pp2 1f1b, interleaved (vpp 2) and zb-h1, each with model.recompute_ahead 1 and 2; four:
// pp4 1f1b and zb-h1.
void expect_bubble_recomputation_equals_full(const std::string& preset) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  if (world.size() != 2 && world.size() != 4) return;  // (the eight-rank run has no case)
  const std::string config = testing::layout_config(preset);
  const std::vector<std::string> four = {"model.n_layer=4"};
  std::vector<std::pair<int, std::vector<std::string>>> cases = {
      {2, pp("1f1b") + four},
      {2, pp("interleaved") + std::vector<std::string>{"parallel.vpp=2"} + four},
      {2, pp("zb-h1") + four},
      {4, std::vector<std::string>{"parallel.pp=4", "parallel.pp_schedule=\"1f1b\""} + four},
      {4, std::vector<std::string>{"parallel.pp=4", "parallel.pp_schedule=\"zb-h1\""} + four}};
  int ran = 0;
  for (const auto& [ranks, sets] : cases) {
    if (ranks != world.size()) continue;
    ++ran;
    const auto run = [&](const std::string& policy, int64_t ahead) {
      MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
      return train(parse_config_string(config, preset + ".toml",
                                       kBase + sets +
                                           std::vector<std::string>{"model.recompute=\"" + policy + "\"",
                                                                    "model.recompute_ahead=" + std::to_string(ahead)}),
                   comm.comm());
    };
    const Trained full = run("full", 1);
    // Two ranks also with model.recompute_ahead = 2 (R's moved into earlier waits, two held).
    for (int64_t ahead : ranks == 2 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1}) {
      const Trained bubble = run("bubble", ahead);
      const std::string what = preset + " bubble (recompute_ahead " + std::to_string(ahead) + ") vs full " +
                               ::testing::PrintToString(sets) + " (rank " + std::to_string(world.rank()) + ")";
      EXPECT_EQ(bubble.losses, full.losses) << what;
      const FullOptimizerState bs = bubble.trainer->optimizer().gather_state(),
                               fs = full.trainer->optimizer().gather_state();
      const Tensor b[3] = {bubble.trainer->params().flat_params(), bs.state.exp_avg, bs.state.exp_avg_sq};
      const Tensor f[3] = {full.trainer->params().flat_params(), fs.state.exp_avg, fs.state.exp_avg_sq};
      for (int k = 0; k < 3; ++k) {
        ASSERT_EQ(b[k].numel(), f[k].numel()) << what;
        for (int64_t i = 0; i < b[k].numel(); ++i)
          ASSERT_EQ(b[k].ptr<float>()[i], f[k].ptr<float>()[i]) << what << ", state " << k << " element " << i;
      }
    }
  }
  EXPECT_GT(ran, 0) << "no bubble-recomputation case of " << world.size() << " ranks";
}

}  // namespace

TEST(PipelineLayouts, Gpt2BubbleRecomputationEqualsFull) { expect_bubble_recomputation_equals_full("gpt2"); }
TEST(PipelineLayouts, LlamaBubbleRecomputationEqualsFull) { expect_bubble_recomputation_equals_full("llama"); }
TEST(PipelineLayouts, Gpt2RecomputationChangesNothing) { expect_recomputation_changes_nothing("gpt2"); }
TEST(PipelineLayouts, LlamaRecomputationChangesNothing) { expect_recomputation_changes_nothing("llama"); }

// `tessera train` under mpiexec on two stages (tied gpt2, gpipe): stopped after 2 of 4 steps, saved,
// resumed by the same command (the tied copies checked again after the resume), the 4 losses, the
// final validation loss, the task's accuracy and the answers shown are the 1-rank run's;
// metrics.jsonl has pp_bytes_per_step and the measured bubble.
TEST(PipelineTraining, TwoStagesStopResumeAndEqualTheOneRankRun) {
  const fs::path dir = testing::temp_dir("pp_cli");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  const std::vector<std::string> base = {"--set", "train.steps=4", "--set", "train.global_batch=8", "--set",
                                         "train.micro_batch=2", "--set", "log.every=1"};
  auto r = testing::train_run(dir, "tiny.toml", "one", 1, base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string one_output = r.output;
  const std::vector<double> want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 4u);
  const std::vector<std::string> pp = testing::with(
      base, {"--set", "parallel.pp=2", "--set", "parallel.pp_schedule=\"gpipe\"", "--set", "train.exit_after_steps=2"});
  // The header's parameter count is the whole model's (the stages' summed, the tied copy once).
  const auto count = [](const std::string& out) {
    const auto at = out.find("model gpt2: ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find(" parameters", at) - at);
  };
  const std::string whole = count(r.output);
  ASSERT_FALSE(whole.empty()) << r.output;
  r = testing::train_run(dir, "tiny.toml", "pp", 2, pp);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("x pp 2 (gpipe)"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output), whole) << r.output;
  r = testing::train_run(dir, "tiny.toml", "pp", 2, pp);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  // The final evaluation's validation loss and task accuracy (greedy answers through the stages):
  // the last stage's, passed over the pipeline to rank 0.
  const double want_val = last_value(dir / "one" / "metrics.jsonl", "val_loss");
  ASSERT_GT(want_val, 0);
  EXPECT_NEAR(last_value(dir / "pp" / "metrics.jsonl", "val_loss"), want_val, 1e-5 * want_val);
  const double want_acc = last_value(dir / "one" / "metrics.jsonl", "val_accuracy");
  ASSERT_GE(want_acc, 0);
  EXPECT_EQ(last_value(dir / "pp" / "metrics.jsonl", "val_accuracy"), want_acc);
  // The answers shown: the same text.
  const auto answers = [](const std::string& out) {
    const auto at = out.rfind("eval  step 4:");
    return at == std::string::npos ? std::string() : out.substr(at, out.find(" [", at) - at);
  };
  EXPECT_FALSE(answers(r.output).empty()) << r.output;
  EXPECT_EQ(answers(r.output), answers(one_output));
  testing::expect_losses_near(testing::losses(dir / "pp" / "metrics.jsonl"), want, 1e-5, "pp2 gpipe, stopped and resumed");
  EXPECT_GT(testing::last_metric(dir / "pp" / "metrics.jsonl", "pp_bytes_per_step"), 0);
  EXPECT_EQ(testing::last_metric(dir / "one" / "metrics.jsonl", "pp_bytes_per_step"), -1);
  // The measured bubble (parallel/pipeline_timing.h): a fraction, and per rank busy, idle and
  // waiting times that add up as defined (idle = step - busy).
  const double bubble = last_value(dir / "pp" / "metrics.jsonl", "pp_bubble_fraction");
  EXPECT_GT(bubble, 0);
  EXPECT_LT(bubble, 1);
  const double step_s = last_value(dir / "pp" / "metrics.jsonl", "pp_step_s");
  const std::vector<double> busy = last_array(dir / "pp" / "metrics.jsonl", "pp_busy_s"),
                            idle = last_array(dir / "pp" / "metrics.jsonl", "pp_idle_s"),
                            wait = last_array(dir / "pp" / "metrics.jsonl", "pp_wait_s");
  ASSERT_EQ(busy.size(), 2u);
  ASSERT_EQ(idle.size(), 2u);
  ASSERT_EQ(wait.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_GT(busy[r], 0);
    EXPECT_NEAR(busy[r] + idle[r], step_s, 1e-6 * step_s);  // printed with 9 digits
    EXPECT_LE(wait[r], idle[r] * (1 + 1e-6));
  }
  EXPECT_NEAR(bubble, (idle[0] + idle[1]) / (2 * step_s), 1e-6);
  EXPECT_EQ(last_value(dir / "one" / "metrics.jsonl", "pp_bubble_fraction"), -1);
  // Memory peaks per pipeline rank: each stage holds part of the parameters (the last one the tied
  // table's copy as well), so each holds less than the whole model.
  const std::vector<double> whole_params = last_array(dir / "one" / "metrics.jsonl", "peak_bytes_params"),
                            stage_params = last_array(dir / "pp" / "metrics.jsonl", "peak_bytes_params");
  ASSERT_EQ(whole_params.size(), 1u);
  ASSERT_EQ(stage_params.size(), 2u);
  for (double b : stage_params) {
    EXPECT_GT(b, 0);
    EXPECT_LT(b, whole_params[0]);
  }
  // Each stage's whole peak: rank 0's is memory_peak_bytes, and each at least its parameters' peak.
  const std::vector<double> stage_total = last_array(dir / "pp" / "metrics.jsonl", "peak_bytes_by_stage");
  ASSERT_EQ(stage_total.size(), 2u);
  EXPECT_EQ(stage_total[0], last_value(dir / "pp" / "metrics.jsonl", "memory_peak_bytes"));
  for (size_t r = 0; r < 2; ++r) EXPECT_GT(stage_total[r], stage_params[r]);
  fs::remove_all(dir);
}

// Checkpoints cross between layouts: a 1-rank checkpoint after step 1 resumes on two stages (1f1b;
// the tied copy filled from the stored table and checked equal to the first stage's), which train
// steps 2 and 3 and save; one rank resumes that and trains step 4. The four losses are the
// uninterrupted 1-rank run's.
TEST(PipelineTraining, CheckpointsCrossBetweenOneRankAndStages) {
  const fs::path dir = testing::temp_dir("pp_ckpt");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  const std::vector<std::string> base = {"--set", "train.steps=4", "--set", "train.global_batch=8", "--set",
                                         "train.micro_batch=2", "--set", "log.every=1"};
  auto r = testing::train_run(dir, "tiny.toml", "one", 1, base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 4u);
  r = testing::train_run(dir, "tiny.toml", "mixed", 1, testing::with(base, {"--set", "train.exit_after_steps=1"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::train_run(dir, "tiny.toml", "mixed", 2,
                         testing::with(base, {"--set", "parallel.pp=2", "--set", "train.exit_after_steps=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 1"), std::string::npos) << r.output;
  r = testing::train_run(dir, "tiny.toml", "mixed", 1, base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 3"), std::string::npos) << r.output;
  testing::expect_losses_near(testing::losses(dir / "mixed" / "metrics.jsonl"), want, 1e-5,
                              "1 rank -> pp2 -> 1 rank");
  fs::remove_all(dir);
}

// A 1-rank checkpoint after step 2 resumes on dp 2 x tp 2 x pp 2 (eight ranks: the tied copy
// filled from the stored table, the tp shards cut from the global tensors), which trains steps 3
// and 4: the losses, the final checkpoint (parameters and AdamW moments, 1e-5 of each family's
// largest value), the validation loss and the task's accuracy are the uninterrupted 1-rank run's.
// Eight processes on two cores: `slow`.
TEST(PipelineTrainingSlow, OneRankCheckpointResumesOnDp2Tp2Pp2) {
  const fs::path dir = testing::temp_dir("pp_dp_tp");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  const std::vector<std::string> base = {"--set", "train.steps=4", "--set", "train.global_batch=8", "--set",
                                         "train.micro_batch=2", "--set", "log.every=1"};
  auto r = testing::train_run(dir, "tiny.toml", "one", 1, base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 4u);
  r = testing::train_run(dir, "tiny.toml", "mixed", 1, testing::with(base, {"--set", "train.exit_after_steps=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::train_run(dir, "tiny.toml", "mixed", 8,
                         testing::with(base, {"--set", "parallel.pp=2", "--set", "parallel.tp=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("8 ranks = tp 2 x dp 2 x pp 2 (1f1b)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at step 2"), std::string::npos) << r.output;
  testing::expect_losses_near(testing::losses(dir / "mixed" / "metrics.jsonl"), want, 1e-5, "1 rank -> dp2 x tp2 x pp2");
  testing::expect_checkpoints_near(dir / "mixed" / "checkpoints" / "step_00000004.h5",
                                   dir / "one" / "checkpoints" / "step_00000004.h5", 1e-5, "1 rank -> dp2 x tp2 x pp2");
  const double want_val = last_value(dir / "one" / "metrics.jsonl", "val_loss");
  ASSERT_GT(want_val, 0);
  EXPECT_NEAR(last_value(dir / "mixed" / "metrics.jsonl", "val_loss"), want_val, 1e-5 * want_val);
  EXPECT_EQ(last_value(dir / "mixed" / "metrics.jsonl", "val_accuracy"),
            last_value(dir / "one" / "metrics.jsonl", "val_accuracy"));
  fs::remove_all(dir);
}

TEST(PipelineLayouts, Gpt2TiedStagesEqualTheOneRankRun) { expect_pipelines_equal_one_rank("gpt2"); }
TEST(PipelineLayouts, LlamaStagesEqualTheOneRankRun) { expect_pipelines_equal_one_rank("llama"); }

}  // namespace tessera

// Pipeline parallelism in the trainer: two stages under "1f1b", "gpipe" and "interleaved" (two
// chunks per rank), four stages, and two stages with dp or tp on four ranks, train the 1-rank run's
// losses and final parameters and AdamW moments within 1e-5 (fp32, other reduction orders), for the
// tied GPT-2 preset (the last stage's copy of wte.weight is compared with the 1-rank table too) and
// LLaMA. Runs under `mpiexec -n 2` and `-n 4` (ctest PipelineLayouts.two_ranks / four_ranks; the
// suite means nothing on one rank). As the layout matrix (test_layout_matrix.cpp): each layout
// trains the real Trainer on its own communicator and compares its stage's tensors with the 1-rank
// run it computed itself. PipelineTraining.* runs `tessera train` end to end under mpiexec: stop and
// resume, checkpoints crossing layouts, the validation loss, metrics.jsonl's pp_bytes_per_step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
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
          {"dp2pp2vpp2_interleaved", 4, pp("interleaved") + std::vector<std::string>{"parallel.vpp=2"},
           {"model.n_layer=4", "train.global_batch=16"}}};
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

}  // namespace

TEST(PipelineLayouts, Gpt2RecomputationChangesNothing) { expect_recomputation_changes_nothing("gpt2"); }
TEST(PipelineLayouts, LlamaRecomputationChangesNothing) { expect_recomputation_changes_nothing("llama"); }

// `tessera train` under mpiexec on two stages (tied gpt2, gpipe): stopped after 2 of 4 steps, saved,
// resumed by the same command (the tied copies checked again after the resume), the 4 losses and
// the final validation loss are the 1-rank run's; metrics.jsonl has pp_bytes_per_step, and the
// skipped task accuracy says so.
TEST(PipelineTraining, TwoStagesStopResumeAndEqualTheOneRankRun) {
  const fs::path dir = testing::temp_dir("pp_cli");
  std::ofstream(dir / "tiny.toml") << testing::kTinyConfig;
  const std::vector<std::string> base = {"--set", "train.steps=4", "--set", "train.global_batch=8", "--set",
                                         "train.micro_batch=2", "--set", "log.every=1"};
  auto r = testing::train_run(dir, "tiny.toml", "one", 1, base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
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
  EXPECT_NE(r.output.find("the task's accuracy (greedy answers) is not evaluated under parallel.pp > 1 yet"),
            std::string::npos)
      << r.output;
  // The final evaluation's validation loss: the last stage's, summed over the pipeline to rank 0.
  const auto val_loss = [](const fs::path& metrics) {
    const std::string text = testing::read_file(metrics), field = "\"val_loss\": ";
    const auto at = text.rfind(field);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + field.size()));
  };
  const double want_val = val_loss(dir / "one" / "metrics.jsonl");
  ASSERT_GT(want_val, 0);
  EXPECT_NEAR(val_loss(dir / "pp" / "metrics.jsonl"), want_val, 1e-5 * want_val);
  testing::expect_losses_near(testing::losses(dir / "pp" / "metrics.jsonl"), want, 1e-5, "pp2 gpipe, stopped and resumed");
  EXPECT_GT(testing::last_metric(dir / "pp" / "metrics.jsonl", "pp_bytes_per_step"), 0);
  EXPECT_EQ(testing::last_metric(dir / "one" / "metrics.jsonl", "pp_bytes_per_step"), -1);
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

TEST(PipelineLayouts, Gpt2TiedStagesEqualTheOneRankRun) { expect_pipelines_equal_one_rank("gpt2"); }
TEST(PipelineLayouts, LlamaStagesEqualTheOneRankRun) { expect_pipelines_equal_one_rank("llama"); }

}  // namespace tessera

// The layout matrix in process: every layout of dp, tp, sequence parallelism and ZeRO-1 gives the
// 1-rank run's losses (1e-5 relative: fp32, different reduction orders), parameters and AdamW
// moments (1e-5 of the largest of their family), for the GPT-2 and LLaMA presets. Runs under
// `mpiexec -n 2` and `-n 4` (ctest LayoutMatrix.two_ranks / four_ranks; not as one rank): each
// layout of as many ranks as the world trains the real Trainer on a communicator of its own, and
// every rank compares its shards with the whole tensors of the 1-rank run it computed itself. No
// process starts, and no checkpoint files but one 1-rank file that every layout resumes; `tessera
// train` end to end under mpiexec, with checkpoints saved and resumed across layouts, is
// tests/app/test_*_parallel_training.cpp (label slow).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

using testing::expect_state_near;
using testing::Trained;
using testing::train;

// One layout: its ranks and the settings ("section.key=value") that make it.
struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> sets;
};

// A model and its layouts: `base` settings for every run, the 1-rank run included.
struct Matrix {
  std::string config;
  std::vector<std::string> base;
  std::vector<Layout> layouts;
};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::string> kZero = {"parallel.zero=1"};
std::vector<std::string> tp(int n, bool sp) {
  return {"parallel.tp=" + std::to_string(n), std::string("parallel.sequence_parallel=") + (sp ? "true" : "false")};
}

// The tp layouts' settings: 6 steps of 4 micro-batches of 2 (test_tensor_parallel_training.cpp).
const std::vector<std::string> kTpBase = {"train.steps=6", "train.global_batch=8", "train.micro_batch=2"};

// The model of the tp tests (four heads, two KV heads for llama) and its layouts; the dp and
// ZeRO-1 layouts of test_data_parallel_training.cpp on the tiny GPT-2 (buckets of 0.01 MB, several
// per backward) and on a model of 28,281 parameters (C = 33: padded for 2 and 4 ranks).
Matrix gpt2() {
  return {testing::layout_config("gpt2"), kTpBase,
          {{"tp2", 2, tp(2, false)},
           {"tp2sp", 2, tp(2, true)},
           {"tp4", 4, tp(4, false)},
           {"tp4sp", 4, tp(4, true)},
           {"dp2tp2", 4, tp(2, false)},
           {"dp2tp2sp", 4, tp(2, true)},
           {"dp2tp2_zero", 4, tp(2, false) + kZero},
           {"dp2tp2sp_zero_recompute", 4, tp(2, true) + kZero + std::vector<std::string>{"model.recompute=\"full\""}}}};
}

Matrix llama() {
  return {testing::layout_config("llama"), kTpBase,
          {{"dp2", 2, {}},
           {"dp2_zero", 2, kZero},
           {"tp2", 2, tp(2, false)},
           {"tp2sp", 2, tp(2, true)},
           {"dp4_zero", 4, kZero},
           {"tp4", 4, tp(4, false)},
           {"tp4sp", 4, tp(4, true)},
           {"dp2tp2", 4, tp(2, false)},
           {"dp2tp2sp_zero", 4, tp(2, true) + kZero}}};
}

const std::vector<std::string> kDpBase = kTpBase + std::vector<std::string>{"parallel.bucket_mb=0.01"};

Matrix data_parallel() {
  return {testing::kTinyConfig, kDpBase,
          {{"dp2_overlap", 2, {"parallel.overlap_grad_reduce=true"}},
           {"dp2_no_overlap", 2, {"parallel.overlap_grad_reduce=false"}},
           {"dp4_overlap", 4, {"parallel.overlap_grad_reduce=true"}}}};
}

Matrix zero_one() {
  return {testing::kTinyConfig, kDpBase + std::vector<std::string>{"model.n_embd=33", "model.n_head=3"},
          {{"zero2", 2, kZero}, {"zero4", 4, kZero}}};
}

// Trains the 1-rank run, then each layout of as many ranks as the world, and compares.
void expect_layouts_equal_one_rank(const std::string& name, const Matrix& m) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  const Trained one = train(parse_config_string(m.config, name + ".toml", m.base), MPI_COMM_NULL);
  ASSERT_EQ(one.losses.size(), 6u);
  int ran = 0;
  for (const Layout& l : m.layouts) {
    if (l.ranks != world.size()) continue;
    ++ran;
    const std::string what = name + " " + l.name + " (rank " + std::to_string(world.rank()) + ")";
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());  // the layout's own
    Trained got = train(parse_config_string(m.config, name + ".toml", m.base + l.sets), comm.comm());
    testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
    EXPECT_EQ(got.trainer->params().size(), one.trainer->params().size()) << what;
    expect_state_near(*got.trainer, *one.trainer, 1e-5, what);
  }
  EXPECT_GT(ran, 0) << "no layout of " << world.size() << " ranks for " << name;
}

// A checkpoint of the 1-rank run after 3 of its 6 steps (one small file, written by world rank 0
// alone: a save is cheap on one rank, seconds on several) resumes on the layouts named in `which`
// that have as many ranks as the world: the next three losses and the final state are the
// uninterrupted 1-rank run's, so parameters, both moments, AdamW's step count and the data position
// all came through. Saves on several ranks, and resuming them elsewhere, are the slow CLI tests
// (TensorParallelTrainingSlow.CheckpointsResumeAcrossLayouts, DataParallelTrainingSlow.*).
void expect_one_rank_checkpoint_resumes_on_layouts(const std::string& name, const Matrix& m,
                                                   const std::vector<std::string>& which) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  const Trained one = train(parse_config_string(m.config, name + ".toml", m.base), MPI_COMM_NULL);
  ASSERT_EQ(one.losses.size(), 6u);
  const std::vector<double> last_three(one.losses.begin() + 3, one.losses.end());
  const std::string dir =
      broadcast_bytes(world.comm(), world.rank() == 0 ? testing::temp_dir("layout_resume_" + name).string() : "", 0);
  std::string error;
  if (world.rank() == 0) {
    error = testing::error_of([&] {
      Trainer first(parse_config_string(m.config, name + ".toml", m.base + std::vector<std::string>{"train.exit_after_steps=3"}),
                    dir, MPI_COMM_SELF);
      first.run();
    });
  }
  throw_if_any_failed(world.comm(), error);
  for (const Layout& l : m.layouts) {
    if (l.ranks != world.size() || std::find(which.begin(), which.end(), l.name) == which.end()) continue;
    const std::string what = name + " one -> " + l.name + " (rank " + std::to_string(world.rank()) + ")";
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    Trainer t(parse_config_string(m.config, name + ".toml", m.base + l.sets), dir, comm.comm());
    EXPECT_EQ(t.start_step(), 3) << what;
    std::vector<double> losses;
    for (int64_t s = t.start_step(); s < 6; ++s) losses.push_back(t.step(s).loss);
    testing::expect_losses_near(losses, last_three, 1e-5, what);
    EXPECT_EQ(t.params().size(), one.trainer->params().size()) << what;
    expect_state_near(t, *one.trainer, 1e-5, what);
  }
  MPI_Barrier(world.comm());
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

// The matrix: dp 2 and 4 (with and without overlapping the bucketed all-reduce with backward), ZeRO-1
// on 2 and 4 ranks (padded), tp 2 and 4, dp 2 x tp 2, with and without sequence parallelism and
// ZeRO-1, one with full recomputation; LLaMA (grouped KV heads, replicated under tp 4) too.
TEST(LayoutMatrix, Gpt2TensorParallelLayoutsEqualTheOneRankRun) { expect_layouts_equal_one_rank("gpt2", gpt2()); }
TEST(LayoutMatrix, LlamaLayoutsEqualTheOneRankRun) { expect_layouts_equal_one_rank("llama", llama()); }
TEST(LayoutMatrix, DataParallelLayoutsEqualTheOneRankRun) { expect_layouts_equal_one_rank("dp", data_parallel()); }
TEST(LayoutMatrix, ZeroOneLayoutsEqualTheOneRankRun) { expect_layouts_equal_one_rank("zero", zero_one()); }

// Resumed onto tp shards (vocabulary padded, heads split), sequence parallelism, dp x tp with
// ZeRO-1 and recomputation, and ZeRO-1 shards of a padded flat buffer.
TEST(LayoutMatrix, OneRankCheckpointResumesOnOtherLayouts) {
  expect_one_rank_checkpoint_resumes_on_layouts("gpt2", gpt2(), {"tp2sp", "tp4", "dp2tp2sp_zero_recompute"});
  expect_one_rank_checkpoint_resumes_on_layouts("zero", zero_one(), {"zero2", "zero4"});
}

}  // namespace tessera

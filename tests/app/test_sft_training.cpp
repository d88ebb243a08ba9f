// Supervised fine-tuning data in the trainer: a dataset written by `tessera prepare --sft` (a loss
// mask beside it, packed records under data.document_mask) trains the 1-rank run's losses, final
// parameters and AdamW moments (1e-5: fp32, other summation orders) on dp 2, tp 2 with sequence
// parallelism, pp 2 (1F1B) and cp 2, and on four ranks dp 2 x tp 2 (sp), tp 2 (sp) x pp 2 and dp 2 x
// cp 2, for GPT-2 and LLaMA, with the data-parallel ranks of a step
// holding different numbers of trained targets (the loss is the mean over the global batch's
// trained targets, not a mean of per-rank means). Runs under `mpiexec -n 2` or `-n 4` (ctest
// SftLayouts.two_ranks and SftLayouts.four_ranks, label mpi; the suite means
// nothing on one rank).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "app/prepare_sft.h"
#include "app/trainer.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/token_dataset.h"
#include "layout_testing.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"
#include "trainer_testing.h"

namespace tessera {
namespace {
using testing::expect_state_near;
using testing::Trained;
using testing::train;

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Records of three shapes (short question and answer; a long prompt with a one-byte answer; a
// short prompt with a long answer), so windows hold from none to most of their targets trained.
std::string records() {
  std::string out;
  for (int i = 0; i < 160; ++i) {
    const int a = i % 10, b = (i * 7) % 10;
    const std::string sum = std::to_string(a + b);
    std::string prompt, response;
    switch (i % 3) {
      case 0: prompt = std::to_string(a) + "+" + std::to_string(b) + "=", response = sum; break;
      case 1: prompt = "please add " + std::to_string(a) + " and " + std::to_string(b) + ", then say the sum: ",
              response = sum; break;
      default: prompt = "count to " + std::to_string(a) + ":", response = " 1 2 3 4 5 6 7 8 9 10 11 12 13" ; break;
    }
    out += "{\"prompt\": \"" + prompt + "\", \"response\": \"" + response + "\"}\n";
  }
  return out;
}

// The records prepared by rank 0 into a temp directory (PREFIX and a copy PREFIX_nomask without
// the .mask); every rank gets the prefix.
std::string sft_dataset(const MpiCommunicator& world) {
  std::string prefix;
  if (world.rank() == 0) {
    const auto dir = testing::temp_dir("sft_layouts");
    std::ofstream(dir / "records.jsonl") << records();
    PrepareSftArgs a;
    a.inputs = {(dir / "records.jsonl").string()};
    a.tokenizer = "byte";
    a.out = (dir / "sft").string();
    std::ostringstream log;
    run_prepare_sft(a, log);
    for (const char* ext : {".bin", ".idx"}) std::filesystem::copy_file(a.out + ext, a.out + "_nomask" + ext);
    prefix = a.out;
  }
  return broadcast_bytes(world.comm(), prefix, 0);
}

// 5 steps of 4 micro-batches of 2 windows of 24 tokens (chunks of 6 under cp 2).
std::vector<std::string> sft_settings(const std::string& prefix) {
  return {"train.steps=5", "train.global_batch=8", "train.micro_batch=2", "data.task=\"tokens\"",
          "data.tokenizer=\"byte\"", "data.train=[{path=\"" + prefix + "\"}]", "data.document_mask=true"};
}

// The trained targets each of two data-parallel ranks holds in step 0.
std::vector<int64_t> trained_targets_per_dp_rank(const Config& cfg) {
  const auto ds = open_token_dataset({cfg.data.train[0].path}, cfg.train.seq_len, 257);
  const Sampler sampler(ds->num_samples(), static_cast<uint64_t>(cfg.train.seed));
  std::vector<int64_t> counts;
  for (int64_t r = 0; r < 2; ++r) {
    const BatchLayout layout{cfg.train.global_batch, cfg.train.micro_batch, 2, r};
    int64_t n = 0;
    for (int64_t m = 0; m < layout.micro_batches(); ++m)
      for (int32_t t : make_batch(*ds, sampler.micro_batch(0, m, layout)).targets) n += t != kIgnoreTarget;
    counts.push_back(n);
  }
  return counts;
}

void expect_sft_layouts_equal_one_rank(const std::string& preset) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  const std::string prefix = sft_dataset(world);
  const std::string config = testing::layout_config(preset);
  const std::vector<std::string> base = sft_settings(prefix);
  const Config one_cfg = parse_config_string(config, preset + ".toml", base);
  const std::vector<int64_t> counts = trained_targets_per_dp_rank(one_cfg);
  EXPECT_NE(counts[0], counts[1]) << "the test needs dp ranks with different numbers of trained targets";
  EXPECT_GT(counts[0] + counts[1], 0);
  EXPECT_LT(counts[0] + counts[1], 8 * 24);  // and some targets masked out

  const Trained one = train(one_cfg, MPI_COMM_NULL);
  ASSERT_EQ(one.losses.size(), 5u);
  // The mask changes the run: the same tokens without it train other losses.
  const Trained all = train(parse_config_string(config, preset + ".toml", sft_settings(prefix + "_nomask")), MPI_COMM_NULL);
  EXPECT_GT(std::abs(all.losses[0] - one.losses[0]), 1e-3 * one.losses[0]) << preset;

  // Two ranks: each dimension alone; four: the hybrids (dp is what the others leave).
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts =
      world.size() == 2
          ? std::vector<std::pair<std::string, std::vector<std::string>>>{
                {"dp2", {}},
                {"tp2sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
                {"pp2_1f1b", {"parallel.pp=2", "parallel.pp_schedule=\"1f1b\""}},
                {"cp2_ring", {"parallel.cp=2", "parallel.cp_comm=\"ring\""}}}
          : std::vector<std::pair<std::string, std::vector<std::string>>>{
                {"dp2_tp2sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
                {"tp2sp_pp2", {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.pp=2"}},
                {"dp2_cp2", {"parallel.cp=2", "parallel.cp_comm=\"ring\""}}};
  for (const auto& [name, sets] : layouts) {
    const std::string what = preset + " sft " + name + " (rank " + std::to_string(world.rank()) + ")";
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    Trained got = train(parse_config_string(config, preset + ".toml", base + sets), comm.comm());
    testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
    expect_state_near(*got.trainer, *one.trainer, 1e-5, what);
  }
  MPI_Barrier(world.comm());
  if (world.rank() == 0) std::filesystem::remove_all(std::filesystem::path(prefix).parent_path());
}

int world_size() {
  int n = 0;
  MPI_Comm_size(testing::test_world(), &n);
  return n;
}

}  // namespace

TEST(SftLayouts, Gpt2EqualsTheOneRankRun) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "the layouts are of two or four ranks";
  expect_sft_layouts_equal_one_rank("gpt2");
}
TEST(SftLayouts, LlamaEqualsTheOneRankRun) {
  if (world_size() != 2 && world_size() != 4) GTEST_SKIP() << "the layouts are of two or four ranks";
  expect_sft_layouts_equal_one_rank("llama");
}

}  // namespace tessera

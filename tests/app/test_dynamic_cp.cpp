// Tests app/dynamic_cp.h (parallel.cp_mode = "dynamic"): the config's refusals, a packed row's
// documents and rows, the calibration file, and (DynamicCpLayouts.*, under mpiexec -n 4) dynamic cp 2,
// cp 4 and dp 2 x cp 2 training the 1-rank run's losses and final state, with the cost model forcing
// every row split, measured at start, and forcing every row whole. Documents long-tailed: most of
// 3 to 10 bytes, one in five of 30 to 47, with seq_len 24 (the long ones cut into pieces whose
// positions continue to 47 < model.max_seq_len = 48).
#include "app/dynamic_cp.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/trainer.h"
#include "data/indexed_dataset.h"
#include "error_testing.h"
#include "layout_testing.h"
#include "parallel/mpi.h"
#include "parallel/mpi_communicator.h"
#include "trainer_testing.h"

namespace tessera {
namespace {
using testing::Trained;
using testing::train;

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A byte-tokenizer indexed dataset of n long-tailed documents and the end-of-text id 256.
void write_documents(const std::string& prefix, int n) {
  IndexedDatasetBuilder out(prefix, IndexedDatasetBuilder::dtype_for_vocab(257));
  uint64_t x = 123456789;
  for (int d = 0; d < n; ++d) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const bool long_doc = (x >> 40) % 5 == 0;
    const int len = long_doc ? 30 + static_cast<int>((x >> 33) % 18) : 3 + static_cast<int>((x >> 33) % 8);
    std::vector<int32_t> ids;
    for (int i = 0; i < len; ++i) ids.push_back(97 + (d * 7 + i * (d % 3 + 1)) % 26);
    ids.push_back(256);
    out.add_document(ids);
  }
  out.finalize();
}

// Rows of 24, four per micro-batch, 8 per step: 1 rank accumulates 2 micro-batches, dp 2 one each.
std::vector<std::string> settings(const std::string& prefix, int64_t steps = 4) {
  return {"train.steps=" + std::to_string(steps), "train.global_batch=8", "train.micro_batch=0",
          "model.max_seq_len=48", "data.task=\"tokens\"", "data.tokenizer=\"byte\"",
          "data.train=[{path=\"" + prefix + "\"}]", "data.batching=\"tokens\"", "train.tokens_per_micro_batch=96"};
}

Config config(const std::string& preset, const std::vector<std::string>& sets) {
  return parse_config_string(testing::layout_config(preset), preset + ".toml", sets);
}

TEST(DynamicCpConfig, RefusesWhatDoesNotCompose) {
  const std::vector<std::string> base = settings("unused") + std::vector<std::string>{"parallel.cp=2",
                                                                                      "parallel.cp_mode=\"dynamic\""};
  EXPECT_NO_THROW(config("gpt2", base));
  const auto refused = [&](const std::vector<std::string>& sets, const std::vector<std::string>& words) {
    std::string message = "no error";
    try {
      config("gpt2", base + sets);
    } catch (const Error& e) {
      message = e.what();
    }
    for (const std::string& w : words) EXPECT_NE(message.find(w), std::string::npos) << "\"" << w << "\" not in: " << message;
  };
  refused({"data.batching=\"windows\"", "train.tokens_per_micro_batch=0", "train.micro_batch=2"},
          {"parallel.cp_mode = \"dynamic\"", "data.batching = \"windows\""});
  refused({"parallel.cp=1"}, {"parallel.cp = 1", "parallel.cp >= 2"});
  refused({"parallel.cp_comm=\"allgather\""}, {"parallel.cp_comm = \"allgather\"", "ring"});
  refused({"parallel.tp=2"}, {"parallel.tp = 2", "parallel.tp = 1"});
  refused({"parallel.pp=2"}, {"parallel.pp = 2", "parallel.pp = 1"});
  refused({"parallel.cp_mode=\"static\"", "parallel.cp_calibration=\"x.toml\""},
          {"parallel.cp_calibration = \"x.toml\"", "parallel.cp_mode = \"static\""});
  refused({"parallel.cp_mode=\"sometimes\""}, {"parallel.cp_mode", "sometimes"});
}

TEST(DynamicCpTrainer, RowDocumentsAndRows) {
  Batch b;
  b.B = 2;
  b.T = 6;
  b.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  b.targets = b.tokens;
  b.doc_start = {0, 0, 2, 2, 2, 5, 0, 0, 0, 0, 0, 0};
  b.doc_position = {0, 0, 0, 0, 0, 0, 24, 24, 24, 24, 24, 24};
  EXPECT_EQ(row_documents(b, 0), (std::vector<int64_t>{2, 3, 1}));
  EXPECT_EQ(row_documents(b, 1), (std::vector<int64_t>{6}));
  const Batch r = batch_rows(b, {1});
  EXPECT_EQ(r.B, 1);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(r.doc_position, std::vector<int32_t>(6, 24));
}

TEST(DynamicCpTrainer, CalibrationFileRoundTripsAndNamesBadKeys) {
  const std::filesystem::path dir = testing::temp_dir("dynamic_cp_calibration");
  const CpCostModel m{1.5e-7, 2.25e-9, 3e-5, 1e-9};
  const std::string good = (dir / "good.toml").string();
  std::ofstream(good) << cp_cost_toml(m);
  const CpCostModel back = read_cp_cost(good);
  EXPECT_EQ(back.token_s, m.token_s);
  EXPECT_EQ(back.pair_s, m.pair_s);
  EXPECT_EQ(back.ring_step_s, m.ring_step_s);
  EXPECT_EQ(back.ring_token_s, m.ring_token_s);
  const std::string bad = (dir / "bad.toml").string();
  std::ofstream(bad) << "[cp_cost]\ntoken_s = 1e-7\npair_s = -1.0\nring_step_s = 0\nring_token_s = 0\n";
  EXPECT_TRUE(testing::throws_with([&] { read_cp_cost(bad); }, {"bad.toml", "cp_cost.pair_s", "-1"}));
  const std::string missing = (dir / "missing.toml").string();
  std::ofstream(missing) << "[cp_cost]\ntoken_s = 1e-7\n";
  EXPECT_TRUE(testing::throws_with([&] { read_cp_cost(missing); }, {"missing.toml", "cp_cost.pair_s", "missing"}));
  std::filesystem::remove_all(dir);
}

struct Layout {
  std::string name;
  std::vector<std::string> sets;
  int ranks;
};

// Ranks [0, n) of world as a communicator (MPI_COMM_NULL on the others).
MPI_Comm first_ranks(const MpiCommunicator& world, int n, MpiCommunicator& holder) {
  holder = MpiCommunicator::split(world.comm(), world.rank() < n ? 0 : 1, world.rank());
  return world.rank() < n ? holder.comm() : MPI_COMM_NULL;
}

void expect_layouts_equal_one_rank(const std::string& preset) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  if (world.size() != 4) GTEST_SKIP() << "the layouts run on four ranks";
  std::string prefix;
  if (world.rank() == 0) {
    prefix = (testing::temp_dir("dynamic_cp_layouts") / "docs").string();
    write_documents(prefix, 120);
  }
  prefix = broadcast_bytes(world.comm(), prefix, 0);
  const std::string dir = std::filesystem::path(prefix).parent_path().string();
  // Cost models forcing the plan: ring steps free and attention dear (every long row split), and
  // ring steps dearer than any row (nothing split); "" measures at start.
  if (world.rank() == 0) {
    std::ofstream(dir + "/split.toml") << cp_cost_toml({1e-9, 1e-6, 0.0, 0.0});
    std::ofstream(dir + "/whole.toml") << cp_cost_toml({1e-9, 1e-9, 10.0, 0.0});
  }
  MPI_Barrier(world.comm());
  const Trained one = train(config(preset, settings(prefix)), MPI_COMM_NULL);
  ASSERT_EQ(one.losses.size(), 4u);
  const std::vector<std::pair<std::string, std::string>> costs = {
      {"split", dir + "/split.toml"}, {"measured", ""}, {"whole", dir + "/whole.toml"}};
  const std::vector<Layout> layouts = {{"cp2", {"parallel.cp=2"}, 2},
                                       {"cp4", {"parallel.cp=4"}, 4},
                                       {"dp2_cp2", {"parallel.dp=2", "parallel.cp=2"}, 4}};
  for (const Layout& l : layouts)
    for (const auto& [cost_name, file] : costs) {
      const std::string what = preset + " dynamic " + l.name + " " + cost_name + " (rank " +
                               std::to_string(world.rank()) + ")";
      MpiCommunicator holder = MpiCommunicator::duplicate(world.comm());
      const MPI_Comm comm = first_ranks(world, l.ranks, holder);
      if (comm != MPI_COMM_NULL) {
        const std::vector<std::string> sets = {"parallel.cp_mode=\"dynamic\"",
                                               "parallel.cp_calibration=\"" + file + "\""};
        Trained got = train(config(preset, settings(prefix) + l.sets + sets), comm);
        testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
        // 3e-5, as TokenBatchingLayouts (tests/app/test_token_batching.cpp says why).
        testing::expect_state_near(*got.trainer, *one.trainer, 3e-5, what);
        const DynamicCp* d = got.trainer->dynamic_cp();
        ASSERT_NE(d, nullptr) << what;
        EXPECT_GT(d->rows_planned(), 0) << what;
        if (cost_name == "split") {
          EXPECT_GT(d->rows_split_total(), 0) << what << ": the forcing model split nothing";
        } else if (cost_name == "whole") {
          EXPECT_EQ(d->rows_split_total(), 0) << what;
        } else {
          EXPECT_GT(d->cost().pair_s + d->cost().token_s, 0) << what;
        }
      }
      MPI_Barrier(world.comm());
    }
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

TEST(DynamicCpLayouts, Gpt2EqualsTheOneRankRun) { expect_layouts_equal_one_rank("gpt2"); }
TEST(DynamicCpLayouts, LlamaEqualsTheOneRankRun) { expect_layouts_equal_one_rank("llama"); }

}  // namespace tessera

// Tests app/dynamic_cp.h (parallel.cp_mode = "dynamic"): the config's refusals, a packed row's
// documents and rows, the calibration file and the checkpoint's record of the cost model;
// (DynamicCpResume.*, under mpiexec -n 2) a resume bit for bit; and (DynamicCpLayouts.*, under
// mpiexec -n 4) dynamic cp 2, cp 4, dp 2 x cp 2, tp 2 x cp 2 and tp 2 + sp x cp 2 training the 1-rank
// run's losses and final state, with the cost model forcing every row split, measured at start,
// forcing every row whole, and piling every row on one rank, each run's memory estimate against
// the allocator's peak (app/memory_check.h). Documents long-tailed: most of
// 3 to 10 bytes, one in five of 30 to 47, with seq_len 24 (the long ones cut into pieces whose
// positions continue to 47 < model.max_seq_len = 48).
#include "app/dynamic_cp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "app/memory_check.h"
#include "app/token_batching.h"
#include "app/trainer.h"
#include "app/training_data.h"
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
  EXPECT_NO_THROW(config("gpt2", base + std::vector<std::string>{"parallel.tp=2", "parallel.sequence_parallel=true"}));
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

// The checkpoint's record of the cost model: its round trip, exact; a record for another seq_len or
// cp (or none) is passed over with the reason; a malformed one names the file and the attribute.
TEST(DynamicCpTrainer, CheckpointRecordRoundTripsForItsSeqLenAndCp) {
  const CpCostModel m{1.0 / 3.0, 2.25e-9, 3e-5, 1e-9 / 7.0};
  const GroupAttributes groups = {{kDynamicCpGroup, cp_cost_record(m, 24, 2)}};
  std::string why;
  const std::optional<CpCostModel> back = cp_cost_of(groups, "ck.h5", 24, 2, &why);
  ASSERT_TRUE(back.has_value()) << why;
  EXPECT_EQ(back->token_s, m.token_s);
  EXPECT_EQ(back->pair_s, m.pair_s);
  EXPECT_EQ(back->ring_step_s, m.ring_step_s);
  EXPECT_EQ(back->ring_token_s, m.ring_token_s);
  EXPECT_FALSE(cp_cost_of(groups, "ck.h5", 48, 2, &why).has_value());
  EXPECT_NE(why.find("train.seq_len = 24"), std::string::npos) << why;
  EXPECT_FALSE(cp_cost_of(groups, "ck.h5", 24, 4, &why).has_value());
  EXPECT_NE(why.find("parallel.cp = 2"), std::string::npos) << why;
  EXPECT_FALSE(cp_cost_of({}, "ck.h5", 24, 2, &why).has_value());
  EXPECT_NE(why.find("no /dynamic_cp record"), std::string::npos) << why;
  GroupAttributes bad = groups;
  bad[kDynamicCpGroup]["pair_s"] = std::string("fast");
  EXPECT_TRUE(testing::throws_with([&] { cp_cost_of(bad, "ck.h5", 24, 2, &why); }, {"ck.h5", "pair_s"}));
}

// Resume under dynamic cp 2 (two ranks, GPT-2): 4 steps, or 2, a checkpoint, and a new Trainer on
// the run directory to 4, equal bit for bit (losses and parameters) to the uninterrupted run that
// plans with the same cost model. The cost model comes from the checkpoint's record, not from
// parallel.cp_calibration: (a) the first run planned with a file (the forcing "split" model, which
// measuring on this machine would not reproduce); (b) the first run measured its own, and the
// uninterrupted run reads it back from that run's cp_calibration.toml. A file named on resume wins.
TEST(DynamicCpResume, ResumesBitExactlyWithTheCheckpointsCostModel) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  if (world.size() != 2) GTEST_SKIP() << "dynamic cp 2 runs on two ranks";
  const std::string dir = broadcast_bytes(
      world.comm(), world.rank() == 0 ? testing::temp_dir("dynamic_cp_resume").string() : "", 0);
  const std::string prefix = dir + "/docs", split = dir + "/split.toml", whole = dir + "/whole.toml";
  if (world.rank() == 0) {
    write_documents(prefix, 120);
    std::ofstream(split) << cp_cost_toml({1e-9, 1e-6, 0.0, 0.0});
    std::ofstream(whole) << cp_cost_toml({1e-9, 1e-9, 10.0, 0.0});
  }
  MPI_Barrier(world.comm());
  const std::vector<std::string> base =
      settings(prefix) + std::vector<std::string>{"parallel.cp=2", "parallel.cp_mode=\"dynamic\""};
  const auto with_file = [&](const std::string& f) {
    return base + std::vector<std::string>{"parallel.cp_calibration=\"" + f + "\""};
  };
  const std::vector<std::string> stop = {"train.exit_after_steps=2"};
  for (const bool measured : {false, true}) {
    const std::string what = std::string(measured ? "measured" : "split.toml") + " (rank " +
                             std::to_string(world.rank()) + ")";
    const std::string run = dir + (measured ? "/run_measured" : "/run_file");
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    {
      Trainer first(config("gpt2", (measured ? base : with_file(split)) + stop), run, comm.comm());
      first.run();
    }
    // The uninterrupted run, planning with the first run's cost model.
    const std::string file = measured ? run + "/" + kCpCalibrationFile : split;
    const Trained uninterrupted = train(config("gpt2", with_file(file)), comm.comm());
    Trainer resumed(config("gpt2", base), run, comm.comm());
    ASSERT_EQ(resumed.start_step(), 2) << what;
    ASSERT_NE(resumed.dynamic_cp(), nullptr);
    EXPECT_EQ(resumed.dynamic_cp()->cost_from().rfind("checkpoint ", 0), 0u) << what << ": "
                                                                               << resumed.dynamic_cp()->cost_from();
    const CpCostModel& got = resumed.dynamic_cp()->cost();
    const CpCostModel& want = uninterrupted.trainer->dynamic_cp()->cost();
    EXPECT_EQ(got.token_s, want.token_s) << what;
    EXPECT_EQ(got.pair_s, want.pair_s) << what;
    EXPECT_EQ(got.ring_step_s, want.ring_step_s) << what;
    EXPECT_EQ(got.ring_token_s, want.ring_token_s) << what;
    for (int64_t s = 2; s < 4; ++s)
      EXPECT_EQ(resumed.step(s).loss, uninterrupted.losses[static_cast<size_t>(s)]) << what << " step " << s;
    if (!measured) {
      EXPECT_GT(resumed.dynamic_cp()->rows_split_total(), 0) << what << ": the split model split nothing";
    }
    const Tensor a = resumed.params().flat_params(), b = uninterrupted.trainer->params().flat_params();
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_EQ(std::memcmp(a.ptr<float>(), b.ptr<float>(), static_cast<size_t>(a.numel()) * sizeof(float)), 0)
        << what << ": the resumed run's parameters are not the uninterrupted run's, bit for bit";
  }
  // A file named on resume wins over the checkpoint's record.
  {
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    Trainer resumed(config("gpt2", with_file(whole)), dir + "/run_file", comm.comm());
    EXPECT_EQ(resumed.dynamic_cp()->cost_from(), whole);
    EXPECT_EQ(resumed.dynamic_cp()->cost().ring_step_s, 10.0);
  }
  MPI_Barrier(world.comm());
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

struct Layout {
  std::string name;
  std::vector<std::string> sets;
  int ranks;
  std::vector<std::string> costs;  // the cost models it trains with (names in expect_layouts_equal_one_rank)
};

// Ranks [0, n) of world as a communicator (MPI_COMM_NULL on the others).
MPI_Comm first_ranks(const MpiCommunicator& world, int n, MpiCommunicator& holder) {
  holder = MpiCommunicator::split(world.comm(), world.rank() < n ? 0 : 1, world.rank());
  return world.rank() < n ? holder.comm() : MPI_COMM_NULL;
}

// The memory estimate under dynamic cp (app/memory_check.h) against the allocator's peak: at or
// above every rank's. It is the worst plan's (a micro-batch's rows all whole on one rank, as the
// 1-rank run holds them), so it is loose for a balanced plan; with `piled` (a cost model of zeros:
// every placement ties and the planner puts every row whole on cp rank 0) that plan is run, and the
// estimate is within 5% of the largest rank's peak: the bound is reached. Collective over comm.
void expect_memory_bound(const Config& cfg, const Trainer& got, MPI_Comm comm, bool piled, const std::string& what) {
  const Config resolved = with_token_micro_batch(cfg);
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  const int64_t tp = std::max<int64_t>(1, resolved.parallel.tp), dp = ranks / (resolved.parallel.cp * tp);
  const double estimate = static_cast<double>(
      estimate_training_memory(resolved, data_vocab_size(resolved), MemoryLayout{tp, dp, false}).allocator_bytes());
  const double peak = static_cast<double>(got.allocator().total_peak());
  double most = peak;
  MPI_Allreduce(&peak, &most, 1, MPI_DOUBLE, MPI_MAX, comm);
  std::cout << "[ memory ] " << what << ": estimate " << estimate << " B, this rank's peak " << peak
            << ", the largest rank's " << most << ", estimate / largest " << estimate / most << "\n";
  EXPECT_GE(estimate, peak) << what << ": the estimate is below this rank's allocator peak";
  if (piled) {
    EXPECT_LE(estimate, 1.05 * most) << what << ": every row on one rank, yet the estimate is 5% above its peak";
  }
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
    std::ofstream(dir + "/pile.toml") << cp_cost_toml({0.0, 0.0, 10.0, 0.0});
  }
  MPI_Barrier(world.comm());
  const Trained one = train(config(preset, settings(prefix)), MPI_COMM_NULL);
  ASSERT_EQ(one.losses.size(), 4u);
  const std::vector<std::pair<std::string, std::string>> costs = {
      {"split", dir + "/split.toml"}, {"measured", ""}, {"whole", dir + "/whole.toml"}, {"pile", dir + "/pile.toml"}};
  const std::vector<std::string> all = {"split", "measured", "whole", "pile"};
  const std::vector<Layout> layouts = {
      {"cp2", {"parallel.cp=2"}, 2, all},
      {"cp4", {"parallel.cp=4"}, 4, all},
      {"dp2_cp2", {"parallel.dp=2", "parallel.cp=2"}, 4, {"split", "measured", "pile"}},
      // tp: the measured cost model broadcast over the tp group; pile: idle passes under tp
      {"tp2_cp2", {"parallel.tp=2", "parallel.cp=2"}, 4, {"split", "measured", "pile"}},
      {"tp2sp_cp2", {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.cp=2"}, 4, {"split", "measured"}}};
  for (const Layout& l : layouts)
    for (const auto& [cost_name, file] : costs) {
      if (std::find(l.costs.begin(), l.costs.end(), cost_name) == l.costs.end()) continue;
      const std::string what = preset + " dynamic " + l.name + " " + cost_name + " (rank " +
                               std::to_string(world.rank()) + ")";
      MpiCommunicator holder = MpiCommunicator::duplicate(world.comm());
      const MPI_Comm comm = first_ranks(world, l.ranks, holder);
      if (comm != MPI_COMM_NULL) {
        const std::vector<std::string> sets = {"parallel.cp_mode=\"dynamic\"",
                                               "parallel.cp_calibration=\"" + file + "\""};
        const Config cfg = config(preset, settings(prefix) + l.sets + sets);
        Trained got = train(cfg, comm);
        testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
        // 3e-5, as TokenBatchingLayouts (tests/app/test_token_batching.cpp says why).
        testing::expect_state_near(*got.trainer, *one.trainer, 3e-5, what);
        const DynamicCp* d = got.trainer->dynamic_cp();
        ASSERT_NE(d, nullptr) << what;
        EXPECT_GT(d->rows_planned(), 0) << what;
        expect_memory_bound(cfg, *got.trainer, comm, cost_name == "pile", what);
        if (cost_name == "split") {
          EXPECT_GT(d->rows_split_total(), 0) << what << ": the forcing model split nothing";
        } else if (cost_name == "whole" || cost_name == "pile") {
          EXPECT_EQ(d->rows_split_total(), 0) << what;
        } else {
          EXPECT_GT(d->cost().pair_s + d->cost().token_s, 0) << what;
        }
        // Every rank of a dp replica plans with the same numbers (under tp each tp rank's cp group
        // measures its own; dp replicas plan their own batches, each with its cp group's model).
        if (l.name.rfind("dp", 0) != 0) {
          const CpCostModel& c = d->cost();
          std::vector<double> mine = {c.token_s, c.pair_s, c.ring_step_s, c.ring_token_s}, lo(4), hi(4);
          MPI_Allreduce(mine.data(), lo.data(), 4, MPI_DOUBLE, MPI_MIN, comm);
          MPI_Allreduce(mine.data(), hi.data(), 4, MPI_DOUBLE, MPI_MAX, comm);
          EXPECT_EQ(lo, hi) << what << ": the ranks' cost models differ";
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

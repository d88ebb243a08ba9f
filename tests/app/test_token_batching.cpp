// Tests app/token_batching.h in the trainer (data.batching = "tokens"): the config's refusals, the
// loss averaged over real tokens (padding carries none), a bit-exact resume from the checkpoint's
// cursor, and (TokenBatchingLayouts.*, under mpiexec -n 2) dp 2, dp 2 + ZeRO-1, tp 2 + sp, pp 2 and
// cp 2 training the 1-rank run's losses and final state within 1e-5 (fp32, other summation orders),
// on both presets. Documents of 3 to 40 bytes with seq_len 24: the long ones are cut into pieces
// whose positions continue (model.max_seq_len = 48).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
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

// A byte-tokenizer indexed dataset of `n` documents of 3 to 40 learnable letters and the
// end-of-text id 256, at prefix.
void write_documents(const std::string& prefix, int n) {
  IndexedDatasetBuilder out(prefix, IndexedDatasetBuilder::dtype_for_vocab(257));
  uint64_t x = 987654321;
  for (int d = 0; d < n; ++d) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int len = 3 + static_cast<int>((x >> 33) % 38);
    std::vector<int32_t> ids;
    for (int i = 0; i < len; ++i) ids.push_back(97 + (d * 5 + i * (d % 4 + 1)) % 26);
    ids.push_back(256);
    out.add_document(ids);
  }
  out.finalize();
}

// Rows of 24, two per micro-batch, 8 per step: 1 rank accumulates 4 micro-batches, dp 2 two each.
std::vector<std::string> token_settings(const std::string& prefix, int64_t steps = 5) {
  return {"train.steps=" + std::to_string(steps), "train.global_batch=8", "train.micro_batch=0",
          "model.max_seq_len=48", "data.task=\"tokens\"", "data.tokenizer=\"byte\"",
          "data.train=[{path=\"" + prefix + "\"}]", "data.batching=\"tokens\"", "train.tokens_per_micro_batch=48"};
}

Config config(const std::string& preset, const std::vector<std::string>& sets) {
  return parse_config_string(testing::layout_config(preset), preset + ".toml", sets);
}

TEST(TokenBatchingConfig, RefusesWhatItDoesNotSupport) {
  const std::string p = "/nonexistent/docs";
  auto refused = [&](const std::vector<std::string>& extra, const std::vector<std::string>& words) {
    const std::string msg = testing::error_of([&] { config("gpt2", token_settings(p) + extra); });
    EXPECT_FALSE(msg.empty()) << "accepted: " << extra[0];
    for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "\"" << w << "\" not in: " << msg;
  };
  refused({"train.tokens_per_micro_batch=50"}, {"multiple of train.seq_len = 24", "got 50"});
  refused({"train.tokens_per_micro_batch=0"}, {"needs train.tokens_per_micro_batch"});
  refused({"train.micro_batch=4"}, {"train.micro_batch = 4", "2 rows"});
  refused({"data.task=\"addition\""}, {"data.task = \"addition\""});
  refused({"data.train=[{path=\"a\"},{path=\"b\"}]"}, {"lists 2 (a blend)"});
  refused({"train.device=\"cuda\""}, {"CPU", "train.device = \"cuda\""});
  EXPECT_TRUE(testing::throws_with([] { config("gpt2", {"train.tokens_per_micro_batch=48"}); },
                                   {"train.tokens_per_micro_batch = 48", "data.batching = \"windows\""}));
  const Config ok = config("gpt2", token_settings(p));
  EXPECT_EQ(ok.data.batching, "tokens");
  EXPECT_EQ(with_token_micro_batch(ok).train.micro_batch, 2);
  EXPECT_EQ(Config{}.data.batching, "windows");
}

class TokenBatchingTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("token_batching_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    prefix_ = (dir_ / "docs").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string prefix_;
};

// The first step holds every document under two budgets (all of them fit either step): its loss,
// averaged over the real tokens, is the same whatever the padding (8 of 24 rows filled, or 8 of 48).
// Counting the padding would scale it by the fill.
TEST_F(TokenBatchingTraining, PaddingCarriesNoLoss) {
  write_documents(prefix_, 5);
  const Trained small = train(config("gpt2", token_settings(prefix_, 1)), MPI_COMM_NULL);
  const Trained big = train(config("gpt2", token_settings(prefix_, 1) + std::vector<std::string>{
                                               "train.global_batch=16", "train.tokens_per_micro_batch=96"}),
                            MPI_COMM_NULL);
  ASSERT_EQ(small.losses.size(), 1u);
  EXPECT_NEAR(small.losses[0], big.losses[0], 1e-6 * small.losses[0]);
  EXPECT_GT(small.losses[0], 1.0);
}

// Train 5 steps, or 3, a checkpoint, and a new Trainer resuming to 5: the same losses, bit for bit
// (the cursor in the checkpoint places the resumed run's documents exactly), and a run from the
// cursor's start differs (the cursor has teeth). A windows checkpoint is refused by name.
TEST_F(TokenBatchingTraining, ResumesBitExactlyFromTheCursor) {
  (void)testing::test_world();  // MPI for the checkpoints' collective I/O (one rank, MPI_COMM_SELF)
  write_documents(prefix_, 60);
  for (const std::string preset : {"gpt2", "llama"}) {
    const Trained whole = train(config(preset, token_settings(prefix_)), MPI_COMM_NULL);
    const std::string run = (dir_ / ("run_" + preset)).string();
    {
      Trainer first(config(preset, token_settings(prefix_) + std::vector<std::string>{"train.exit_after_steps=3"}), run,
                    MPI_COMM_SELF);
      first.run();
    }
    Trainer resumed(config(preset, token_settings(prefix_)), run, MPI_COMM_SELF);
    ASSERT_EQ(resumed.start_step(), 3) << preset;
    for (int64_t s = 3; s < 5; ++s) EXPECT_EQ(resumed.step(s).loss, whole.losses[static_cast<size_t>(s)]) << preset << s;
    const Tensor a = resumed.params().flat_params(), b = whole.trainer->params().flat_params();
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_EQ(std::memcmp(a.ptr<float>(), b.ptr<float>(), static_cast<size_t>(a.numel()) * sizeof(float)), 0)
        << preset << ": the resumed run's parameters are not the uninterrupted run's, bit for bit";
    // Different data at each step: the losses are not all alike.
    EXPECT_NE(whole.losses[3], whole.losses[4]) << preset;
  }
  const std::string windows_run = (dir_ / "windows").string();
  {
    std::vector<std::string> w = token_settings(prefix_) + std::vector<std::string>{"train.exit_after_steps=1"};
    w = w + std::vector<std::string>{"data.batching=\"windows\"", "train.tokens_per_micro_batch=0", "train.micro_batch=2"};
    Trainer first(config("gpt2", w), windows_run, MPI_COMM_SELF);
    first.run();
  }
  EXPECT_TRUE(testing::throws_with([&] { Trainer t(config("gpt2", token_settings(prefix_)), windows_run, MPI_COMM_SELF); },
                                   {"/data_tokens", "data.batching = \"windows\""}));
}

struct Layout {
  std::string name;
  std::vector<std::string> sets;
};

void expect_layouts_equal_one_rank(const std::string& preset) {
  MpiCommunicator world = MpiCommunicator::duplicate(testing::test_world());
  if (world.size() != 2) GTEST_SKIP() << "the layouts run on two ranks";
  std::string prefix;
  if (world.rank() == 0) {
    prefix = (testing::temp_dir("token_batching_layouts") / "docs").string();
    write_documents(prefix, 120);
  }
  prefix = broadcast_bytes(world.comm(), prefix, 0);
  const Trained one = train(config(preset, token_settings(prefix)), MPI_COMM_NULL);
  ASSERT_EQ(one.losses.size(), 5u);
  const std::vector<Layout> layouts = {
      {"dp2", {"parallel.dp=2"}},
      {"dp2_zero", {"parallel.dp=2", "parallel.zero=1"}},
      {"tp2sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"pp2_1f1b", {"parallel.pp=2", "parallel.pp_schedule=\"1f1b\""}},
      {"cp2_ring", {"parallel.cp=2", "parallel.cp_comm=\"ring\""}}};
  for (const Layout& l : layouts) {
    const std::string what = preset + " tokens " + l.name + " (rank " + std::to_string(world.rank()) + ")";
    MpiCommunicator comm = MpiCommunicator::duplicate(world.comm());
    Trained got = train(config(preset, token_settings(prefix) + l.sets), comm.comm());
    testing::expect_losses_near(got.losses, one.losses, 1e-5, what);
    // 3e-5 for the state, not the other layout tests' 1e-5: measured on llama tp 2 + sp after one
    // step, every gradient (exp_avg) agrees with the 1-rank run's to 2.5e-7 of its family's scale
    // (fp32 rounding of other summation orders), but blocks.0.mlp.down.weight moves by 1.4e-5:
    // AdamW's first update m / (sqrt(v) + eps) turns the rounding of a gradient near eps into a
    // visible step. (The same data as windows with the document mask: 2.5e-6 there.)
    testing::expect_state_near(*got.trainer, *one.trainer, 3e-5, what);
  }
  MPI_Barrier(world.comm());
  if (world.rank() == 0) std::filesystem::remove_all(std::filesystem::path(prefix).parent_path());
}

}  // namespace

TEST(TokenBatchingLayouts, Gpt2EqualsTheOneRankRun) { expect_layouts_equal_one_rank("gpt2"); }
TEST(TokenBatchingLayouts, LlamaEqualsTheOneRankRun) { expect_layouts_equal_one_rank("llama"); }

}  // namespace tessera

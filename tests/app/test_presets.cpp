// The preset configs in configs/ parse, and the models they describe have the parameter counts
// published for them. Counting registers parameters without allocating them, so even the 1B
// preset is checked whole; a forward/backward runs on each preset shrunk by --set overrides. The
// presets leave train.micro_batch automatic, so the quickstart trains under `mpiexec -n 2` as is.
#include <gtest/gtest.h>

#include <filesystem>

#include "app/config.h"
#include "layout_testing.h"
#include "model/gpt.h"
#include "testing.h"

namespace tessera {
using testing::kCpu;
namespace {

const std::string kConfigs = std::string(TESSERA_TEST_DATA_DIR) + "/../../configs/";

int64_t parameter_count(const Config& c) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  Gpt gpt(to_model_config(c, 1), ps);
  int64_t n = 0;
  for (const auto& e : ps.entries()) n += e.local_shape.numel();
  return n;
}

}  // namespace

// GPT-2 124M and 350M: the counts of Hugging Face's gpt2 and gpt2-medium (tied head, 1024
// positions). TinyLlama 1.1B (the llama-1b preset's shape): 1,100,048,384.
TEST(Presets, ParameterCountsMatchThePublishedModels) {
  EXPECT_EQ(parameter_count(load_config(kConfigs + "gpt2-124m.toml")), 124439808);
  EXPECT_EQ(parameter_count(load_config(kConfigs + "gpt2-350m.toml")), 354823168);
  EXPECT_EQ(parameter_count(load_config(kConfigs + "llama-1b.toml")), 1100048384);
}

TEST(Presets, EveryConfigParsesAndTrainsOneTinyStep) {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigs)) {
    if (entry.path().extension() != ".toml") continue;
    ++seen;
    SCOPED_TRACE(entry.path().string());
    // Shrunk so a forward/backward takes milliseconds; everything else as the preset says.
    const Config c = load_config(entry.path().string(),
                                 {"model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.n_kv_head=0",
                                  "model.ffn_hidden=64", "model.vocab_size=64", "model.max_seq_len=16",
                                  "train.seq_len=8", "train.micro_batch=1", "train.global_batch=2"});
    EXPECT_FALSE(to_toml(c).empty());
    // Automatic (0): a fixed one would have to divide global_batch / dp for every rank count.
    EXPECT_EQ(load_config(entry.path().string()).train.micro_batch, 0);
    Allocator alloc;
    ParameterStore ps(alloc, DType::F32);
    Gpt gpt(to_model_config(c, 64), ps, recompute_policy(c));
    ps.finalize();
    ps.initialize(kCpu, 1);
    std::vector<int32_t> tokens(8, 3), targets(8, 5);
    GptCtx ctx;
    gpt.forward(kCpu, ctx, alloc, Tensor(tokens.data(), DType::I32, {1, 8}),
                Tensor(targets.data(), DType::I32, {1, 8}));
    const double loss = read_loss_sums(kCpu, ctx.loss_sums).mean();
    EXPECT_GT(loss, 0.0);
    gpt.backward(kCpu, ctx, alloc, 1.0 / 8);
  }
  EXPECT_GE(seen, 5);
}

// A user's first `mpirun -n 2 build/tessera train configs/quickstart.toml` (a few steps): the
// micro-batch is chosen per layout and printed; an explicit one that cannot work is still refused.
TEST(Presets, QuickstartTrainsUnderMpiexecWithAnAutomaticMicroBatch) {
  const std::filesystem::path dir = testing::temp_dir("quickstart_mpi");
  std::filesystem::copy_file(kConfigs + "quickstart.toml", dir / "quickstart.toml");
  const std::vector<std::string> few = {"--set", "train.steps=2",        "--set", "log.every=1",
                                        "--set", "data.val_examples=8", "--set", "train.eval_batches=1",
                                        "--set", "checkpoint.at_end=false"};
  testing::RunResult r = testing::train_run(dir, "quickstart.toml", "two", 2, few);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("batch 32 x 48 tokens (micro auto = 16, accumulation 1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tp 1 x dp 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 2/2"), std::string::npos) << r.output;
  r = testing::train_run(dir, "quickstart.toml", "one", 1, few);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(micro auto = 32, accumulation 1)"), std::string::npos) << r.output;
  std::vector<std::string> fixed = few;
  fixed.insert(fixed.end(), {"--set", "train.micro_batch=32"});
  r = testing::train_run(dir, "quickstart.toml", "fixed", 2, fixed);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train.global_batch = 32 must be a multiple of train.micro_batch x dp = 32 x 2 = 64"),
            std::string::npos)
      << r.output;
  std::filesystem::remove_all(dir);
}

}  // namespace tessera

// The MPI communicators' staging through host copies (MpiCommunicator::stage_through_host, the path
// device tensors take with train.device = "cuda" and parallel.comm = "mpi") run through the whole
// trainer on the CPU: TESSERA_TEST_STAGE_COMMS makes every communicator copy every tensor through
// its staging blocks. dp 2 with ZeRO-1 (buckets during the backward, reduce-scatter, all-gather),
// tp 2 with sequence parallelism and pp 2 (point-to-point batches, the tied embedding's broadcast)
// give the same losses and checkpoints, bit for bit, as without staging: the copies are exact and
// MPI sums the same values in the same order.
#include <gtest/gtest.h>

#include <fstream>

#include "layout_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;
using testing::with;

TEST(StagedComms, TrainTheSameBitsAsDirectMpi) {
  const fs::path dir = testing::temp_dir("staged_comms");
  std::ofstream(dir / "tiny.toml") << testing::layout_config("gpt2");
  const std::vector<std::string> settings = {"--set", "train.steps=3", "--set", "train.global_batch=8", "--set",
                                             "train.micro_batch=2", "--set", "log.every=1", "--set",
                                             "parallel.bucket_mb=0.01"};
  struct Layout {
    std::string name;
    std::vector<std::string> sets;
  };
  for (const Layout& l : {Layout{"dp2_zero", {"--set", "parallel.zero=1"}},
                          Layout{"tp2_sp", {"--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=true"}},
                          Layout{"pp2", {"--set", "parallel.pp=2"}}}) {
    const auto run = [&](const std::string& name, const std::vector<std::string>& env) {
      std::vector<std::string> args = {"-n", "2", TESSERA_BINARY, "train", (dir / "tiny.toml").string(), "--run-dir",
                                       (dir / name).string()};
      for (const std::string& a : with(settings, l.sets)) args.push_back(a);
      return testing::run_program(TESSERA_MPIEXEC, args, dir, {}, SIGINT, env);
    };
    auto r = run(l.name + "_direct", {});
    ASSERT_EQ(r.exit_code, 0) << l.name << ": " << r.output;
    r = run(l.name + "_staged", {"TESSERA_TEST_STAGE_COMMS=1"});
    ASSERT_EQ(r.exit_code, 0) << l.name << ": " << r.output;
    const auto want = testing::losses(dir / (l.name + "_direct") / "metrics.jsonl");
    ASSERT_EQ(want.size(), 3u) << l.name;
    EXPECT_EQ(testing::losses(dir / (l.name + "_staged") / "metrics.jsonl"), want) << l.name;
    testing::expect_checkpoints_near(dir / (l.name + "_staged") / "checkpoints" / "step_00000003.h5",
                                     dir / (l.name + "_direct") / "checkpoints" / "step_00000003.h5", 1e-30, l.name);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

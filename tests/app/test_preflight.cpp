// Tests app/preflight.h and the checks `tessera train` makes before training, through the binary:
// a config path that is a directory or /dev/urandom, a read-only run or checkpoint directory,
// resuming at or past train.steps, a checkpoint holding NaN, and resuming with a changed global
// batch or seed.
#include "app/preflight.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "app/checkpoint/checkpoint_testing.h"
#include "cli_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace testing;

// A read-only directory even for root (chmod does not stop root): a read-only tmpfs mounted on it,
// unmounted with the object. mounted() is false where mounting is not allowed.
class ReadOnlyMount {
 public:
  explicit ReadOnlyMount(const fs::path& dir) : dir_(dir) {
    fs::create_directories(dir_);
    mounted_ = ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_RDONLY, "size=1m") == 0;
  }
  ~ReadOnlyMount() {
    if (mounted_) ::umount(dir_.c_str());
  }
  bool mounted() const { return mounted_; }
  const fs::path& path() const { return dir_; }

 private:
  fs::path dir_;
  bool mounted_ = false;
};

struct RunDir {
  fs::path dir;
  explicit RunDir(const std::string& name) : dir(temp_dir(name)) { std::ofstream(dir / "tiny.toml") << kTinyConfig; }
  ~RunDir() { fs::remove_all(dir); }
  // `tessera train tiny.toml --run-dir <dir>/run --set ...`
  RunResult train(const std::vector<std::string>& sets, const std::string& run = "run") const {
    std::vector<std::string> args = {"train", (dir / "tiny.toml").string(), "--run-dir", (dir / run).string()};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    return run_tessera(args, dir);
  }
  fs::path checkpoint(int step) const {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d.h5", step);
    return dir / "run" / "checkpoints" / name;
  }
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A directory as the config used to train the default model (12 layers, 2000 steps); /dev/urandom
// used to be read forever. Both are refused before reading. The timeout and the address-space cap
// keep a build without the check from running away with the machine.
TEST(TrainPreflight, ConfigThatIsADirectoryOrADeviceIsRefused) {
  RunDir r("preflight_config");
  for (const std::string& config : {r.dir.string(), std::string("/dev/urandom")}) {
    const RunResult out = run_program("/usr/bin/timeout", {"-k", "5", "30", "/usr/bin/prlimit", "--as=4294967296", TESSERA_BINARY,
                                                           "train", config, "--run-dir", (r.dir / "run").string()},
                                      r.dir);
    EXPECT_EQ(out.exit_code, 1) << out.output;
    EXPECT_TRUE(contains(out.output, "the config file " + config + " is")) << out.output;
    EXPECT_FALSE(contains(out.output, "| loss")) << out.output;
  }
}

// A read-only checkpoint directory used to be found at the first save, after all the training.
TEST(TrainPreflight, ReadOnlyRunOrCheckpointDirectoryIsRefusedBeforeTraining) {
  RunDir r("preflight_readonly");
  ReadOnlyMount ro(r.dir / "ro");
  if (!ro.mounted()) GTEST_SKIP() << "cannot mount a read-only tmpfs here (needs root and mount rights)";
  RunResult out = r.train({"checkpoint.dir=\"" + ro.path().string() + "\""});
  EXPECT_EQ(out.exit_code, 1) << out.output;
  EXPECT_TRUE(contains(out.output, "cannot write to the checkpoint directory (checkpoint.dir) " + ro.path().string() +
                                       ": Read-only file system"))
      << out.output;
  EXPECT_FALSE(contains(out.output, "| loss")) << out.output;  // refused before the first step
  // The run directory itself on the read-only mount: existing, or to be created there.
  for (const fs::path& run : {ro.path(), ro.path() / "run"}) {
    out = run_tessera({"train", (r.dir / "tiny.toml").string(), "--run-dir", run.string()}, r.dir);
    EXPECT_EQ(out.exit_code, 1) << out.output;
    EXPECT_TRUE(contains(out.output, "the run directory (--run-dir) " + run.string() + ": Read-only file system"))
        << out.output;
  }
}

// A checkpoint at or past train.steps: nothing to train, said so, exit 0, and no invented loss
// (the summary used to print "final loss 0.0000").
TEST(TrainPreflight, ResumingAtOrPastTrainStepsHasNothingToDo) {
  RunDir r("preflight_done");
  ASSERT_EQ(r.train({"train.steps=4"}).exit_code, 0);
  for (const int steps : {4, 3}) {
    const RunResult out = r.train({"train.steps=" + std::to_string(steps)});
    EXPECT_EQ(out.exit_code, 0) << out.output;
    EXPECT_TRUE(contains(out.output, "nothing to do: checkpoint " + r.checkpoint(4).string() +
                                         " is at step 4 >= train.steps = " + std::to_string(steps) +
                                         "; raise train.steps to continue"))
        << out.output;
    EXPECT_FALSE(contains(out.output, "final loss")) << out.output;
  }
}

// A checkpoint holding NaN (a run that diverged, a damaged file) is refused on resume, naming the
// tensor; before, the run "trained" on it and reported a loss of 0.
TEST(TrainPreflight, CheckpointWithNonFiniteWeightsIsRefusedNamingTheTensor) {
  RunDir r("preflight_nan");
  ASSERT_EQ(r.train({"train.steps=3"}).exit_code, 0);
  set_first_value(r.checkpoint(3).string(), "/model/blocks.1.mlp.fc.weight", std::nanf(""));
  const RunResult out = r.train({"train.steps=6"});
  EXPECT_EQ(out.exit_code, 1) << out.output;
  EXPECT_TRUE(contains(out.output, "checkpoint " + r.checkpoint(3).string() +
                                       " holds non-finite values (NaN or inf) in blocks.1.mlp.fc.weight"))
      << out.output;
  EXPECT_FALSE(contains(out.output, "| loss")) << out.output;
}

// Resuming with another global batch or seed is allowed, and said: one warning per key, old -> new,
// and what it changes. An unchanged resume says nothing.
TEST(TrainPreflight, ResumingWithChangedBatchOrSeedWarnsPerKey) {
  RunDir r("preflight_changed");
  ASSERT_EQ(r.train({"train.steps=2"}).exit_code, 0);
  RunResult out = r.train({"train.steps=3"});
  EXPECT_EQ(out.exit_code, 0) << out.output;
  EXPECT_FALSE(contains(out.output, "changed since the checkpoint")) << out.output;
  out = r.train({"train.steps=4", "train.global_batch=16", "train.micro_batch=16", "train.seed=7", "data.val_examples=8"});
  EXPECT_EQ(out.exit_code, 0) << out.output;
  for (const char* w : {"warning: train.global_batch changed since the checkpoint: 8 -> 16; this changes the data order",
                        "warning: train.seed changed since the checkpoint: 1337 -> 7; this changes the data order",
                        "no longer reproduces one that was never interrupted",
                        "warning: data.val_examples changed since the checkpoint: 16 -> 8; this changes the evaluation"})
    EXPECT_TRUE(contains(out.output, w)) << w << " not in: " << out.output;
  EXPECT_FALSE(contains(out.output, "train.micro_batch changed")) << out.output;  // the layout, not the data
}

TEST(Preflight, DataOrderChangesComparesTheStoredConfig) {
  Config now;
  EXPECT_TRUE(data_order_changes(to_toml(now), now).empty());
  Config before = now;
  before.data.digits = 3;
  before.optim.lr = 1.0;  // not a data key
  const auto w = data_order_changes(to_toml(before), now);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "data.digits changed since the checkpoint: 3 -> 2")) << w[0];
  const auto unreadable = data_order_changes("not toml [", now);
  ASSERT_EQ(unreadable.size(), 1u);
  EXPECT_TRUE(contains(unreadable[0], "cannot compare")) << unreadable[0];
}

}  // namespace
}  // namespace tessera

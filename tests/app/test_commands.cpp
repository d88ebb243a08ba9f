// Tests app/commands.cpp: only `train` (and `plan --calibrate`, which measures the ranks) runs
// under mpiexec; the other commands refuse once, by name, before doing anything, and every rank exits 1.
#include <gtest/gtest.h>

#include "cli_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;

TEST(Commands, OnlyTrainRunsUnderMpiexec) {
  const fs::path dir = testing::temp_dir("commands_mpi");
  const std::string missing = (dir / "missing.h5").string();
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"generate", {"generate", "--ckpt", missing, "--prompt", "1+1="}},
      {"ckpt inspect", {"ckpt", "inspect", missing}},
      {"ckpt export", {"ckpt", "export", missing, "--out", (dir / "hf").string()}},
      {"ckpt import", {"ckpt", "import", dir.string(), "--out", (dir / "imported.h5").string()}},
      {"prepare", {"prepare", "--input", (dir / "in.txt").string(), "--tokenizer", "byte", "--out",
                   (dir / "out").string()}},
      {"plan", {"plan", (dir / "missing.toml").string(), "--gpus", "8"}},
  };
  for (const auto& [name, command] : cases) {
    std::vector<std::string> args = {"-n", "2", TESSERA_BINARY};
    args.insert(args.end(), command.begin(), command.end());
    const auto r = testing::run_program(TESSERA_MPIEXEC, args, dir);
    EXPECT_EQ(r.exit_code, 1) << name << ": " << r.output;
    const std::string want = "tessera " + name + " runs on one process; start it without mpirun (got 2 ranks)";
    const size_t at = r.output.find(want);
    EXPECT_NE(at, std::string::npos) << name << ": " << r.output;
    EXPECT_EQ(r.output.rfind(want), at) << name << ": printed more than once: " << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "hf")) << "refused before doing anything";
  EXPECT_FALSE(fs::exists(dir / "out.bin"));
  EXPECT_FALSE(fs::exists(dir / "imported.h5"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

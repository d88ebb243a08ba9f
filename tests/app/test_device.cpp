// Tests app/device.cpp: the local rank from each launcher's environment, the device it selects,
// and `tessera train` with train.device = "cuda" where it cannot run: refused at start with the
// reason, on every rank (two under mpiexec), before anything is trained.
#include <gtest/gtest.h>

#include <map>

#include "app/config.h"
#include "app/device.h"
#include "cli_testing.h"
#include "kernels/exec.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LocalRank, ComesFromTheLauncherMpiFirst) {
  EXPECT_EQ(local_rank(env_of({})), 0);
  EXPECT_EQ(local_rank(env_of({{"SLURM_LOCALID", "3"}})), 3);
  EXPECT_EQ(local_rank(env_of({{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"SLURM_LOCALID", "0"}})), 2);
  // mpiexec in a Slurm batch job: the batch step's SLURM_LOCALID (0) is not the rank's.
  EXPECT_EQ(local_rank(env_of({{"MPI_LOCALRANKID", "1"}, {"SLURM_LOCALID", "0"}})), 1);
  EXPECT_EQ(local_rank(env_of({{"MPI_LOCALRANKID", ""}, {"SLURM_LOCALID", "5"}})), 5);  // empty: unset
}

TEST(LocalRank, RefusesAValueThatIsNotOne) {
  for (const char* bad : {"-1", "x", "2x", "99999999999"}) {
    const std::string e = error_of([&] { local_rank(env_of({{"SLURM_LOCALID", bad}})); });
    EXPECT_NE(e.find("SLURM_LOCALID = \"" + std::string(bad) + "\""), std::string::npos) << e;
  }
}

TEST(SelectDevice, CpuOrTheLocalRanksGpu) {
  EXPECT_EQ(select_device("cpu", 3, 0, false, "h"), Device::cpu());
  EXPECT_EQ(select_device("cuda", 0, 8, true, "h"), Device::cuda(0));
  EXPECT_EQ(select_device("cuda", 5, 8, true, "h"), Device::cuda(5));
  EXPECT_EQ(select_device("cuda", 3, 2, true, "h"), Device::cuda(1));  // ranks share the GPUs in turn
}

TEST(SelectDevice, RefusesCudaWithoutABackendOrADevice) {
  std::string e = error_of([] { select_device("cuda", 0, 4, false, "node7"); });
  EXPECT_NE(e.find("train.device = \"cuda\", but this tessera was built without the CUDA backend"), std::string::npos)
      << e;
  e = error_of([] { select_device("cuda", 2, 0, true, "node7"); });
  EXPECT_NE(e.find("no CUDA device is visible on node7 (local rank 2"), std::string::npos) << e;
  e = error_of([] { select_device("tpu", 0, 0, true, "node7"); });
  EXPECT_NE(e.find("train.device = \"tpu\" is not a device"), std::string::npos) << e;
}

// This machine, whatever it has: cpu always works; cuda works exactly when a device is visible.
TEST(ResolveTrainDevice, MatchesThisMachine) {
  EXPECT_EQ(resolve_train_device("cpu", MPI_COMM_NULL), Device::cpu());
  if (cuda_device_count() > 0) {
    EXPECT_EQ(resolve_train_device("cuda", MPI_COMM_NULL).kind, DeviceKind::CUDA);
  } else {
    const std::string e = error_of([] { resolve_train_device("cuda", MPI_COMM_NULL); });
    EXPECT_NE(e.find(cuda_backend_built() ? "no CUDA device is visible" : "without the CUDA backend"),
              std::string::npos)
        << e;
  }
}

// Two ranks asking for cuda on a machine without a GPU stop at start, each saying why, and train
// nothing.
TEST(TrainDevice, CudaIsRefusedAtStartOnEveryRank) {
  const testing::TrainRun run = testing::make_run("train_device_cuda");
  std::vector<std::string> args = {"-n", "2", TESSERA_BINARY};
  for (const std::string& a : run.args({"train.device=\"cuda\"", "train.micro_batch=4"})) args.push_back(a);
  const testing::RunResult r = testing::run_program(TESSERA_MPIEXEC, args, run.dir);
  EXPECT_NE(r.exit_code, 0) << r.output;
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: cuda trains here (tests/app/cuda/)";
  const std::string why = cuda_backend_built() ? "no CUDA device is visible" : "without the CUDA backend";
  EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run.run() / "metrics.jsonl") && testing::losses(run.run() / "metrics.jsonl").size() > 0)
      << "nothing is trained";
  fs::remove_all(run.dir);
}

// What a CUDA run cannot do yet is refused by name, before anything is allocated; a plain fp32
// one-rank GPT trains there (the verdict depends on the config and the world size only, so these
// run on any machine).
TEST(UnsupportedOnCuda, NamesTheKey) {
  Config c;
  EXPECT_EQ(unsupported_on_cuda(c), "");
  c.parallel.tp = 2;  // layouts: the MPI communicator stages device tensors through host buffers
  c.parallel.pp = 2;
  c.train.dtype = "bf16";  // cuBLASLt's bf16 GEMMs, fp32 attention (docs/cuda.md)
  EXPECT_EQ(unsupported_on_cuda(c), "");
  c.parallel.cp = 2;  // the ring's merge has a CUDA kernel (attention_merge)
  c.parallel.cp_comm = "allgather";
  EXPECT_EQ(unsupported_on_cuda(c), "");
  const auto refusal = [&](const std::function<void(Config&)>& set) {
    Config k;
    set(k);
    return unsupported_on_cuda(k);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {refusal([](Config& k) { k.model.kind = "vlm"; }), "model.kind = \"vlm\""},
      {refusal([](Config& k) { k.data.document_mask = true; }), "data.document_mask = true"},
      {refusal([](Config& k) { k.upscale.method = "solar"; }), "[upscale] method = \"solar\""},
  };
  for (const auto& [message, key] : cases) {
    EXPECT_NE(message.find("train.device = \"cuda\""), std::string::npos) << message;
    EXPECT_NE(message.find(key), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace tessera

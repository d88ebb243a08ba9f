// `tessera plan --calibrate` with train.device = "cuda" (CTest label gpu; two ranks, one GPU, so
// registered by hand with label mpi too: tests/CMakeLists.txt): the file holds every op family of
// the model's step at its shapes, the GEMMs at theirs, every collective's fit and the chain scales,
// each a positive finite number, and says which device it describes; a CUDA config plans with it
// and a CPU config is refused. Tiny shapes and timings (calibrate.*): under the SIMT emulator the
// numbers mean nothing, so no timing is compared with anything. Skipped without a visible device.
#include <gtest/gtest.h>

#include <csignal>
#include <cmath>
#include <fstream>

#include "app/plan_command.h"
#include "kernels/backend_info.h"
#include "kernels/exec.h"
#include "layout_testing.h"
#include "plan/calibrate.h"

#define TESSERA_REQUIRE_GPU()                                                             \
  do {                                                                                    \
    if (::tessera::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device is visible"; \
  } while (0)

namespace tessera {
namespace {
namespace fs = std::filesystem;

bool positive(double x) { return x > 0 && std::isfinite(x); }

// The tiny calibration's settings: every size at its least, one repetition.
const std::vector<std::string> kQuick = {"--set", "calibrate.min_seconds=0.0005", "--set", "calibrate.repeats=1",
                                         "--set", "calibrate.gemm_size=64", "--set", "calibrate.stream_elements=4096",
                                         "--set", "calibrate.max_message_bytes=32768"};

// `mpiexec -n 2 tessera plan --calibrate <dir>/tiny.toml --out <dir>/<out> <sets...>` (env: the ranks').
testing::RunResult calibrate(const fs::path& dir, const std::string& out, const std::vector<std::string>& sets,
                             const std::vector<std::string>& env = {}) {
  std::vector<std::string> args = {"-n", "2", TESSERA_BINARY, "plan", "--calibrate", (dir / "tiny.toml").string(),
                                   "--out", (dir / out).string()};
  args.insert(args.end(), sets.begin(), sets.end());
  args.insert(args.end(), kQuick.begin(), kQuick.end());
  return testing::run_program(TESSERA_MPIEXEC, args, dir, {}, SIGINT, env);
}

TEST(CudaCalibration, TwoRanksMeasureTheGpuAndPlansReadTheFile) {
  TESSERA_REQUIRE_GPU();
  const fs::path dir = testing::temp_dir("cuda_calibrate");
  const fs::path config = dir / "tiny.toml", cluster = dir / "cuda.toml";
  std::ofstream(config) << testing::layout_config("gpt2");
  const testing::RunResult r = calibrate(dir, "cuda.toml", {"--set", "train.device=\"cuda\""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"train.device = \"cuda\"", "parallel.comm = \"mpi\"", "all-reduce 4096 bytes over 2 ranks",
                           "all-gather over 2 ranks", "reduce-scatter over 2 ranks", "send/recv over 2 ranks",
                           "the model forward + backward (micro-batch", "the model forward + backward at tp 2",
                           "the model forward + backward at cp 2", "wrote "})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;

  const plan::ClusterSpec c = plan::load_cluster(cluster.string());
  EXPECT_EQ(c.device, "cuda");
  EXPECT_NE(c.device_name.find("sm_"), std::string::npos) << c.device_name;  // the runtime's name
  EXPECT_FALSE(c.host_memory);
  EXPECT_EQ(c.devices_per_node, 2);
  EXPECT_NE(c.description.find("parallel.comm = \"mpi\""), std::string::npos) << c.description;
  EXPECT_FALSE(c.async_progress);  // MPI, staged through the host
  // The device's memory, shared by the ranks that train.device puts on it (local rank mod devices).
  const int sharing = (2 + cuda_device_count() - 1) / cuda_device_count();
  // The runtime's count (totalGlobalMem), not a number parsed back out of the device's name.
  EXPECT_NEAR(c.device_memory, double(cuda_device_memory(0)) / sharing, 1e-9 * c.device_memory);
  for (const double x : {c.peak_flops_fp32, c.peak_flops_bf16, c.memory_bandwidth, c.op_latency, c.device_memory,
                         c.chain_scale_fp32, c.chain_scale_bf16})
    EXPECT_TRUE(positive(x)) << x;
  for (const double x : {c.chain_scale_fp32, c.chain_scale_bf16}) EXPECT_NE(x, 1.0);  // measured, not the default
  // Every collective, fitted on its own.
  for (const double x : {c.intra.bandwidth, c.intra.all_gather_bandwidth, c.intra.reduce_scatter_bandwidth,
                         c.intra.p2p_bandwidth})
    EXPECT_TRUE(positive(x)) << x;
  for (const double x : {c.intra.latency, c.intra.all_gather_latency, c.intra.reduce_scatter_latency,
                         c.intra.p2p_latency})
    EXPECT_TRUE(x >= 0 && std::isfinite(x)) << x;
  // Every op of the step at its shapes (forward and backward, fp32 and bf16), and the GEMMs at theirs.
  const plan::Workload w = workload_of(load_config(config.string()));
  const std::vector<plan::OpTime> want = plan::model_op_shapes(w, 2);
  ASSERT_EQ(c.op_times.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(c.op_times[i].op, want[i].op) << i;
    EXPECT_EQ(c.op_times[i].shape, want[i].shape) << plan::op_name(want[i].op);
    EXPECT_EQ(c.op_times[i].bf16, want[i].bf16) << plan::op_name(want[i].op);
    EXPECT_TRUE(positive(c.op_times[i].seconds)) << plan::op_name(want[i].op) << " " << c.op_times[i].seconds;
  }
  for (const plan::OpKind op : {plan::OpKind::AttentionForward, plan::OpKind::AttentionBackward,
                                plan::OpKind::LayerNormForward, plan::OpKind::LayerNormBackward,
                                plan::OpKind::ResidualForward, plan::OpKind::ResidualBackward, plan::OpKind::GeluForward,
                                plan::OpKind::GeluBackward, plan::OpKind::EmbeddingForward,
                                plan::OpKind::EmbeddingBackward, plan::OpKind::CrossEntropyForward,
                                plan::OpKind::CrossEntropyBackward, plan::OpKind::AdamW, plan::OpKind::GradNorm,
                                plan::OpKind::LinearForward, plan::OpKind::LinearBackwardInput,
                                plan::OpKind::LinearBackwardWeight})
    EXPECT_TRUE(plan::has_op_times(c, op)) << plan::op_name(op);
  const std::vector<plan::GemmShape> shapes = plan::model_gemm_shapes(w, 2);
  ASSERT_EQ(c.gemm_rates.size(), 2 * shapes.size());
  for (const plan::GemmRate& g : c.gemm_rates) EXPECT_TRUE(positive(g.flops)) << g.m << "x" << g.n << "x" << g.k;

  // A CUDA config plans with the file; a CPU one is refused, naming the file and the key.
  const testing::RunResult p = testing::run_tessera(
      {"plan", config.string(), "--gpus", "2", "--cluster", cluster.string(), "--set", "train.device=\"cuda\""}, dir);
  EXPECT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(p.output.find("on 2 x local"), std::string::npos) << p.output;
  const testing::RunResult cpu = testing::run_tessera({"plan", config.string(), "--gpus", "2", "--cluster",
                                                       cluster.string()},
                                                      dir);
  EXPECT_EQ(cpu.exit_code, 1) << cpu.output;
  EXPECT_NE(cpu.output.find("--cluster " + cluster.string() + " was calibrated on cluster.device = \"cuda\""),
            std::string::npos)
      << cpu.output;
  fs::remove_all(dir);
}

// parallel.comm = "nccl": the collectives through the NCCL communicator, one device per rank (NCCL
// refuses two ranks on one GPU): under the SIMT emulator two emulated devices (TESSERA_SIMT_DEVICES
// for the ranks), on GPUs skipped unless two are visible.
TEST(CudaCalibration, NcclCollectivesOnTwoDevices) {
  TESSERA_REQUIRE_GPU();
#ifdef TESSERA_SIMT
  const std::vector<std::string> env = {"TESSERA_SIMT_DEVICES=2"};
#else
  if (cuda_device_count() < 2) GTEST_SKIP() << "NCCL needs a GPU per rank: fewer than two are visible";
  const std::vector<std::string> env;
#endif
  const fs::path dir = testing::temp_dir("cuda_calibrate_nccl");
  std::ofstream(dir / "tiny.toml") << testing::layout_config("gpt2");
  const testing::RunResult r =
      calibrate(dir, "nccl.toml", {"--set", "train.device=\"cuda\"", "--set", "parallel.comm=\"nccl\""}, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"parallel.comm = \"nccl\"", "all-gather over 2 ranks", "send/recv over 2 ranks", "wrote "})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  const plan::ClusterSpec c = plan::load_cluster((dir / "nccl.toml").string());
  EXPECT_EQ(c.device, "cuda");
  EXPECT_TRUE(c.async_progress);  // NCCL runs on its own stream beside the compute
  EXPECT_NEAR(c.device_memory, double(cuda_device_memory(0)), 1e-9 * c.device_memory);  // one rank each
  for (const double x : {c.intra.bandwidth, c.intra.all_gather_bandwidth, c.intra.reduce_scatter_bandwidth,
                         c.intra.p2p_bandwidth, c.chain_scale_fp32, c.chain_scale_bf16})
    EXPECT_TRUE(positive(x)) << x;
  EXPECT_EQ(c.op_times.size(), plan::model_op_shapes(workload_of(load_config((dir / "tiny.toml").string())), 2).size());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

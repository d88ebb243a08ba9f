// `tessera train` with train.device = "cuda" against the same run on the CPU (CTest label gpu):
// losses and every checkpoint tensor, a checkpoint written on one device resumed on the other.
// Without a visible GPU every test ends in GTEST_SKIP, which CTest reports as skipped (never
// passed). None of these has run on a GPU yet (docs/cuda.md).
//
// Tolerances. The CPU's tiny-model runs under different layouts agree to 1e-5 (fp32 sums in
// another order). The CUDA kernels are fp32 too, but each op is held to its CPU reference only
// within its op case's tolerance (tests/kernels/op_cases.cpp: up to 1e-5 normwise for the F32
// attention, 2e-6 for AdamW, GEMMs through cuBLASLt in another blocking than OpenBLAS), so the
// gradients differ from the CPU's by up to ~1e-5 relative where the layouts' differ by ~1e-7.
// AdamW divides by sqrt(v) + eps: in the first steps a small gradient's relative error becomes
// the update's, so parameters can differ by that relative error times lr per step. Losses: 1e-4
// relative (a loss averages thousands of terms; its error is the parameters'); checkpoint
// tensors: 1e-3 relative to the largest of their family (expect_checkpoints_near). A wrong index
// or a missing synchronization shows as O(1). To be confirmed on the first GPU.
#include <gtest/gtest.h>

#include <fstream>

#include "kernels/exec.h"
#include "layout_testing.h"

// Ends the test as skipped, naming why, unless a CUDA device is visible.
#define TESSERA_REQUIRE_GPU()                                                        \
  do {                                                                               \
    if (::tessera::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device is visible"; \
  } while (0)

namespace tessera {
namespace {
namespace fs = std::filesystem;
using testing::with;

constexpr double kLossRel = 1e-4, kTensorRel = 1e-3;

const std::vector<std::string> kCuda = {"--set", "train.device=\"cuda\""};

std::vector<std::string> settings(int steps, std::vector<std::string> extra = {}) {
  return with({"--set", "train.steps=" + std::to_string(steps), "--set", "train.global_batch=8", "--set",
               "train.micro_batch=4", "--set", "log.every=1", "--set", "checkpoint.every=6"},
              extra);
}

// preset trained 8 steps (two micro-batches each, a checkpoint at 6 and 8) on the CPU and on CUDA:
// the losses and both checkpoints' tensors (the files hold the same tensors at the same shapes),
// then an evaluation at the end on both (train.eval_every: the validation loss and greedy answers).
void expect_cuda_matches_cpu(const std::string& preset) {
  const fs::path dir = testing::temp_dir("cuda_vs_cpu_" + preset);
  std::ofstream(dir / "tiny.toml") << testing::layout_config(preset);
  const std::vector<std::string> eval = {"--set", "train.eval_every=4"};
  auto r = testing::train_run(dir, "tiny.toml", "cpu", 1, settings(8, eval));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::train_run(dir, "tiny.toml", "cuda", 1, settings(8, with(eval, kCuda)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("device: cuda:0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("accuracy"), std::string::npos) << "the evaluation ran: " << r.output;
  const auto want = testing::losses(dir / "cpu" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 8u);
  testing::expect_losses_near(testing::losses(dir / "cuda" / "metrics.jsonl"), want, kLossRel, preset);
  for (const char* file : {"step_00000006.h5", "step_00000008.h5"})
    testing::expect_checkpoints_near(dir / "cuda" / "checkpoints" / file, dir / "cpu" / "checkpoints" / file,
                                     kTensorRel, preset + " " + file);
  fs::remove_all(dir);
}

TEST(CudaTraining, Gpt2MatchesTheCpu) {
  TESSERA_REQUIRE_GPU();
  expect_cuda_matches_cpu("gpt2");
}

TEST(CudaTraining, LlamaMatchesTheCpu) {
  TESSERA_REQUIRE_GPU();
  expect_cuda_matches_cpu("llama");
}

// A checkpoint saved on CUDA at step 6 resumes on the CPU, and one saved on the CPU resumes on
// CUDA: the last two losses and the step-8 tensors as the CPU's uninterrupted run.
TEST(CudaTraining, CheckpointsResumeAcrossDevices) {
  TESSERA_REQUIRE_GPU();
  const fs::path dir = testing::temp_dir("cuda_resume");
  std::ofstream(dir / "tiny.toml") << testing::layout_config("gpt2");
  auto r = testing::train_run(dir, "tiny.toml", "cpu", 1, settings(8));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "cpu" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 8u);
  struct Hop {
    std::string name;
    std::vector<std::string> before, after;
  };
  for (const Hop& h : {Hop{"cuda_to_cpu", kCuda, {}}, Hop{"cpu_to_cuda", {}, kCuda}}) {
    r = testing::train_run(dir, "tiny.toml", h.name, 1, settings(8, with(h.before, {"--set", "train.exit_after_steps=6"})));
    ASSERT_EQ(r.exit_code, 0) << h.name << ": " << r.output;
    r = testing::train_run(dir, "tiny.toml", h.name, 1, settings(8, h.after));
    ASSERT_EQ(r.exit_code, 0) << h.name << ": " << r.output;
    EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
    const auto got = testing::losses(dir / h.name / "metrics.jsonl");
    ASSERT_EQ(got.size(), 8u) << h.name;
    testing::expect_losses_near(got, want, kLossRel, h.name);
    testing::expect_checkpoints_near(dir / h.name / "checkpoints" / "step_00000008.h5",
                                     dir / "cpu" / "checkpoints" / "step_00000008.h5", kTensorRel, h.name);
  }
  fs::remove_all(dir);
}

// checkpoint.init_from on CUDA: the weights of a CPU checkpoint uploaded into a fresh run, whose
// first loss is then the CPU's first loss after that file's step (the same weights, fresh moments).
TEST(CudaTraining, InitFromACpuCheckpoint) {
  TESSERA_REQUIRE_GPU();
  const fs::path dir = testing::temp_dir("cuda_init_from");
  std::ofstream(dir / "tiny.toml") << testing::layout_config("gpt2");
  auto r = testing::train_run(dir, "tiny.toml", "base", 1, settings(6));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string from = (dir / "base" / "checkpoints" / "step_00000006.h5").string();
  const std::vector<std::string> init = {"--set", "checkpoint.init_from=\"" + from + "\""};
  r = testing::train_run(dir, "tiny.toml", "cpu", 1, settings(2, init));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::train_run(dir, "tiny.toml", "cuda", 1, settings(2, with(init, kCuda)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("initialized from"), std::string::npos) << r.output;
  testing::expect_losses_near(testing::losses(dir / "cuda" / "metrics.jsonl"),
                              testing::losses(dir / "cpu" / "metrics.jsonl"), kLossRel, "init_from");
  fs::remove_all(dir);
}

// train.dtype = "bf16" on CUDA (cuBLASLt's bf16 GEMMs with fp32 accumulation, the f32 attention)
// tracks fp32 on CUDA for 20 steps within 2% per step, as on the CPU (tests/app/test_trainer.cpp:
// the same bound, there over 30 steps), and differs from it somewhere (bf16 really ran); and it
// tracks the CPU's bf16 run within the same 2% (both round the same operands to bf16).
TEST(CudaTraining, Bf16TracksFp32) {
  TESSERA_REQUIRE_GPU();
  const fs::path dir = testing::temp_dir("cuda_bf16");
  std::ofstream(dir / "tiny.toml") << testing::layout_config("gpt2");
  const std::vector<std::string> bf16 = {"--set", "train.dtype=\"bf16\"", "--set", "checkpoint.every=0"};
  auto r = testing::train_run(dir, "tiny.toml", "fp32", 1, settings(20, with(kCuda, {"--set", "checkpoint.every=0"})));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::train_run(dir, "tiny.toml", "bf16", 1, settings(20, with(kCuda, bf16)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::train_run(dir, "tiny.toml", "cpu_bf16", 1, settings(20, bf16));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto fp32 = testing::losses(dir / "fp32" / "metrics.jsonl"), got = testing::losses(dir / "bf16" / "metrics.jsonl");
  ASSERT_EQ(fp32.size(), 20u);
  testing::expect_losses_near(got, fp32, 0.02, "bf16 vs fp32 on cuda");
  EXPECT_NE(got, fp32) << "bf16 gave the fp32 losses exactly: the bf16 GEMMs did not run";
  testing::expect_losses_near(got, testing::losses(dir / "cpu_bf16" / "metrics.jsonl"), 0.02, "bf16 cuda vs cpu");
  fs::remove_all(dir);
}

// Several ranks on one GPU with parallel.comm = "mpi" (device tensors staged through pinned host
// buffers): dp 2 (and ZeRO-1), tp 2 with sequence parallelism, pp 2 and cp 2 (ring and all-gather:
// context attention on device tensors, the CUDA attention_merge) against the 1-rank CUDA run,
// losses and checkpoints within the CPU layouts' 1e-5 (the same kernels on both sides; only the
// reduction order differs). Registered by hand, labels gpu;mpi (tests/CMakeLists.txt).
TEST(CudaTrainingLayouts, RanksSharingOneGpuMatchOneRank) {
  TESSERA_REQUIRE_GPU();
  const fs::path dir = testing::temp_dir("cuda_layouts");
  std::ofstream(dir / "tiny.toml") << testing::layout_config("gpt2");
  auto r = testing::train_run(dir, "tiny.toml", "one", 1, settings(6, kCuda));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = testing::losses(dir / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  struct Layout {
    std::string name;
    std::vector<std::string> sets;
  };
  for (const Layout& l : {Layout{"dp2", {"--set", "parallel.dp=2"}},
                          Layout{"dp2_zero", {"--set", "parallel.dp=2", "--set", "parallel.zero=1"}},
                          Layout{"tp2_sp", {"--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=true"}},
                          Layout{"pp2", {"--set", "parallel.pp=2"}},
                          Layout{"cp2_ring", {"--set", "parallel.cp=2"}},
                          Layout{"cp2_allgather", {"--set", "parallel.cp=2", "--set", "parallel.cp_comm=\"allgather\""}}}) {
    r = testing::train_run(dir, "tiny.toml", l.name, 2, settings(6, with(kCuda, l.sets)));
    ASSERT_EQ(r.exit_code, 0) << l.name << ": " << r.output;
    testing::expect_losses_near(testing::losses(dir / l.name / "metrics.jsonl"), want, 1e-5, l.name);
    testing::expect_checkpoints_near(dir / l.name / "checkpoints" / "step_00000006.h5",
                                     dir / "one" / "checkpoints" / "step_00000006.h5", 1e-5, l.name);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

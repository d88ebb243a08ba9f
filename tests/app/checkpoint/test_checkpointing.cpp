// Tests app/checkpoint/checkpointing.h through `tessera train`: bit-exact resume, a process killed with
// SIGKILL in the middle of a save, preemption by SIGUSR1, keep_last pruning, a damaged or missing
// newest checkpoint, a corrupted config, a full disk (one rank and two, on a small tmpfs),
// temporaries planted as symlinks, and a checkpoint whose shapes do not fit the config.
#include "app/checkpoint/checkpointing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "app/checkpoint/checkpoint_io.h"
#include "app/trainer.h"
#include "app/cli_testing.h"
#include "app/disk_testing.h"
#include "mpi_testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;

using testing::make_run;
using testing::TrainRun;

// The "loss" values of metrics.jsonl, as printed (9 significant digits), by step.
std::map<int64_t, std::string> loss_lines(const fs::path& metrics) {
  std::map<int64_t, std::string> out;
  std::istringstream in(testing::read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto l = line.find("\"loss\": ");
    if (l == std::string::npos) continue;
    const int64_t step = std::stoll(line.substr(line.find("\"step\": ") + 8));
    out[step] = line.substr(l, line.find(',', l) - l);
  }
  return out;
}

std::map<std::string, std::vector<float>> tensors_of(const fs::path& file) {
  CheckpointReader r(file.string(), testing::test_world());
  std::map<std::string, std::vector<float>> out;
  for (const auto& t : r.tensors()) out[t.path] = r.read_all(t.path);
  return out;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void rewrite(const fs::path& file, const std::function<void(std::string&)>& change) {
  std::string bytes = testing::read_file(file);
  change(bytes);
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One flipped bit in the config text stored in the file: norm_eps = 1e-5 becomes 1e-1.
void corrupt_config(const fs::path& file) {
  rewrite(file, [](std::string& bytes) {
    const size_t at = bytes.find("norm_eps = 1e-5");
    ASSERT_NE(at, std::string::npos);
    bytes[at + 14] = '1';  // '5' (0x35) -> '1' (0x31): one bit
  });
}

// Flips bytes inside the stored data of /model/wte.weight (found by its values).
void corrupt_tensor(const fs::path& file) {
  const std::vector<float> wte = tensors_of(file).at("/model/wte.weight");
  rewrite(file, [&](std::string& bytes) {
    const std::string needle(reinterpret_cast<const char*>(wte.data() + wte.size() / 2), 16);
    const size_t at = bytes.find(needle);
    ASSERT_NE(at, std::string::npos);
    for (size_t i = at; i < at + 4; ++i) bytes[i] = static_cast<char>(~bytes[i]);
  });
}

}  // namespace

// Stopped at step 8 by train.exit_after_steps and resumed, a run gives exactly the losses and
// final parameters and optimizer moments of the uninterrupted run (same layout and threads).
TEST(Checkpointing, ResumeIsBitExact) {
  const TrainRun whole = make_run("ckpt_whole"), pieces = make_run("ckpt_pieces");
  RunResult r = whole.train({"train.steps=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = pieces.train({"train.steps=20", "train.exit_after_steps=8"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train.exit_after_steps = 8 reached: saved"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(pieces.ckpts() / "step_00000008.h5"));
  r = pieces.train({"train.steps=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at step 8"), std::string::npos) << r.output;

  const auto a = loss_lines(whole.run() / "metrics.jsonl"), b = loss_lines(pieces.run() / "metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);  // 8 from the first piece, 12 appended by the second
  for (const auto& [step, loss] : a) EXPECT_EQ(b.at(step), loss) << "step " << step;
  const auto ta = tensors_of(whole.ckpts() / "step_00000020.h5"), tb = tensors_of(pieces.ckpts() / "step_00000020.h5");
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [path, values] : ta) EXPECT_EQ(tb.at(path), values) << path;
  fs::remove_all(whole.dir);
  fs::remove_all(pieces.dir);
}

// train.dtype = "bf16": stopped at step 4 and resumed, the run gives exactly the uninterrupted
// run's losses and final state, so the weights' bf16 copy is rebuilt from the resumed fp32 masters
// (a copy left at the initial values would change every loss after the resume). The checkpoint
// holds fp32 tensors only: the bf16 copy is not state.
TEST(Checkpointing, Bf16ResumeIsBitExactAndCheckpointsStayFp32) {
  const TrainRun whole = make_run("ckpt_bf16_whole"), pieces = make_run("ckpt_bf16_pieces");
  RunResult r = whole.train({"train.steps=8", "train.dtype=\"bf16\""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision: bf16"), std::string::npos) << r.output;
  r = pieces.train({"train.steps=8", "train.dtype=\"bf16\"", "train.exit_after_steps=4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = pieces.train({"train.steps=8", "train.dtype=\"bf16\""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 4"), std::string::npos) << r.output;
  const auto a = loss_lines(whole.run() / "metrics.jsonl"), b = loss_lines(pieces.run() / "metrics.jsonl");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (const auto& [step, loss] : a) EXPECT_EQ(b.at(step), loss) << "step " << step;
  CheckpointReader reader((whole.ckpts() / "step_00000008.h5").string(), testing::test_world());
  for (const auto& t : reader.tensors()) EXPECT_EQ(t.dtype, "float32") << t.path;
  const auto ta = tensors_of(whole.ckpts() / "step_00000008.h5"), tb = tensors_of(pieces.ckpts() / "step_00000008.h5");
  for (const auto& [path, values] : ta) EXPECT_EQ(tb.at(path), values) << path;
  fs::remove_all(whole.dir);
  fs::remove_all(pieces.dir);
}

// An fp32 checkpoint resumes into bf16, whose checkpoint resumes into fp32 again: steps 1-4 fp32,
// 5-8 bf16, 9-12 fp32, against an fp32 run throughout. Steps 1-4 are the same run (equal); the
// later losses differ by bf16 rounding only: within 2e-2 relative (the golden models' bf16 loss is
// within 1e-3 of fp32 after one step and 2.5e-2 after ten AdamW steps on one batch,
// tests/model/test_gpt.cpp; here each step sees new data and lr is 3e-3).
TEST(Checkpointing, Fp32CheckpointResumesIntoBf16AndBack) {
  const TrainRun fp32 = make_run("ckpt_fp32_only"), mixed = make_run("ckpt_fp32_bf16_fp32");
  RunResult r = fp32.train({"train.steps=12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mixed.train({"train.steps=12", "train.exit_after_steps=4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mixed.train({"train.steps=12", "train.dtype=\"bf16\"", "train.exit_after_steps=4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("precision: bf16"), std::string::npos) << r.output;
  r = mixed.train({"train.steps=12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 8"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("precision: bf16"), std::string::npos) << r.output;
  const auto a = loss_lines(fp32.run() / "metrics.jsonl"), b = loss_lines(mixed.run() / "metrics.jsonl");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  bool moved = false;
  for (const auto& [step, loss] : a) {
    const double la = std::stod(loss.substr(8)), lb = std::stod(b.at(step).substr(8));
    if (step <= 4) {
      EXPECT_EQ(b.at(step), loss) << "step " << step;
    }
    EXPECT_NEAR(lb, la, 2e-2 * la) << "step " << step;
    moved = moved || (step > 4 && b.at(step) != loss);
  }
  EXPECT_TRUE(moved) << "the bf16 steps gave the fp32 losses exactly: bf16 did not run";
  fs::remove_all(fp32.dir);
  fs::remove_all(mixed.dir);
}

// SIGKILL after the new file is written but before it is renamed into place: the previous
// checkpoint stays intact and named by `latest`, and the next run resumes from it.
TEST(Checkpointing, KillDuringSaveKeepsThePreviousCheckpoint) {
  const TrainRun run = make_run("ckpt_kill");
  RunResult r = run.train({"train.steps=20", "train.exit_after_steps=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path marker = run.dir / "paused";
  r = run.train({"train.steps=20", "train.exit_after_steps=5"}, marker, SIGKILL,
                {"TESSERA_TEST_PAUSE_BEFORE_RENAME=" + marker.string()});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  const std::string tmp = testing::read_file(marker);  // the temporary's name, as announced
  EXPECT_EQ(fs::path(tmp).filename().string().rfind("step_00000010.h5.tmp.", 0), 0u) << tmp;
  EXPECT_TRUE(fs::exists(tmp.substr(0, tmp.size() - 1)));
  EXPECT_FALSE(fs::exists(run.ckpts() / "step_00000010.h5"));
  EXPECT_EQ(testing::read_file(run.ckpts() / "latest"), "step_00000005.h5\n");
  r = run.train({"train.steps=12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step_00000005.h5 at step 5"), std::string::npos) << r.output;
  // The killed process's temporary is gone: a new writer removes stale ones.
  EXPECT_EQ(testing::names_of(run.ckpts()), (std::vector<std::string>{"latest", "step_00000005.h5", "step_00000012.h5"}));
  fs::remove_all(run.dir);
}

// train.exit_after_minutes: saves at the first step boundary past the limit and exits 0; the
// same command continues the schedule to the end.
TEST(Checkpointing, ExitAfterMinutesSavesAndTheSameCommandContinues) {
  const TrainRun run = make_run("ckpt_minutes");
  RunResult r = run.train({"train.steps=20", "train.exit_after_minutes=1e-6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train.exit_after_minutes reached: saved"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(run.ckpts() / "step_00000001.h5"));
  r = run.train({"train.steps=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("at step 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 20 steps"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

// SIGUSR1 (Slurm's warning before the time limit): checkpoint at the step boundary, exit 75.
TEST(Checkpointing, PreemptionSignalSavesAndExitsForRequeue) {
  const TrainRun run = make_run("ckpt_preempt");
  const RunResult r = run.train({"train.steps=100000"}, run.run() / "metrics.jsonl", SIGUSR1);
  EXPECT_EQ(r.exit_code, kExitPreempted) << r.output;
  EXPECT_NE(r.output.find("preempted by signal"), std::string::npos) << r.output;
  EXPECT_EQ(testing::read_file(run.ckpts() / "latest").rfind("step_", 0), 0u);
  fs::remove_all(run.dir);
}

TEST(Checkpointing, KeepLastPrunesOlderFiles) {
  const TrainRun run = make_run("ckpt_prune");
  const RunResult r = run.train({"train.steps=10", "checkpoint.every=2", "checkpoint.keep_last=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run.ckpts())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000008.h5", "step_00000010.h5"}));
  fs::remove_all(run.dir);
}

// checkpoint.at_end = false (benchmarks): a completed run saves only what checkpoint.every asks
// for, the last step included when every divides it.
TEST(Checkpointing, AtEndFalseSavesOnlyThePeriodicCheckpoints) {
  const TrainRun run = make_run("ckpt_at_end");
  auto saved = [&] {
    std::vector<std::string> names;
    if (fs::exists(run.ckpts()))
      for (const auto& e : fs::directory_iterator(run.ckpts())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  RunResult r = run.train({"train.steps=3", "checkpoint.at_end=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(saved(), std::vector<std::string>{});
  r = run.train({"train.steps=7", "checkpoint.at_end=false", "checkpoint.every=2", "checkpoint.resume=\"none\""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(saved(), (std::vector<std::string>{"latest", "step_00000002.h5", "step_00000004.h5", "step_00000006.h5"}));
  r = run.train({"train.steps=8", "checkpoint.at_end=false", "checkpoint.every=2", "checkpoint.resume=\"none\"",
                 "checkpoint.overwrite=true"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(saved(), (std::vector<std::string>{"latest", "step_00000004.h5", "step_00000006.h5", "step_00000008.h5"}))
      << "keep_last = 3";
  fs::remove_all(run.dir);
}

// A newest checkpoint cut short (a full disk, a crash outside tessera) is skipped with a warning.
TEST(Checkpointing, DamagedNewestCheckpointFallsBackToTheOneBefore) {
  const TrainRun run = make_run("ckpt_damaged");
  RunResult r = run.train({"train.steps=10", "checkpoint.every=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path newest = run.ckpts() / "step_00000010.h5";
  fs::resize_file(newest, fs::file_size(newest) / 2);
  r = run.train({"train.steps=12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: skipping checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step_00000005.h5 at step 5"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

// `latest` names a checkpoint whose tensor data is corrupted: resume = auto reads every chunk of a
// candidate before using it, skips this one with a warning naming it and why, and resumes from the
// newest valid one. A `latest` naming a file that is gone is reported too, not skipped silently.
TEST(Checkpointing, CorruptOrMissingLatestFallsBackToTheNewestValidOne) {
  const TrainRun run = make_run("ckpt_corrupt_latest");
  RunResult r = run.train({"train.steps=10", "checkpoint.every=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path newest = run.ckpts() / "step_00000010.h5";
  ASSERT_EQ(testing::read_file(run.ckpts() / "latest"), "step_00000010.h5\n");
  corrupt_tensor(newest);
  r = run.train({"train.steps=12"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: skipping checkpoint " + newest.string() +
                          ": checksum mismatch reading /model/wte.weight in " + newest.string()),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("step_00000005.h5 at step 5"), std::string::npos) << r.output;

  // `latest` (now step 12) names a file that is gone.
  fs::remove(run.ckpts() / "step_00000012.h5");
  r = run.train({"train.steps=13"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: `latest` in " + run.ckpts().string() +
                          " names step_00000012.h5, which does not exist"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("step_00000005.h5 at step 5"), std::string::npos) << r.output;  // 10 is still corrupt
  fs::remove_all(run.dir);
}

// One flipped bit in the config stored in a checkpoint (norm_eps 1e-5 -> 1e-1) is refused by every
// reader, naming the file: `ckpt inspect`, `generate`, an explicit resume; resume = auto skips it.
TEST(Checkpointing, CorruptedConfigIsRefusedEverywhere) {
  const TrainRun run = make_run("ckpt_corrupt_config");
  RunResult r = run.train({"train.steps=3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path file = run.ckpts() / "step_00000003.h5";
  corrupt_config(file);
  const std::string refusal = "checksum mismatch in the metadata of " + file.string();
  r = testing::run_tessera({"ckpt", "inspect", file.string()}, run.dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(refusal), std::string::npos) << r.output;
  r = testing::run_tessera({"generate", "--ckpt", file.string(), "--prompt", "1+1=", "--max-tokens", "2"}, run.dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(refusal), std::string::npos) << r.output;
  r = run.train({"train.steps=6", "checkpoint.resume=\"" + file.string() + "\""});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(refusal), std::string::npos) << r.output;
  r = run.train({"train.steps=4"});  // auto: the only checkpoint is skipped; a fresh start
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: skipping checkpoint " + file.string() + ": " + refusal), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("resumed from"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

// Files and symlinks planted under the temporary names older versions used (step_N.h5.tmp,
// latest.tmp) are never written through: a save creates fresh names exclusively, and a new
// writer removes the planted links (never what they point to).
TEST(Checkpointing, PlantedTemporarySymlinksAreNeverFollowed) {
  const TrainRun run = make_run("ckpt_symlinks");
  fs::create_directories(run.ckpts());
  const fs::path victim_file = run.dir / "victim_file", victim_latest = run.dir / "victim_latest";
  std::ofstream(victim_file) << "precious\n";
  std::ofstream(victim_latest) << "also precious\n";
  fs::create_symlink(victim_file, run.ckpts() / "step_00000002.h5.tmp");
  fs::create_symlink(victim_latest, run.ckpts() / "latest.tmp");
  const RunResult r = run.train({"train.steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::read_file(victim_file), "precious\n");
  EXPECT_EQ(testing::read_file(victim_latest), "also precious\n");
  EXPECT_FALSE(fs::is_symlink(run.ckpts() / "step_00000002.h5"));
  EXPECT_EQ(testing::names_of(run.ckpts()), (std::vector<std::string>{"latest", "step_00000002.h5"}));
  EXPECT_EQ(tensors_of(run.ckpts() / "step_00000002.h5").size(), 3u * 36u);  // 36 parameters, 2 moments each
  fs::remove_all(run.dir);
}

// A disk that fills up during a save: the save fails on every rank at the same point (the space
// is reserved before HDF5 writes anything), the run ends with exit 1 and one message, no
// temporary is left, `latest` still names the last good checkpoint, and once there is space the
// same command resumes from it. ranks > 1 runs under mpiexec with a deadline: a hang fails the
// test (and its processes are killed) instead of blocking ctest.
void full_disk_run(int ranks) {
  const TrainRun run = make_run("ckpt_full_disk_" + std::to_string(ranks));
  const testing::RemoveAtEnd cleanup{run.dir};
  // A tiny checkpoint is 0.59 MiB (0.83 MiB reserved while it is written): saves at steps 1 and 2
  // fit in 1.5 MiB, the one at step 3 does not. (Without the reservation, that save ran out of
  // space halfway: one rank crashed in MPI_Finalize, two ranks hung in different collectives.)
  testing::SmallDisk disk(run.dir / "disk", 1536 << 10);
  // RLIMIT_FSIZE, the fallback elsewhere, would also limit the shared-memory files MPI starts with.
  if (!disk.mounted()) GTEST_SKIP() << "mounting a tmpfs needs root; a file size limit would break MPI_Init";
  std::vector<std::string> args = {"train", run.config.string(), "--run-dir", (disk.path() / "run").string()};
  for (const char* s : {"train.steps=3", "checkpoint.every=1", "checkpoint.keep_last=10", "train.micro_batch=4"})
    args.push_back("--set"), args.push_back(s);
  if (ranks > 1) args.insert(args.begin(), {"-n", std::to_string(ranks), TESSERA_BINARY});
  const auto result = testing::run_with_deadline(ranks > 1 ? TESSERA_MPIEXEC : TESSERA_BINARY, args, run.dir, 120);
  const RunResult& r = result.run;
  ASSERT_FALSE(result.timed_out) << "the run hung on a full disk:\n" << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;  // not a crash (139) in MPI_Finalize
  EXPECT_EQ(count_of(r.output, "tessera: error:"), 1u) << r.output;
  EXPECT_NE(r.output.find("tessera: error: not enough space to save checkpoint"), std::string::npos) << r.output;
  const fs::path ckpts = disk.path() / "run" / "checkpoints";
  EXPECT_EQ(testing::names_of(ckpts), (std::vector<std::string>{"latest", "step_00000001.h5", "step_00000002.h5"}));
  EXPECT_EQ(testing::read_file(ckpts / "latest"), "step_00000002.h5\n");
  if (ranks > 1) return;  // resuming is the same on any layout; one rank keeps this test short
  ASSERT_TRUE(disk.resize(16 << 20));
  std::vector<std::string> again = args;
  std::replace(again.begin(), again.end(), std::string("train.steps=3"), std::string("train.steps=4"));
  const auto resumed = testing::run_with_deadline(TESSERA_BINARY, again, run.dir, 120);
  ASSERT_FALSE(resumed.timed_out) << resumed.run.output;
  EXPECT_EQ(resumed.run.exit_code, 0) << resumed.run.output;
  EXPECT_NE(resumed.run.output.find("step_00000002.h5 at step 2"), std::string::npos) << resumed.run.output;
}

TEST(Checkpointing, FullDiskFailsTheRunWithOneMessage) { full_disk_run(1); }
TEST(Checkpointing, FullDiskFailsEveryRankTogether) { full_disk_run(2); }

TEST(Checkpointing, ShapeMismatchListsEveryDifference) {
  const TrainRun run = make_run("ckpt_mismatch");
  RunResult r = run.train({"train.steps=3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run.train({"train.steps=6", "model.n_embd=48"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("wte.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("blocks.1.mlp.fc.weight"), std::string::npos) << r.output;
  r = run.train({"train.steps=6", "checkpoint.resume=\"" + (run.dir / "nope.h5").string() + "\""});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("nope.h5"), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

}  // namespace tessera
